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
from typing import Final

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.session import StreamSession

__all__ = ["Collector", "StreamRegistry"]


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
        self._open = 0  # streams started whose task has not ended
        self.collector = Collector(clock=clock)

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
            self._open -= 1
            self.collector.stream_ended(self._open)

        task = session.start()
        self._open += 1
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


class Collector:
    """When Python's cyclic garbage collector runs, while streams are served.

    The young generations: when a stream's task ends, the same policy as the automatic
    collector, so that most young passes happen between requests rather than in the
    middle of another request's time to first event.

    The oldest generation: a full pass walks every object alive, and with many streams
    open that is every open stream's session, engine and buffers: 13-127 ms with 1000
    paced streams open (8 passes in one 10 s load, bench.load's B5), every stream's next
    token late by as much, while those passes found 0-121 objects to free. A stream's
    objects are freed by their reference counts when it ends; what the cycle collector
    finds, the young passes find (about 50 objects per stream here). So once the app
    :meth:`takes over <take_over>`, the automatic collector never starts a full pass
    (its third threshold raised out of reach), and this class starts one when a stream
    ends and the collector would have been due (its usual count of young passes), at
    least ``quiet_every_s`` after the last, while at most ``quiet_open`` streams are
    open; or, however many are open, once ``longest_s`` have passed without one, so
    that cyclic garbage that reached the oldest generation is freed within that bound.
    """

    def __init__(
        self,
        *,
        quiet_open: int = 8,
        quiet_every_s: float = 60.0,
        longest_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet_open = quiet_open
        self.quiet_every_s = quiet_every_s
        self.longest_s = longest_s
        self._clock = clock
        self._last_full = clock()
        self._saved: tuple[int, int, int] | None = None  # the thresholds before take_over
        self.full_passes = 0  # started by this class

    def take_over(self) -> None:
        """Full passes are this class's from now on (the app's start-up, after
        ``gc.freeze()``); :meth:`give_back` restores the automatic collector's. Apps of
        one process (tests run several) share the collector: the first to take over
        keeps the thresholds, the last to give back restores them."""
        if self._saved is None:
            self._saved = _take_full_passes()
            self._last_full = self._clock()

    def give_back(self) -> None:
        if self._saved is not None:
            self._saved = None
            _give_full_passes()

    def full_due(self, open_streams: int, young_passes: int) -> bool:
        """Whether a stream's end, with ``open_streams`` still open and ``young_passes``
        middle-generation passes since the last full one, starts a full pass."""
        if self._saved is None or young_passes < self._saved[2]:
            return False
        since = self._clock() - self._last_full
        return since >= self.longest_s or (
            open_streams <= self.quiet_open and since >= self.quiet_every_s
        )

    def stream_ended(self, open_streams: int) -> None:
        _, count1, count2 = gc.get_count()
        threshold0, threshold1, _ = gc.get_threshold()
        if not threshold0:  # 0: automatic collection is off; leave it so
            return
        if self.full_due(open_streams, count2):
            gc.collect(2)
            self._last_full = self._clock()
            self.full_passes += 1
        else:
            gc.collect(1 if count1 + 1 >= threshold1 else 0)


_owners: list[tuple[int, int, int]] = []  # the thresholds before, once per owner


def _take_full_passes() -> tuple[int, int, int]:
    before = _owners[0] if _owners else gc.get_threshold()
    _owners.append(before)
    gc.set_threshold(before[0], before[1], _NEVER)
    return before


def _give_full_passes() -> None:
    before = _owners.pop()
    if not _owners:
        young0, young1, _ = gc.get_threshold()  # as the app may have left them
        gc.set_threshold(young0, young1, before[2])


# The third threshold while the Collector owns full passes: a count of middle-generation
# passes the automatic collector never reaches (the largest C int gc.set_threshold takes;
# at one pass per 7,000 allocations, 1.5 * 10^13 allocations).
_NEVER: Final = (1 << 31) - 1
