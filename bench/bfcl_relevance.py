"""BFCL ``irrelevance`` through the gateway's proxy: does it still decline?

Run with ``python -m bench.bfcl_relevance``. The other side of ``bench.bfcl``: each of the
category's 240 cases is a question and a function that cannot answer it ("the area of a
triangle" with only a body-mass-index function), from the same ``bfcl-eval`` data. The
right reply is no call. Anything that makes the proxy call more often (a prompt, a
narrowing default) must be judged here as well as on ``simple_python``, or the gain there
is a loss of relevance detection.

Each case goes to the gateway as ``bench.bfcl`` sends its own (the function as the one
tool, the default ``tool_choice``, temperature 0, the same seed and ``max_tokens``), to the
``proxy`` arm only: llama-server alone never calls on this model (it answers every
``simple_python`` case in prose), so it declines every irrelevant one for the same reason.
A case passes when the reply holds no tool call. ``--stride N`` takes every Nth case;
``--rev`` serves the gateway from a commit. Prints a table; ``--out`` keeps one JSON line
per case. Nothing is written to bench/RESULTS.md: the numbers go there by hand, beside the
``simple_python`` run they judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import httpx

from bench import bfcl
from bench._results import load_average
from bench.bfcl import TIMEOUT_S, Case, Verdict, code_at, data_dir, embedded_gateway

CATEGORY: Final = "BFCL_v4_irrelevance.json"
CASES: Final = 240  # the category's size in bfcl-eval's data


def load_irrelevance(data: Path) -> list[Case]:
    """Every ``irrelevance`` case of ``data``, in file order, with no possible answer (the
    right reply is no call). A case with several functions offers the first."""
    cases = []
    for line in (data / CATEGORY).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        (messages,) = entry["question"]
        cases.append(Case(entry["id"], messages, entry["function"][0], {}))
    return cases


def judge(case: Case, message: Mapping[str, Any] | None) -> Verdict:
    """This category's verdict: a reply is right (``accurate``) when it holds no call."""
    called = bool((message or {}).get("tool_calls"))
    return Verdict(called, not called, "called" if called else "")


async def ask(client: httpx.AsyncClient, url: str, case: Case, model: str) -> dict[str, object]:
    """Send ``case`` as ``bench.bfcl`` sends its own; what came back, as a line of ``--out``."""
    return (await bfcl.ask(client, url, "proxy", case, model, judge=judge)).to_json()


def declined(record: dict[str, object]) -> bool:
    """Whether a reply (a line of ``--out``) declined: a 200 with no tool call."""
    return record["status"] == 200 and not record["tool_calls"] and not record["error"]


async def run(args: argparse.Namespace) -> None:
    cases = load_irrelevance(data_dir())
    if len(cases) != CASES:
        raise RuntimeError(f"expected {CASES} irrelevance cases, found {len(cases)}")
    cases = cases[:: args.stride]
    load_at_start = load_average()
    started = time.monotonic()
    lines: list[dict[str, object]] = []
    with code_at(args.rev) as (env, code), tempfile.TemporaryDirectory() as artifacts:
        env = {
            **env,
            "LLAMA_NICE": str(args.llama_nice),
            "LLAMA_PARALLEL": str(args.concurrency),
            "LLAMA_THREADS": str(args.llama_threads),
        }
        async with embedded_gateway(env, Path(artifacts)) as gateway:
            gate = asyncio.Semaphore(args.concurrency)
            limits = httpx.Limits(max_connections=2 * args.concurrency)
            timeout = httpx.Timeout(TIMEOUT_S, connect=10)
            async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
                url = f"{gateway.url}/v1/chat/completions"

                async def one(case: Case) -> None:
                    async with gate:
                        record = await ask(client, url, case, gateway.model)
                    lines.append(record)
                    mark = "declined" if declined(record) else "CALLED"
                    print(f"{len(lines):3}/{len(cases)} {case.id:<18} {mark}", flush=True)

                await asyncio.gather(*(one(case) for case in cases))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        order = {case.id: i for i, case in enumerate(cases)}
        lines.sort(key=lambda r: order[str(r["id"])])
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))
    print("\n".join(report(lines, code, " ".join(sys.argv[1:]), load_at_start, started)))


def report(
    lines: Sequence[dict[str, object]],
    code: str,
    argv: str,
    load_at_start: str,
    started: float,
) -> list[str]:
    """The run as Markdown: the declined rate and what the calls were."""
    n = len(lines)
    kept = sum(declined(r) for r in lines)
    called = Counter(
        "error" if r["error"] else f"HTTP {r['status']}" if r["status"] != 200 else "called"
        for r in lines
        if not declined(r)
    )
    return [
        f"`python -m bench.bfcl_relevance {argv}` at `{code}`; load average at start "
        f"{load_at_start}, {time.monotonic() - started:.0f} s.",
        "",
        "| irrelevance cases | declined (no call) through the proxy |",
        "|---|---|",
        f"| {n} | **{kept}/{n} ({kept / max(n, 1):.0%})** |",
        "",
        "Not declined: " + (", ".join(f"{k} {v}" for k, v in called.most_common()) or "none"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1, help="every Nth case (default all)")
    parser.add_argument("--concurrency", type=int, default=2, help="cases at once (and slots)")
    parser.add_argument("--rev", help="serve the gateway from this git revision (e.g. HEAD)")
    parser.add_argument("--llama-nice", type=int, default=0, help="llama-server's nice value")
    parser.add_argument(
        "--llama-threads", type=int, default=1, help="llama-server's threads (default 1, as bfcl)"
    )
    parser.add_argument("--out", type=Path, help="one JSON line per case")
    parser.add_argument(
        "--guardrail",
        action="append",
        default=[],
        metavar="NAME=off",
        help="switch a guardrail off on the proxy (an ablation: relevance=off)",
    )
    args = parser.parse_args()
    for item in args.guardrail:
        name, _, value = item.partition("=")
        if value != "off" or not name:
            parser.error(f"--guardrail takes NAME=off, not {item!r}")
        bfcl.GUARDRAILS_OFF[name] = False
    if args.stride < 1 or args.concurrency < 1:
        parser.error("--stride and --concurrency must be at least 1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
