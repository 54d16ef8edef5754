"""Live and recent streams: lookup for resume and cancel, and idempotency records.

In memory, per process (the default of docs/deployment.md; a Redis-backed store is the multi-replica
option). A finished stream stays for ``resume_ttl_s`` so a client can resume it or replay
it by idempotency key; after that it is forgotten, and so is its key.

Idempotency (IETF draft-ietf-httpapi-idempotency-key-header, docs/tools.md):
same key + same body -> the stored stream, replayed with the same frames and ids;
same key while that stream still runs -> 409; same key + a different body -> 422.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.session import StreamSession

__all__ = ["StreamRegistry"]


@dataclass(frozen=True, slots=True)
class _IdempotencyRecord:
    body_hash: str
    stream_id: str


class StreamRegistry:
    """Owns every session's lifetime: started here, cancelled here at shutdown."""

    def __init__(
        self,
        *,
        resume_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = resume_ttl_s
        self._clock = clock
        self._sessions: dict[str, StreamSession] = {}
        # (stream, its idempotency key) in the order the streams ended
        self._ended: deque[tuple[StreamSession, str | None]] = deque()
        self._keys: dict[str, _IdempotencyRecord] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def active(self) -> int:
        return sum(1 for s in self._sessions.values() if s.running)

    def frames_buffered(self) -> int:
        """Frames appended but not yet written to their clients, over the running streams
        (the ``toolforge_frame_queue_depth`` gauge, read at scrape time)."""
        return sum(s.log.pending() for s in self._sessions.values() if s.running)

    def _expired(self, session: StreamSession, now: float) -> bool:
        return session.finished_at is not None and now - session.finished_at > self._ttl

    def find(self, stream_id: str) -> StreamSession | None:
        """The stream if this process runs it (or ran it within the TTL), else None."""
        self.sweep()
        session = self._sessions.get(stream_id)
        if session is None or self._expired(session, self._clock()):
            return None
        return session

    def get(self, stream_id: str) -> StreamSession:
        session = self.find(stream_id)
        if session is None:
            raise self.not_found(stream_id)
        return session

    def not_found(self, stream_id: str) -> RequestError:
        """No stream ``stream_id`` here, nor (the caller has asked) on another replica."""
        return RequestError(
            ErrorCode.NOT_FOUND,
            f"no stream {stream_id!r}: it never existed or ended more than "
            f"{self._ttl:.0f} s ago (RESUME_TTL_S)",
            http_status=404,
        )

    @staticmethod
    def key_reused() -> RequestError:
        """The same Idempotency-Key with another body."""
        return RequestError(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            "this Idempotency-Key was used with a different request body; "
            "use a new key for a new request",
            http_status=422,
        )

    @staticmethod
    def in_flight(stream_id: str) -> RequestError:
        """The same Idempotency-Key while its stream still runs."""
        return RequestError(
            ErrorCode.IDEMPOTENCY_IN_FLIGHT,
            f"the request with this Idempotency-Key is still streaming as "
            f"{stream_id!r}; resume it with GET /v1/streams/{stream_id}",
            http_status=409,
        )

    def replay_for(self, key: str, body_hash: str) -> StreamSession | None:
        """The stored stream for ``key``, or None if the key is new. 409 / 422 as above."""
        self.sweep()
        record = self._keys.get(key)
        if record is None:
            return None
        if record.body_hash != body_hash:
            raise self.key_reused()
        session = self._sessions.get(record.stream_id)
        if session is None or self._expired(session, self._clock()):
            return None  # the stored stream expired with its key: a new stream starts
        if session.running:
            raise self.in_flight(session.id)
        return session

    def start(
        self,
        session: StreamSession,
        *,
        idempotency_key: str | None = None,
        body_hash: str = "",
    ) -> asyncio.Task[None]:
        """Start ``session``'s task and keep it for resume (and its key): the task."""
        self.sweep()
        self._sessions[session.id] = session
        if idempotency_key is not None:
            self._keys[idempotency_key] = _IdempotencyRecord(body_hash, session.id)
        ended = (session, idempotency_key)

        def end(_: object) -> None:
            self._ended.append(ended)
            _collect_young()

        task = session.start()
        task.add_done_callback(end)
        return task

    def sweep(self) -> None:
        """Forget streams that ended more than the TTL ago (and their keys).

        Streams are looked at in the order they ended, so a sweep costs the expired ones
        only, never a pass over every stream kept; lookups check their own stream's expiry.
        """
        now = self._clock()
        ended = self._ended
        while ended:
            finished_at = ended[0][0].finished_at
            # None: a task cancelled before its first step (the loop closing) never ends
            # its stream; nothing can resume it either.
            if finished_at is not None and now - finished_at <= self._ttl:
                break
            session, key = ended.popleft()
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]
            if key is not None:
                record = self._keys.get(key)
                if record is not None and record.stream_id == session.id:
                    del self._keys[key]

    def cancel_all(self, reason: str) -> list[StreamSession]:
        """Cancel every running stream (each still ends with ``done``); returns them."""
        running = [s for s in self._sessions.values() if s.running]
        for session in running:
            session.cancel(reason)
        return running

    async def aclose(self) -> None:
        """Shutdown: cancel every running stream and wait until each has ended cleanly."""
        running = self.cancel_all("shutdown")
        if running:
            await asyncio.gather(*(s.wait() for s in running))


def _collect_young() -> None:
    """Collect the young generations now, as a stream ends, rather than wherever the
    allocation count next crosses the threshold: often in the middle of another
    request's time to first token. The same policy as the automatic collector."""
    _, count1, _ = gc.get_count()
    threshold0, threshold1, _ = gc.get_threshold()
    if threshold0:  # 0: automatic collection is off; leave it so
        gc.collect(1 if count1 + 1 >= threshold1 else 0)
