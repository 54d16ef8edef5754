"""The request machinery the HTTP adapters share: deadlines, error mapping, draining.

:mod:`toolforge.upstream.openai_compat`, :mod:`toolforge.upstream.ollama` and
:mod:`toolforge.upstream.ollama_control` speak different dialects over the same kind of
exchange; what does not depend on the dialect is here.

* Three timeouts, each named in its error (a hang before the headers, between chunks or while
connecting is a different fault). httpx has a single
  read timeout, so only ``connect`` (and pool) is left to httpx; the first-byte and idle
  deadlines are per-read deadlines with ``asyncio.timeout`` semantics, kept by
  :class:`Exchange` (see it for why not ``asyncio.timeout`` itself: cost per token). The
  adapter moves the exchange through its phases, :data:`CONNECT`, :data:`FIRST_BYTE` and
  :data:`STREAM`, which name the timeouts and classify connection errors.
* Every httpx exception is mapped to :class:`UpstreamError` in one context manager,
  :class:`Exchange`, like httpx's own ``map_httpcore_exceptions``.
* :func:`drain` reads what is left of a body after the end of the stream, so the
  connection can go back to the pool.
* :func:`open_stream` sends a streamed request and hands back what the adapters check
  (:class:`StreamHead`), the body's chunks and its closer.
* Small helpers for requests and error messages: :func:`request_body`,
  :func:`json_default`, :func:`excerpt`, :func:`snippet`, :func:`describe`,
  :data:`ERROR_BODY_BYTES` and :data:`RETRYABLE_STATUS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Final, NamedTuple

import anyio
import httpx
import orjson

from toolforge.core.redact import public_url, redact_text
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.http11 import Body
from toolforge.upstream.transport import PostTemplate, ResponseHead

__all__ = [
    "CONNECT",
    "ERROR_BODY_BYTES",
    "FIRST_BYTE",
    "RETRYABLE_STATUS",
    "STREAM",
    "Exchange",
    "StreamHead",
    "describe",
    "drain",
    "excerpt",
    "json_default",
    "open_stream",
    "request_body",
    "set_trace_injector",
    "snippet",
]

# W3C Trace Context for the upstream request: set by toolforge.runtime.tracing when traces
# are on (``opentelemetry.propagate.inject``), else None and nothing is added.
_inject: Callable[[dict[str, str]], None] | None = None


def set_trace_injector(inject: Callable[[dict[str, str]], None] | None) -> None:
    """What adds ``traceparent`` (and ``tracestate``) to each streamed upstream request,
    from the current OpenTelemetry context; ``None``: nothing."""
    global _inject
    _inject = inject


_SNIPPET_CHARS: Final = 120
ERROR_BODY_BYTES: Final = 2048
"""How much of an error (or otherwise unexpected) body is read for the error message."""
# After the end of the stream ([DONE], or Ollama's "done" line) we read what is left of the
# body so the connection can go back to the pool (httpcore closes a connection whose
# response was not read to the end). The terminating chunk normally arrives with the end;
# we wait no longer than this for a server that keeps the body open, since the caller
# waits for the generator to finish.
_DRAIN_S: Final = 0.02
_DRAIN_BYTES: Final = 64 * 1024
# Statuses worth retrying besides 5xx, as the OpenAI SDK retries them (408, 409, 429); 425
# is "too early". 400/401/403/404/422 mean the request or the credentials are wrong: the
# same request fails again, so the error says retryable=false.
RETRYABLE_STATUS: Final = frozenset({408, 409, 425, 429})

# Phases of one exchange, used to name timeouts and to classify connection errors.
CONNECT: Final = "connect"
FIRST_BYTE: Final = "first-byte"
STREAM: Final = "stream"


def snippet(text: str) -> str:
    """The start of ``text``, quoted, for an error message. Redacted first, then cut: the
    upstream's words may repeat what it was sent (a 401 that quotes the API key), and a
    secret cut in half at the end would no longer be recognised."""
    text = redact_text(text)
    return repr(text[:_SNIPPET_CHARS] + ("…" if len(text) > _SNIPPET_CHARS else ""))


def describe(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the exception has no message."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class StreamHead(NamedTuple):
    """What an adapter checks of a streamed response before reading its body."""

    status_code: int
    content_type: str


def request_body(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a request body built from a ChatRequest.

    Copied to an exact-size object: orjson returns its bytes inside the buffer it grew
    while writing (measured: a 130 KB allocation for a 9 KB chat body), and the request
    keeps its body for the whole stream, so every open stream would hold that much.
    """
    return bytes(memoryview(orjson.dumps(body, default=json_default)))


def json_default(value: object) -> object:
    """``orjson.dumps(..., default=json_default)`` for the bodies built from a ChatRequest."""
    # ChatRequest allows read-only mappings and tuples; orjson serialises only dict/list.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot serialise {type(value).__name__} in a chat request")


class Exchange:
    """One request's state: its phase, its read deadline, and the one place where httpx
    exceptions (and our own deadline expiring) become :class:`UpstreamError`.

    Used as ``with exchange.until(when):`` around every await on httpx, never around a
    ``yield``: the deadline bounds how long the upstream takes to deliver once we ask, so a
    consumer that pauses (backpressure, docs/protocol.md) does not make the upstream "idle".

    The deadline is ``asyncio.timeout_at`` semantics at a fraction of the cost. We measured
    ``async with asyncio.timeout(...)`` around each read at about 6 µs (a Timeout and a
    TimerHandle per read) next to about 13 µs for the read itself. Here a read costs a few
    attribute writes; one TimerHandle is re-armed lazily: when it fires and the deadline has
    moved on, it reschedules itself, and only when the deadline really passed during a read
    does it cancel the reading task, which ``__exit__`` turns back into a timeout exactly as
    ``asyncio.Timeout`` does (``uncancel()``, so a cancellation from outside still wins).
    """

    __slots__ = (
        "_cancelling",
        "_expired",
        "_handle",
        "_loop",
        "_scheduled_for",
        "_task",
        "_when",
        "connect_s",
        "finished",
        "first_byte_s",
        "idle_s",
        "phase",
        "url",
    )

    def __init__(self, url: str, connect_s: float, first_byte_s: float, idle_s: float) -> None:
        self.url = url
        self.connect_s = connect_s
        self.first_byte_s = first_byte_s
        self.idle_s = idle_s
        self.phase = CONNECT
        self.finished = False  # a finish_reason arrived: the generation is complete
        self._loop = asyncio.get_running_loop()
        self._when: float | None = None  # deadline of the read in progress; None: no read
        self._handle: asyncio.TimerHandle | None = None
        self._scheduled_for = 0.0
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._expired = False

    def until(self, when: float | None) -> Exchange:
        """Arm the deadline (loop time; ``None``: none) for the read about to start."""
        self._when = when
        if when is not None:
            task = asyncio.current_task()
            assert task is not None
            self._task = task
            self._cancelling = task.cancelling()
            if self._handle is None or when < self._scheduled_for:
                self._schedule(when)
        return self

    def moved(self, when: float) -> None:
        """Push the deadline of the read in progress on to ``when`` (loop time): bytes
        came in a callback while the read waits. The timer follows lazily, as for
        :meth:`until`."""
        if self._when is not None:
            self._when = when

    def close(self) -> None:
        """Cancel the timer; call once the exchange is over."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._scheduled_for = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        when = self._when
        if when is None:
            return  # no read in progress; the next until() re-arms
        if when > self._scheduled_for:
            self._schedule(when)  # a later read moved the deadline on
            return
        assert self._task is not None
        self._expired = True
        self._task.cancel()

    def __enter__(self) -> Exchange:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._when = None
        if exc is None or isinstance(exc, UpstreamError):
            return False
        if isinstance(exc, asyncio.CancelledError):
            if not self._expired:
                return False
            self._expired = False
            assert self._task is not None
            if self._task.uncancel() > self._cancelling:
                return False  # cancelled from outside as well: that wins
        elif not isinstance(exc, (httpx.HTTPError, httpx.StreamError)):
            return False  # our own bugs pass through untouched
        if self.finished and self.phase == STREAM:
            # The model already finished; a connection that then drops or stalls before
            # [DONE] lost us nothing. The read returns "end of body" instead.
            return True
        raise self._map(exc) from exc

    def _map(self, exc: BaseException) -> UpstreamError:
        error = self._mapped(exc)
        # The URL without its credentials, and the library's words redacted (an httpx
        # message may quote the URL it was given).
        return UpstreamError(error.code, redact_text(error.message))

    def _mapped(self, exc: BaseException) -> UpstreamError:
        timeout, unavailable = ErrorCode.UPSTREAM_TIMEOUT, ErrorCode.UPSTREAM_UNAVAILABLE
        url = public_url(self.url)
        if isinstance(exc, httpx.ConnectTimeout):
            return UpstreamError(
                timeout, f"upstream connect timeout: {url} not reached in {self.connect_s} s"
            )
        if isinstance(exc, httpx.PoolTimeout):
            return UpstreamError(
                timeout, f"upstream pool timeout: no free connection in {self.connect_s} s"
            )
        if isinstance(exc, (asyncio.CancelledError, httpx.TimeoutException)):
            if self.phase == STREAM:
                return UpstreamError(
                    timeout, f"upstream idle timeout: nothing received for {self.idle_s} s"
                )
            return UpstreamError(
                timeout, f"upstream first-byte timeout: no response in {self.first_byte_s} s"
            )
        if isinstance(exc, httpx.ConnectError):  # refused, DNS, unreachable, TLS handshake
            return UpstreamError(unavailable, f"cannot connect to upstream {url}: {exc}")
        if isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError)):
            if self.phase == STREAM:
                # FIN, RST or a truncated chunked body before [DONE] and finish_reason.
                return UpstreamError(
                    ErrorCode.UPSTREAM_PROTOCOL,
                    f"upstream closed the stream early ({describe(exc)})",
                )
            return UpstreamError(
                unavailable, f"upstream {url} closed the connection before responding: {exc}"
            )
        return UpstreamError(
            ErrorCode.UPSTREAM_PROTOCOL, f"upstream HTTP failure ({describe(exc)})"
        )


async def open_stream(
    client: httpx.AsyncClient,
    post: PostTemplate,
    *,
    content: bytes,
    timeouts: httpx.Timeout,
    exchange: Exchange,
    first_byte_s: float,
) -> tuple[StreamHead, AsyncIterator[bytes], float, Callable[[], Awaitable[None]]]:
    """POST ``content`` for a streamed answer: the response's status and content type,
    its body's chunks, the first-byte deadline (loop time) and the function that closes
    the response, with ``exchange`` in its :data:`FIRST_BYTE` phase.

    The adapter keeps only the chunks and the closer once it has checked the head: an
    ``httpx.Response`` is about 1.2 KB, for every open stream (bench B4), and the lean
    transport builds none at all.

    The first-byte clock starts when the request goes out, after any connect (httpx's
    ``trace`` extension says when; transports without tracing, such as MockTransport,
    start it once the response is there). An ``UpstreamClient``'s lean transport gets
    the request directly, with the head ``post`` serialised once, and its body is read
    without httpx's wrappers (the client class says why). On failure the exchange is
    closed and the error raised as is.
    """
    loop = asyncio.get_running_loop()
    first_byte_at: float | None = None

    def sent() -> None:
        nonlocal first_byte_at
        first_byte_at = loop.time() + first_byte_s
        exchange.phase = FIRST_BYTE
        exchange.until(first_byte_at)

    async def trace(name: str, info: Mapping[str, Any]) -> None:
        if name.endswith("send_request_headers.started"):
            sent()

    lean = getattr(client, "lean", None)  # toolforge.upstream.transport.UpstreamClient
    response: ResponseHead | httpx.Response
    headers, extra = post.headers, b""
    if _inject is not None:  # traces on: this request's traceparent
        carrier: dict[str, str] = {}
        _inject(carrier)
        if carrier:
            headers = {**headers, **carrier}
            extra = "".join(f"{k}: {v}\r\n" for k, v in carrier.items()).encode("latin-1")
    try:
        with exchange.until(None):  # connect: bounded by httpx's connect/pool timeouts
            if lean is not None and not lean.proxied(post.key):
                response = await lean.post(post, content, timeouts.as_dict(), sent, extra)
            else:
                http_request = client.build_request(
                    "POST",
                    post.url,
                    content=content,
                    headers=headers,
                    timeout=timeouts,
                    extensions={"trace": trace},
                )
                response = await client.send(http_request, stream=True)
    except BaseException:
        exchange.close()
        raise
    if first_byte_at is None:
        first_byte_at = loop.time() + first_byte_s
    exchange.phase = FIRST_BYTE
    if isinstance(response, ResponseHead):
        body = response.stream
        head = StreamHead(response.status_code, response.header("content-type") or "")
        return head, aiter(body), first_byte_at, body.aclose
    head = StreamHead(response.status_code, response.headers.get("content-type", ""))
    chunks: AsyncIterator[bytes]
    if response.is_stream_consumed:
        # A response built in memory (MockTransport with bytes content) is already read,
        # and aiter_raw() would refuse it; aiter_bytes() replays it. Identity encoding
        # (asked for by both adapters) makes the two the same bytes.
        chunks = response.aiter_bytes()
    else:
        chunks = response.aiter_raw()
    return head, chunks, first_byte_at, response.aclose


async def excerpt(chunks: AsyncIterator[bytes]) -> str:
    """The start of an error (or otherwise unexpected) body from its chunks, whitespace
    collapsed, for the error message."""
    raw = b""
    async for part in chunks:
        raw += part
        if len(raw) >= ERROR_BODY_BYTES:
            break
    return " ".join(raw[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())


async def drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what is left of a body after the end of the stream, briefly; data is ignored."""
    # Best effort, see _DRAIN_S. The time limit is an anyio scope, not asyncio.timeout:
    # httpcore shields its pool cleanup with anyio scopes, which a native cancel ignores;
    # under load asyncio.timeout firing inside that cleanup left pool entries ACTIVE and
    # their sockets open (bench B4).
    if isinstance(chunks, Body) and chunks.received:
        # The lean transport's body, in full already (the usual end: ``[DONE]`` and the
        # last chunk came together): read without waiting, so no time limit to set up.
        async for _ in chunks:
            pass
        return
    seen = 0
    with anyio.move_on_after(_DRAIN_S):
        try:
            async for part in chunks:
                seen += len(part)
                if seen > _DRAIN_BYTES:
                    return
        except (httpx.HTTPError, httpx.StreamError):
            pass
