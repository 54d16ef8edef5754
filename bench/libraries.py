"""Why the hand-written parts, reproducible in one run: the gateway as it ships beside the
gateway with one part put back to the library it replaced.

Run with ``python -m bench.libraries`` (``--requests``, ``--b2-rounds``, ``--b2-tokens``).

Arms, each its own gateway process in front of the same scripted upstream:

- ``gateway``: as shipped: the lean upstream transport (app/upstream/transport.py:
  httptools, one Python step per socket read) and the plain ASGI SSE writer
  (app/api/sse.py, FrameStreamResponse);
- ``stock-httpx``: the upstream client is ``httpx.AsyncClient`` with its default transport
  (httpcore + h11), what the lean transport replaced;
- ``sse-starlette``: ``POST /v1/stream`` is written by sse-starlette's
  ``EventSourceResponse``, what FrameStreamResponse replaced (the same session and frames).

B1 (time to first event added over the direct upstream, and the gateway's CPU per request)
and B2 (tokens/s at full speed, and CPU per token) as ``bench.ab`` runs them: every arm
and the direct upstream take turns in rotating order, so the shared machine's drift hits
all alike. The load average before and after is printed: on a busy machine, repeat and
compare the spread. Never writes RESULTS.md (bench/RESULTS.md records runs by hand).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os

from bench._procs import Proc, scratch, spawn_gateway, spawn_upstream
from bench.ab import b1, rotations
from bench.gateway import Run, Target, _uvloop, b2_streams, direct_body, gateway_body, median
from bench.gateway import one_stream as _one_stream

ARMS = ("gateway", "stock-httpx", "sse-starlette")


async def b2(targets: dict[str, Target], procs: dict[str, Proc], n: int, rounds: int) -> list[str]:
    up = procs["direct"]
    lines: list[str] = []
    for label, model, total, expect_text, frames in b2_streams(n):
        runs: dict[str, list[Run]] = {name: [] for name in targets}
        for i, order in enumerate(rotations(list(targets), rounds + 1)):
            for name in order:
                t = targets[name]
                expect = total if t.direct else expect_text
                run = await _one_stream(t, model, expect, procs[name], up, frames)
                run.tokens = total
                if i:  # round 0 warms everything up
                    runs[name].append(run)
        rate = {name: median([r.rate for r in rs]) for name, rs in runs.items()}
        lines.append(f"B2, {label} ({total:,} tokens, median of {rounds} rounds):")
        lines.append(f"  direct {rate['direct']:,.0f} tokens/s")
        for name in ARMS:
            cpu = median([r.gw_cpu_s for r in runs[name]]) / total * 1e6
            each = sorted(r.rate / d.rate for r, d in zip(runs[name], runs["direct"], strict=True))
            lines.append(
                f"  {name} {rate[name]:,.0f} tokens/s, ratio {rate[name] / rate['direct']:.3f} "
                f"(rounds {each[0]:.3f}-{each[-1]:.3f}), CPU {cpu:.1f} µs/token"
            )
    return lines


async def compare(args: argparse.Namespace) -> list[str]:
    with scratch("toolforge-libs-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        gateways = {
            arm: spawn_gateway(
                url, artifacts, env={"TOOLFORGE_BENCH_ARM": "" if arm == "gateway" else arm}
            )
            for arm in ARMS
        }
        procs += gateways.values()
        targets = {
            "direct": Target("direct", up.port, "/v1/chat/completions", direct_body),
            **{
                name: Target(name, p.port, "/v1/stream", gateway_body)
                for name, p in gateways.items()
            },
        }
        lines = await b1(targets, gateways, args.requests, args.warmup)
        if args.b2_rounds:
            lines += await b2(targets, {"direct": up, **gateways}, args.b2_tokens, args.b2_rounds)
        return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="B1, per arm, after warm-up")
    parser.add_argument("--warmup", type=int, default=30, help="B1")
    parser.add_argument("--b2-rounds", type=int, default=3, help="per stream; 0 skips B2")
    parser.add_argument("--b2-tokens", type=int, default=20_000)
    args = parser.parse_args()
    versions = ", ".join(
        f"{pkg} {importlib.metadata.version(pkg)}"
        for pkg in ("httpx", "httpcore", "h11", "httptools", "sse-starlette", "starlette")
    )
    load_before = os.getloadavg()
    _uvloop()
    lines = asyncio.run(compare(args))
    load_after = os.getloadavg()
    print(f"{versions}; {os.cpu_count()} CPUs")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
