"""Tool round trip: a two-tool stream beside the same text without tools, in one run.

Run with ``python -m bench.tool_roundtrip`` (``make bench`` runs it too). The scripted upstream and
the gateway run in their own processes (``bench._procs``). ``tools2`` is a three-turn
conversation: a ``places.search`` call, a ``bookings.create`` call, then the RESULT; each
tool call pauses the model, runs the tool and resumes it with a new upstream request.
``tools0`` is the same text in one turn, with OBJECT frames where the calls were. The
added latency per tool round trip, excluding the tool's own time, is

    (t(tools2) - t(tools0) - sum of the tools' duration_ms) / 2

per pair of runs (alternating, after a warm-up). Target (docs/performance.md): p50 ≤ 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from bench._procs import spawn_gateway, spawn_upstream


def one_stream(client: httpx.Client, url: str, model: str) -> tuple[float, float]:
    """Seconds from POST to the done frame, and the tools' own time in ms."""
    tools_ms = 0.0
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/stream", json={"input": "x", "model": model}) as r:
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "tool.result":
                tools_ms += orjson.loads(line[6:])["duration_ms"]
            elif line.startswith("data: ") and event == "done":
                return time.perf_counter() - started, tools_ms
    raise RuntimeError(f"{model}: the stream ended without a done frame")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    upstream = spawn_upstream()
    with tempfile.TemporaryDirectory() as artifacts:
        gateway = spawn_gateway(f"http://127.0.0.1:{upstream.port}/v1", Path(artifacts))
        try:
            url = f"http://127.0.0.1:{gateway.port}"
            added: list[float] = []
            plain: list[float] = []
            with_tools: list[float] = []
            own: list[float] = []
            with httpx.Client(timeout=30) as client:
                for _ in range(5):  # warm-up: connections, caches, first imports
                    one_stream(client, url, "tools2")
                    one_stream(client, url, "tools0")
                for _ in range(args.runs):
                    t2, tools_ms = one_stream(client, url, "tools2")
                    t0, _ = one_stream(client, url, "tools0")
                    with_tools.append(t2 * 1e3)
                    plain.append(t0 * 1e3)
                    own.append(tools_ms)
                    added.append((t2 * 1e3 - t0 * 1e3 - tools_ms) / 2)
        finally:
            gateway.stop()
            upstream.stop()

    def q(values: list[float], p: float) -> float:
        return statistics.quantiles(values, n=100)[int(p) - 1]

    print(
        f"`python -m bench.tool_roundtrip --runs {args.runs}` — alternating pairs after 5 warm-ups"
    )
    print()
    rows = [
        ("tools0: same text, no tools (1 upstream request)", plain),
        ("tools2: two tool round trips (3 upstream requests)", with_tools),
        ("the tools' own time (sum of duration_ms)", own),
        ("**added per tool round trip**", added),
    ]
    print("| stream | p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|")
    for label, values in rows:
        p50, p90, p99 = statistics.median(values), q(values, 90), q(values, 99)
        print(f"| {label} | {p50:.2f} | {p90:.2f} | {p99:.2f} |")
    p50 = statistics.median(added)
    print()
    print(f"- added per round trip p50 {p50:.2f} ms ≤ 5 ms: **{'MET' if p50 <= 5 else 'MISSED'}**")


if __name__ == "__main__":
    main()
