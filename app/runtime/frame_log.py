"""The frame log: the backpressure queue, the replay buffer and the artifact source at once.

Every frame of a stream is encoded once (``toolforge.core.protocol.frames``) and appended here.
Readers follow the log with a cursor:

- the *primary* reader is the client that started the stream. The log is the bounded
  queue of docs/protocol.md between the upstream reader and that client's SSE writer: once
  ``max_pending`` frames are appended but not yet written to it, ``wait_for_room`` blocks
  the producer, which therefore stops reading the upstream, and TCP throttles the model
  server. It resumes as soon as the writer catches up.
- a *resuming* reader (``GET /v1/streams/{id}`` with ``Last-Event-ID``) or an idempotent
  replay starts after any id, gets every frame it missed, then follows live frames. It
  never throttles the producer: only the client that asked for the stream does.

A reader takes everything already appended in one batch and writes it at once: frames
that are buffered are coalesced into one write, and a lone frame is written immediately,
without waiting for company.

**The relay.** While the primary reader has written everything and waits for more, it
may lend the log a *relay* (:meth:`FrameLog.wait_relaying`): a plain function that writes
encoded frames to its client at once. Then the frames :meth:`FrameLog.append` stores are
handed to the relay by one callback at the end of the producer's step (``call_soon``:
every frame of one upstream read still goes out in one write), and the reader's task is
not woken at all: a paced token costs the producer's task step and a callback, not two
task steps. A producer appending from a read callback of its own (the session's
``deliver``, see :mod:`toolforge.runtime.session`) brackets a read's frames with
:meth:`FrameLog.hold` and :meth:`FrameLog.flush`: they go to the relay at the end of the
read, in one write, without the callback. The relay is used only in the common case —
the primary reader caught up, the frame not the stream's last — and gives the reader
back its queue the moment anything else is needed: frames it declines (its client is
slow, gone, or a ping is due), the ``done`` frame, :meth:`FrameLog.close`,
:meth:`FrameLog.wake`, the primary reader leaving, or :meth:`FrameLog.unrelay`. The
bytes a client receives are the same either way: the same encoded frames, in the same
order, each written once.

Why one structure rather than an ``asyncio.Queue`` plus a replay list: the two would hold
the same frames twice and could disagree about ids; here an id is an index. Only the
encoded bytes are kept, back to back in one buffer with an offset per frame: a few dozen
bytes a token, not a frame object (and its dict), nor a ``bytes`` object (33 bytes of header
and a list slot) per frame. :attr:`FrameLog.frames` decodes them again for the artifacts
and for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import orjson

from toolforge.core.protocol.frames import Frame, decode, encode_frame
from toolforge.core.protocol.sse_blocks import event_data

__all__ = ["FrameLog", "Relay", "decode_events", "decode_frames"]

Relay = Callable[[bytes, int], bool]
"""Writes a batch of encoded frames (their bytes, the last one's id) to the primary
reader's client now, and reports it with :meth:`FrameLog.written`; returns False to be
woken instead (it then wrote nothing, or handed the bytes on in a way its reader finishes
itself)."""


class FrameLog:
    """Append-only, numbered, encoded frames of one stream, with waiting readers."""

    def __init__(
        self,
        *,
        max_pending: int,
        clock: Callable[[], float] = time.monotonic,
        relay: bool = True,
    ) -> None:
        """``relay``: whether a primary reader may write frames from :meth:`append`
        (``STREAM_RELAY``); off, every frame wakes the reader's task."""
        self._buffer = bytearray()  # every frame's bytes, back to back
        self._ends = array("I")  # where frame i (id i + 1) ends in the buffer
        self.event_counts: dict[str, int] = {}
        self._max_pending = max_pending
        self._clock = clock
        self._closed = False
        # Futures of the readers waiting for frames (or the close), and of the producer
        # waiting for the primary reader to advance. One future per waiter, not an
        # asyncio.Event: an Event carries a deque of about 600 bytes, per open stream.
        self._readers: list[asyncio.Future[None]] = []
        self._producer: asyncio.Future[None] | None = None
        self._primary_cursor: int | None = None  # None: no primary reader attached
        self.relay_allowed = relay
        # The primary reader's relay while it waits caught up (wait_relaying), and the
        # future it sleeps on meanwhile: woken only when the relay gives the reader back.
        self._relay: Relay | None = None
        self._relay_waiter: asyncio.Future[None] | None = None
        self._relay_due: asyncio.Handle | None = None  # the callback that hands frames over
        self._held = False  # hold(): frames wait for flush(), not for a callback
        self._held_due = False  # held frames are waiting for the relay
        self.relayed = 0  # frames the relay wrote (tests, bench)
        self.high_water = 0  # the most frames ever waiting for the primary reader
        self.paused_s = 0.0  # total time the producer waited for room
        self.bytes_written = 0

    # -- producer side -----------------------------------------------------------------

    @property
    def last_id(self) -> int:
        return len(self._ends)

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Frames appended but not yet written to the primary reader."""
        cursor = self._primary_cursor
        return 0 if cursor is None else len(self._ends) - cursor

    async def wait_for_room(self) -> None:
        """Block while the primary reader has ``max_pending`` frames left to write."""
        if self.pending() < self._max_pending:
            return
        started = self._clock()
        try:
            while self.pending() >= self._max_pending:
                self._producer = asyncio.get_running_loop().create_future()
                await self._producer
        finally:
            self.paused_s += self._clock() - started

    def append(self, frame: Frame) -> int:
        """Number, encode and store ``frame``; wake readers. Returns its id."""
        if self._closed:
            raise RuntimeError("append() after close(): a stream has exactly one end")
        seq = len(self._ends) + 1
        data = encode_frame(seq, frame)
        self._buffer += data
        self._ends.append(len(self._buffer))
        event = frame.event
        counts = self.event_counts
        counts[event] = counts.get(event, 0) + 1
        if self._relay is not None:
            # The primary reader waits caught up. ``done`` is left to it: it ends the body
            # in the same write as the frames before it.
            if event == "done":
                self.unrelay()
            elif self._held:
                self._held_due = True
            elif self._relay_due is None:
                self._relay_due = asyncio.get_running_loop().call_soon(self._hand_over)
        pending = self.pending()
        if pending > self.high_water:
            self.high_water = pending
        self._wake_readers()
        return seq

    def hold(self) -> None:
        """Until :meth:`flush`, frames appended wait for it rather than for a callback
        to reach the relay: the producer appends a whole socket read's frames from the
        read callback itself, and hands them over at its end in one write."""
        self._held = True

    def flush(self) -> None:
        """End :meth:`hold`: what it held goes to the relay now."""
        self._held = False
        if self._held_due:
            self._held_due = False
            self._hand_over()

    def close(self) -> None:
        """No more frames: readers return once they have written everything."""
        self._closed = True
        self.unrelay()
        self._wake_readers()

    def _wake_readers(self) -> None:
        readers = self._readers
        if readers:
            self._readers = []
            for waiter in readers:
                if not waiter.done():
                    waiter.set_result(None)

    # -- reader side -------------------------------------------------------------------

    def attach_primary(self) -> None:
        self._primary_cursor = 0

    def detach_primary(self) -> None:
        """The primary reader left: it no longer throttles the producer."""
        self._primary_cursor = None
        self.unrelay()
        self._wake_producer()

    def _wake_producer(self) -> None:
        producer = self._producer
        if producer is not None:
            self._producer = None
            if not producer.done():
                producer.set_result(None)

    def _start(self, frame_index: int) -> int:
        return self._ends[frame_index - 1] if frame_index else 0

    def encoded(self) -> bytes:
        """Every frame's block so far, back to back (one copy of the buffer)."""
        return bytes(self._buffer)

    def encoded_after(self, after: int) -> list[bytes]:
        """The encoded frames after id ``after``, one ``bytes`` each."""
        ends, buffer = self._ends, self._buffer
        start = self._start(after) if after < len(ends) else 0
        out = []
        for end in ends[after:]:
            out.append(bytes(buffer[start:end]))
            start = end
        return out

    @property
    def frames(self) -> list[Frame]:
        """Every frame so far, decoded again from its bytes (tests)."""
        return list(decode_frames(self.encoded_after(0)))

    def take(self, cursor: int) -> tuple[bytes | None, int]:
        """Everything after id ``cursor`` as one coalesced batch (``None``: nothing new),
        and the cursor after it."""
        end = len(self._ends)
        if cursor >= end:
            return None, cursor
        with memoryview(self._buffer) as view:  # one copy, and the buffer may grow again
            return bytes(view[self._start(cursor) : self._ends[end - 1]]), end

    def written(self, cursor: int, size: int, *, primary: bool) -> None:
        """A reader handed ``size`` bytes up to id ``cursor`` to the server; the primary
        reader's progress makes room for the producer."""
        self.bytes_written += size
        if primary and self._primary_cursor is not None:
            self._primary_cursor = cursor
            self._wake_producer()

    async def wait(self) -> None:
        """Until a frame is appended, the log closes, or :meth:`wake` is called."""
        waiter = asyncio.get_running_loop().create_future()
        self._readers.append(waiter)
        try:
            await waiter
        finally:
            if waiter.cancelled():  # the reader gave up: no longer waiting
                with contextlib.suppress(ValueError):
                    self._readers.remove(waiter)

    def wake(self) -> None:
        """Wake every waiting reader (a ping is due, a client left): each checks why."""
        self.unrelay()
        self._wake_readers()

    async def wait_relaying(self, relay: Relay) -> None:
        """Like :meth:`wait`, for the primary reader once it has written everything:
        meanwhile ``relay`` writes each new frame from :meth:`append`. Returns when the
        relay gives the reader back its queue (see the module's docstring); without a
        primary reader caught up, or with the relay off (``STREAM_RELAY``), this is
        :meth:`wait`."""
        if (
            not self.relay_allowed
            or self._closed
            or self._relay is not None
            or self._primary_cursor != len(self._ends)
        ):
            await self.wait()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._relay, self._relay_waiter = relay, waiter
        try:
            await waiter
        finally:
            if self._relay_waiter is waiter:  # a cancel: no relay without its reader
                self._relay = self._relay_waiter = None

    def _hand_over(self) -> None:
        """The relay's callback: everything the primary reader has not written, at once."""
        self._relay_due = None
        relay, cursor = self._relay, self._primary_cursor
        if relay is None or cursor is None:
            return
        batch, end = self.take(cursor)
        if batch is None:
            return
        if relay(batch, end):
            self.relayed += end - cursor
        else:
            self.unrelay()

    @property
    def relaying(self) -> bool:
        """A relay writes the next frame (the primary reader waits caught up)."""
        return self._relay is not None

    def unrelay(self) -> None:
        """Give the primary reader back its queue: the next frame wakes its task. The hook
        for anything that needs the queued path from now on (it is also taken on its own
        by the cases the module's docstring lists)."""
        due = self._relay_due
        if due is not None:
            self._relay_due = None
            due.cancel()
        waiter = self._relay_waiter
        if waiter is not None:
            self._relay = self._relay_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def follow(self, after: int = 0, *, primary: bool = False) -> AsyncIterator[bytes]:
        """Yield the frames after id ``after`` in coalesced batches until the log closes.

        The caller writes each batch before asking for the next, so a primary reader's
        cursor only advances once its bytes have been handed to the server.
        """
        cursor = max(0, min(after, len(self._ends)))
        while True:
            batch, end = self.take(cursor)
            if batch is not None:
                yield batch
                cursor = end
                self.written(cursor, len(batch), primary=primary)
                continue
            if self._closed:
                return
            await self.wait()


def decode_events(encoded: Iterable[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each frame's event name and JSON object, as sent (``encode_frame``'s output read
    back): what the artifacts record."""
    for raw in encoded:
        event, data = event_data(raw)
        yield event.decode(), orjson.loads(data)


def decode_frames(encoded: Iterable[bytes]) -> Iterator[Frame]:
    """The typed frames back from their wire form, each validated as it is decoded."""
    for event, data in decode_events(encoded):
        yield decode(event, data)
