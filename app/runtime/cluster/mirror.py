"""The mirror: the frames of every stream this replica runs, copied into their resume
buffers in Redis (:mod:`.resume`) by one loop for the whole replica.

Theory of operation. Every flush interval (``REDIS_FLUSH_MS``; 0 is taken as 1 ms) the
loop looks at each tracked stream's frame log (two integers compared: no task and no
wake-up per stream) and sends, in ONE pipelined round trip (``transaction=False``), the
``append`` script call of every stream with new frames, and a ``PEXPIRE`` of the keys of
every stream idle for a third of ``RESUME_TTL_S``. Each reply advances its own stream's
cursor. So a replica pays Redis one round trip per interval whatever the number of
streams it runs, where one mirror task per stream paid one per stream. A round trip
carries at most ``REDIS_MIRROR_MAX_ENTRIES`` commands and about
``REDIS_MIRROR_MAX_BYTES`` of frames (a stream's own batch is never split: one larger
than that goes alone); what is left of an interval's work follows at once in more round
trips, so no stream's frames, its ``done`` least of all, wait for the next interval.

What each stream's buffer gets is what its own mirror task wrote before:

- one entry per write, id ``{last frame id}-0``, fields ``f`` (its first frame id), ``d``
  (the frames' bytes as sent) and ``e`` (``1`` on the entry holding ``done``);
- the first frames reach the client before any Redis work: the loop runs in a task step
  of its own, woken by its timer, and a frame's reader is woken (or its relay called)
  from the step that appended the frame, before;
- a stream that ends has its ``done`` in Redis within one interval (then it is let go);
- Redis unavailable: the stream goes on; its writes are retried every ``_RETRY_S``
  (the frame log still holds every frame, so the buffer catches up in one entry), and
  given up once the stream ended longer than ``RESUME_TTL_S`` ago (nobody could resume
  it any more). A write that timed out here but ran on Redis after all is not an error:
  sent again as it was, the ``append`` script answers an entry id it already holds as
  written; with more frames, the next entry repeats some, and readers skip the frames
  they hold (:meth:`.resume.RemoteStream.follow`);
- a stream another replica declared lost (``append`` answers 0) is let go;
- :meth:`Mirror.flush`, at shutdown after the streams ended, writes the last frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Final

from redis.exceptions import NoScriptError

from toolforge.log import get_logger
from toolforge.runtime.cluster.connection import Connection, RedisUnavailable
from toolforge.runtime.cluster.keys import frames_key, idem_key, meta_key
from toolforge.runtime.frame_log import FrameLog
from toolforge.runtime.session import StreamSession

__all__ = ["Mirror"]

log = get_logger("toolforge.runtime.cluster")

# A stream whose write failed is tried again this much later (Redis down or hung: one
# failing round trip every half second for all of them, not one per stream per interval).
_RETRY_S: Final = 0.5
# The shortest interval between two rounds: REDIS_FLUSH_MS 0 means "as soon as it can",
# and the loop looks at every stream each round.
_MIN_TICK_S: Final = 0.001
# What a command costs in a round trip's byte budget besides its frames (keys, args).
_COMMAND_BYTES: Final = 128


@dataclass(slots=True, eq=False)
class _Tracked:
    """One stream being mirrored."""

    session: StreamSession
    log: FrameLog
    keys: list[str]
    owner: str  # the API key name that started it ("" for none)
    touched: float  # when its keys' TTLs were last set (monotonic)
    cursor: int = 0  # the last frame id in Redis
    retry_at: float = 0.0  # after a failed write: not before this


@dataclass(slots=True, eq=False)
class _Write:
    """One stream's part of a round trip: an append (``end`` > 0) or a TTL refresh."""

    tracked: _Tracked
    end: int = 0  # the last frame id in this entry
    final: bool = False  # the entry holds done
    data: bytes = b""  # the frames' bytes


class Mirror:
    """This replica's mirror loop: :meth:`track` a stream once, its frames follow."""

    def __init__(
        self,
        conn: Connection,
        *,
        flush_s: float,
        ttl_ms: int,
        max_entries: int,
        max_bytes: int,
    ) -> None:
        self._conn = conn
        self._tick_s = max(_MIN_TICK_S, flush_s)
        self._ttl_ms = ttl_ms
        self._refresh_s = max(0.5, ttl_ms / 3000)
        self._max_entries = max(1, max_entries)
        self._max_bytes = max(1, max_bytes)
        self._streams: dict[str, _Tracked] = {}
        self._task: asyncio.Task[None] | None = None
        self.round_trips = 0  # pipelines Redis answered (tests, bench)
        self.appends = 0  # append calls among them

    @property
    def tracked(self) -> int:
        """Streams whose frames are not all in Redis yet."""
        return len(self._streams)

    def track(self, session: StreamSession, idempotency_key: str | None = None) -> None:
        """Mirror ``session``'s frames into its resume buffer until its ``done``."""
        keys = [frames_key(session.id), meta_key(session.id)]
        if idempotency_key is not None:
            keys.append(idem_key(idempotency_key))
        self._streams[session.id] = _Tracked(
            session, session.log, keys, session.plan.owner or "", time.monotonic()
        )
        if self._task is None or self._task.done():  # done: its event loop was closed
            self._task = asyncio.get_running_loop().create_task(self._run(), name="resume-mirror")

    async def flush(self, timeout_s: float) -> None:
        """After the streams ended: write their last frames now, round after round (for
        up to ``timeout_s``: Redis may be down), then stop."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # a round cut short is written again below, never twice
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._streams:
                    await self.write_round()
                    if self._streams:  # not ended, or waiting to retry: a moment
                        await asyncio.sleep(self._tick_s)
        self._streams.clear()

    async def _run(self) -> None:
        """A round every interval while anything is tracked; the task ends when nothing
        is (:meth:`track` starts another)."""
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                await self.write_round()
            except Exception:  # one loop mirrors every stream: a bug must not stop it
                log.exception("redis.mirror_failed")
                await asyncio.sleep(_RETRY_S)
            if not self._streams:
                self._task = None
                return

    async def write_round(self) -> None:
        """One round: every stream's new frames (and the idle streams' TTLs) in as few
        round trips as the caps allow, one when they fit."""
        now = time.monotonic()
        writes: list[_Write] = []
        size = 0
        down = False  # Redis did not answer this round: the rest waits with the others
        for tracked in list(self._streams.values()):
            frames = tracked.log
            last = frames.last_id
            if last == tracked.cursor:
                if frames.closed:  # every frame, done included, is in Redis
                    self._let_go(tracked)
                elif now - tracked.touched >= self._refresh_s and now >= tracked.retry_at:
                    writes.append(_Write(tracked))  # idle (a tool, a client): keep it alive
                    size += _COMMAND_BYTES
                continue
            if now < tracked.retry_at:
                continue
            batch, end = frames.take(tracked.cursor)
            if batch is None:
                continue
            writes.append(_Write(tracked, end, frames.closed and end == last, batch))
            size += len(batch) + _COMMAND_BYTES
            if not down and (len(writes) >= self._max_entries or size >= self._max_bytes):
                down = not await self._send(writes, now)
                writes, size = [], 0
        if down:
            self._failed(writes)
        elif writes:
            await self._send(writes, now)

    async def _send(self, writes: list[_Write], now: float, *, reloaded: bool = False) -> bool:
        """One round trip; each stream advances by its own reply. False: Redis did not
        answer (every stream in it is tried again after ``_RETRY_S``)."""
        conn = self._conn
        try:
            if reloaded:  # Redis restarted since the script was loaded
                script = conn.script("append").script
                await conn.call("the resume buffer", conn.redis.script_load(script))
            replies = await conn.call("the resume buffer", self._pipeline(writes).execute(False))
        except RedisUnavailable as exc:
            # The streams go on; their copies catch up once Redis is back.
            conn.warn("redis.mirror_behind", streams=len(writes), error=exc.message)
            self._failed(writes)
            return False
        self.round_trips += 1
        missing: list[_Write] = []  # NOSCRIPT: sent again at once, a done must not wait
        failed: list[_Write] = []
        at = 0
        for write in writes:
            tracked = write.tracked
            if not write.end:  # a TTL refresh: one reply per key, none of them needed
                at += len(tracked.keys)
                tracked.touched = now
                continue
            reply: Any = replies[at]
            at += 1
            self.appends += 1
            if isinstance(reply, NoScriptError) and not reloaded:
                missing.append(write)
            elif isinstance(reply, Exception):
                conn.warn("redis.mirror_refused", stream_id=tracked.session.id, error=str(reply))
                failed.append(write)
            elif not reply:  # another replica declared it lost (we were cut off too long)
                self._let_go(tracked)
            else:
                self._written(write, now)
        self._failed(failed)
        if missing:
            return await self._send(missing, now, reloaded=True)
        return True

    def _pipeline(self, writes: list[_Write]) -> Any:
        conn = self._conn
        sha = conn.script("append").sha
        pipe = conn.redis.pipeline(transaction=False)
        ttl_ms, replica = self._ttl_ms, conn.replica_id
        for write in writes:
            tracked = write.tracked
            keys = tracked.keys
            if not write.end:
                for key in keys:
                    pipe.pexpire(key, ttl_ms)
                continue
            # The append script's arguments (lua/append.lua): entry id, first frame id,
            # the frames, final, TTL, this replica, the API key name.
            args: list[Any] = [f"{write.end}-0", tracked.cursor + 1, write.data]
            args += [int(write.final), ttl_ms, replica, tracked.owner]
            # EVALSHA itself, not the script object: a pipeline that holds scripts asks
            # Redis whether it has them first, a second round trip every time.
            pipe.evalsha(sha, len(keys), *keys, *args)
        return pipe

    def _written(self, write: _Write, now: float) -> None:
        tracked = write.tracked
        tracked.cursor = write.end
        tracked.touched = now
        if write.final:
            self._let_go(tracked)

    def _failed(self, writes: list[_Write]) -> None:
        """Try these again after ``_RETRY_S``; a stream that ended longer than
        ``RESUME_TTL_S`` ago is given up (nobody could resume it any more)."""
        if not writes:
            return
        now = time.monotonic()
        for write in writes:
            tracked = write.tracked
            tracked.retry_at = now + _RETRY_S
            finished = tracked.session.finished_at
            if finished is not None and now - finished > self._ttl_ms / 1000:
                self._let_go(tracked)

    def _let_go(self, tracked: _Tracked) -> None:
        if self._streams.get(tracked.session.id) is tracked:
            del self._streams[tracked.session.id]
