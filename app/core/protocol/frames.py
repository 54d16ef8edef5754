"""The frames of the wire protocol (docs/protocol.md): one typed value per SSE event, and their
encoding. Pure functions and values, no I/O.

Theory of operation
-------------------
Each event the gateway sends is a frozen dataclass here: its SSE event name is the class
variable ``event`` and its JSON object is the ``data`` property. The fields are the
object's keys in the order they go on the wire, so ``data`` is the exact object the
client receives, byte for byte once encoded. A field whose default is ``None`` is
*absent unless set*: ``data`` leaves it out while it is ``None``. Those are the optional
keys (``needs_approval``, ``frame_id``, out-of-band ``diagnostics``) and the keys docs/protocol.md
lists that this gateway does not send yet (``tool.call``'s ``executor`` and ``rescued``,
``done``'s ``workflow``); a key that may be ``null`` on the wire (``budget_tokens``) has
no default.

The session numbers frames (the SSE ``id``, strictly increasing from 1) and
:func:`encode_frame` encodes each exactly once, into the bytes that are written, replayed
on resume and replayed for an idempotent retry, so those are byte-identical by
construction. :func:`decode` is the way back, validating as it goes. The frames' JSON
Schemas (``schemas/frames/``, the OpenAPI document) are generated from these classes by
:mod:`toolforge.core.protocol.schema`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, NotRequired, TypeAlias

import orjson
from pydantic import ConfigDict, Field, NonNegativeFloat, NonNegativeInt, TypeAdapter, with_config

# pydantic reads TypedDicts from typing_extensions only, before Python 3.12.
from typing_extensions import TypedDict

from toolforge.core.protocol.sentinels import ID_CHARS, MAX_ID_CHARS, MAX_NAME_CHARS
from toolforge.errors import ErrorCode, ToolForgeError

__all__ = [
    "CONTEXT_COMPACTED",
    "DONE",
    "ERROR",
    "EVENTS",
    "JSON_BEGIN",
    "JSON_DELTA",
    "JSON_END",
    "PING",
    "PING_BYTES",
    "REASONING_DELTA",
    "RESULT_BEGIN",
    "RESULT_DELTA",
    "RESULT_END",
    "STEP_NUDGE",
    "STREAM_BEGIN",
    "STREAM_PAUSED",
    "STREAM_RESUMED",
    "TEXT_DELTA",
    "TOOL_CALL",
    "TOOL_RESULT",
    "ContextCompacted",
    "Diagnostics",
    "Done",
    "DoneMetrics",
    "Error",
    "Frame",
    "JsonBegin",
    "JsonDelta",
    "JsonEnd",
    "ModeName",
    "Ping",
    "ReasoningDelta",
    "ResultBegin",
    "ResultDelta",
    "ResultEnd",
    "SchemaViolation",
    "StepNudge",
    "StreamBegin",
    "StreamPaused",
    "StreamResumed",
    "TextDelta",
    "ToolCall",
    "ToolResult",
    "ToolResultError",
    "decode",
    "encode_frame",
]

STREAM_BEGIN: Final = "stream.begin"
TEXT_DELTA: Final = "text.delta"
REASONING_DELTA: Final = "reasoning.delta"
JSON_BEGIN: Final = "json.begin"
JSON_DELTA: Final = "json.delta"
JSON_END: Final = "json.end"
TOOL_CALL: Final = "tool.call"
TOOL_RESULT: Final = "tool.result"
RESULT_BEGIN: Final = "result.begin"
RESULT_DELTA: Final = "result.delta"
RESULT_END: Final = "result.end"
STEP_NUDGE: Final = "step.nudge"
CONTEXT_COMPACTED: Final = "context.compacted"
STREAM_PAUSED: Final = "stream.paused"
STREAM_RESUMED: Final = "stream.resumed"
ERROR: Final = "error"
DONE: Final = "done"
PING: Final = "ping"

ModeName: TypeAlias = Literal["sentinel", "constrained", "native"]

# Ids and names of OBJECT and RESULT frames come from their sentinels, so they keep the
# sentinel grammar. Tool calls do not: native mode takes the upstream's own ids and names.
_FrameId = Annotated[str, Field(pattern=f"^{ID_CHARS}{{1,{MAX_ID_CHARS}}}$")]
_SchemaName = Annotated[str, Field(pattern=f"^{ID_CHARS}{{1,{MAX_NAME_CHARS}}}$")]


class _TypedFrame:
    """What every typed frame has: ``event`` and ``data`` (see the module docstring)."""

    __slots__ = ()
    # Frames are closed objects: an unknown key is an error in decode() and in the schemas.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")
    event: ClassVar[str]

    @property
    def data(self) -> dict[str, object]:
        """The frame's JSON object: every field in order, those absent unless set left out."""
        out: dict[str, object] = {}
        for name, optional in _KEYS[type(self)]:
            value = getattr(self, name)
            if value is not None or not optional:
                out[name] = value
        return out


# -- the objects inside frames ------------------------------------------------------------


@with_config(ConfigDict(extra="forbid"))
class SchemaViolation(TypedDict):
    """One reason a value failed its schema (``toolforge.core.guarantee.ValidatorError``)."""

    path: str
    message: str


@with_config(ConfigDict(extra="forbid"))
class Diagnostics(TypedDict):
    """Why an END value is degraded: the repair failed (docs/protocol.md)."""

    error: Literal["schema_repair_failed"]
    last_validator_errors: list[SchemaViolation]


@with_config(ConfigDict(extra="forbid"))
class ToolResultError(TypedDict):
    """Why a tool call has no result: a tool error (``ToolError.to_dict()``, with
    ``retryable`` and maybe ``details``) or a refusal before it ran (code and message)."""

    code: ErrorCode
    message: str
    retryable: NotRequired[bool]
    details: NotRequired[list[dict[str, str]]]


@with_config(ConfigDict(extra="forbid"))
class DoneMetrics(TypedDict):
    """The stream's headline figures; metrics.json has the rest."""

    ttft_ms: float | None
    duration_ms: float
    tokens_per_s: float | None
    frames: int


# -- the frames -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamBegin(_TypedFrame):
    """Always the first frame (id 1). ``budget_tokens``: the context budget the gateway
    chose for a managed model server (docs/servers.md), null for a remote upstream."""

    event: ClassVar[str] = STREAM_BEGIN
    stream_id: str
    model: str
    mode: ModeName
    budget_tokens: NonNegativeInt | None
    # Where budget_tokens came from (docs/context.md): the gateway's decision for the server it
    # manages, CTX_BUDGET_TOKENS (manual), the upstream's own report, or the workflow's.
    budget_source: Literal["server_manager", "manual", "upstream", "workflow"] | None = None


@dataclass(frozen=True, slots=True)
class TextDelta(_TypedFrame):
    """Free text outside frames, sent as soon as it cannot be part of a sentinel."""

    event: ClassVar[str] = TEXT_DELTA
    chunk: Annotated[str, Field(min_length=1)]


@dataclass(frozen=True, slots=True)
class ReasoningDelta(_TypedFrame):
    """The model's reasoning (``<think>…</think>``, or the upstream's own
    ``reasoning_content``), kept apart from its answer. Sent where reasoning is separated:
    by the OpenAI-compatible proxy, which returns it as ``reasoning_content`` (docs/proxy.md)."""

    event: ClassVar[str] = REASONING_DELTA
    chunk: Annotated[str, Field(min_length=1)]


@dataclass(frozen=True, slots=True)
class _BodyBegin(_TypedFrame):
    id: _FrameId
    schema: _SchemaName


@dataclass(frozen=True, slots=True)
class _BodyDelta(_TypedFrame):
    # A sentinel id: the framer takes it from a BEGIN the tokenizer accepted, and
    # encode_frame() writes it without JSON escaping, which those characters never need.
    id: _FrameId
    chunk: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _BodyEnd(_TypedFrame):
    id: _FrameId
    length: NonNegativeInt
    value: object
    repaired: bool
    degraded: bool
    diagnostics: Diagnostics | None = None


@dataclass(frozen=True, slots=True)
class JsonBegin(_BodyBegin):
    """An OBJECT frame opened; ``schema`` names the schema its value is held to."""

    event: ClassVar[str] = JSON_BEGIN


@dataclass(frozen=True, slots=True)
class JsonDelta(_BodyDelta):
    """A piece of the open OBJECT frame's body (JSON text), in order."""

    event: ClassVar[str] = JSON_DELTA


@dataclass(frozen=True, slots=True, kw_only=True)
class JsonEnd(_BodyEnd):
    """The OBJECT frame's END: ``value`` is valid against its schema, ``length`` is the
    body's UTF-8 bytes. Degraded (the repair failed, docs/protocol.md): ``value`` is the minimal
    valid object, with ``diagnostics`` inside it, or beside it (this frame's
    ``diagnostics``) when the schema has no room for them."""

    event: ClassVar[str] = JSON_END


@dataclass(frozen=True, slots=True)
class ResultBegin(_BodyBegin):
    """The RESULT frame opened; ``schema`` is the name the model wrote."""

    event: ClassVar[str] = RESULT_BEGIN


@dataclass(frozen=True, slots=True)
class ResultDelta(_BodyDelta):
    """A piece of the RESULT frame's body (JSON text), in order."""

    event: ClassVar[str] = RESULT_DELTA


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultEnd(_BodyEnd):
    """The RESULT frame's END: ``value`` is valid against the request's
    ``result_schema``; repaired and degraded as for ``json.end``."""

    event: ClassVar[str] = RESULT_END


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall(_TypedFrame):
    """A tool call whose END arrived and whose arguments parsed strictly; the model is
    paused until its ``tool.result``. ``needs_approval`` is sent (true) only for a call
    that waits for ``POST …/approvals/{id}``. ``executor`` and ``rescued`` (docs/protocol.md) are
    not sent yet: absent unless set."""

    event: ClassVar[str] = TOOL_CALL
    id: str
    name: str
    args: object
    needs_approval: bool | None = None
    executor: Literal["server", "client"] | None = None
    rescued: bool | None = None


# ok: true carries ``result`` (any JSON, null included), ok: false carries ``error``.
_RESULT_OR_ERROR: Final[dict[str, Any]] = {
    "oneOf": [
        {"properties": {"ok": {"const": True}}, "required": ["result"]},
        {"properties": {"ok": {"const": False}}, "required": ["error"]},
    ],
    "not": {"required": ["result", "error"]},
}


@with_config(ConfigDict(extra="forbid", json_schema_extra=_RESULT_OR_ERROR))
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult(_TypedFrame):
    """The outcome of a tool call, or its refusal (``ok`` false, ``attempts`` 0); the model
    resumes next. ``duration_ms`` covers the attempts and retry delays, not queueing."""

    event: ClassVar[str] = TOOL_RESULT
    id: str
    name: str
    ok: bool
    result: object = None
    error: ToolResultError | None = None
    duration_ms: NonNegativeFloat
    attempts: NonNegativeInt
    cached: bool
    performance_warning: bool

    @property
    def data(self) -> dict[str, object]:
        """``result`` when ``ok`` (even a null one), ``error`` otherwise: never both."""
        out: dict[str, object] = {"id": self.id, "name": self.name, "ok": self.ok}
        if self.ok:
            out["result"] = self.result
        else:
            out["error"] = self.error
        out["duration_ms"] = self.duration_ms
        out["attempts"] = self.attempts
        out["cached"] = self.cached
        out["performance_warning"] = self.performance_warning
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StepNudge(_TypedFrame):
    """A workflow correction sent to the model (docs/workflows.md), each tier firmer; ``call_id``
    is the tool call it answers, null for a turn without one."""

    event: ClassVar[str] = STEP_NUDGE
    kind: str
    tier: Annotated[int, Field(ge=1, le=3)]
    message: str
    call_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCompacted(_TypedFrame):
    """The history sent to the model was compacted to fit its budget (docs/context.md)."""

    event: ClassVar[str] = CONTEXT_COMPACTED
    phase: Annotated[int, Field(ge=1)]
    tokens_before: NonNegativeInt
    tokens_after: NonNegativeInt
    budget_tokens: NonNegativeInt
    messages_before: NonNegativeInt
    messages_after: NonNegativeInt


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamPaused(_TypedFrame):
    """A client paused the stream (``POST /v1/streams/{id}/pause``, or ``pause`` on its
    socket): the gateway reads nothing more from the model until ``stream.resumed``, for
    ``max_ms`` at the most (``PAUSE_MAX_S``). Frames already made still come."""

    event: ClassVar[str] = STREAM_PAUSED
    max_ms: NonNegativeInt


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamResumed(_TypedFrame):
    """The model is read again after ``paused_ms``: a client resumed it (``reason``
    ``resumed``), or the pause reached ``PAUSE_MAX_S`` (``pause_limit``)."""

    event: ClassVar[str] = STREAM_RESUMED
    reason: Literal["resumed", "pause_limit"]
    paused_ms: NonNegativeInt


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(_TypedFrame):
    """Something failed after the response headers: errors are frames, never a 500.
    At most one, right before ``done``. The same object as an HTTP error body's
    ``error`` (``ToolForgeError.to_dict()``)."""

    event: ClassVar[str] = ERROR
    code: ErrorCode
    message: str
    retryable: bool
    frame_id: str | None = None
    details: list[dict[str, str]] | None = None

    @classmethod
    def of(cls, exc: ToolForgeError) -> Error:
        """The error frame that reports ``exc``."""
        return cls(
            code=exc.code,
            message=exc.message,
            retryable=exc.retryable,
            frame_id=exc.frame_id,
            details=exc.details,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(_TypedFrame):
    """Exactly one, always last. ``reason``: stop, length, error, cancelled,
    client_disconnected or shutdown (docs/protocol.md §6); ``usage``: the upstream's token
    counts summed over the stream's calls, or ``{"completion_chunks": n}``. ``workflow``
    (docs/protocol.md): a workflow run's summary (its steps, iterations, nudges, rescues); absent
    for other streams."""

    event: ClassVar[str] = DONE
    reason: str
    usage: Mapping[str, object]
    metrics: DoneMetrics
    workflow: Mapping[str, object] | None = None
    # What the small-model guardrails did (docs/workflows.md: rescues, nudges, respond calls, ...),
    # counted by kind; absent when none acted.
    guardrails: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Ping(_TypedFrame):
    """A keep-alive every ``PING_INTERVAL_S``, from the first byte. It has no SSE ``id``:
    it is not a frame of the stream's sequence, so it never moves a client's
    ``Last-Event-ID``, is never replayed and never makes two replays differ."""

    event: ClassVar[str] = PING


Frame: TypeAlias = (
    StreamBegin
    | TextDelta
    | ReasoningDelta
    | JsonBegin
    | JsonDelta
    | JsonEnd
    | ToolCall
    | ToolResult
    | ResultBegin
    | ResultDelta
    | ResultEnd
    | StepNudge
    | ContextCompacted
    | StreamPaused
    | StreamResumed
    | Error
    | Done
    | Ping
)

EVENTS: Final[Mapping[str, type[Frame]]] = {
    cls.event: cls
    for cls in (
        StreamBegin,
        TextDelta,
        ReasoningDelta,
        JsonBegin,
        JsonDelta,
        JsonEnd,
        ToolCall,
        ToolResult,
        ResultBegin,
        ResultDelta,
        ResultEnd,
        StepNudge,
        ContextCompacted,
        StreamPaused,
        StreamResumed,
        Error,
        Done,
        Ping,
    )
}
"""Every typed frame class by its SSE event name, in docs/protocol.md's order."""

# Each class's fields, and whether each is absent unless set (its default is None).
_KEYS: Final[Mapping[type[_TypedFrame], tuple[tuple[str, bool], ...]]] = {
    cls: tuple((f.name, f.default is None) for f in dataclasses.fields(cls))
    for cls in EVENTS.values()
}
# What decode() validates with, built on first use (a few ms for every class).
_ADAPTERS: dict[str, TypeAdapter[Any]] = {}

PING_BYTES: Final = b"event: %s\ndata: %s\n\n" % (PING.encode(), orjson.dumps(Ping().data))
"""A whole ping, written as is: no ``id:`` line (see :class:`Ping`)."""

# The frames sent once per model token are encoded from templates rather than from a
# dict built and serialised. timeit, a 12-character chunk, best of 15 on a busy 2-core
# machine: text.delta 0.18 µs against 0.22 µs for the untyped frame's dict, json.delta
# and result.delta 0.23 µs, as before; a dict built from the typed fields would cost
# 0.29-0.32 µs, and orjson's own path for slotted dataclasses 0.39 µs. The id of a body
# delta goes in without JSON escaping: it is a sentinel id (see _BodyDelta), whose
# characters JSON writes as they are.
_TEXT_DELTA_SSE: Final = b'id: %d\nevent: text.delta\ndata: {"chunk":%s}\n\n'
_JSON_DELTA_SSE: Final = b'id: %d\nevent: json.delta\ndata: {"id":"%s","chunk":%s}\n\n'
_RESULT_DELTA_SSE: Final = b'id: %d\nevent: result.delta\ndata: {"id":"%s","chunk":%s}\n\n'


def encode_frame(seq: int, frame: Frame) -> bytes:
    """``id: <seq>``, ``event: <name>`` and one compact ``data:`` line.

    orjson escapes every control character inside strings, so the JSON never contains a
    raw CR or LF and one ``data:`` line always suffices (SSE splits events on those).
    A ping is not numbered: it is written as :data:`PING_BYTES`.
    """
    if type(frame) is TextDelta:
        return _TEXT_DELTA_SSE % (seq, orjson.dumps(frame.chunk))
    if type(frame) is ResultDelta:
        return _RESULT_DELTA_SSE % (seq, frame.id.encode(), orjson.dumps(frame.chunk))
    if type(frame) is JsonDelta:
        return _JSON_DELTA_SSE % (seq, frame.id.encode(), orjson.dumps(frame.chunk))
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        seq,
        frame.event.encode(),
        orjson.dumps(frame.data),
    )


def decode(event: str, data: Mapping[str, Any]) -> Frame:
    """The typed frame of an SSE event and its decoded JSON object.

    Validates as the frame's JSON Schema does: required keys, types, no unknown keys, and
    ``data`` gives back exactly ``data`` (so no ``null`` where a key is absent unless
    set, no ``error`` beside a ``result``). Raises ``ValueError`` for an unknown event or
    an object that is not that frame's.
    """
    adapter = _ADAPTERS.get(event)
    if adapter is None:
        cls = EVENTS.get(event)
        if cls is None:
            raise ValueError(f"unknown event {event!r}; known: {', '.join(EVENTS)}")
        adapter = _ADAPTERS[event] = TypeAdapter(cls)
    frame: Frame = adapter.validate_python(data)
    if frame.data != data:
        keys = sorted(set(data).symmetric_difference(frame.data)) or "values"
        raise ValueError(f"not a {event} frame as the gateway sends it: {keys} differ")
    return frame
