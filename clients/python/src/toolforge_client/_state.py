"""What the sync and async clients share, without I/O: events, the request body, what a
stream has received so far, which callbacks an event calls, and what it asks the client
to do (run a client tool, ask for an approval)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict

from pydantic import ValidationError

from toolforge_client.errors import APIError, StreamError, UpstreamError
from toolforge_client.frames import (
    FRAME_TYPES,
    Done,
    Error,
    Frame_,
    JsonEnd,
    ResultEnd,
    StreamBegin,
    TextDelta,
    ToolCall,
    ToolResult,
)
from toolforge_client.tools import ClientTool, ToolFunction, as_client_tool

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "Callbacks",
    "Event",
    "Plan",
    "StreamOptions",
    "StreamResult",
    "StreamState",
    "Transport",
    "backoff_s",
    "build_body",
    "plan",
]

# How a stream travels: SSE responses and HTTP posts, or one WebSocket for both ways.
Transport = Literal["sse", "ws"]

DEFAULT_TOOL_TIMEOUT_S: Final = 60.0  # under the gateway's CLIENT_TOOL_TIMEOUT_MS (120 s)


@dataclass(frozen=True, slots=True)
class Event:
    """One frame of the stream: ``id`` its SSE id (its position, from 1), ``event`` its
    name, ``data`` its typed model (``frames.FRAME_TYPES[event]``)."""

    id: int
    event: str
    data: Frame_


@dataclass
class StreamResult:
    """Everything a stream delivered. ``value`` is the RESULT frame's validated value."""

    stream_id: str | None = None
    events: list[Event] = field(default_factory=list)
    objects: list[JsonEnd] = field(default_factory=list)
    result: ResultEnd | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    error: Error | None = None
    done: Done | None = None
    last_event_id: int = 0
    resumes: int = 0  # reconnections after a dropped connection
    text_parts: list[str] = field(default_factory=list, repr=False)

    @property
    def text(self) -> str:
        """The free text (every ``text.delta``), joined."""
        if len(self.text_parts) > 1:
            self.text_parts[:] = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""

    @property
    def value(self) -> Any:
        return self.result.value if self.result is not None else None

    def raise_for_error(self) -> None:
        """Raise the :class:`StreamError` for the stream's ``error`` frame, if any."""
        if self.error is None:
            return
        cls = UpstreamError if self.error.code.startswith("UPSTREAM_") else StreamError
        raise cls(
            self.error.code,
            self.error.message,
            retryable=self.error.retryable,
            frame_id=self.error.frame_id,
            result=self,
        )


class StreamState:
    """Reads SSE events into :class:`Event` s and a :class:`StreamResult`: pings are left
    out, and a frame already seen (by id) is dropped, so that a resume can never deliver
    one twice."""

    def __init__(self, stream_id: str | None = None, last_event_id: int = 0) -> None:
        self.result = StreamResult(stream_id=stream_id, last_event_id=last_event_id)

    @property
    def finished(self) -> bool:
        return self.result.done is not None

    def accept(self, event: str, sse_id: str, data: str | Any) -> Event | None:
        """One frame: ``data`` the SSE data line, or its value already parsed (the
        WebSocket's frames)."""
        if event == "ping" or not sse_id.isdigit():
            return None
        seq = int(sse_id)
        if seq <= self.result.last_event_id:
            return None
        cls = FRAME_TYPES.get(event, Frame_)
        try:
            if isinstance(data, str):
                data = json.loads(data) if data else {}
            frame = cls.model_validate(data)
        except (ValueError, ValidationError) as exc:
            raise APIError(
                f"the gateway sent a malformed {event!r} frame (id {seq}): {exc}"
            ) from exc
        ev = Event(seq, event, frame)
        r = self.result
        r.last_event_id = seq
        r.events.append(ev)
        match frame:
            case StreamBegin():
                r.stream_id = frame.stream_id
            case TextDelta():
                r.text_parts.append(frame.chunk)
            case JsonEnd():
                r.objects.append(frame)
            case ResultEnd():
                r.result = frame
            case ToolCall():
                r.tool_calls.append(frame)
            case ToolResult():
                r.tool_results.append(frame)
            case Error():
                r.error = frame
            case Done():
                r.done = frame
        return ev


Callback = Callable[[Any], Any]


@dataclass(frozen=True)
class Callbacks:
    """The callbacks of a stream; each may be sync or (on the async client) async.

    ``on_event(event)`` every frame; ``on_text(chunk)``; ``on_json(JsonEnd)`` each OBJECT;
    ``on_result(ResultEnd)``; ``on_tool_call(ToolCall)`` every call, server or client;
    ``on_tool_result(ToolResult)``; ``on_approval(ToolCall) -> bool`` for a call that
    needs approval (its answer is posted for you).
    """

    on_event: Callback | None = None
    on_text: Callback | None = None
    on_json: Callback | None = None
    on_result: Callback | None = None
    on_tool_call: Callback | None = None
    on_tool_result: Callback | None = None
    on_approval: Callback | None = None

    def calls(self, ev: Event) -> list[tuple[Callback, Any]]:
        out: list[tuple[Callback, Any]] = []
        if self.on_event is not None:
            out.append((self.on_event, ev))
        frame = ev.data
        if isinstance(frame, TextDelta) and self.on_text is not None:
            out.append((self.on_text, frame.chunk))
        for kind, callback in (
            (JsonEnd, self.on_json),
            (ResultEnd, self.on_result),
            (ToolCall, self.on_tool_call),
            (ToolResult, self.on_tool_result),
        ):
            if isinstance(frame, kind) and callback is not None:
                out.append((callback, frame))
        return out


def build_body(
    *,
    input: str | None,
    messages: Sequence[Mapping[str, Any]] | None,
    tools: Sequence[str] | None,
    client_tools: Iterable[ClientTool | ToolFunction | Mapping[str, Any]],
    on_disconnect: str | None,
    extra: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, ClientTool]]:
    """The ``POST /v1/stream`` body, and the client tools by name. ``extra``: the other
    fields (``result_schema``, ``mode``, …), those that are None left out."""
    if (input is None) == (messages is None):
        raise ValueError("give input= or messages=, not both and not neither")
    body: dict[str, Any] = {"input": input} if input is not None else {"messages": messages}
    if tools is not None:
        body["tools"] = list(tools)
    declared = [as_client_tool(t) for t in client_tools]
    by_name = {t.name: t for t in declared}
    if len(by_name) != len(declared):
        raise ValueError("two client tools have the same name")
    if declared:
        body["client_tools"] = [t.to_wire() for t in declared]
    if on_disconnect is not None:
        body["on_disconnect"] = on_disconnect
    body.update({k: v for k, v in extra.items() if v is not None})
    return body, by_name


def backoff_s(attempt: int) -> float:
    """The wait before resume attempt ``attempt`` (1, 2, …): 0.1 s doubling, at most 2 s."""
    return float(min(0.1 * 2 ** (attempt - 1), 2.0))


class StreamOptions(TypedDict, total=False):
    """The keyword arguments of ``stream``/``run``: the request fields of
    docs/protocol.md §5 (``extra_body`` for any other), then the SDK's own."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[str]
    client_tools: Iterable[ClientTool | ToolFunction | Mapping[str, Any]]
    result_schema: str
    object_schemas: Sequence[str | Mapping[str, Any]]
    mode: str
    sampling: Mapping[str, Any]
    profile: str
    model: str
    max_tool_calls: int
    workflow: str | Mapping[str, Any]
    on_disconnect: str
    idempotency_key: str
    extra_body: Mapping[str, Any]
    timeout: float
    tool_timeout: float
    transport: Transport
    on_event: Callback
    on_text: Callback
    on_json: Callback
    on_result: Callback
    on_tool_call: Callback
    on_tool_result: Callback
    on_approval: Callback


_SDK_OPTIONS: Final = frozenset(
    {
        "client_tools",
        "on_disconnect",
        "idempotency_key",
        "extra_body",
        "timeout",
        "tool_timeout",
        "transport",
    }
)
_REQUEST_FIELDS: Final = (
    frozenset(StreamOptions.__annotations__)
    - _SDK_OPTIONS
    - frozenset(Callbacks.__dataclass_fields__)
)


@dataclass(frozen=True)
class Plan:
    """A stream to start: the body, headers, client tools, callbacks and timeouts."""

    body: dict[str, Any]
    headers: dict[str, str]
    tools: dict[str, ClientTool]
    callbacks: Callbacks
    timeout: float | None
    tool_timeout: float | None
    transport: Transport = "sse"


def plan(max_resumes: int, input: str | None, options: StreamOptions) -> Plan:
    """Check ``options`` and turn them into a :class:`Plan`. ``on_disconnect`` defaults to
    ``continue`` when the client resumes, so that a dropped connection does not end the
    stream on the gateway."""
    unknown = set(options) - set(StreamOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; use extra_body= for new fields")
    on_disconnect = options.get("on_disconnect")
    if on_disconnect is None and max_resumes > 0:
        on_disconnect = "continue"
    extra: dict[str, Any] = {k: v for k, v in options.items() if k in _REQUEST_FIELDS}
    extra.pop("messages", None)
    extra.pop("tools", None)
    extra.update(options.get("extra_body") or {})
    body, tools = build_body(
        input=input,
        messages=options.get("messages"),
        tools=options.get("tools"),
        client_tools=options.get("client_tools", ()),
        on_disconnect=on_disconnect,
        extra=extra,
    )
    key = options.get("idempotency_key")
    transport = options.get("transport", "sse")
    if transport not in ("sse", "ws"):
        raise ValueError(f"transport={transport!r}: 'sse' or 'ws'")
    if transport == "ws" and key:
        raise ValueError("idempotency_key= needs transport='sse': a socket's start has none")
    callbacks = Callbacks(
        **{k: v for k, v in options.items() if k in Callbacks.__dataclass_fields__}  # type: ignore[arg-type]
    )
    return Plan(
        body,
        {"Idempotency-Key": key} if key else {},
        tools,
        callbacks,
        options.get("timeout"),
        options.get("tool_timeout"),
        transport,
    )
