"""Adapter for OpenAI-compatible ``/chat/completions`` streaming.

One adapter serves llama-server, vLLM, Groq and Ollama's ``/v1``: they all speak the same
``chat.completion.chunk`` SSE dialect. The adapter is thin on purpose (docs/architecture.md): it
takes an injected ``httpx.AsyncClient`` (tests pass a ``MockTransport`` or a real loopback server),
builds the wire body, reads raw bytes into the sans-IO :class:`UpstreamSSEDecoder`, and
yields :class:`UpstreamDelta` values from a :class:`ChatStream`, which can also hand them
over inside the socket's read callback (:meth:`ChatStream.follow`).

Why the pieces look the way they do:

* ``response.aiter_raw()`` is the cheapest httpx read path (measured in bench/RESULTS.md:
  14 µs/event against 17 for ``aiter_lines`` and 21 for httpx-sse's iterator); we ask for
  ``Accept-Encoding: identity`` so raw bytes are the body.
* Three timeouts, each named in its error, and the one mapping of httpx exceptions to
  :class:`UpstreamError` are :class:`~toolforge.upstream.exchange.Exchange`'s, shared with the
  Ollama adapter (:mod:`toolforge.upstream.exchange` says why they look the way they do). The
  first-byte clock starts when the request headers are sent (httpx's ``trace`` extension
  tells us), so a slow connect is reported as a connect timeout, not a first-byte one.
* Closing the stream (``aclose()`` or cancelling the task) closes the response, which
  closes the TCP connection at once when the body was not finished (docs/protocol.md: cancel
  within 50 ms).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import anyio
import httpx
import orjson

from toolforge.core.messages import wire_messages
from toolforge.core.redact import redact_text
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, DeltaConsumer, ToolCallDelta, UpstreamDelta
from toolforge.upstream.exchange import (
    RETRYABLE_STATUS,
    STREAM,
    Exchange,
    StreamHead,
    drain,
    excerpt,
    open_stream,
    request_body,
    snippet,
)
from toolforge.upstream.http11 import Body
from toolforge.upstream.sse_decoder import SSEMessage, UpstreamSSEDecoder
from toolforge.upstream.transport import PostTemplate

__all__ = ["ChatStream", "OpenAICompatUpstream", "models_request"]

_DONE: Final = "[DONE]"


def models_request(base_url: str, *, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The URL and headers of ``GET {base_url}/models``: what ``/readyz`` asks to learn
    that the upstream answers (llama-server, vLLM, Ollama's ``/v1`` and hosted APIs all
    serve it)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return base_url.rstrip("/") + "/models", headers


def _error_member(body_start: str) -> Any:
    """The body's ``error`` member when the body is OpenAI-style JSON, else None."""
    try:
        body = orjson.loads(body_start)
    except orjson.JSONDecodeError:
        return None
    return body.get("error") if type(body) is dict else None


def _error_text(body_start: str) -> str:
    """The upstream's own error message when the body is OpenAI-style JSON, else the body."""
    error = _error_member(body_start)
    message = error.get("message") if type(error) is dict else error
    return snippet(message if isinstance(message, str) else body_start)


# How each server says a prompt is longer than the model's context: llama-server's error
# type, OpenAI's error code (vLLM's message says "maximum context length").
_OVER_CONTEXT_TYPES: Final = frozenset({"exceed_context_size_error"})
_OVER_CONTEXT_CODES: Final = frozenset({"context_length_exceeded"})


def _over_context(status: int, body_start: str) -> UpstreamError | None:
    """A 400 that says the prompt is over the model's context, as a typed error with the
    numbers the upstream gave (llama-server: ``n_prompt_tokens``, ``n_ctx``); else None."""
    if status != 400:
        return None
    error = _error_member(body_start)
    if type(error) is not dict:
        return None
    message = error.get("message")
    text = message if isinstance(message, str) else ""
    if not (
        error.get("type") in _OVER_CONTEXT_TYPES
        or error.get("code") in _OVER_CONTEXT_CODES
        or "maximum context length" in text
    ):
        return None
    prompt, n_ctx = error.get("n_prompt_tokens"), error.get("n_ctx")
    if isinstance(prompt, int) and isinstance(n_ctx, int):
        said = f"the prompt is {prompt} tokens, the model's context {n_ctx}"
    else:
        said = snippet(text) if text else "the prompt is longer than the model's context"
    refused = UpstreamError(
        ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        f"the upstream refused the request: {said}; shorten the messages, the tools or "
        "their descriptions, or serve the model with a larger context",
    )
    refused.retryable = False  # the same prompt is refused again
    return refused


# UpstreamDelta is built once per chunk, the hot path. The frozen dataclass __init__ costs
# an object.__setattr__ per field; the slot descriptors' own setters do the same work in
# about 60% of the time (measured: 413 ns against 594 for the three-field init and 743 for
# the four-field one), so adding ``tool_calls`` made a plain text chunk cheaper, not dearer.
# The check below keeps this in step with the dataclass.
_DELTA_FIELDS: Final = ("text", "finish_reason", "usage", "tool_calls", "reasoning")
assert tuple(f.name for f in dataclasses.fields(UpstreamDelta)) == _DELTA_FIELDS
_new_object = object.__new__
_set_text, _set_finish, _set_usage, _set_tool_calls, _set_reasoning = (
    UpstreamDelta.__dict__[name].__set__ for name in _DELTA_FIELDS
)


def _delta(
    text: str,
    finish: str | None,
    usage: dict[str, Any] | None,
    tool_calls: tuple[ToolCallDelta, ...],
    reasoning: str = "",
) -> UpstreamDelta:
    """``UpstreamDelta(text, finish, usage, tool_calls, reasoning)``, faster (see
    ``_DELTA_FIELDS``)."""
    delta: UpstreamDelta = _new_object(UpstreamDelta)
    _set_text(delta, text)
    _set_finish(delta, finish)
    _set_usage(delta, usage)
    _set_tool_calls(delta, tool_calls)
    _set_reasoning(delta, reasoning)
    return delta


def _parse_chunk(data: str) -> UpstreamDelta | None:
    """One ``data:`` payload → a delta, or ``None`` when it carries nothing for us."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(
            ErrorCode.UPSTREAM_PROTOCOL, f"upstream sent non-JSON data: {snippet(data)}"
        ) from exc
    if type(chunk) is not dict:
        raise _shape_error(data)
    error = chunk.get("error")
    if error is not None:
        # vLLM and llama-server report mid-stream failures as {"error": {...}} data.
        message = error.get("message") if isinstance(error, dict) else None
        raise UpstreamError(
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "upstream reported an error: "
            + redact_text(message if isinstance(message, str) else repr(error)),
        )
    text: Any = ""
    finish: Any = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    reasoning: Any = ""
    choices = chunk.get("choices")
    if choices:
        if type(choices) is not list or type(choice := choices[0]) is not dict:
            raise _shape_error(data)
        if choice.get("index", 0) != 0:
            return None  # n > 1: we generate one choice; others are not ours
        delta = choice.get("delta")
        if delta:
            if type(delta) is not dict:
                raise _shape_error(data)
            text = delta.get("content") or ""
            calls = delta.get("tool_calls")
            if calls:  # native mode only; [] and null mean none
                tool_calls = _parse_tool_calls(calls, data)
            if "reasoning_content" in delta:  # llama-server, vLLM, DeepSeek: thinking apart
                reasoning = delta["reasoning_content"] or ""
                if type(reasoning) is not str:
                    raise _shape_error(data)
        finish = choice.get("finish_reason")
    usage: Any = chunk.get("usage")
    if usage is None and type(x_groq := chunk.get("x_groq")) is dict:
        usage = x_groq.get("usage")  # Groq puts usage under x_groq in the last chunk
    if type(text) is not str or not (finish is None or type(finish) is str):
        raise _shape_error(data)
    if not (usage is None or type(usage) is dict):
        raise _shape_error(data)
    timings = chunk.get("timings")
    if type(timings) is dict:  # llama-server, last chunk: prompt-cache reuse (cache_n), speeds
        usage = {**(usage or {}), "timings": timings}
    if not text and finish is None and usage is None and not tool_calls and not reasoning:
        return None  # e.g. the role-only first chunk
    return _delta(text, finish, usage, tool_calls, reasoning)


def _parse_tool_calls(calls: Any, data: str) -> tuple[ToolCallDelta, ...]:
    """``delta.tool_calls`` → its pieces, as sent: nothing is merged or invented here.

    Each item is ``{index?, id?, type?, function: {name?, arguments?}}``. What servers do
    with it differs, and all of it is accepted: vLLM and llama-server send ``id`` and
    ``name`` first and then argument fragments under the same ``index``; Groq sends each
    call whole in one chunk; Ollama's ``/v1`` sent no ``index`` before 0.4.7
    (ollama/ollama#7881) and still reuses ``index`` 0 for parallel calls on some models
    (ollama/ollama#15457); some servers leave out ``id``. ``""`` and ``null`` for ``id``
    or ``name`` mean "not in this piece", so a server that repeats the keys empty in
    continuation pieces is understood. ``arguments`` as a JSON object rather than a string
    (Ollama's native shape, leaked by some proxies) is re-serialised to text.
    """
    if type(calls) is not list:
        raise _shape_error(data)
    out: list[ToolCallDelta] = []
    for call in calls:
        if type(call) is not dict:
            raise _shape_error(data)
        index = call.get("index")
        call_id = call.get("id") or None
        function = call.get("function")
        name: Any = None
        arguments: Any = ""
        if function is not None:
            if type(function) is not dict:
                raise _shape_error(data)
            name = function.get("name") or None
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif type(arguments) is dict:
                arguments = orjson.dumps(arguments).decode()
        if not (
            (index is None or (type(index) is int and 0 <= index))
            and (call_id is None or type(call_id) is str)
            and (name is None or type(name) is str)
            and type(arguments) is str
        ):
            raise _shape_error(data)
        out.append(ToolCallDelta(index, call_id, name, arguments))
    return tuple(out)


def _shape_error(data: str) -> UpstreamError:
    return UpstreamError(
        ErrorCode.UPSTREAM_PROTOCOL, f"upstream chunk has an unexpected shape: {snippet(data)}"
    )


class OpenAICompatUpstream:
    """Streams ``POST {base_url}/chat/completions`` from an OpenAI-compatible server.

    ``base_url`` follows the OpenAI SDK convention and includes the version prefix, e.g.
    ``http://127.0.0.1:8080/v1`` or ``https://api.groq.com/openai/v1``.

    Timeouts, in seconds: ``connect_s`` to open a connection (and to wait for a pooled
    one); ``first_byte_s`` from sending the request to the first body byte (covers prompt
    processing, which on a CPU can take a minute for a long context); ``idle_s`` allowed
    between two body chunks once the stream has started.

    ``retry_unanswered``: send a request once more when the server closed its connection
    without answering (llama-server does this to kept-alive connections, see
    :mod:`toolforge.upstream.llama_server`).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        api_key: str | None = None,
        connect_s: float = 5.0,
        first_byte_s: float = 120.0,
        idle_s: float = 30.0,
        retry_unanswered: bool = False,
    ) -> None:
        url = httpx.URL(base_url.rstrip("/") + "/chat/completions")
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"upstream base_url must be an http(s) URL, got {base_url!r}")
        self._client = client
        self._url = url
        self._url_text = str(url)  # for the exchange's errors: httpx rebuilds it on each str()
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._post = PostTemplate(url, {**headers, "Content-Type": "application/json"})
        self._connect_s = connect_s
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        self._retry_unanswered = retry_unanswered
        # Reads are bounded by our asyncio deadlines, so httpx's read/write timeouts are off.
        self._timeout = httpx.Timeout(connect=connect_s, read=None, write=None, pool=connect_s)

    def __repr__(self) -> str:  # never shows the API key
        return f"OpenAICompatUpstream({str(self._url)!r})"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so tests and logs can show it)."""
        body: dict[str, Any] = {
            "model": request.model,
            # The wire dicts alone: a history's metadata never reaches an upstream.
            "messages": wire_messages(request.messages),
            "stream": True,
            # Usage arrives in a last chunk only when asked for (OpenAI, vLLM, llama-server).
            "stream_options": {"include_usage": True},
        }
        for name in ("temperature", "seed", "max_tokens", "top_p"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        if request.stop is not None:
            body["stop"] = list(request.stop)
        body.update(request.extra)
        return body

    def stream(self, request: ChatRequest) -> ChatStream:
        """The generation's deltas until ``[DONE]``; :class:`UpstreamError` on any
        failure. Nothing is sent before the first read."""
        return ChatStream(self, request_body(self.body(request)))

    async def _open(
        self, content: bytes
    ) -> tuple[Exchange, bytes | None, AsyncIterator[bytes], Callable[[], Awaitable[None]]]:
        """Send the request and read the first body chunk: the exchange, that chunk
        (``None``: an empty body), the body's iterator and its closer.

        With ``retry_unanswered``, a request whose connection the server closed or
        refused before the first chunk of an answer (``UPSTREAM_UNAVAILABLE``) is sent
        once more on a new connection: nothing of it has reached the session yet. An
        HTTP error answer, a timeout, or a failure once the body has begun never is.
        """
        attempts = 2 if self._retry_unanswered else 1
        for attempt in range(1, attempts + 1):
            exchange = Exchange(self._url_text, self._connect_s, self._first_byte_s, self._idle_s)
            try:
                return exchange, *await self._first_chunk(exchange, content)
            except UpstreamError as exc:
                if attempt == attempts or exc.code is not ErrorCode.UPSTREAM_UNAVAILABLE:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _first_chunk(
        self, exchange: Exchange, content: bytes
    ) -> tuple[bytes | None, AsyncIterator[bytes], Callable[[], Awaitable[None]]]:
        head, chunks, first_byte_at, close = await open_stream(
            self._client,
            self._post,
            content=content,
            timeouts=self._timeout,
            exchange=exchange,
            first_byte_s=self._first_byte_s,
        )
        chunk: bytes | None = None
        try:
            with exchange.until(first_byte_at):
                if head.status_code >= 400 or not self._is_sse(head):
                    self._check_response(head, await excerpt(chunks))
                chunk = await anext(chunks, None)
        except BaseException:
            exchange.close()
            with anyio.CancelScope(shield=True):
                await close()
            raise
        return chunk, chunks, close

    @staticmethod
    def _is_sse(head: StreamHead) -> bool:
        return "text/event-stream" in head.content_type

    @staticmethod
    def _check_response(head: StreamHead, body_start: str) -> None:
        status = head.status_code
        if status >= 400:
            over = _over_context(status, body_start)
            if over is not None:
                raise over
            error = UpstreamError(
                ErrorCode.UPSTREAM_HTTP_ERROR,
                f"upstream returned HTTP {status}: {_error_text(body_start)}",
            )
            error.retryable = status >= 500 or status in RETRYABLE_STATUS
            raise error
        if not OpenAICompatUpstream._is_sse(head):
            content_type = head.content_type or "no content-type"
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL,
                f"upstream answered {content_type}, not text/event-stream: {snippet(body_start)}",
            )


class ChatStream:
    """One generation's deltas, from the request to ``[DONE]``: an async iterator (the
    request goes out on the first read) that :meth:`aclose` closes.

    Two ways to read it. Iterating reads the response body chunk by chunk, each read
    bounded by the idle timeout. :meth:`follow` instead lends the connection a callback
    (:meth:`toolforge.upstream.http11.Body.attach`): each socket read is decoded and
    parsed inside it and its deltas handed to a consumer at once, the reading task asleep
    until the consumer declines a delta or anything else needs it (the end, an error, the
    connection's news). Then iteration goes on where the callback stopped: the deltas it
    parsed but did not hand over come first, in order. Both ways share one decoder and one
    parser, so the deltas, errors and their order are the same whichever reads: a paced
    token costs the callback, not a task step and the coroutines between the socket and
    the session.

    Why a class and not an async generator: the decoder's state must be reachable from the
    callback, and a generator's locals are not.
    """

    __slots__ = (
        "_body",
        "_close",
        "_closed",
        "_consumer",
        "_content",
        "_decoder",
        "_done",
        "_ended",
        "_error",
        "_exchange",
        "_idle_s",
        "_loop",
        "_pending",
        "_upstream",
        "_waiter",
    )

    def __init__(self, upstream: OpenAICompatUpstream, content: bytes) -> None:
        self._upstream = upstream
        self._content = content
        self._exchange: Exchange | None = None  # None until the request is out
        self._body: AsyncIterator[bytes] | None = None
        self._close: Callable[[], Awaitable[None]] | None = None
        self._decoder = UpstreamSSEDecoder()
        # Parsed, not yet read: rare and short (a read the consumer stopped in the middle
        # of); a list, not a deque, whose first block is about 600 bytes per open stream.
        self._pending: list[UpstreamDelta] = []
        self._error: Exception | None = None  # raised once the pending deltas are read
        self._done = False  # [DONE], or the end of a body after finish_reason
        self._ended = False  # nothing more to read: StopAsyncIteration
        self._closed = False
        self._consumer: DeltaConsumer | None = None  # while follow() waits
        self._waiter: asyncio.Future[None] | None = None
        self._idle_s = upstream._idle_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> UpstreamDelta:
        pending = self._pending
        if pending:
            return pending.pop(0)
        try:
            while not pending:
                if self._ended:
                    raise StopAsyncIteration
                if self._error is not None:
                    self._ended = True
                    raise self._error
                if self._done:
                    assert self._body is not None
                    await drain(self._body)
                    self._ended = True
                    raise StopAsyncIteration
                if self._exchange is None:
                    await self._open()
                else:
                    await self._read()
        except BaseException:
            # As a generator's clean-up: the end, an error or a cancel closes the response.
            self._ended = True
            await self.aclose()
            raise
        return pending.pop(0)

    async def aclose(self) -> None:
        """Close the response (at once if it is not finished); idempotent."""
        self._ended = True
        if self._closed or self._exchange is None:
            return
        self._closed = True
        self._exchange.close()
        assert self._close is not None
        # Shielded: the cancel that may have brought us here must not cut the close
        # short, or httpcore keeps the connection ACTIVE in its pool (see exchange.drain).
        with anyio.CancelScope(shield=True):
            await self._close()

    async def follow(self, consumer: DeltaConsumer) -> None:
        """Hand each delta to ``consumer.deliver`` inside the socket's read callback as
        it arrives, this task asleep, until the consumer declines one, the stream ends or
        breaks, or the connection has news; then return (read on by iterating). Returns
        at once where deltas wait to be read already, after the generation's
        ``finish_reason``, or where the body is not the lean transport's (a proxy, a
        mock): iterate then. The idle timeout holds as for a
        read: :class:`UpstreamError` when nothing comes for ``idle_s``."""
        body = self._body
        exchange = self._exchange
        if (
            self._pending
            or self._done
            or self._ended
            or self._error is not None
            or exchange is None
            or exchange.finished
            or type(body) is not Body
            or not body.attach(self)
        ):
            return
        loop = self._loop
        assert loop is not None
        self._waiter = waiter = loop.create_future()
        self._consumer = consumer
        try:
            with exchange.until(loop.time() + self._idle_s):
                await waiter
        finally:
            self._consumer = self._waiter = None
            body.detach()

    # -- the connection's sink (toolforge.upstream.http11.Sink) ------------------------------

    def data(self, data: bytes) -> None:
        """One read's body bytes, in the connection's callback, while :meth:`follow` waits."""
        exchange = self._exchange
        assert exchange is not None and self._loop is not None
        exchange.moved(self._loop.time() + self._idle_s)
        consumer = self._consumer
        try:
            self._take(self._decoder.feed(data))
        except Exception as exc:  # the decoder's own (invalid UTF-8, a line too long) or
            # a bug: raised to the task, as iteration would, never out of the callback
            # (where the loop would close the connection and report it as a reset)
            self._error = exc
        if self._consumer is not None and (
            self._done or self._error is not None or exchange.finished
        ):
            # The end (or, after finish_reason, the wait for it: the task's read keeps the
            # idle timeout's meaning there, "nothing lost").
            self._unfollow()
        if consumer is not None:
            consumer.settle()

    def news(self) -> None:
        """The response ended or broke: the task reads the rest."""
        self._unfollow()

    # -- inside --------------------------------------------------------------------------

    def _unfollow(self) -> None:
        self._consumer = None
        body = self._body
        if type(body) is Body:
            body.detach()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _open(self) -> None:
        self._loop = asyncio.get_running_loop()
        # The body is not kept once it is sent: a few KB for every open stream.
        content, self._content = self._content, b""
        exchange, chunk, chunks, close = await self._upstream._open(content)
        self._exchange = exchange
        self._body = chunks
        self._close = close
        exchange.phase = STREAM
        self._chunk(chunk)

    async def _read(self) -> None:
        exchange = self._exchange
        assert exchange is not None and self._loop is not None and self._body is not None
        chunk = None  # stays None if the mapper turns a post-finish drop into EOF
        with exchange.until(self._loop.time() + self._idle_s):
            try:
                chunk = await self._body.__anext__()
            except StopAsyncIteration:
                chunk = None
        self._chunk(chunk)

    def _chunk(self, chunk: bytes | None) -> None:
        """A chunk of the body, or its end (``None``)."""
        if chunk is not None:
            self._take(self._decoder.feed(chunk))
            return
        self._take(self._decoder.close())
        if self._done or self._error is not None:
            return
        assert self._exchange is not None
        if self._exchange.finished:  # some servers end after finish_reason without [DONE]
            self._done = True
        else:
            self._error = UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL,
                "upstream closed the stream early (no [DONE], no finish_reason)",
            )

    def _take(self, messages: list[SSEMessage]) -> None:
        """Parse ``messages`` in order: each delta to the consumer while it takes them,
        else into the pending deltas; stop at ``[DONE]`` or at an error."""
        if self._done or self._error is not None:
            return  # after [DONE] nothing counts
        exchange = self._exchange
        assert exchange is not None
        pending = self._pending
        consumer = self._consumer
        for message in messages:
            data = message.data
            if data == _DONE:
                self._done = True
                return
            if not data:
                continue  # keep-alive or an event with no data
            try:
                delta = _parse_chunk(data)
            except UpstreamError as exc:
                self._error = exc
                return
            if delta is None:
                continue
            if delta.finish_reason is not None:
                exchange.finished = True
            if consumer is None:
                pending.append(delta)
            elif not consumer.deliver(delta):
                consumer = None
                self._unfollow()
