"""The replica's resume-buffer mirror (docs/deployment.md, "Resume buffers"): every
stream's new frames of a flush interval go to Redis in one pipelined round trip for the
whole replica, each stream's buffer as it was with one mirror task per stream.

End to end: gateway processes and a real ``redis-server`` (the replicas' fixtures), the
round trips counted by Redis itself (``INFO stats``' reads against ``INFO commandstats``'
EVALSHA calls). In process: the mirror driven round by round against the same Redis, with
streams whose frame logs the test fills (their round trips counted by the mirror).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import redis

from tests.replicas.conftest import RedisServer, Replica, ReplicaFactory
from toolforge.core.protocol.frames import Done, TextDelta
from toolforge.runtime.cluster.connection import Connection
from toolforge.runtime.cluster.keys import frames_key, meta_key
from toolforge.runtime.cluster.resume import ResumeBuffers
from toolforge.runtime.frame_log import FrameLog
from toolforge.runtime.session import StreamSession

SENTINEL = {"mode": "sentinel"}


def body(model: str) -> dict[str, Any]:
    return {"input": "x", "model": model, **SENTINEL}


PING = b"event: ping\ndata: {}\n\n"


async def raw_stream(replica: Replica, model: str) -> tuple[str, bytes]:
    """A whole ``POST /v1/stream`` body, byte for byte, and its stream id; without its
    pings (they are the connection's, not frames of the stream: no id, not buffered)."""
    url = f"{replica.url}/v1/stream"
    async with replica.client.stream("POST", url, json=body(model)) as r:
        r.raise_for_status()
        raw = b"".join([chunk async for chunk in r.aiter_raw()])
        return r.headers["x-stream-id"], _frames(raw)


def _frames(raw: bytes) -> bytes:
    blocks = raw.split(b"\n\n")
    return b"\n\n".join(block for block in blocks if block + b"\n\n" != PING)


async def raw_resume(replica: Replica, stream_id: str, last_id: str = "0") -> bytes:
    url = f"{replica.url}/v1/streams/{stream_id}"
    async with replica.client.stream("GET", url, headers={"Last-Event-ID": last_id}) as r:
        r.raise_for_status()
        return _frames(b"".join([chunk async for chunk in r.aiter_raw()]))


def buffer_of(client: redis.Redis, stream_id: str) -> list[tuple[str, dict[bytes, bytes]]]:
    """The stream's resume buffer: (entry id, fields) in order."""
    entries = client.xrange(frames_key(stream_id))
    return [(entry_id.decode(), fields) for entry_id, fields in entries]


async def until_done_in_redis(client: redis.Redis, stream_id: str) -> None:
    """Until the buffer's last entry holds ``done`` (a few seconds at most)."""
    for _ in range(200):
        entries = await asyncio.to_thread(client.xrevrange, frames_key(stream_id), count=1)
        if entries and entries[0][1].get(b"e") == b"1":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{stream_id}: done never reached its resume buffer")


def assert_buffer_is(client: redis.Redis, stream_id: str, sent: bytes) -> None:
    """The buffer holds exactly the bytes sent: entries ``{last frame id}-0``, each ``f``
    the frame after the previous entry's last, ``e`` 1 on the last entry only."""
    entries = buffer_of(client, stream_id)
    assert entries, stream_id
    last = 0
    for entry_id, fields in entries:
        assert int(fields[b"f"]) == last + 1, (entry_id, fields[b"f"])
        last = int(entry_id.removesuffix("-0"))
        assert entry_id == f"{last}-0"
    assert [fields[b"e"] for _, fields in entries] == [b"0"] * (len(entries) - 1) + [b"1"]
    assert b"".join(fields[b"d"] for _, fields in entries) == sent
    assert sent.count(b"\nid: ") + sent.startswith(b"id: ") >= last  # every frame numbered
    assert client.hget(meta_key(stream_id), "state") == b"done"


def redis_counts(client: redis.Redis) -> tuple[int, int]:
    """(reads Redis processed, EVALSHA calls it ran) so far."""
    reads = int(client.info("stats")["total_reads_processed"])
    evalsha = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    return reads, int(evalsha)


# -- end to end ----------------------------------------------------------------------------


async def test_many_streams_cost_a_round_trip_per_flush_not_one_per_stream(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    a, b = await replicas(REDIS_FLUSH_MS="20")
    client = redis_server.client()
    reads0, evalsha0 = await asyncio.to_thread(redis_counts, client)
    n = 40
    sent = await asyncio.gather(*(raw_stream(a, "slow:30:10") for _ in range(n)))
    for stream_id, _ in sent:
        await until_done_in_redis(client, stream_id)
    reads1, evalsha1 = await asyncio.to_thread(redis_counts, client)
    appends, reads = evalsha1 - evalsha0, reads1 - reads0
    # Each stream's 30 tokens 10 ms apart took several entries (one per flush with news);
    # one mirror task per stream made each its own round trip, a read of Redis's each.
    # Now one round trip carries every stream's entries of that flush: the reads are the
    # pipelines, the heartbeats and these INFO calls.
    assert appends >= 2 * n, (appends, reads)
    assert reads * 4 < appends, (appends, reads)
    for stream_id, raw in sent:
        assert_buffer_is(client, stream_id, raw)
    # A resume through the other replica gets the same bytes.
    for stream_id, raw in sent[:5]:
        assert await raw_resume(b, stream_id) == raw
    client.close()


async def test_done_reaches_redis_with_the_stream_s_last_write(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    # A long interval: a short stream is one entry, done in it, and a paced one ends with
    # an entry that holds its done (nothing waits for a later round).
    (a,) = await replicas(1, REDIS_FLUSH_MS="100")
    client = redis_server.client()
    for model in ("slow:5:0", "slow:20:20"):
        stream_id, raw = await raw_stream(a, model)
        await until_done_in_redis(client, stream_id)
        assert_buffer_is(client, stream_id, raw)
        if model == "slow:5:0":
            assert len(buffer_of(client, stream_id)) == 1
    client.close()


async def _while_stream_runs(replica: Replica, model: str, outage: Any) -> tuple[str, bytes]:
    streaming = asyncio.create_task(raw_stream(replica, model))
    await asyncio.sleep(0.3)
    await outage()
    return await streaming


async def test_redis_hung_mid_stream_and_back_the_buffer_catches_up(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    a, b = await replicas(REDIS_TIMEOUT_MS="300")

    async def hang() -> None:
        redis_server.pause()
        try:
            await asyncio.sleep(1.0)  # longer than REDIS_TIMEOUT_MS: writes time out
        finally:
            redis_server.unpause()

    stream_id, raw = await _while_stream_runs(a, "slow:200:10", hang)
    client = redis_server.client()
    await until_done_in_redis(client, stream_id)
    # Writes that timed out here may have run once Redis was back: entries can overlap
    # (readers skip the frames they hold), never leave a gap, and a resume anywhere is
    # the stream's own bytes.
    last = 0
    for entry_id, fields in buffer_of(client, stream_id):
        assert int(fields[b"f"]) <= last + 1, (entry_id, last)
        last = int(entry_id.removesuffix("-0"))
    assert await raw_resume(b, stream_id) == raw
    cut = raw.index(b"id: 100\n")
    assert await raw_resume(b, stream_id, "99") == raw[cut:]
    client.close()


async def test_redis_restarted_mid_stream_the_buffer_goes_on_from_there(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    a, b = await replicas(REDIS_TIMEOUT_MS="300")

    async def restart() -> None:
        await asyncio.to_thread(redis_server.restart)  # empty, without the Lua scripts

    stream_id, raw = await _while_stream_runs(a, "slow:200:10", restart)
    client = redis_server.client()
    await until_done_in_redis(client, stream_id)
    # What the old Redis held is gone; from the first entry after the restart on, the
    # frames are the stream's own, to its done, and B serves them.
    resumed = await raw_resume(b, stream_id)
    assert resumed and raw.endswith(resumed), (len(raw), len(resumed))
    assert resumed.startswith(b"id: ") and b"event: done" in resumed
    client.close()


# -- in process ---------------------------------------------------------------------------


@dataclass
class _Plan:
    owner: str | None = None


@dataclass
class _Stream:
    """What the mirror reads of a session: its id, frame log, owner and end time."""

    id: str
    log: FrameLog = field(default_factory=lambda: FrameLog(max_pending=10_000))
    plan: _Plan = field(default_factory=_Plan)
    finished_at: float | None = None

    def say(self, *chunks: str) -> None:
        for chunk in chunks:
            self.log.append(TextDelta(chunk=chunk))

    def end(self) -> None:
        usage: dict[str, int] = {}
        metrics = {"ttft_ms": None, "duration_ms": 0.0, "tokens_per_s": None, "frames": 0}
        self.log.append(Done(reason="stop", usage=usage, metrics=metrics))  # type: ignore[arg-type]
        self.log.close()
        self.finished_at = 0.0


@pytest.fixture
async def buffers(redis_server: RedisServer) -> AsyncIterator[ResumeBuffers]:
    """A replica's resume buffers whose mirror the test drives: its own rounds are an
    hour apart, the test calls them (``mirror.write_round``)."""
    conn = Connection(redis_server.url, {"timeout_s": 0.5, "replica_ttl_s": 1})
    made = ResumeBuffers(conn, flush_s=3600, resume_ttl_s=1, max_entries=4, max_bytes=1 << 20)
    # Loaded ahead, so the counts below are the rounds' own (a Redis without the script
    # answers NOSCRIPT once; the mirror loads it and sends those writes again).
    await conn.redis.script_load(conn.script("append").script)
    try:
        yield made
    finally:
        made.mirror._streams.clear()  # the streams the test left running: nothing to write
        await made.flush()
        await conn.aclose()


def tracked(buffers: ResumeBuffers, n: int) -> list[_Stream]:
    streams = [_Stream(f"s_mirror{i:03d}") for i in range(n)]
    for stream in streams:
        buffers.track(cast(StreamSession, stream))
    return streams


async def test_one_round_writes_every_stream_in_as_few_round_trips_as_the_cap_allows(
    buffers: ResumeBuffers, redis_server: RedisServer
) -> None:
    mirror = buffers.mirror
    streams = tracked(buffers, 10)
    for stream in streams:
        stream.say("a", "b", "c")
    await mirror.write_round()
    assert (mirror.round_trips, mirror.appends) == (3, 10)  # 4 + 4 + 2 commands
    client = redis_server.client()
    for stream in streams:
        assert [entry_id for entry_id, _ in buffer_of(client, stream.id)] == ["3-0"]
    # Nothing new: no round trip. Two streams move on, one ends: one round trip.
    await mirror.write_round()
    assert mirror.round_trips == 3
    streams[0].say("d")
    streams[1].end()
    await mirror.write_round()
    assert (mirror.round_trips, mirror.appends) == (4, 12)
    assert buffer_of(client, streams[1].id)[-1] == ("4-0", buffer_of(client, streams[1].id)[-1][1])
    assert buffer_of(client, streams[1].id)[-1][1][b"e"] == b"1"
    assert mirror.tracked == 9  # its done is in Redis: let go
    client.close()


async def test_the_byte_cap_splits_a_round_and_a_large_batch_goes_alone(
    buffers: ResumeBuffers, redis_server: RedisServer
) -> None:
    mirror = buffers.mirror
    mirror._max_entries = 1000
    mirror._max_bytes = 4096
    streams = tracked(buffers, 6)
    streams[0].say("y" * 10_000)
    for stream in streams[1:]:
        stream.say("x" * 1000)  # about 1.2 KB a stream with its costs: the fourth fills 4 KB
    await mirror.write_round()
    assert (mirror.round_trips, mirror.appends) == (3, 6)  # the large one, 4, 1
    client = redis_server.client()
    big = buffer_of(client, streams[0].id)
    assert len(big) == 1 and b"y" * 10_000 in big[0][1][b"d"]
    client.close()


async def test_idle_streams_have_their_ttls_refreshed_in_one_round_trip(
    buffers: ResumeBuffers, redis_server: RedisServer
) -> None:
    mirror = buffers.mirror
    mirror._max_entries = 1000
    streams = tracked(buffers, 20)
    for stream in streams:
        stream.say("a")
    await mirror.write_round()
    assert mirror.round_trips == 1
    client = redis_server.client()
    await asyncio.sleep(0.7)  # idle for more than a third of the 1 s TTL
    await mirror.write_round()
    assert (mirror.round_trips, mirror.appends) == (2, 20)  # the refreshes: no append
    for stream in streams:
        assert client.pttl(frames_key(stream.id)) > 700
        assert client.pttl(meta_key(stream.id)) > 700
    client.close()


async def test_a_stream_declared_lost_elsewhere_is_let_go(
    buffers: ResumeBuffers, redis_server: RedisServer
) -> None:
    mirror = buffers.mirror
    streams = tracked(buffers, 3)
    for stream in streams:
        stream.say("a")
    await mirror.write_round()
    client = redis_server.client()
    client.hset(meta_key(streams[0].id), "state", "lost")  # another replica's finalize
    for stream in streams:
        stream.say("b")
    await mirror.write_round()
    assert mirror.tracked == 2
    assert [e for e, _ in buffer_of(client, streams[0].id)] == ["1-0"]
    assert [e for e, _ in buffer_of(client, streams[1].id)] == ["1-0", "2-0"]
    client.close()


async def test_flush_at_shutdown_writes_the_last_frames(redis_server: RedisServer) -> None:
    conn = Connection(redis_server.url, {"timeout_s": 0.5, "replica_ttl_s": 1})
    buffers = ResumeBuffers(conn, flush_s=0.2, resume_ttl_s=5)
    try:
        streams = tracked(buffers, 5)
        for stream in streams:
            stream.say("a", "b")
            stream.end()
        await buffers.flush()  # before the loop's first round was due
        assert buffers.mirror.tracked == 0
        client = redis_server.client()
        for stream in streams:
            assert buffer_of(client, stream.id)[-1][1][b"e"] == b"1"
        client.close()
    finally:
        await conn.aclose()
