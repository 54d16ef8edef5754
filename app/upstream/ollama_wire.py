"""The Ollama ``/api/chat`` dialect, sans-IO: the request body, the NDJSON stream, errors.

:class:`~toolforge.upstream.ollama.OllamaUpstream` does the I/O; everything it says and hears on
the wire is decided here, so it can be tested without a socket.

Theory of operation. The response is ``application/x-ndjson``: one JSON object per line
(Ollama docs, "Streaming"), ``{"message": {"content", "tool_calls"?}, "done": false}``
until a last line with ``"done": true``, ``done_reason`` and the token counts and
durations. :class:`NDJSONDecoder` (like httpx's ``LineDecoder``) cuts raw bytes into
lines, holding back a partial line across chunks: each byte is searched for ``\\n`` once
and each line parsed once, and a cut inside a UTF-8 character is harmless because
``\\n`` never occurs inside one. :class:`ChatLineParser` turns a line into an
:class:`UpstreamDelta`.

Dialect differences, as data:

* sampling goes under ``options`` (``max_tokens`` is ``num_predict``: ``_OPTION_NAMES``),
  and ``num_ctx`` always goes with it (see :mod:`toolforge.upstream.ollama` for why);
* OpenAI-only request keys are dropped (``_OPENAI_ONLY``); ``tools`` are sent as they are
  (Ollama takes the OpenAI ``{"type": "function", "function": {...}}`` shape);
* continuation messages are converted: assistant ``tool_calls`` carry ``arguments`` as an
  object, and a ``tool`` message names its tool in ``tool_name`` (Ollama docs, "Tool
  calling"); ``tool_call_id`` is kept, newer servers read it and older ones ignore it;
* streamed ``tool_calls`` arrive whole (Ollama parses a call completely before sending
  it), with ``function.index`` only on newer servers and usually without ``id``: each
  becomes one :class:`ToolCallDelta` with a fresh index and its arguments as compact
  JSON text, so :class:`toolforge.core.native_tools.ToolCallAssembler` builds the same calls
  as from an OpenAI stream;
* ``done_reason`` maps through ``_FINISH_REASONS``; ``"stop"`` after tool calls is
  reported as ``"tool_calls"``, as Ollama's own ``/v1`` does;
* ``prompt_eval_count``/``eval_count`` (and the durations, in ns) become ``usage``
  (``_USAGE_FIELDS``);
* ``message.thinking`` (thinking models with ``think`` on) is not the answer and is
  dropped; send ``extra={"think": False}`` to save the tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import orjson

from toolforge.core.messages import wire_messages
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, ToolCallDelta, UpstreamDelta
from toolforge.upstream.exchange import RETRYABLE_STATUS, snippet

__all__ = [
    "MAX_LINE_BYTES",
    "ChatLineParser",
    "NDJSONDecoder",
    "OllamaModelNotFound",
    "chat_body",
    "http_error",
]

MAX_LINE_BYTES: Final = 1024 * 1024
"""Longest NDJSON line accepted. A chat line holds one token, or whole tool calls (at most
16 calls of 32 KB arguments each: MAX_NATIVE_CALLS, MAX_ARGS_BYTES); 1 MiB bounds what a
server that never ends a line can make us hold."""

_OPTION_NAMES: Final = (
    ("temperature", "temperature"),
    ("seed", "seed"),
    ("max_tokens", "num_predict"),
    ("top_p", "top_p"),
)
# OpenAI request keys with no meaning to /api/chat. Ollama has no tool_choice: its models
# always choose ("auto", what native mode sends).
_OPENAI_ONLY: Final = frozenset({"tool_choice", "stream_options"})
_FINISH_REASONS: Final = MappingProxyType(
    # "load"/"unload" answer an empty messages list (Ollama docs, "Load a model").
    {"stop": "stop", "length": "length", "load": "stop", "unload": "stop"}
)
# What to do about an error status, by status and words in Ollama's message ("": any).
_HINTS: Final = (
    (400, "does not support tools", "the model has no native tool calling: use mode sentinel"),
    (404, "", "is this an Ollama server? base_url is its root, e.g. http://127.0.0.1:11434"),
)
_USAGE_FIELDS: Final = (
    ("prompt_eval_count", "prompt_tokens"),
    ("eval_count", "completion_tokens"),
    ("total_duration", "total_duration_ns"),
    ("load_duration", "load_duration_ns"),
    ("prompt_eval_duration", "prompt_eval_duration_ns"),
    ("eval_duration", "eval_duration_ns"),
)


class OllamaModelNotFound(UpstreamError):
    """Ollama has no model by this name (HTTP 404): pull it, or pick one it lists."""

    retryable = False

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(
            ErrorCode.UPSTREAM_HTTP_ERROR,
            f"Ollama has no model {model!r} ({detail}): pull it with `ollama pull {model}`"
            " or choose one that `ollama list` shows",
        )
        self.model = model


def _error_message(body: str) -> str:
    """Ollama's own message from an ``{"error": "..."}`` body, else the body; quoted."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return snippet(body)
    error = parsed.get("error") if type(parsed) is dict else None
    return snippet(error if isinstance(error, str) else body)


def http_error(status: int, body: str, *, url: str, model: str | None) -> UpstreamError:
    """The one mapping of an Ollama HTTP error status (the adapter's and the control's)."""
    detail = _error_message(body)
    if status == 404 and model is not None and "model" in detail:
        return OllamaModelNotFound(model, f"HTTP 404: {detail}")
    message = f"Ollama returned HTTP {status} for {url}: {detail}"
    for hint_status, words, hint in _HINTS:
        if status == hint_status and words in detail:
            message += f"; {hint}"
            break
    error = UpstreamError(ErrorCode.UPSTREAM_HTTP_ERROR, message)
    error.retryable = status >= 500 or status in RETRYABLE_STATUS
    return error


class NDJSONDecoder:
    """Raw bytes in, complete lines out (without their ``\\n``); sans-IO.

    ``feed`` returns the lines a chunk completes and holds back the rest; ``close``
    returns a last line the body did not end with ``\\n``. Blank lines are dropped.
    A line longer than ``max_line_bytes`` is ``UPSTREAM_PROTOCOL``.
    """

    __slots__ = ("_max", "_pending", "_pending_size")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._pending: list[bytes] = []  # pieces of the line in progress
        self._pending_size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._hold(chunk)
            return []
        lines = chunk[:end].split(b"\n")
        if self._pending:
            self._hold(lines[0])
            lines[0] = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
        if end + 1 < len(chunk):
            self._hold(chunk[end + 1 :])
        for line in lines:
            if len(line) > self._max:
                raise self._too_long()
        return [line for line in lines if line and not line.isspace()]

    def close(self) -> list[bytes]:
        line = b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        return [line] if line and not line.isspace() else []

    def _hold(self, piece: bytes) -> None:
        self._pending_size += len(piece)
        if self._pending_size > self._max:
            raise self._too_long()
        self._pending.append(piece)

    def _too_long(self) -> UpstreamError:
        return UpstreamError(
            ErrorCode.UPSTREAM_PROTOCOL,
            f"upstream sent an NDJSON line longer than {self._max} bytes",
        )


class ChatLineParser:
    """One stream's ``/api/chat`` lines → :class:`UpstreamDelta` (``None``: nothing for us)."""

    __slots__ = ("_next_index", "_saw_calls")

    def __init__(self) -> None:
        self._next_index = 0
        self._saw_calls = False

    def parse(self, line: bytes) -> UpstreamDelta | None:
        try:
            chunk = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL,
                f"upstream sent a line that is not JSON ({exc.msg}): {_quote(line)}",
            ) from exc
        if type(chunk) is not dict:
            raise _shape_error(line)
        error = chunk.get("error")
        if error is not None:  # Ollama docs, "Errors that occur while streaming"
            raise UpstreamError(
                ErrorCode.UPSTREAM_HTTP_ERROR,
                f"Ollama reported an error mid-stream: {_error_message(line.decode('utf-8'))}",
            )
        text: Any = ""
        calls: tuple[ToolCallDelta, ...] = ()
        message = chunk.get("message")
        if message is not None:
            if type(message) is not dict:
                raise _shape_error(line)
            text = message.get("content") or ""
            if type(text) is not str:
                raise _shape_error(line)
            raw_calls = message.get("tool_calls")
            if raw_calls:  # [] and null mean none
                calls = self._tool_calls(raw_calls, line)
        done = chunk.get("done", False)
        if done is False:
            return UpstreamDelta(text, None, None, calls) if text or calls else None
        if done is not True:
            raise _shape_error(line)
        return UpstreamDelta(text, self._finish(chunk, line), _usage(chunk, line), calls)

    def _tool_calls(self, raw: Any, line: bytes) -> tuple[ToolCallDelta, ...]:
        if type(raw) is not list:
            raise _shape_error(line)
        out: list[ToolCallDelta] = []
        for call in raw:
            function = call.get("function") if type(call) is dict else None
            if type(function) is not dict:
                raise _shape_error(line)
            call_id = call.get("id") or None
            name = function.get("name") or None  # none: the assembler reports the model
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif type(arguments) is dict:
                arguments = orjson.dumps(arguments).decode()  # compact, as OpenAI sends it
            if not (
                (call_id is None or type(call_id) is str)
                and (name is None or type(name) is str)
                and type(arguments) is str
            ):
                raise _shape_error(line)
            # Each call comes whole, so each is its own call: Ollama's function.index is
            # absent on older servers and omitted when 0, so it cannot tell calls apart.
            out.append(ToolCallDelta(self._next_index, call_id, name, arguments))
            self._next_index += 1
        self._saw_calls = True
        return tuple(out)

    def _finish(self, chunk: dict[str, Any], line: bytes) -> str:
        reason = chunk.get("done_reason") or "stop"  # older servers send none
        if type(reason) is not str:
            raise _shape_error(line)
        finish = _FINISH_REASONS.get(reason, reason)
        return "tool_calls" if finish == "stop" and self._saw_calls else finish


def _usage(chunk: dict[str, Any], line: bytes) -> dict[str, Any]:
    # Counts are omitted when zero (Go omitempty), e.g. a prompt served from the cache.
    usage: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0}
    for wire, ours in _USAGE_FIELDS:
        value = chunk.get(wire)
        if value is None:
            continue
        if type(value) is not int or value < 0:
            raise _shape_error(line)
        usage[ours] = value
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _quote(line: bytes) -> str:
    return snippet(line.decode("utf-8", "replace"))


def _shape_error(line: bytes) -> UpstreamError:
    return UpstreamError(
        ErrorCode.UPSTREAM_PROTOCOL, f"upstream line has an unexpected shape: {_quote(line)}"
    )


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    """OpenAI-shaped continuation messages as Ollama wants them; others unchanged."""
    names: dict[str, str] = {}  # tool_call_id -> function name, for the tool messages
    out: list[Any] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            out.append(_assistant_message(message, calls, names))
        elif message.get("role") == "tool":
            name = names.get(message.get("tool_call_id") or "")
            out.append({**message, "tool_name": name} if name is not None else message)
        else:
            out.append(message)
    return out


def _assistant_message(
    message: Mapping[str, Any], calls: Sequence[Mapping[str, Any]], names: dict[str, str]
) -> dict[str, Any]:
    converted: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        function = call.get("function") or {}
        name = function.get("name")
        call_id = call.get("id")
        if isinstance(call_id, str) and isinstance(name, str):
            names[call_id] = name
        item: dict[str, Any] = {
            "type": "function",
            "function": {
                "index": index,
                "name": name,
                "arguments": _arguments_object(function.get("arguments")),
            },
        }
        if call_id:
            item["id"] = call_id
        converted.append(item)
    # Ollama's content is a string; OpenAI's null means "no text".
    return {**message, "content": message.get("content") or "", "tool_calls": converted}


def _arguments_object(arguments: Any) -> Any:
    """OpenAI's arguments (JSON text) as the object Ollama wants; ``{}`` when not one
    (as :func:`toolforge.core.native_tools.assistant_tool_call_message` does)."""
    if isinstance(arguments, Mapping):
        return arguments
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if type(value) is dict else {}
    return {}


def chat_body(
    request: ChatRequest, *, num_ctx: int, keep_alive: str | float | None
) -> dict[str, Any]:
    """The ``/api/chat`` body for ``request``: streamed, ``num_ctx`` always in ``options``
    (nothing in the request can change it), ``keep_alive`` unless ``None``."""
    options: dict[str, Any] = {}
    for field, option in _OPTION_NAMES:
        value = getattr(request, field)
        if value is not None:
            options[option] = value
    if request.stop is not None:
        options["stop"] = list(request.stop)
    extra = {k: v for k, v in request.extra.items() if k not in _OPENAI_ONLY}
    options.update(extra.pop("options", None) or {})
    options["num_ctx"] = num_ctx  # last: the ServerManager's budget always wins
    body: dict[str, Any] = {
        "model": request.model,
        "messages": _messages(wire_messages(request.messages)),
        "stream": True,
        "options": options,
    }
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    body.update(extra)
    return body
