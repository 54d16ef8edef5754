"""One HTTP/1.1 client connection, on an asyncio protocol and llhttp (``httptools``), and
the response body read from it: what :class:`toolforge.upstream.transport.LeanTransport` pools.

A :class:`Connection` is the protocol object of one socket. llhttp's callbacks fill in the
current response (status, headers, body chunks); its reader, the transport while it waits
for the head and then :class:`Body`, sleeps on one future and is woken by new bytes, EOF
or an error. :class:`Body` yields everything received since its previous item as one
``bytes``, so a fast upstream costs one Python step per socket read, and pauses reading
above :data:`HIGH_WATER` unread bytes. When the response ends (or breaks), the connection
goes back to its :class:`Pool`: released for reuse, or discarded.

A body's reader may also attach a :class:`Sink` (:meth:`Body.attach`): then each read's
body bytes go to it inside ``data_received``, with no task woken, until it detaches
itself or the response ends or breaks (then :meth:`Sink.news`, and the reader goes on
with :class:`Body`). What a paced token costs is then one callback, not a task step.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol, TypeAlias

import httptools
import httpx

__all__ = [
    "HIGH_WATER",
    "PARSE_ERRORS",
    "Body",
    "Connection",
    "Key",
    "Pool",
    "Sink",
    "read_error",
    "request_head",
]

HIGH_WATER: Final = 64 * 1024
"""Unread body bytes above which the socket is no longer read, so that TCP throttles the
upstream while our consumer is slow. A read is up to 256 KiB (asyncio's and uvloop's read
size), so the buffer peaks at about this plus one read."""

Key: TypeAlias = tuple[str, str, int]  # (scheme, host, port): one pool per origin
PARSE_ERRORS: Final = (httptools.HttpParserError, httptools.HttpParserUpgrade)


class Pool(Protocol):
    """Where a connection goes when its response is over."""

    def release(self, conn: Connection) -> None:
        """The response was read to its end: keep the connection for the next request if
        it may be kept alive, else close it."""

    def discard(self, conn: Connection) -> None:
        """Close the connection and give its slot back."""


class Sink(Protocol):
    """Takes a response body's bytes inside the connection's read callback
    (:meth:`Body.attach`)."""

    def data(self, data: bytes) -> None:
        """The body bytes of one socket read, taken off the connection (the sink may
        detach itself here)."""

    def news(self) -> None:
        """The response ended or broke, or the socket did: the sink is detached already,
        and the body's reader reads what is left through :class:`Body`."""


class _MessageAfterEnd(Exception):
    """Raised in a parser callback: the server sent more after a complete response."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Connection(asyncio.Protocol):
    """One connection. llhttp's callbacks fill in the current response; its reader (the
    transport while it waits for the head, then :class:`Body`) sleeps on ``waiter``."""

    transport: asyncio.Transport  # set by connection_made, before anyone else sees us

    def __init__(self, owner: Pool, key: Key) -> None:
        self.owner = owner
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False  # the socket is gone (EOF, reset, or closed by us)
        self.error: BaseException | None = None  # a reset or a parse error; None: clean EOF
        self.closed = False  # closed by the owner, its pool slot given back
        self.in_pool = False
        self.spare = False  # opened ahead of need (LeanTransport preconnect), not used yet
        self.idle_since = 0.0
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.write_paused = self.read_paused = False
        self.reset()

    def reset(self) -> None:
        """Forget the last response, before the next one."""
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = self.complete = self.keep_alive = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.sink: Sink | None = None
        if self.read_paused:
            self.resume_reading()

    def write(self, data: bytes) -> None:
        if not self.lost:  # uvloop raises on a closed transport; asyncio would ignore it
            self.transport.write(data)

    def resume_reading(self) -> None:
        self.read_paused = False
        self.transport.resume_reading()

    async def wait(self, seconds: float | None) -> None:
        """Sleep until the parser or the socket has news; ``TimeoutError`` after ``seconds``."""
        waiter = self.waiter = self.loop.create_future()
        if seconds is None:
            await waiter
            return
        # A bare timer, not asyncio.timeout: this runs once per read.
        timer = self.loop.call_later(seconds, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    async def drain(self, seconds: float | None) -> None:
        """Wait until the kernel takes our writes again (after ``pause_writing``)."""
        async with asyncio.timeout(seconds):
            while self.write_paused and not self.lost:
                self.drained = self.loop.create_future()
                await self.drained

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's: not subclasses

    def data_received(self, data: bytes) -> None:
        if self.in_pool:  # an idle connection must be silent: do not trust it again
            self.owner.discard(self)
            return
        if self.error is not None:
            return
        try:
            self.parser.feed_data(data)
        except PARSE_ERRORS as exc:
            if self.complete:  # bytes after the end: the response is fine, the connection not
                self.keep_alive = False
            else:
                self.error = exc
        sink = self.sink
        if sink is not None:
            chunks = self.chunks
            if chunks:  # in order: the bytes, then any end or error that came with them
                self.chunks = []
                self.buffered = 0
                sink.data(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            if self.sink is sink and (self.complete or self.error is not None):
                self.sink = None
                sink.news()
        if self.buffered > HIGH_WATER and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None:
            self.error = self.error or exc
        elif self.head_done and not self.complete and not self._framed():
            self.complete = True  # a close-delimited body ends at EOF (RFC 9112 §6.3 item 8)
        self._wake()
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.news()
        self.resume_writing()
        if self.in_pool:
            self.owner.discard(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _framed(self) -> bool:
        framing = (b"content-length", b"transfer-encoding")
        return any(name.lower() in framing for name, _ in self.headers)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise _MessageAfterEnd  # surfaces as a parse error in data_received

    def on_status(self, status: bytes) -> None:
        self.reason += status  # llhttp may deliver a span in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # interim (100 Continue, 103 Early Hints): skipped; llhttp
            self.reason, self.headers = b"", []  # stops after a 101, and read_error says so
        else:
            self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.head_done:  # not the end of an interim response
            self.complete = True
            # Asked now: llhttp clears the flags behind the answer right after this callback.
            self.keep_alive = self.parser.should_keep_alive()


def read_error(conn: Connection, request: httpx.Request | None) -> httpx.TransportError:
    """The httpx exception for a connection that ended (or broke) before the response did."""
    error = conn.error
    if conn.status == 101:  # we never ask for an upgrade (such requests go to the fallback)
        return httpx.RemoteProtocolError("unexpected 101 Switching Protocols", request=request)
    if isinstance(error, PARSE_ERRORS):
        return httpx.RemoteProtocolError(f"malformed response: {error}", request=request)
    if error is not None:  # a reset, or a TLS failure mid-stream
        return httpx.ReadError(str(error) or type(error).__name__, request=request)
    if not conn.head_done:  # httpcore's words, so that logs read the same
        message = "Server disconnected without sending a response."
    else:
        message = "peer closed connection without sending complete message body"
    return httpx.RemoteProtocolError(message, request=request)


class Body(httpx.AsyncByteStream):
    """The response body: each item is everything received since the previous one."""

    def __init__(
        self, conn: Connection, request: httpx.Request | None, timeout: float | None
    ) -> None:
        self._conn: Connection | None = conn
        self._request = request
        self._timeout = timeout

    def __aiter__(self) -> Body:
        return self

    @property
    def received(self) -> bool:
        """The whole body is in: reading what is left never waits."""
        conn = self._conn
        return conn is None or conn.complete

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        if not conn.chunks:
            timeout = self._timeout
            try:
                while not conn.chunks and not conn.complete:
                    if conn.lost or conn.error is not None:
                        raise read_error(conn, self._request)
                    if timeout is None:  # the adapters' case (their own deadlines): one
                        # frame less per read than conn.wait, which every token pays
                        waiter = conn.waiter = conn.loop.create_future()
                        await waiter
                    else:
                        await conn.wait(timeout)
            except TimeoutError:
                self._drop()
                raise httpx.ReadTimeout("read timed out", request=self._request) from None
            except BaseException:  # an error or a cancel: the connection is unusable
                self._drop()
                raise
            if not conn.chunks:
                self._conn = None
                conn.owner.release(conn)
                raise StopAsyncIteration
        chunks = conn.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        conn.chunks = []
        conn.buffered = 0
        if conn.read_paused:
            conn.resume_reading()
        return data

    def attach(self, sink: Sink) -> bool:
        """From now on, hand each read's body bytes to ``sink`` inside the connection's
        read callback instead of keeping them for this iterator, until it detaches
        (:meth:`detach`) or :meth:`Sink.news`. False, and nothing attached, when this
        iterator has something to read already (bytes, an end, an error)."""
        conn = self._conn
        if (
            conn is None
            or conn.chunks
            or conn.complete
            or conn.lost
            or conn.error is not None
            or conn.sink is not None
        ):
            return False
        conn.sink = sink
        return True

    def detach(self) -> None:
        """The sink takes no more: reads are kept for this iterator again."""
        conn = self._conn
        if conn is not None:
            conn.sink = None

    async def aclose(self) -> None:
        # No await in here: a cancel arriving now must not leave the connection counted.
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.sink = None
        if conn.complete:  # received in full: reusable even if unread
            conn.owner.release(conn)
        else:  # closed early: closed, not drained (the caller drains if it wants)
            conn.owner.discard(conn)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.sink = None
            conn.owner.discard(conn)


def request_head(request: httpx.Request) -> bytes:
    raw = request.headers.raw
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), request.url.raw_path)]
    lines += [b"%s: %s\r\n" % pair for pair in raw]
    lines.append(b"\r\n")
    head = b"".join(lines)
    # h11 refuses CR or LF inside a header (request smuggling); two C-level counts check it.
    if head.count(b"\n") != len(raw) + 2 or head.count(b"\r") != len(raw) + 2:
        raise httpx.LocalProtocolError("illegal character in request head", request=request)
    return head
