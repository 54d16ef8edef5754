"""Adapter for Anthropic's Messages API (``UPSTREAM_KIND=anthropic``): a frontier baseline.

The gateway's histories are OpenAI-shaped (:mod:`toolforge.core.messages`); this adapter
converts them at the boundary, as an Anthropic client does
(:func:`to_anthropic`):

* system messages become the top-level ``system`` string;
* an assistant message's ``tool_calls`` become ``tool_use`` blocks (``input`` the parsed
  arguments object), and each ``tool`` message a ``tool_result`` block in a user message
  (``is_error`` when the gateway's envelope says ``ok: false``);
* a ``tool_use`` that no result answers (a call a workflow refused, or one compaction
  dropped) gets a synthetic error ``tool_result``: Anthropic rejects an unanswered call;
* consecutive messages of one role are merged (the API wants strict user/assistant
  alternation), ``tool_result`` blocks first in their user message; the first message is
  a user one; empty text blocks are left out (the API rejects them).

Sampling maps to ``temperature``, ``top_p``, ``stop_sequences`` and ``max_tokens`` (required
by the API: ``ANTHROPIC_MAX_TOKENS`` when the request sets none); ``seed`` and
llama-server's fields (``grammar``, ``cache_prompt``) have no Anthropic counterpart and
are not sent. OpenAI-format ``tools``/``tool_choice`` in ``ChatRequest.extra`` (native
mode) become Anthropic's ``tools`` (``input_schema``) and ``tool_choice``.

Streaming (:class:`AnthropicStreamParser`, sans-IO): the SSE events ``message_start``
(input tokens), ``content_block_start`` (a ``tool_use`` block's id and name),
``content_block_delta`` (``text_delta`` → text, ``input_json_delta`` → the call's
arguments, ``thinking_delta`` → reasoning), ``content_block_stop``, ``message_delta``
(``stop_reason`` → the OpenAI finish reason, output tokens), ``message_stop`` (the end),
``ping`` and ``error`` (an :class:`~toolforge.errors.UpstreamError`). Headers:
``x-api-key`` and ``anthropic-version``. HTTP errors carry Anthropic's own error type and
message; 429, 5xx and 529 (overloaded) are retryable, 4xx are not.

The wire format is Anthropic's documented one (docs.anthropic.com, "Messages" and
"Streaming Messages"); tests replay recorded fixtures of it and a scripted server on
loopback (tests/upstream/fixtures/anthropic/README.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import httpx
import orjson

from toolforge.core.messages import content_text, wire_messages
from toolforge.core.redact import redact_text
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, ToolCallDelta, UpstreamDelta
from toolforge.upstream.exchange import (
    RETRYABLE_STATUS,
    STREAM,
    Exchange,
    excerpt,
    open_stream,
    request_body,
    snippet,
)
from toolforge.upstream.sse_decoder import UpstreamSSEDecoder
from toolforge.upstream.transport import PostTemplate

__all__ = [
    "ANTHROPIC_VERSION",
    "AnthropicStreamParser",
    "AnthropicUpstream",
    "anthropic_body",
    "models_request",
    "to_anthropic",
]

ANTHROPIC_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header: the Messages API's current version."""


def models_request(
    base_url: str, *, api_key: str | None, version: str = ANTHROPIC_VERSION
) -> tuple[str, dict[str, str]]:
    """The URL and headers of ``GET /v1/models``: what ``/readyz`` asks to learn that the
    API answers (the key in Anthropic's own header, the version it requires)."""
    headers = {"anthropic-version": version}
    if api_key:
        headers["x-api-key"] = api_key
    return base_url.rstrip("/").removesuffix("/v1") + "/v1/models", headers


UNANSWERED: Final = "[no result: this tool call was not run]"
"""The synthetic ``tool_result`` of a call no result answers."""

_STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "pause_turn": "stop",
    "refusal": "content_filter",
}
# Anthropic error types that are worth a retry (docs: "Errors").
_RETRYABLE_TYPES: Final = frozenset({"overloaded_error", "api_error", "rate_limit_error"})
# ChatRequest.extra keys Anthropic knows; the rest (grammar, cache_prompt, ...) are not sent.
_PASSTHROUGH: Final = ("top_k", "metadata", "thinking")


# -- the request --------------------------------------------------------------------------


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return {}
        return value if type(value) is dict else {}
    return {}


def _is_error(content: str) -> bool:
    """A tool message whose content is the gateway's envelope with ``ok: false``."""
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and value.get("ok") is False


def to_anthropic(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` for the Messages API from an OpenAI-shaped history."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []  # {"role", "content": [blocks]}

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for item in wire_messages(messages):
        role = item.get("role")
        text = content_text(item.get("content"))
        if role == "system":
            if text:
                system.append(text)
        elif role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for call in item.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": str(call.get("id") or ""),
                        "name": str(function.get("name") or ""),
                        "input": _arguments(function.get("arguments")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(item.get("tool_call_id") or ""),
                "content": text,
            }
            if _is_error(text):
                result["is_error"] = True
            add("user", [result])
        else:  # user, and any other role the API does not have
            add("user", [{"type": "text", "text": text}] if text else [])

    _pair_calls(turns)
    for turn in turns:  # tool_result blocks come first in a user message
        if turn["role"] == "user":
            turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": "(continue)"}]})
    return ("\n\n".join(system) or None), turns


def _pair_calls(turns: list[dict[str, Any]]) -> None:
    """Every ``tool_use`` answered by a ``tool_result`` in the next (user) message: a
    synthetic error result for each one that is not; results that answer no call of the
    message before are turned into text (the API rejects them too)."""
    index = 0
    while index < len(turns):
        turn = turns[index]
        if turn["role"] == "assistant":
            ids = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
            if ids:
                if index + 1 == len(turns) or turns[index + 1]["role"] != "user":
                    turns.insert(index + 1, {"role": "user", "content": []})
                answers = turns[index + 1]["content"]
                answered = {b["tool_use_id"] for b in answers if b["type"] == "tool_result"}
                missing = [
                    {
                        "type": "tool_result",
                        "tool_use_id": i,
                        "content": UNANSWERED,
                        "is_error": True,
                    }
                    for i in ids
                    if i not in answered
                ]
                answers[:0] = missing
        elif turn["role"] == "user":
            before = turns[index - 1] if index > 0 else None
            calls = (
                {b["id"] for b in before["content"] if b["type"] == "tool_use"}
                if before is not None and before["role"] == "assistant"
                else set()
            )
            turn["content"] = [
                b
                if b["type"] != "tool_result" or b["tool_use_id"] in calls
                else {"type": "text", "text": f"Tool result: {b['content']}"}
                for b in turn["content"]
            ]
        index += 1


def _tools(extra: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = extra.get("tools")
    if tools:
        out["tools"] = [
            {
                "name": (t.get("function") or {}).get("name"),
                "description": (t.get("function") or {}).get("description", ""),
                "input_schema": (t.get("function") or {}).get("parameters")
                or {"type": "object", "properties": {}},
            }
            for t in tools
        ]
    choice = extra.get("tool_choice")
    if isinstance(choice, str) and tools:
        mapped = {"auto": "auto", "required": "any", "none": "none"}.get(choice)
        if mapped is not None:
            out["tool_choice"] = {"type": mapped}
    elif isinstance(choice, Mapping) and tools:
        name = (choice.get("function") or {}).get("name")
        if name:
            out["tool_choice"] = {"type": "tool", "name": name}
    return out


def anthropic_body(request: ChatRequest, *, default_max_tokens: int = 4096) -> dict[str, Any]:
    """The ``POST /v1/messages`` body for ``request`` (streamed)."""
    system, messages = to_anthropic(request.messages)
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens if request.max_tokens is not None else default_max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system is not None:
        body["system"] = system
    if request.temperature is not None:
        body["temperature"] = min(max(request.temperature, 0.0), 1.0)  # Anthropic: 0..1
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.stop is not None:
        body["stop_sequences"] = list(request.stop)
    body.update(_tools(request.extra))
    for key in _PASSTHROUGH:
        if key in request.extra:
            body[key] = request.extra[key]
    return body


# -- the stream ---------------------------------------------------------------------------


def _error(kind: str, message: str, *, status: int | None = None) -> UpstreamError:
    where = f"HTTP {status}" if status is not None else "in the stream"
    error = UpstreamError(
        ErrorCode.UPSTREAM_HTTP_ERROR, f"Anthropic answered {kind} ({where}): {message}"
    )
    error.retryable = kind in _RETRYABLE_TYPES or (
        status is not None and (status >= 500 or status in RETRYABLE_STATUS or status == 529)
    )
    return error


def _error_of(body: str, status: int | None) -> UpstreamError:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _error("an error", snippet(body), status=status)
    detail = value.get("error") if isinstance(value, dict) else None
    if not isinstance(detail, dict):
        return _error("an error", snippet(body), status=status)
    message = redact_text(str(detail.get("message", "")))  # it may quote the key it was sent
    return _error(str(detail.get("type", "error")), message, status=status)


class AnthropicStreamParser:
    """Anthropic's SSE events in, :class:`UpstreamDelta` values out. No I/O."""

    __slots__ = ("_input_tokens", "_tools", "done")

    def __init__(self) -> None:
        self._input_tokens: int | None = None
        self._tools: dict[int, int] = {}  # content block index -> tool call ordinal
        self.done = False

    def feed(self, event: str, data: str) -> UpstreamDelta | None:
        """One event (its name and data); ``None`` when it carries nothing for the model."""
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL, f"Anthropic event is not JSON: {snippet(data)}"
            ) from None
        if not isinstance(value, dict):
            raise _shape(data)
        kind = value.get("type", event)
        if kind == "content_block_delta":
            delta = value.get("delta")
            if not isinstance(delta, dict):
                raise _shape(data)
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                return UpstreamDelta(text) if isinstance(text, str) and text else None
            if dtype == "input_json_delta":
                ordinal = self._tools.get(value.get("index", -1))
                if ordinal is None:
                    raise _shape(data)
                piece = ToolCallDelta(ordinal, None, None, str(delta.get("partial_json", "")))
                return UpstreamDelta("", tool_calls=(piece,))
            if dtype == "thinking_delta":
                thought = delta.get("thinking")
                return UpstreamDelta("", reasoning=thought) if isinstance(thought, str) else None
            return None  # signature_delta, citations: nothing for the gateway
        if kind == "content_block_start":
            block = value.get("content_block")
            if not isinstance(block, dict):
                raise _shape(data)
            if block.get("type") == "tool_use":
                ordinal = len(self._tools)
                self._tools[value.get("index", ordinal)] = ordinal
                piece = ToolCallDelta(ordinal, block.get("id"), block.get("name"), "")
                return UpstreamDelta("", tool_calls=(piece,))
            text = block.get("text")
            return UpstreamDelta(text) if block.get("type") == "text" and text else None
        if kind == "message_start":
            message = value.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
                self._input_tokens = usage["input_tokens"]
            return None
        if kind == "message_delta":
            delta = value.get("delta") or {}
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            usage = value.get("usage") or {}
            output = usage.get("output_tokens") if isinstance(usage, dict) else None
            counts: dict[str, Any] | None = None
            if isinstance(output, int):
                prompt = self._input_tokens or 0
                counts = {
                    "prompt_tokens": prompt,
                    "completion_tokens": output,
                    "total_tokens": prompt + output,
                }
            finish = _STOP_REASONS.get(str(reason), "stop") if reason is not None else None
            return UpstreamDelta("", finish_reason=finish, usage=counts)
        if kind == "message_stop":
            self.done = True
            return None
        if kind == "error":
            detail = value.get("error")
            if isinstance(detail, dict):
                raise _error(str(detail.get("type", "error")), str(detail.get("message", "")))
            raise _error("an error", snippet(data))
        return None  # ping, content_block_stop, and event types added later


def _shape(data: str) -> UpstreamError:
    return UpstreamError(
        ErrorCode.UPSTREAM_PROTOCOL, f"Anthropic event has an unexpected shape: {snippet(data)}"
    )


class AnthropicUpstream:
    """Streams ``POST {base_url}/v1/messages`` from Anthropic's Messages API.

    ``base_url`` is the API root (``https://api.anthropic.com``; a trailing ``/v1`` is
    accepted). Timeouts as :class:`~toolforge.upstream.openai_compat.OpenAICompatUpstream`'s.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str = "https://api.anthropic.com",
        *,
        api_key: str | None = None,
        version: str = ANTHROPIC_VERSION,
        default_max_tokens: int = 4096,
        connect_s: float = 5.0,
        first_byte_s: float = 120.0,
        idle_s: float = 30.0,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        url = httpx.URL(root + "/v1/messages")
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"Anthropic base_url must be an http(s) URL, got {base_url!r}")
        self._client = client
        self._url = url
        self._url_text = str(url)
        headers = {
            "Accept": "text/event-stream",
            "Accept-Encoding": "identity",
            "Content-Type": "application/json",
            "anthropic-version": version,
        }
        if api_key:
            headers["x-api-key"] = api_key
        self._post = PostTemplate(url, headers)
        self._default_max_tokens = default_max_tokens
        self._connect_s = connect_s
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        self._timeout = httpx.Timeout(connect=connect_s, read=None, write=None, pool=connect_s)

    def __repr__(self) -> str:  # never shows the API key
        return f"AnthropicUpstream({self._url_text!r})"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""
        return anthropic_body(request, default_max_tokens=self._default_max_tokens)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[UpstreamDelta, None]:
        """Yield deltas until ``message_stop``; raise :class:`UpstreamError` on any failure."""
        loop = asyncio.get_running_loop()
        exchange = Exchange(self._url_text, self._connect_s, self._first_byte_s, self._idle_s)
        chunk, chunks, close = await self._open(exchange, request_body(self.body(request)))
        try:
            exchange.phase = STREAM
            decoder = UpstreamSSEDecoder()
            parser = AnthropicStreamParser()
            while True:
                events = decoder.feed(chunk) if chunk is not None else decoder.close()
                for event in events:
                    if not event.data:
                        continue
                    delta = parser.feed(event.event or "", event.data)
                    if delta is not None:
                        if delta.finish_reason is not None:
                            exchange.finished = True
                        yield delta
                    if parser.done:
                        return
                if chunk is None:
                    raise UpstreamError(
                        ErrorCode.UPSTREAM_PROTOCOL,
                        "Anthropic closed the stream early (no message_stop)",
                    )
                chunk = None
                with exchange.until(loop.time() + self._idle_s):
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        chunk = None
        finally:
            exchange.close()
            with anyio.CancelScope(shield=True):
                await close()

    async def _open(
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
        try:
            with exchange.until(first_byte_at):
                if head.status_code >= 400:
                    raise _error_of(await excerpt(chunks), head.status_code)
                if "text/event-stream" not in head.content_type:
                    body = await excerpt(chunks)
                    raise UpstreamError(
                        ErrorCode.UPSTREAM_PROTOCOL,
                        f"Anthropic answered {head.content_type or 'no content-type'}, not "
                        f"text/event-stream: {snippet(body)}",
                    )
                chunk = await anext(chunks, None)
        except BaseException:
            exchange.close()
            with anyio.CancelScope(shield=True):
                await close()
            raise
        return chunk, chunks, close
