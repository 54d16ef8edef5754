"""Resume buffers: every stream's SSE blocks mirrored into Redis, and read back by any
replica (``GET /v1/streams/{id}`` on a replica that does not run it).

``tf:s:{id}:f`` is a Redis Stream of the frames' bytes exactly as they were sent. The
replica's *mirror* (:mod:`.mirror`) follows every stream's frame log like any other reader
(it never throttles the producer) and appends whatever is new, every ``REDIS_FLUSH_MS``,
all of the replica's streams in one pipelined round trip: the only Redis work while
tokens flow, and not on the token's own path. Each entry's
id is ``{last frame id}-0`` and carries ``f`` (its first frame id), ``d`` (the bytes) and
``e`` (``1`` on the entry holding ``done``), so a resume after frame *N* reads from
``(N-0``. A replica that dies leaves its buffer; the first reader that finds its owner
gone appends ``error`` (``STREAM_LOST``) and ``done``, atomically, so every later reader
sees the same end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

from toolforge.core.protocol.frames import Done, Error, encode_frame
from toolforge.core.protocol.sse_blocks import split_blocks
from toolforge.errors import ErrorCode
from toolforge.runtime.cluster.connection import BLOCK_MS, Connection
from toolforge.runtime.cluster.keys import alive_key, frames_key, meta_key
from toolforge.runtime.cluster.mirror import Mirror
from toolforge.runtime.frame_log import decode_frames
from toolforge.runtime.session import StreamSession

__all__ = ["RemoteStream", "ResumeBuffers"]

# Beyond two flush intervals, what a stream's first mirror write may take to be in Redis
# (its round trip on a busy replica).
_ANNOUNCE_SLACK_S: Final = 0.02


class ResumeBuffers:
    """This replica's side of the buffers: it mirrors the streams it runs (one loop for
    all of them, :class:`~.mirror.Mirror`), and finds any stream Redis knows."""

    def __init__(
        self,
        conn: Connection,
        *,
        flush_s: float,
        resume_ttl_s: float,
        max_entries: int = 512,
        max_bytes: int = 1 << 20,
    ) -> None:
        """``max_entries`` and ``max_bytes``: one mirror round trip's caps
        (``REDIS_MIRROR_MAX_ENTRIES``, ``REDIS_MIRROR_MAX_BYTES``)."""
        self._conn = conn
        self.flush_s = flush_s
        self.ttl_ms = max(1000, int(resume_ttl_s * 1000))
        self.mirror = Mirror(
            conn, flush_s=flush_s, ttl_ms=self.ttl_ms, max_entries=max_entries, max_bytes=max_bytes
        )

    def track(self, session: StreamSession, idempotency_key: str | None = None) -> None:
        """Mirror ``session``'s frames into its resume buffer until its ``done``."""
        self.mirror.track(session, idempotency_key)

    async def flush(self) -> None:
        """After the streams ended: let the mirror write their last frames, then stop."""
        await self.mirror.flush(max(1.0, 4 * self._conn.timeout_s))

    async def find_announced(self, stream_id: str) -> RemoteStream | None:
        """As :meth:`find`, for a stream id a client holds: a stream's first frames reach
        its client before its replica's mirror writes it to Redis (within a flush
        interval, by design), so a command or a resume sent at once to another replica
        can come first. Where Redis does not know the stream, look once more after that
        window (two intervals and 20 ms); only an unknown id pays the wait."""
        found = await self.find(stream_id)
        if found is None:
            await asyncio.sleep(2 * self.flush_s + _ANNOUNCE_SLACK_S)
            found = await self.find(stream_id)
        return found

    async def find(self, stream_id: str) -> RemoteStream | None:
        """The stream as Redis knows it, or None (never existed, or expired)."""
        conn = self._conn
        meta = await conn.call("resuming a stream", conn.redis.hgetall(meta_key(stream_id)))
        if not meta:
            return None
        key = meta.get(b"key")
        return RemoteStream(
            self,
            stream_id,
            meta[b"owner"].decode(),
            meta[b"state"].decode(),
            key=None if key is None else key.decode(),
        )


class RemoteStream:
    """A stream known to Redis, read from its resume buffer (another replica runs it, or
    ran it)."""

    def __init__(
        self,
        buffers: ResumeBuffers,
        stream_id: str,
        owner: str,
        state: str,
        *,
        key: str | None = None,
    ) -> None:
        self._buffers = buffers
        self._conn = buffers._conn
        self.id = stream_id
        self.owner = owner  # the replica that runs (ran) it
        self.state = state
        self.key = key  # the API key name that started it (docs/security.md), None without keys

    async def follow(self, after: int = 0) -> AsyncIterator[bytes]:
        """The frames after id ``after``, in batches, until ``done``; ``b""`` whenever
        nothing came for a while (the writer's chance to ping). A dead owner's stream
        ends with ``error`` (``STREAM_LOST``) and ``done``."""
        conn = self._conn
        key = frames_key(self.id)
        cursor = after
        while True:
            found = await conn.call(
                "resuming a stream",
                conn.redis.xread({key: f"{cursor}-0"}, count=512, block=BLOCK_MS),
                extra_s=BLOCK_MS / 1000,
            )
            entries = found[0][1] if found else []
            if not entries:
                yield b""
                if await self._check_owner():
                    return
                continue
            out: list[bytes] = []
            final = False
            for entry_id, fields in entries:
                last = int(entry_id.split(b"-", 1)[0])
                first = int(fields[b"f"])
                data = fields[b"d"]
                if first <= cursor:
                    if fields.get(b"l") == b"1":
                        # The end written for a lost stream, and this client holds frames
                        # the buffer never got: the same end, numbered after its own.
                        data = b"".join(
                            encode_frame(cursor + i, frame)
                            for i, frame in enumerate(decode_frames(split_blocks(data)), 1)
                        )
                        last = cursor + 2
                    else:
                        data = b"".join(split_blocks(data)[cursor - first + 1 :])
                out.append(data)
                cursor = last
                if fields.get(b"e") == b"1":
                    final = True
                    break
            yield b"".join(out)
            if final:
                return

    async def _check_owner(self) -> bool:
        """Nothing new: if the owner is dead, end the buffer with STREAM_LOST + done.
        True if the stream is gone from Redis altogether (its keys expired)."""
        conn = self._conn
        pipe = conn.redis.pipeline(transaction=False)
        pipe.exists(meta_key(self.id))
        pipe.exists(alive_key(self.owner))
        meta, alive = await conn.call("resuming a stream", pipe.execute())
        if not meta:  # expired: nothing more will come, whoever runs it
            return True
        if alive or self.owner == conn.replica_id:
            return False
        key = frames_key(self.id)
        latest = await conn.call("resuming a stream", conn.redis.xrevrange(key, count=1))
        n = int(latest[0][0].split(b"-", 1)[0]) if latest else 0
        result = await conn.call(
            "resuming a stream",
            conn.script("finalize")(
                keys=[key, meta_key(self.id), alive_key(self.owner)],
                args=[n, f"{n + 2}-0", n + 1, _lost_frames(n, self.owner), self._buffers.ttl_ms],
            ),
        )  # 1, -1, -2: the next read shows where the buffer stands
        if result == 0:  # ended: done or lost, or expired
            found = await conn.call("resuming a stream", conn.redis.exists(meta_key(self.id)))
            return not found
        return False


def _lost_frames(n: int, owner: str) -> bytes:
    error = Error(
        code=ErrorCode.STREAM_LOST,
        message=(
            f"the replica running this stream ({owner}) stopped; the frames before this "
            "one are all that were kept. Send the request again to start over"
        ),
        retryable=True,
    )
    done = Done(
        reason="error",
        usage={},
        metrics={"ttft_ms": None, "duration_ms": 0.0, "tokens_per_s": None, "frames": n + 2},
    )
    return encode_frame(n + 1, error) + encode_frame(n + 2, done)
