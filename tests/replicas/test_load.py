"""500 concurrent streams across two replicas sharing Redis, half the clients dropping at
random: nothing leaks (streams, sockets, Redis keys once the resume TTL has passed) and
every stream that finished has its artifacts, complete."""

from __future__ import annotations

import asyncio
import os
import random
import time

import orjson
import pytest

from tests.replicas.conftest import RedisServer, Replica, ReplicaFactory, assert_whole, read_sse
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import ScriptedUpstream
from toolforge.runtime.artifacts import ARTIFACT_FILES

STREAMS = 500
TOKENS = 30
RESUME_TTL_S = 2


def _sockets(pid: int) -> dict[int, int]:
    """The process's TCP sockets, counted by the port at the other end (0: listening)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    counts: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[9] in inodes:
                    port = int(fields[2].rsplit(":", 1)[1], 16)
                    counts[port] = counts.get(port, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_500_streams_across_two_replicas_with_half_the_clients_dropping(
    replicas: ReplicaFactory, redis_server: RedisServer, upstream: ScriptedUpstream
) -> None:
    a, b = await replicas(RESUME_TTL_S=str(RESUME_TTL_S), REDIS_MAX_CONNECTIONS="16")
    baseline = {port for r in (a, b) for port in _sockets(r.proc.pid)}
    rng = random.Random(20)
    # Half the clients leave after a random number of frames (0: before the first).
    drop_after = [rng.randrange(0, TOKENS) if i % 2 else None for i in range(STREAMS)]
    body = {"input": "x", "model": f"slow:{TOKENS}:3", "mode": "sentinel"}

    async def one(i: int) -> tuple[Replica, list[Event], bool]:
        replica = rng.choice((a, b))
        limit = drop_after[i]
        events = await read_sse(
            replica.client,
            "POST",
            f"{replica.url}/v1/stream",
            json=body,
            until=None if limit is None else (lambda e: int(e.id) > limit),
        )
        return replica, events, limit is None

    results = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    finished = [(r, ev) for r, ev, whole in results if whole]
    assert len(finished) == STREAMS // 2
    for _, events in finished:
        assert_whole(events)
        text = "".join(e.data["chunk"] for e in events if e.event == "text.delta")
        assert text == "".join(f"w{i} " for i in range(TOKENS))
        assert events[-1].data["metrics"]["frames"] == len(events)

    # Every stream ends (the dropped ones cancelled), and its artifacts are written.
    for replica in (a, b):
        deadline = time.monotonic() + 30
        while await replica.metric("toolforge_streams_active") != 0:
            assert time.monotonic() < deadline, f"streams still running on {replica.name}"
            await asyncio.sleep(0.2)

    for replica, events in finished:
        stream_id = events[0].data["stream_id"]
        path = replica.artifacts / "runs" / stream_id
        deadline = time.monotonic() + 10
        while not all((path / name).exists() for name in ARTIFACT_FILES):
            assert time.monotonic() < deadline, f"{stream_id}: artifacts incomplete"
            await asyncio.sleep(0.1)
        frames = (path / "frames.ndjson").read_bytes().splitlines()
        assert len(frames) == len(events)
        metrics = orjson.loads((path / "metrics.json").read_bytes())
        assert metrics["frames"] == len(events)
    runs = sum(1 for r in (a, b) for p in (r.artifacts / "runs").iterdir() if p.is_dir())
    assert runs == STREAMS

    # No socket left behind: to the upstream, at most the pool's keep-alive connections
    # (100, DEFAULT_LIMITS); to Redis, at most REDIS_MAX_CONNECTIONS; from the clients,
    # none once they have closed theirs.
    await a.client.aclose()
    await b.client.aclose()
    up_port = int(upstream.base_url.rsplit(":", 1)[1].split("/")[0])
    for replica in (a, b):
        deadline = time.monotonic() + 5
        while True:
            sockets = _sockets(replica.proc.pid)
            up = sockets.pop(up_port, 0)
            to_redis = sockets.pop(redis_server.port, 0)
            others = {port: n for port, n in sockets.items() if port not in baseline}
            if up <= 100 and to_redis <= 16 and not others:
                break
            assert time.monotonic() < deadline, (replica.name, up, to_redis, others)
            await asyncio.sleep(0.2)

    # Redis: once the resume TTL has passed, only the replicas' own heartbeat keys remain.
    await asyncio.sleep(RESUME_TTL_S + 1)
    left = [k for k in redis_server.keys() if not k.startswith("tf:r:")]
    assert left == [], left[:10]
