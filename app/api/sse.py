"""The SSE edge: a session's frame log written to one client, with pings and disconnects.

A plain ASGI response, written here rather than taken from sse-starlette, because this
is the gateway's hot path and it is small. sse-starlette's ``EventSourceResponse`` runs
every response in an anyio task group of four tasks (stream, ping, disconnect listener,
exit watcher) and wraps each send in a cancel scope: measured at 9-13 µs per event and
about 0.5 ms per request on this stack (bench/RESULTS.md). Here one response costs one extra task
(the disconnect watcher) and one timer (the ping); a batch costs one ``send``:

* frames come from :class:`~toolforge.runtime.frame_log.FrameLog` already encoded
  (``toolforge.core.protocol.frames``) and already coalesced: whatever was appended since the
  last write goes out in one ``send``, and a lone frame goes out at once, without waiting for
  company;
* the writer sleeps on the log, which wakes it for a new frame, for a ping that is due,
  and for a client that left, so no send is ever cancelled halfway;
* ``send`` returns once uvicorn has the bytes; while the client reads slowly it blocks
  (uvicorn's flow control), the primary cursor stays put, and the session stops reading
  the upstream (docs/protocol.md backpressure);
* the relay (``STREAM_RELAY``, on by default): once the primary response has written
  everything, it lends the log a relay (:meth:`FrameLog.wait_relaying`), and new frames are
  sent by a callback at the end of the producer's step, without waking this task (a
  callback instead of a task step per paced token; measured in bench/RESULTS.md, paced
  tokens).
  ``send`` is driven there as a plain call: the server's ``send`` finishes without
  waiting unless its client is slow, and then the relay hands the unfinished ``send`` to
  this task, which finishes it (the same bytes, once) before it writes anything else, the
  primary cursor staying put until then. Pings, a client that left, the stream's last
  frame and its end are this task's, as before.

Server shutdown is the session registry's business (``toolforge serve`` cancels every
stream, so each ends with ``done``; see :mod:`toolforge.api.serve`), not the writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Generator, Mapping
from typing import Any, Final

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from toolforge.core.protocol.frames import PING_BYTES
from toolforge.errors import ToolForgeError
from toolforge.runtime.cluster import RemoteStream
from toolforge.runtime.frame_log import FrameLog
from toolforge.runtime.session import StreamSession

__all__ = ["FrameStreamResponse", "RemoteStreamResponse"]


_HEADERS: Final = (
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),  # nginx: do not buffer the stream
)
_CONTENT_TYPE: Final = (b"content-type", b"text/event-stream; charset=utf-8")

# How long the primary response's head and ``stream.begin`` wait for the stream's first
# frame after it. An upstream that answers within this goes out in one burst: the head,
# then ``stream.begin`` and that frame in one write. Written as soon as the upstream
# request is out, the head and ``stream.begin`` each woke the client while the upstream
# was answering, and on a machine with few cores those wake-ups (the client's, ours)
# ran in the upstream's place: measured 0.2-0.3 ms of time to first event (bench B1,
# docs/performance.md). A slower upstream gets its head this much later, which no SSE
# client notices; a client that leaves meanwhile is noticed at once.
HEAD_HOLD_S: Final = 0.005


class FrameStreamResponse(Response):
    """Write ``session``'s frames after id ``after`` to the client, then follow it live.

    The *primary* response (the one that started the stream) throttles the producer and,
    when it ends for any reason (the stream finished, the client left before or after
    the headers, the server shuts down), tells the session, which applies the request's
    ``on_disconnect``: by default it waits ``DISCONNECT_GRACE_MS`` for a resume before it
    cancels the upstream. Any other response (a resume, a replay) tells the session it
    joined: one that comes while the stream waits for its client becomes the primary
    response in the client's place.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        session: StreamSession,
        *,
        after: int = 0,
        primary: bool = False,
        ping_interval_s: float = 15.0,
        headers: Mapping[str, str] | None = None,
        encoder: Callable[[bytes], bytes] | None = None,
        ping: bytes = PING_BYTES,
    ) -> None:
        """``encoder``: writes each batch of encoded frames in another dialect (the
        OpenAI-compatible proxy's chunks), ``ping`` its keep-alive."""
        self._session = session
        self._encoder = encoder
        self._ping = ping
        self._after = after
        self._primary = primary
        self._ping_interval_s = ping_interval_s
        self.status_code = 200
        self.background = None
        # Built here rather than by Starlette's init_headers: the same for every stream
        # but one, and shared, not a dozen new objects per open stream (bench B4).
        self.raw_headers = _raw_headers(session.id, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self._session
        if not self._primary:
            self._primary = session.reader_joined(self._after)
            if not self._primary:
                try:
                    await self._write(receive, send)
                finally:
                    session.reader_left()
                return
        try:
            await self._write(receive, send)
        finally:
            session.client_left()

    async def _write(self, receive: Receive, send: Send) -> None:
        log = self._session.log
        primary = self._primary
        loop = asyncio.get_running_loop()
        gone = False
        ping_due = False
        ping: asyncio.TimerHandle | None = None

        def client_left(_: object) -> None:
            nonlocal gone
            gone = True
            log.wake()

        def ping_now() -> None:
            nonlocal ping_due, ping
            ping_due = True
            ping = loop.call_later(self._ping_interval_s, ping_now)
            log.wake()

        watcher = loop.create_task(_until_disconnect(receive))
        watcher.add_done_callback(client_left)
        # The relay's state: a send it could not finish (the client is slow), and a
        # failure of send it met; this task takes both over when it wakes.
        unfinished: tuple[Generator[Any, None, None], object, int, int] | None = None
        failure: BaseException | None = None
        try:
            if primary:
                await _hold_head(log, lambda: gone)
                if gone:
                    return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            ping = loop.call_later(self._ping_interval_s, ping_now)
            cursor = max(0, min(self._after, log.last_id))
            encoder = self._encoder

            def relay(batch: bytes, seq: int) -> bool:
                nonlocal cursor, unfinished, failure
                if gone or ping_due:
                    return False
                try:
                    body = batch if encoder is None else encoder(batch)
                    if body:
                        message = {"type": "http.response.body", "body": body, "more_body": True}
                        sending = send(message).__await__()
                        try:
                            waits_on = sending.send(None)
                        except StopIteration:
                            pass
                        else:  # flow control: the rest of this send is the task's
                            unfinished = (sending, waits_on, seq, len(batch))
                            return False
                except BaseException as exc:  # the task raises it, where it would have
                    failure = exc
                    return False
                cursor = seq
                log.written(seq, len(batch), primary=True)
                return True

            while not gone:
                if unfinished is not None:
                    sending, waits_on, seq, size = unfinished
                    unfinished = None
                    await _finish_send(sending, waits_on)
                    cursor = seq
                    log.written(seq, size, primary=True)
                    continue
                if failure is not None:
                    raise failure
                batch, end = log.take(cursor)
                if batch is not None:
                    # The last batch ends the body in the same write (and syscall).
                    last = log.closed and end == log.last_id
                    body = batch if encoder is None else encoder(batch)
                    if body or last:
                        await send(
                            {"type": "http.response.body", "body": body, "more_body": not last}
                        )
                    cursor = end
                    log.written(cursor, len(batch), primary=primary)
                    if last:
                        return
                elif log.closed:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                elif ping_due:
                    ping_due = False
                    # No id: pings are not frames, so they never move Last-Event-ID.
                    await send(
                        {"type": "http.response.body", "body": self._ping, "more_body": True}
                    )
                elif primary:
                    await log.wait_relaying(relay)
                else:
                    await log.wait()
        except OSError:  # the socket went away under a send (servers other than uvicorn)
            return
        finally:
            if unfinished is not None:  # the client left during a send the relay began
                unfinished[0].close()
            if ping is not None:
                ping.cancel()
            watcher.remove_done_callback(client_left)
            watcher.cancel()  # parked in receive(); ends at the loop's next turn


def _raw_headers(stream_id: str, extra: Mapping[str, str] | None) -> list[tuple[bytes, bytes]]:
    return [
        *_HEADERS,
        (b"x-stream-id", stream_id.encode("latin-1")),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()),
        _CONTENT_TYPE,
    ]


async def _finish_send(sending: Generator[Any, None, None], waits_on: object) -> None:
    """Finish a ``send`` the relay started (``sending``: its ``__await__`` iterator) and
    that waits on ``waits_on`` (what it yielded: an asyncio future, or None for a bare
    yield), as a task would have."""
    try:
        while True:
            if waits_on is None:
                await asyncio.sleep(0)
            else:
                # Yielded to no task yet: still marked as blocking, which a task resets
                # when it takes a future (asyncio refuses to await it again otherwise).
                waits_on._asyncio_future_blocking = False  # type: ignore[attr-defined]
                await waits_on  # type: ignore[misc]  # an asyncio future
            waits_on = sending.send(None)
    except StopIteration:
        return
    finally:
        sending.close()  # a no-op once finished; a cancel here ends the send too


async def _hold_head(log: FrameLog, gone: Callable[[], bool]) -> None:
    """Until the stream's first frame after ``stream.begin``, its end, or the client
    leaving; ``HEAD_HOLD_S`` at most."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(HEAD_HOLD_S):
            while log.last_id < 2 and not (log.closed or gone()):
                await log.wait()


async def _until_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body was read by the route)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a server that raises instead of sending http.disconnect: gone too
        return


class RemoteStreamResponse(Response):
    """A stream another replica runs (or ran), written from its resume buffer in Redis
    (``toolforge.runtime.cluster.RemoteStream``): the same bytes the owner sent, after id
    ``after``, then live until ``done``. Never the primary response: it cannot throttle a
    producer in another process."""

    media_type = "text/event-stream"

    def __init__(
        self,
        stream: RemoteStream,
        *,
        after: int = 0,
        ping_interval_s: float = 15.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._stream = stream
        self._after = after
        self._ping_interval_s = ping_interval_s
        self.status_code = 200
        self.background = None
        self.raw_headers = _raw_headers(stream.id, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write(send))
        watcher = loop.create_task(_until_disconnect(receive))
        try:
            await asyncio.wait((writer, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, watcher):
                task.cancel()
            await asyncio.gather(writer, watcher, return_exceptions=True)
        if writer.done() and not writer.cancelled() and writer.exception() is not None:
            raise writer.exception()  # type: ignore[misc]

    async def _write(self, send: Send) -> None:
        frames = self._stream.follow(self._after)
        loop = asyncio.get_running_loop()
        try:
            try:
                # The first read before the head: a Redis that fails now is a 503 body,
                # not a 200 that ends at once.
                first = await anext(frames)
            except ToolForgeError as exc:
                body = orjson.dumps({"error": exc.to_dict()})
                await send(
                    {
                        "type": "http.response.start",
                        "status": exc.http_status,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            except StopAsyncIteration:
                first = b""
                frames = _empty()
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            next_ping = loop.time() + self._ping_interval_s
            batch: bytes | None = first
            while batch is not None:
                if batch:
                    await send({"type": "http.response.body", "body": batch, "more_body": True})
                    next_ping = loop.time() + self._ping_interval_s
                elif loop.time() >= next_ping:
                    ping = {"type": "http.response.body", "body": PING_BYTES, "more_body": True}
                    await send(ping)
                    next_ping = loop.time() + self._ping_interval_s
                try:
                    batch = await anext(frames)
                except StopAsyncIteration:
                    batch = None
                except ToolForgeError:
                    # Redis went away mid-stream: end the body without done, so the
                    # client resumes (and hears 503 until Redis is back).
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return
        finally:
            await frames.aclose()  # type: ignore[attr-defined]


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator with nothing in it
