"""The HTTP server's own limits: what a connection may cost before any route runs.

Anyone who can open a TCP connection reaches the server, key or no key, so the limits
that protect the process sit in the protocol that reads the bytes (docs/security.md, "The
server defends itself"):

==========================  =====================================================
``HEADER_TIMEOUT_S``        a request's head (request line and headers) must be
                            complete this long after the connection opens, or
                            after its first byte on a kept-alive connection:
                            slowloris connections are closed
``MAX_HEADER_BYTES``        a larger head is answered 431 and the connection closed
``MAX_HEADERS``             more header lines: 431
``BODY_TIMEOUT_S``          a body must arrive whole this long after its head
``MAX_CONNECTIONS``         connections over this are answered 503 at once
``KEEPALIVE_TIMEOUT_S``     an idle kept-alive connection is closed after this
``KEEPALIVE_MAX_REQUESTS``  the response to the last request a connection may make
                            says ``Connection: close``
==========================  =====================================================

**Why hand-written.** uvicorn reads HTTP/1.1 with httptools (llhttp) and sets none of
these: llhttp has no header size limit (Node enforces its own on top of it), httptools
accumulates a header's name and value until the line ends (a 32 MB header is 32 MB of
memory before any callback runs), uvicorn arms no timer until a first response is sent
(a connection that never finishes its head is held forever), and its
``limit_concurrency`` only answers 503 *after* reading a head, which is exactly what a
slowloris never finishes. ``h11`` has a head limit (``h11_max_incomplete_event_size``)
but no timeouts either, and costs several times httptools' parse time on the hot path.
:class:`LimitedHttpToolsProtocol` is uvicorn's httptools protocol with a guard in front
of the parser: bytes are counted before they are fed to it (so memory is bounded by the
limit, not by what the client sends), header lines are counted in the parser's
callback, and three timers (head, body, idle) close what stalls. Everything else is
uvicorn's own code path; :class:`toolforge.api.serve.GatewayServer` installs it, so
``toolforge serve``, the Docker image's command and the test harness all get it.

**The head leaves with the body.** uvicorn writes a response's head to the socket the
moment the app sends ``http.response.start``, and its body in a write of its own: two
system calls, and on loopback the first wakes the client (which may then take the CPU
from the server) to read a head it can do nothing with yet. Each request's first write
(its head, or a ``100 Continue``) is held until the next write, or until the end of the
event loop's turn (a head whose body is not ready yet leaves then), and the two go out
in one write. A close or an EOF sends what is held first. Measured in
bench/RESULTS.md ("The head and the first body in one write").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from toolforge.errors import ErrorCode, RequestError
from toolforge.settings import Settings

__all__ = ["LimitedHttpToolsProtocol", "ServerLimits"]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The server's limits (defaults: :class:`toolforge.settings.Settings`')."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    body_timeout_s: float = 60.0
    max_connections: int = 1000
    keepalive_timeout_s: float = 5.0
    keepalive_max_requests: int = 1000

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerLimits:
        return cls(
            header_timeout_s=settings.header_timeout_s,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            body_timeout_s=settings.body_timeout_s,
            max_connections=settings.max_connections,
            keepalive_timeout_s=settings.keepalive_timeout_s,
            keepalive_max_requests=settings.keepalive_max_requests,
        )

    def protocol(self) -> type[LimitedHttpToolsProtocol]:
        """The protocol class to hand ``uvicorn.Config(http=...)``, bound to these limits."""

        class Bound(LimitedHttpToolsProtocol):
            limits = self

        return Bound


def _response(status: int, error: RequestError) -> bytes:
    """A whole ``Connection: close`` response with the gateway's typed error body."""
    body = orjson.dumps({"error": error.to_dict()})
    return b"".join(
        (
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        )
    )


# How long the rest of a body answered early is read and dropped: nginx's lingering_timeout.
_LINGER_S: Final = 5.0

_BUSY: Final = _response(
    503,
    RequestError(
        ErrorCode.BAD_REQUEST,
        "this server has MAX_CONNECTIONS connections open; retry shortly",
        http_status=503,
    ),
)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ServerLimits` (see the module docstring).

    The connection is in one of three phases: reading a head (from the connection's
    start, and again from the end of each request), reading a body, or neither (the
    request runs; or the connection idles between requests, which uvicorn's keep-alive
    timer bounds). Each phase that waits on the client has its timer.
    """

    limits: ClassVar[ServerLimits] = ServerLimits()

    # Slots, not the instance dict: uvicorn's protocol sets 28 attributes, and CPython
    # shares one key table among a class's instances only while it has fewer than 30
    # names; past that each connection gets a dict of its own, about 1.3 KB more
    # (docs/performance.md, "Memory per stream").
    __slots__ = (
        "_deadline",
        "_dropping",
        "_head_bytes",
        "_head_lines",
        "_in_head",
        "_refusal",
        "_requests",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keepalive_timeout_s  # type: ignore[assignment]
        self._in_head = True
        self._head_bytes = 0
        self._head_lines = 0
        self._requests = 0
        self._refusal: tuple[int, str] | None = None  # a parser callback's: answer, close
        self._dropping = False  # refused: what still comes is read and dropped
        self._deadline: asyncio.TimerHandle | None = None  # the head's or the body's

    # -- the connection ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.connections) >= self.limits.max_connections:
            # Refused before a byte is read: a flood costs a write and a close each.
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.flow is None:  # refused in connection_made: nothing of uvicorn's to undo
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head's bytes counted before the parser sees them."""
        if self.transport.is_closing() or self._dropping:
            return
        if self._in_head:
            room = self.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Feed what fits: if the head ends within it, the rest is body (or the
                # next request) and goes on as usual; if not, the head is too large.
                self._feed(data[: max(room, 0)])
                if self._in_head and not (self.transport.is_closing() or self._dropping):
                    self._refuse(431, f"request headers over {self.limits.max_header_bytes} bytes")
                elif not (self.transport.is_closing() or self._dropping):
                    self.data_received(data[max(room, 0) :])
                return
            self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is not None:  # a limit a callback found
                self._refuse(*self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and end the connection: the parser is past use, so what the
        client still sends is read and dropped for a moment (a lingering close: closing
        with unread bytes would reset the connection, and the client might never read the
        answer), then the connection closes."""
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still being written: no interleaving.
            self.transport.close()
            return
        error = RequestError(ErrorCode.BAD_REQUEST, message, http_status=status)
        self.transport.write(_response(status, error))
        self._dropping = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm(_LINGER_S)

    # -- the timers -------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        """The head or the body did not come in time: close. A request whose body stalls
        sees ``http.disconnect`` (uvicorn's ``connection_lost``), as if the client left."""
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    # -- the parser's callbacks -------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_lines = 0
        if self._deadline is None:  # a kept-alive connection's next request starts
            self._arm(self.limits.header_timeout_s)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        if self._head_lines > self.limits.max_headers:
            self._refusal = (431, f"more than {self.limits.max_headers} request headers")
            raise _TooManyHeaders  # httptools stops and raises HttpParserCallbackError
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._requests += 1
        self._arm(self.limits.body_timeout_s)  # disarmed at once if there is no body
        super().on_headers_complete()
        cycle = self.cycle
        # Not a new cycle when uvicorn took the head for an upgrade (the last request's
        # cycle, done, or None): only a new one holds the transport itself.
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        if self._requests >= self.limits.keepalive_max_requests and cycle is not None:
            cycle.keep_alive = False  # this response says Connection: close

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if not self._in_head and not self.transport.is_closing():
            # Answered before the body came whole (a 413 on Content-Length): the rest is
            # read and dropped for a moment, so that a client still sending sees the
            # answer rather than a reset, then the connection ends (nginx's lingering close).
            self._arm(min(_LINGER_S, self.limits.body_timeout_s))
        super().on_response_complete()


class _HeadWithBody:
    """One response's view of the connection's transport: its first write is held until
    the next, or until the end of the loop's turn, and the two leave in one write (the
    module docstring). Everything else is the transport's."""

    __slots__ = ("_held", "_loop", "_transport", "_wrote")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._wrote = False
        self._loop = loop

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._wrote:
            self._transport.write(data)
        else:
            self._wrote = True
            self._held = data
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _TooManyHeaders(Exception):
    """Raised in the parser's header callback; the parser turns it into its own error."""
