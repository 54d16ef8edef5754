"""The resume buffers' Redis round trips: N paced streams on one gateway worker with Redis.

Run with ``python -m bench.mirror`` (``--n 200,500``, ``--tokens 50``, ``--delay-ms 100``).
The processes are ``bench.gateway``'s scripted upstream and one gateway with ``REDIS_URL``
set to a ``redis-server`` of the bench's own (``bench.workers``); N streams of ``--tokens``
tokens ``--delay-ms`` apart start 4 ms apart from one client process. Reported: what Redis
itself counted while they ran (``INFO``: the ``EVALSHA`` calls, each one stream's entry in
its resume buffer, and the reads it processed, one per round trip a client sent), so the
mirror's round trips per entry show without a timer or ``MONITOR``. The gateway of another
checkout runs with ``PYTHONPATH=<checkout>/.ab-import`` (``bench.ab``'s package shim).
It prints its table; bench/RESULTS.md is written by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
import redis

from bench._procs import scratch, spawn_gateway, spawn_upstream
from bench.workers import redis_server

__all__ = ["main"]


def _counts(client: redis.Redis) -> tuple[int, int]:
    """(reads Redis processed, EVALSHA calls it ran) so far."""
    stats, commands = client.info("stats"), client.info("commandstats")
    evalsha = commands.get("cmdstat_evalsha", {}).get("calls", 0)
    return int(stats["total_reads_processed"]), int(evalsha)


async def _run(n: int, tokens: int, delay_ms: float) -> str:
    with scratch("toolforge-mirror-") as (artifacts, procs), redis_server() as url:
        up = spawn_upstream()
        procs.append(up)
        room = str(max(1000, 2 * n + 100))
        env = {"REDIS_URL": url, "MAX_CONNECTIONS": room, "UPSTREAM_MAX_CONNECTIONS": room}
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
            started = time.monotonic()

            async def one(i: int) -> int:
                await asyncio.sleep(i * 0.004)
                async with http.stream("POST", stream_url, json=body) as response:
                    raw = b"".join([chunk async for chunk in response.aiter_raw()])
                return raw.count(b"event: done")

            complete = sum(await asyncio.gather(*(one(i) for i in range(n))))
            took = time.monotonic() - started
            await asyncio.sleep(0.5)  # the last flushes
            reads1, evalsha1 = _counts(client)
        client.close()
    entries, reads = evalsha1 - evalsha0, reads1 - reads0
    return (
        f"| {n} | {complete} | {took:.1f} | {n * tokens} | {entries} | {reads} | "
        f"{entries / max(1, reads):.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="200,500", help="stream counts, comma-separated")
    parser.add_argument("--tokens", type=int, default=50, help="tokens per stream")
    parser.add_argument("--delay-ms", type=float, default=100.0, help="between two tokens")
    args = parser.parse_args()
    print(
        "| N | complete | s | tokens | EVALSHA (buffer entries) | Redis reads | entries per read |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.n.split(",")):
        print(asyncio.run(_run(n, args.tokens, args.delay_ms)), flush=True)


if __name__ == "__main__":
    main()
