"""The typed frames: the exact JSON the gateway sent before them, a decoder that is their
inverse, the per-token fast path equal to the general one, and schemas that accept
every frame and refuse what is not one."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolforge.core.guarantee import REPAIR_FAILED
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import (
    EVENTS,
    PING_BYTES,
    ContextCompacted,
    Diagnostics,
    Done,
    DoneMetrics,
    Error,
    Frame,
    JsonBegin,
    JsonDelta,
    JsonEnd,
    Ping,
    ResultBegin,
    ResultDelta,
    ResultEnd,
    StepNudge,
    StreamBegin,
    TextDelta,
    ToolCall,
    ToolResult,
    ToolResultError,
    decode,
    encode_frame,
)
from toolforge.core.protocol.schema import STREAM_EVENT, frame_schema, stream_event_definitions
from toolforge.errors import ErrorCode, JSONError, RequestError, SentinelError, ToolForgeError

METRICS: DoneMetrics = {"ttft_ms": 1.25, "duration_ms": 9.5, "tokens_per_s": None, "frames": 7}
DIAGNOSTICS: Diagnostics = {
    "error": "schema_repair_failed",
    "last_validator_errors": [{"path": "$", "message": "m"}],
}
TOOL_ERROR: ToolResultError = {
    "code": ErrorCode.TOOL_FAILED,
    "message": "boom",
    "retryable": False,
}
RESULT_FIGURES: dict[str, Any] = {
    "duration_ms": 3.5,
    "attempts": 1,
    "cached": False,
    "performance_warning": False,
}

# Each typed frame beside the object its producer built by hand before the typed frames
# (the framer, the session and the engine, the executor's frame_data(), ToolForgeError's
# to_dict(), guarantee.end_fields()): the same keys, in the same order.
BEFORE: list[tuple[Frame, dict[str, Any]]] = [
    (
        StreamBegin(stream_id="s_1", model="m", mode="sentinel", budget_tokens=None),
        {"stream_id": "s_1", "model": "m", "mode": "sentinel", "budget_tokens": None},
    ),
    (TextDelta("héllo \u27e6 \n"), {"chunk": "héllo \u27e6 \n"}),
    (JsonBegin("o1", "Action"), {"id": "o1", "schema": "Action"}),
    (JsonDelta("o1", '{"a": "\\u27e6"'), {"id": "o1", "chunk": '{"a": "\\u27e6"'}),
    (
        JsonEnd(id="o1", length=8, value={"a": 1}, repaired=False, degraded=False),
        {"id": "o1", "length": 8, "value": {"a": 1}, "repaired": False, "degraded": False},
    ),
    (
        ResultEnd(
            id="r1", length=2, value={}, repaired=False, degraded=True, diagnostics=DIAGNOSTICS
        ),
        {
            "id": "r1",
            "length": 2,
            "value": {},
            "repaired": False,
            "degraded": True,
            "diagnostics": DIAGNOSTICS,
        },
    ),
    (ResultBegin("r1", "AssistantReply"), {"id": "r1", "schema": "AssistantReply"}),
    (ResultDelta("r1", "}"), {"id": "r1", "chunk": "}"}),
    (
        ToolCall(id="t1", name="places.search", args={"q": "pizza"}),
        {"id": "t1", "name": "places.search", "args": {"q": "pizza"}},
    ),
    (
        ToolCall(id="t2", name="bookings.create", args={}, needs_approval=True),
        {"id": "t2", "name": "bookings.create", "args": {}, "needs_approval": True},
    ),
    (
        ToolResult(id="t1", name="places.search", ok=True, result=None, **RESULT_FIGURES),
        {"id": "t1", "name": "places.search", "ok": True, "result": None, **RESULT_FIGURES},
    ),
    (
        ToolResult(id="t1", name="x", ok=False, error=TOOL_ERROR, **RESULT_FIGURES),
        {"id": "t1", "name": "x", "ok": False, "error": TOOL_ERROR, **RESULT_FIGURES},
    ),
    (
        ToolResult(
            id="t9",
            name="x",
            ok=False,
            error={"code": ErrorCode.TOOL_CALL_LIMIT, "message": "m"},
            duration_ms=0.0,
            attempts=0,
            cached=False,
            performance_warning=False,
        ),
        {
            "id": "t9",
            "name": "x",
            "ok": False,
            "error": {"code": "TOOL_CALL_LIMIT", "message": "m"},
            "duration_ms": 0.0,
            "attempts": 0,
            "cached": False,
            "performance_warning": False,
        },
    ),
    (
        Done(reason="stop", usage={"prompt_tokens": 3}, metrics=METRICS),
        {"reason": "stop", "usage": {"prompt_tokens": 3}, "metrics": METRICS},
    ),
    (
        Error(code=ErrorCode.INTERNAL, message="internal error", retryable=False),
        {"code": "INTERNAL", "message": "internal error", "retryable": False},
    ),
    (
        StepNudge(kind="step", tier=2, message="call places.search first", call_id=None),
        {"kind": "step", "tier": 2, "message": "call places.search first", "call_id": None},
    ),
    (
        ContextCompacted(
            phase=1,
            tokens_before=900,
            tokens_after=400,
            budget_tokens=1000,
            messages_before=12,
            messages_after=12,
        ),
        {
            "phase": 1,
            "tokens_before": 900,
            "tokens_after": 400,
            "budget_tokens": 1000,
            "messages_before": 12,
            "messages_after": 12,
        },
    ),
    (Ping(), {}),
]
IDS = [f"{frame.event}-{i}" for i, (frame, _) in enumerate(BEFORE)]


def dict_encoded(seq: int, event: str, data: dict[str, Any]) -> bytes:
    """How a frame was encoded before the typed frames: its hand-built dict, dumped."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event.encode(), orjson.dumps(data))


@pytest.mark.parametrize(("frame", "before"), BEFORE, ids=IDS)
def test_each_frame_is_byte_for_byte_what_was_sent_before(
    frame: Frame, before: dict[str, Any]
) -> None:
    assert frame.data == before and list(frame.data) == list(before)
    assert encode_frame(7, frame) == dict_encoded(7, frame.event, before)


@pytest.mark.parametrize(("frame", "before"), BEFORE, ids=IDS)
def test_decode_is_the_inverse_and_the_schema_accepts_the_frame(
    frame: Frame, before: dict[str, Any]
) -> None:
    wire = orjson.loads(orjson.dumps(before))
    assert decode(frame.event, wire) == frame
    jsonschema.validate(wire, frame_schema(type(frame)))


@pytest.mark.parametrize(
    "error",
    [
        SentinelError(ErrorCode.END_ID_MISMATCH, "wrong id", frame_id="o1"),
        JSONError(ErrorCode.JSON_SYNTAX, "bad", offset=3, frame_id="r1"),
        RequestError(ErrorCode.BAD_REQUEST, "bad", details=[{"field": "x", "message": "m"}]),
        ToolForgeError(ErrorCode.INTERNAL, "internal error"),
    ],
)
def test_the_error_frame_is_the_errors_own_dict(error: ToolForgeError) -> None:
    frame = Error.of(error)
    assert frame.data == error.to_dict() and list(frame.data) == list(error.to_dict())
    assert encode_frame(1, frame) == dict_encoded(1, "error", error.to_dict())


def test_ping_bytes_are_the_ping_frame_without_an_id() -> None:
    assert PING_BYTES == b"event: ping\ndata: {}\n\n"


def test_degraded_diagnostics_are_the_guarantees_own() -> None:
    assert DIAGNOSTICS["error"] == REPAIR_FAILED


@given(
    fid=st.from_regex(f"{sentinels.ID_CHARS}{{1,{sentinels.MAX_ID_CHARS}}}", fullmatch=True),
    chunk=st.text(),
    seq=st.integers(1, 2**31),
)
def test_the_per_token_fast_path_writes_what_the_general_one_would(
    fid: str, chunk: str, seq: int
) -> None:
    for frame in (TextDelta(chunk), JsonDelta(fid, chunk), ResultDelta(fid, chunk)):
        general = b"id: %d\nevent: %s\ndata: %s\n\n" % (
            seq,
            frame.event.encode(),
            orjson.dumps(frame.data),
        )
        assert encode_frame(seq, frame) == general


@pytest.mark.parametrize(
    ("event", "data", "why"),
    [
        ("nope", {}, "unknown event"),
        ("text.delta", {"chunk": "x", "extra": 1}, "extra"),
        ("text.delta", {}, "chunk"),
        ("json.begin", {"id": "has space", "schema": "A"}, "pattern"),
        ("error", {"code": "NOT_A_CODE", "message": "m", "retryable": True}, "code"),
        ("tool.call", {"id": "t1", "name": "x", "args": {}, "needs_approval": None}, "differ"),
        (
            "tool.result",
            {
                "id": "t",
                "name": "x",
                "ok": True,
                "result": 1,
                "error": TOOL_ERROR,
                **RESULT_FIGURES,
            },
            "differ",
        ),
        (
            "tool.result",
            {"id": "t", "name": "x", "ok": True, "result": 1, **RESULT_FIGURES, "attempts": "1"},
            "differ",
        ),
    ],
)
def test_decode_refuses_what_is_not_that_frame(event: str, data: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode(event, data)


@pytest.mark.parametrize(
    ("cls", "data"),
    [
        (TextDelta, {"chunk": ""}),  # text.delta carries text
        (ToolCall, {"id": "t1", "name": "x", "args": {}, "needs_approval": None}),  # not null
        (ToolResult, {"id": "t", "name": "x", "ok": True, **RESULT_FIGURES}),  # no result
        (ToolResult, {"id": "t", "name": "x", "ok": False, "result": 1, **RESULT_FIGURES}),
        (
            ToolResult,
            {
                "id": "t",
                "name": "x",
                "ok": True,
                "result": 1,
                "error": TOOL_ERROR,
                **RESULT_FIGURES,
            },
        ),
        (
            ToolResult,
            {"id": "t", "name": "x", "ok": True, "result": 1, **RESULT_FIGURES, "attempts": 1.5},
        ),
        (Done, {"reason": "stop", "usage": {}, "metrics": {"frames": 3}}),  # incomplete metrics
        (StreamBegin, {"stream_id": "s", "model": "m", "mode": "magic", "budget_tokens": 1}),
        (JsonEnd, {"id": "o1", "length": -1, "value": 1, "repaired": False, "degraded": False}),
        (StepNudge, {"kind": "step", "tier": 4, "message": "m", "call_id": None}),
        (Ping, {"x": 1}),
    ],
)
def test_the_schemas_are_tight(cls: type[Frame], data: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, frame_schema(cls))


def test_the_stream_event_union_names_every_event_and_pings_have_no_id() -> None:
    definitions = stream_event_definitions()
    union = definitions[STREAM_EVENT]
    assert set(union["discriminator"]["mapping"]) == set(EVENTS)
    document = {"$ref": f"#/$defs/{STREAM_EVENT}", "$defs": definitions}
    validator = jsonschema.Draft202012Validator(document)
    for frame, before in BEFORE:
        event: dict[str, Any] = {"event": frame.event, "data": before}
        if frame.event != "ping":
            event["id"] = 3
        assert validator.is_valid(event), frame
    assert not validator.is_valid({"id": 1, "event": "ping", "data": {}})
    assert not validator.is_valid({"event": "text.delta", "data": {"chunk": "x"}})
    assert not validator.is_valid({"id": 1, "event": "text.delta", "data": {"id": "o1"}})
