"""The resume buffers' Redis round trips: N paced streams on one gateway worker with Redis.

Run with ``python -m bench.mirror`` (``--n 200,500``, ``--tokens 50``, ``--delay-ms 100``).
The processes are ``bench.gateway``'s scripted upstream and one gateway with ``REDIS_URL``
set to a ``redis-server`` of the bench's own (``bench.workers``); N streams of ``--tokens``
tokens ``--delay-ms`` apart start 4 ms apart from one client process. Reported: what Redis
itself counted while they ran (``INFO``: the ``EVALSHA`` calls, each one stream's entry in
its resume buffer, and the reads it processed, one per round trip a client sent), so the
mirror's round trips per entry show without a timer or ``MONITOR``; and the gateway's CPU
per token while they ran. ``--client python`` runs the gateway with redis-py's pure-Python
parser and packer (a ``hiredis`` that fails to import comes first on its ``PYTHONPATH``,
as when hiredis was not installed), ``hiredis`` as installed; ``--client hiredis,python``
runs both arms for each N.

``--pipeline 12,100`` measures the client alone instead, in this process: pipelines of
that many ``append`` EVALSHA calls shaped as the mirror sends them, through the gateway's
own :class:`~toolforge.runtime.cluster.connection.Connection` (its pool, its timeouts),
with each reply parser (redis-py's Python one, hiredis) and each packer (redis-py's
asyncio one, hiredis's), and this process's CPU per command.

The gateway of another checkout runs with ``PYTHONPATH=<checkout>/.ab-import``
(``bench.ab``'s package shim). It prints its table; bench/RESULTS.md is written by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser
from redis.utils import HIREDIS_AVAILABLE

from bench._procs import cpu_seconds, scratch, spawn_gateway, spawn_upstream
from bench.workers import redis_server
from toolforge.log import configure_logging
from toolforge.runtime.cluster.connection import Connection
from toolforge.runtime.cluster.keys import frames_key, meta_key

__all__ = ["main"]


def _counts(client: redis.Redis) -> tuple[int, int]:
    """(reads Redis processed, EVALSHA calls it ran) so far."""
    stats, commands = client.info("stats"), client.info("commandstats")
    evalsha = commands.get("cmdstat_evalsha", {}).get("calls", 0)
    return int(stats["total_reads_processed"]), int(evalsha)


def _without_hiredis(env: dict[str, str], shim: Path) -> None:
    """``env`` for a gateway whose ``import hiredis`` fails: redis-py's own parser and
    packer, as before hiredis was a dependency."""
    (shim / "hiredis").mkdir(exist_ok=True)
    (shim / "hiredis" / "__init__.py").write_text('raise ImportError("bench.mirror")\n')
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{shim}{os.pathsep}{path}" if path else str(shim)


async def _run(n: int, tokens: int, delay_ms: float, client_arm: str) -> str:
    with (
        scratch("toolforge-mirror-") as (artifacts, procs),
        redis_server() as url,
        tempfile.TemporaryDirectory(prefix="toolforge-mirror-shim-") as shim,
    ):
        up = spawn_upstream()
        procs.append(up)
        room = str(max(1000, 2 * n + 100))
        env = {"REDIS_URL": url, "MAX_CONNECTIONS": room, "UPSTREAM_MAX_CONNECTIONS": room}
        if client_arm == "python":
            _without_hiredis(env, Path(shim))
        gw = spawn_gateway(f"http://127.0.0.1:{up.port}/v1", artifacts, env=env)
        procs.append(gw)
        stream_url = f"http://127.0.0.1:{gw.port}/v1/stream"
        body = {"input": "hi", "model": f"steady:{tokens}:{delay_ms:g}", "mode": "sentinel"}
        client = redis.Redis.from_url(url)
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(
            timeout=tokens * delay_ms / 1000 * 3 + 30, limits=limits
        ) as http:
            await http.post(stream_url, json={**body, "model": "ttft"})  # the first request
            await asyncio.sleep(1.0)
            reads0, evalsha0 = _counts(client)
            started, cpu0 = time.monotonic(), cpu_seconds(gw.pid)

            async def one(i: int) -> int:
                await asyncio.sleep(i * 0.004)
                async with http.stream("POST", stream_url, json=body) as response:
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                return raw.count(b"event: done")

            complete = sum(await asyncio.gather(*(one(i) for i in range(n))))
            took = time.monotonic() - started
            await asyncio.sleep(0.5)  # the last flushes
            cpu = cpu_seconds(gw.pid) - cpu0
            reads1, evalsha1 = _counts(client)
        client.close()
    entries, reads = evalsha1 - evalsha0, reads1 - reads0
    return (
        f"| {n} | {client_arm} | {complete} | {took:.1f} | {n * tokens} | {entries} | {reads} | "
        f"{entries / max(1, reads):.1f} | {cpu / (n * tokens) * 1e6:.1f} |"
    )


_FRAMES = b'id: 7\nevent: token\ndata: {"text":"the model"}\n\n' * 3


async def _pipelines(url: str, size: int, parser: str, packer: str, rounds: int) -> float:
    """CPU µs per EVALSHA over ``rounds`` pipelines of ``size``, after a warm-up."""
    conn = Connection(url, {"timeout_s": 1.0, "replica_ttl_s": 5.0})
    pool = conn.redis.connection_pool
    if packer == "python":  # redis-py's own class, as chosen for the URL
        pool.connection_class = pool.connection_class.__mro__[1]
    assert pool.connection_class.__name__.startswith("Hiredis") == (packer == "hiredis")
    parsers = {"python": _AsyncRESP2Parser, "hiredis": _AsyncHiredisParser}
    pool.connection_kwargs["parser_class"] = parsers[parser]
    sha = conn.script("append").sha
    commands: list[tuple[Any, ...]] = []
    for i in range(size):
        keys = [frames_key(f"s_{i:012x}"), meta_key(f"s_{i:012x}")]
        args = [f"{i + 10}-0", i + 1, _FRAMES, 0, 600_000, conn.replica_id, "bench"]
        commands.append((sha, len(keys), *keys, *args))
    await conn.redis.script_load(conn.script("append").script)

    async def once() -> None:
        pipe = conn.redis.pipeline(transaction=False)
        for command in commands:
            pipe.evalsha(*command)
        await pipe.execute(False)

    for _ in range(5):
        await once()
    started = time.process_time()
    for _ in range(rounds):
        await once()
    took = time.process_time() - started
    await conn.aclose()
    return took / (rounds * size) * 1e6


async def _client_table(sizes: list[int]) -> None:
    if not HIREDIS_AVAILABLE:
        raise SystemExit("--pipeline compares hiredis with redis-py's own: pip install -e .")
    configure_logging(level="WARNING")  # not the client's start-up line before each run
    print("| pipeline | parser | packer | CPU µs per EVALSHA (3 runs) |")
    print("|---|---|---|---|")
    with redis_server() as url:
        for size in sizes:
            for parser, packer in (
                ("python", "python"),
                ("hiredis", "python"),
                ("hiredis", "hiredis"),
            ):
                runs = [await _pipelines(url, size, parser, packer, 12_000 // size) for _ in "123"]
                cells = " / ".join(f"{run:.1f}" for run in runs)
                print(f"| {size} | {parser} | {packer} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="200,500", help="stream counts, comma-separated")
    parser.add_argument("--tokens", type=int, default=50, help="tokens per stream")
    parser.add_argument("--delay-ms", type=float, default=100.0, help="between two tokens")
    parser.add_argument(
        "--client",
        default="hiredis",
        help="the gateway's Redis client: hiredis (as installed), python (redis-py's own "
        "parser and packer), or both comma-separated, run in turn for each N",
    )
    parser.add_argument(
        "--pipeline",
        default="",
        help="pipeline sizes, comma-separated: the client alone, in process (no gateway)",
    )
    args = parser.parse_args()
    if args.pipeline:
        asyncio.run(_client_table([int(x) for x in args.pipeline.split(",")]))
        return
    arms = [arm.strip() for arm in args.client.split(",")]
    if not set(arms) <= {"hiredis", "python"}:
        parser.error(f"--client: hiredis or python, not {args.client!r}")
    print(
        "| N | client | complete | s | tokens | EVALSHA (buffer entries) | Redis reads "
        "| entries per read | gateway CPU µs per token |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.n.split(",")):
        for arm in arms:
            print(asyncio.run(_run(n, args.tokens, args.delay_ms, arm)), flush=True)


if __name__ == "__main__":
    main()
