"""The booking demo, end to end: where its time goes, turn by turn.

Run with ``python -m bench.demo`` (``--runs N``, ``--arms prefill,decode``, ``--other-runs M``:
the arms after the first on seeds 1..M only, to check the first's correct rate on more
seeds). One gateway on the embedded default (``toolforge obtain``'s llama-server and
SmolLM2-135M, started by the ServerManager), in this process; each run is the README's demo
request, as curl sends it (``"workflow": "book_a_table"``, the ``demo`` profile,
constrained mode), seed = the run's number, one run at a time (the demo's one user). The
arms are the adapter's ``prefill_forced`` (docs/performance.md, "The booking demo, end to end"):

* ``prefill``: the text a turn's grammar forces (a call's sentinels and its opening brace)
  goes to llama-server as the start of the assistant's reply, the suffix is written by
  the adapter: the setting's default;
* ``decode``: the whole grammar sent, every forced token decoded (LLAMA_PREFILL_FORCED=false).

The arms alternate run by run on the same server, so a shared machine's load falls on
both alike. Per run, from the client and the run's artifacts (``metrics.json``: llama-server's
``timings`` per model call; the ``tool.result`` frames' ``duration_ms``):

* end to end: the request sent to ``done`` read, by the client;
* per turn: prompt tokens processed (``prompt_n``) and served from the cache (``cache_n``),
  their time (``prompt_ms``), tokens generated (``predicted_n``) and their time
  (``predicted_ms``, the grammar's sampling included);
* tools: the tools' own time; gateway: what is left (the gateway, HTTP, the client).

Correct is the booking bench's "as asked" (bench.workflow_narrowing): the workflow ended
with a booking of a place the search returned, at 19:00 for 2. Prints one JSON line per
run and a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.workflow_narrowing import PROMPT, _judge
from toolforge.api.app import create_app
from toolforge.eval.loopback import Served, serve
from toolforge.settings import Settings
from toolforge.upstream.llama_server import LlamaServerUpstream

__all__ = ["main"]

ARMS = {"prefill": True, "decode": False}  # the arm: the adapter's prefill_forced
_TIMINGS = ("prompt_n", "cache_n", "prompt_ms", "predicted_n", "predicted_ms")


def _request(seed: int) -> dict[str, Any]:
    return {
        "input": PROMPT,
        "workflow": "book_a_table",
        "mode": "constrained",
        "profile": "demo",  # temperature 0.2, max_tokens 384, as the README's request
        "sampling": {"seed": seed},
    }


async def _metrics(artifacts: Path, stream_id: str) -> dict[str, Any]:
    """The run's metrics.json, written once ``done`` is out (off the event loop)."""
    path = artifacts / "runs" / stream_id / "metrics.json"
    for _ in range(100):
        if path.exists():
            return dict(orjson.loads(path.read_bytes()))
        await asyncio.sleep(0.05)
    raise RuntimeError(f"no metrics.json for {stream_id}")


async def _one(
    served: Served, upstream: LlamaServerUpstream, arm: str, seed: int
) -> dict[str, Any]:
    upstream.prefill_forced = ARMS[arm]
    started = time.perf_counter()
    events = await served.stream(_request(seed))
    e2e_ms = (time.perf_counter() - started) * 1e3
    events = [e for e in events if e.event != "ping"]
    verdict = _judge(events)
    metrics = await _metrics(served.artifacts, events[0].data["stream_id"])
    turns = [{k: t.get(k) for k in _TIMINGS} for t in metrics["upstream_timings"]]
    model_ms = sum((t["prompt_ms"] or 0) + (t["predicted_ms"] or 0) for t in turns)
    tool_ms = sum(e.data.get("duration_ms") or 0.0 for e in events if e.event == "tool.result")
    # A call whose last chunk (llama-server's timings) was not read (the engine closes the
    # stream once a terminal call's frame ends) leaves its model time in the remainder.
    whole = len(turns) == metrics["turns"]
    return {
        "arm": arm,
        "seed": seed,
        "as_asked": verdict["as_asked"],
        "booked": verdict["booked"],
        "searches": verdict["searches"],  # each search's query and how many places it found
        "reason": verdict["reason"],
        "e2e_ms": round(e2e_ms, 1),
        "ttft_ms": metrics["ttft_ms"],
        "turn_ttft_ms": metrics["turn_ttft_ms"],
        "turns": turns,
        "model_ms": round(model_ms, 1),
        "tool_ms": round(tool_ms, 3),
        "gateway_ms": round(e2e_ms - model_ms - tool_ms, 1) if whole else None,
        "load": os.getloadavg()[0],
    }


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _turn(rows: list[dict[str, Any]], index: int, key: str) -> str:
    values = [r["turns"][index][key] for r in rows if len(r["turns"]) > index]
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    median = statistics.median(values)
    return f"{median:.0f}"


def _gateway(rows: list[dict[str, Any]]) -> str:
    """The gateway's p50, over the runs whose every call reported its timings."""
    values = [r["gateway_ms"] for r in rows if r["gateway_ms"] is not None]
    return f"{_pct(values, 0.5):.0f} ({len(values)} runs)" if values else "–"


def _report(rows: list[dict[str, Any]], runs: str, arms: list[str]) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print()
    print(f"### The booking demo, end to end ({time.strftime('%Y-%m-%d')}, {commit})")
    print()
    print(
        f"`python -m bench.demo {runs} --arms {','.join(arms)}` on "
        f"{platform.machine()}, {os.cpu_count()} CPUs, 1-minute load average "
        f"{min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f} at the "
        "runs' ends; SmolLM2-135M on the embedded llama-server, one run at a time, "
        "the arms alternating, seeds 1..N. Milliseconds; per turn, medians."
    )
    print()
    print(
        "| arm | correct | e2e p50 | e2e p95 | TTFT p50 | turn 1 prompt / cached / ms "
        "| turn 1 generated / ms | turn 2 prompt / cached / ms | turn 2 generated / ms "
        "| tools p50 | gateway p50 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        n = len(mine)
        e2e = [r["e2e_ms"] for r in mine]
        ttft = [r["ttft_ms"] or 0.0 for r in mine]
        t = [
            f"{_turn(mine, i, 'prompt_n')} / {_turn(mine, i, 'cache_n')} / "
            f"{_turn(mine, i, 'prompt_ms')} | {_turn(mine, i, 'predicted_n')} / "
            f"{_turn(mine, i, 'predicted_ms')}"
            for i in (0, 1)
        ]
        ok = sum(r["as_asked"] for r in mine)
        print(
            f"| {arm} | {ok}/{n} | {_pct(e2e, 0.5):.0f} | {_pct(e2e, 0.95):.0f} "
            f"| {_pct(ttft, 0.5):.0f} | {t[0]} | {t[1]} "
            f"| {_pct([r['tool_ms'] for r in mine], 0.5):.1f} "
            f"| {_gateway(mine)} |"
        )


async def _main(runs: int, arms: list[str], other_runs: int) -> None:
    for name in ("UPSTREAM_BASE_URL", "MODEL_ID", "UPSTREAM_KIND"):
        os.environ.pop(name, None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # A loaded 2-CPU machine (other jobs beside) can take minutes for a prompt: the
        # timeouts are the booking bench's (bench.workflow_narrowing).
        settings = Settings(
            artifacts_dir=Path(tmp),
            log_level="WARNING",
            log_json=False,
            frame_timeout_ms=600_000,
            upstream_first_byte_timeout_s=900,
            upstream_idle_timeout_s=300,
            llama_nice=0,  # not below the other jobs of a shared machine: it is the bench
        )
        app = create_app(settings)
        async with serve(app, start_timeout_s=300) as url, httpx.AsyncClient(timeout=900) as client:
            served = Served(url, app, client, Path(tmp))
            upstream = served.gateway.upstream
            if not isinstance(upstream, LlamaServerUpstream):
                raise SystemExit(f"the embedded default is not llama-server: {upstream!r}")
            # One unmeasured run: the first prompt of a fresh server has no cache yet.
            await _one(served, upstream, arms[0], 0)
            for seed in range(1, runs + 1):
                for arm in arms if seed <= other_runs else arms[:1]:
                    row = await _one(served, upstream, arm, seed)
                    print(orjson.dumps(row).decode(), flush=True)
                    rows.append(row)
    _report(rows, f"--runs {runs} --other-runs {other_runs}", arms)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each arm")
    parser.add_argument("--arms", default="prefill,decode", help="of: " + ", ".join(ARMS))
    parser.add_argument("--other-runs", type=int, help="runs of the other arms (default --runs)")
    parser.add_argument("--report", type=Path, help="only the table, from an earlier run's output")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; the arms are {', '.join(ARMS)}")
    other = args.runs if args.other_runs is None else args.other_runs
    if args.report is not None:
        lines = args.report.read_text().splitlines()
        rows = [orjson.loads(line) for line in lines if line.startswith('{"arm"')]
        for row in rows:  # before the remainder was left out where a call had no timings
            if len(row["turns"]) < len(row["turn_ttft_ms"]):
                row["gateway_ms"] = None
        _report(rows, f"--runs {args.runs} --other-runs {other}", arms)
        return
    asyncio.run(_main(args.runs, arms, other))


if __name__ == "__main__":
    main()
