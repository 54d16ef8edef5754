"""Gateway CPU per paced token: many streams, each token arriving on its own.

Run with ``python -m bench.paced`` (``--streams 200 --tokens 100 --rate 10`` by default:
200 concurrent ``/v1/stream`` clients, each 100 tokens at 10 tokens/s from the scripted
upstream). At that pace no two tokens of one stream share a socket read, so every token
costs the gateway one upstream read, one frame and one client write: what B2 (full
speed, where reads and writes batch) does not show.

Each arm is a gateway process of its own in front of the same upstream, started with the
arm's settings (``--arm NAME=ENV=VALUE,...``; by default the relay path on and off,
``STREAM_RELAY=1`` / ``STREAM_RELAY=0``). The arms take turns, ``--rounds`` rounds each,
and each round reports the gateway's CPU (utime + stime from /proc, after the process has
gone quiet) divided by the tokens delivered, the share of tokens delivered, and the
inter-token gap p99 at the clients. ``--profile DIR`` runs every gateway under cProfile
and writes ``DIR/<arm>.prof`` when it stops (the figures are then the profiler's, not the
gateway's).

Never writes RESULTS.md: the figures go there by hand, with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench._procs import (
    CLK_TCK,
    ROOT,
    Proc,
    free_port,
    plain_tokens,
    scratch,
    settle_cpu,
    spawn_upstream,
)
from bench.gateway import Target, _load, _uvloop, direct_body, gaps, gateway_body, pct
from bench.load import gateway_env

__all__ = ["main"]


class _Gateway(Proc):
    """A gateway process started by this module (so that it can run under cProfile)."""

    def __init__(self, name: str, upstream: str, artifacts: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.stderr = tempfile.TemporaryFile()
        args = ["serve", "--port", str(self.port), "--upstream", upstream]
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.paced", *args, "--artifacts", str(artifacts)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env={**os.environ, **env},
        )
        try:
            self.wait_listening()
        except BaseException:
            self.stop()
            raise


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(port: int, upstream: str, artifacts: str) -> None:
    from bench._procs import _serve_gateway

    profile = os.environ.get("TOOLFORGE_BENCH_PROFILE")
    if not profile:
        _serve_gateway(port, upstream, artifacts)
        return
    # uvicorn raises the signal again once it has shut down: end with SystemExit, so that
    # the stats below are written.
    signal.signal(signal.SIGTERM, _exit)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        _serve_gateway(port, upstream, artifacts)
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def _settled(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` once it has gone quiet."""
    settle_cpu(pid)
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def _arms(specs: list[str]) -> dict[str, dict[str, str]]:
    arms: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, rest = spec.partition("=")
        env = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
        arms[name] = env
    return arms


@dataclass
class Round:
    """One load of ``streams`` clients: CPU seconds (gateway user, system; upstream) and
    what the clients received."""

    gateway: tuple[float, float]
    upstream: float
    tokens: int
    expected: int
    gap_p99_ms: float


async def _round(
    target: Target, proc: Proc | None, up: Proc, streams: int, n: int, delay_ms: float
) -> Round:
    model = f"steady:{n}:{delay_ms:g}"
    tokens = plain_tokens(n)
    g0 = _settled(proc.pid) if proc is not None else (0.0, 0.0)
    u0 = sum(_settled(up.pid))
    times = await _load(target, model, tokens, streams, None)
    g1 = _settled(proc.pid) if proc is not None else (0.0, 0.0)
    u1 = sum(_settled(up.pid))
    itl = [g for t in times for g in gaps(t)]
    return Round(
        (g1[0] - g0[0], g1[1] - g0[1]),
        u1 - u0,
        sum(len(t) for t in times),
        streams * n,
        pct(itl, 99) if itl else float("nan"),
    )


def _line(name: str, r: int, long: Round, short: Round, streams: int) -> str:
    """The round's figures: CPU per token over the whole stream (its start and end
    included), and per *added* token: the long load's CPU less the short one's, over the
    tokens the long one has more (what a token costs, without the stream around it)."""
    extra = max(long.tokens - short.tokens, 1)
    per = max(long.tokens, 1)
    if long.gateway == (0.0, 0.0):  # the direct arm
        gateway = ""
    else:
        total = sum(long.gateway) / per * 1e6
        user, system = (
            (a - b) / extra * 1e6 for a, b in zip(long.gateway, short.gateway, strict=True)
        )
        stream = (sum(short.gateway) - (user + system) / 1e6 * short.tokens) / streams * 1e3
        gateway = (
            f"gateway {total:5.1f} µs/token in all; per added token {user + system:5.1f} µs "
            f"(user {user:4.1f}, system {system:4.1f}); per stream {stream:4.2f} ms  "
        )
    up = (long.upstream - short.upstream) / extra * 1e6
    return (
        f"round {r} {name:>8}: {gateway}upstream {up:4.1f} µs per added token  "
        f"delivered {long.tokens / long.expected * 100:6.2f} %  gap p99 {long.gap_p99_ms:6.2f} ms"
    )


async def _run(args: argparse.Namespace) -> None:
    arms = _arms(args.arm or ["relay=STREAM_RELAY=1", "queued=STREAM_RELAY=0"])
    with scratch("toolforge-paced-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        gateways: dict[str, tuple[Target, Proc | None]] = {}
        if args.direct:
            direct = Target("direct", up.port, "/v1/chat/completions", direct_body)
            gateways["direct"] = (direct, None)
        for name, env in arms.items():
            if args.profile:
                env = {**env, "TOOLFORGE_BENCH_PROFILE": str(Path(args.profile) / f"{name}.prof")}
            # Room for every stream (an arm's own settings win), as bench.load gives B5.
            proc = _Gateway(name, url, artifacts, {**gateway_env(args.streams), **env})
            procs.append(proc)
            gateways[name] = (Target(name, proc.port, "/v1/stream", gateway_body), proc)
        delay_ms = 1000.0 / args.rate
        for target, _ in gateways.values():  # warm up: imports, caches, the pool
            await _load(target, f"steady:5:{delay_ms:g}", plain_tokens(5), 20, None)
        for r in range(1, args.rounds + 1):
            order = list(gateways.items())
            if r % 2 == 0:
                order.reverse()
            for name, (target, gateway) in order:
                short = await _round(target, gateway, up, args.streams, args.short, delay_ms)
                long = await _round(target, gateway, up, args.streams, args.tokens, delay_ms)
                print(_line(name, r, long, short, args.streams), flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve = argparse.ArgumentParser()
        serve.add_argument("serve")
        serve.add_argument("--port", type=int, required=True)
        serve.add_argument("--upstream", required=True)
        serve.add_argument("--artifacts", required=True)
        a = serve.parse_args()
        _serve(a.port, a.upstream, a.artifacts)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument(
        "--short", type=int, default=20, help="tokens of the short load (per added token)"
    )
    parser.add_argument("--rate", type=float, default=10.0, help="tokens/s per stream")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--arm",
        action="append",
        help="NAME=ENV=VALUE[,ENV=VALUE...]: a gateway with these settings (repeatable)",
    )
    parser.add_argument(
        "--direct", action="store_true", help="an arm of clients on the upstream directly"
    )
    parser.add_argument("--profile", help="a directory: run the gateways under cProfile")
    args = parser.parse_args()
    _uvloop()
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
