"""The invariant checks catch what they claim to: each broken stream below is reported, and
a good one is not. Without this, a conformance suite could be green by checking nothing."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.conformance.checks import Findings, check_stream, frame_schema_errors
from toolforge.eval.conformance.match import matches

BEGIN = {"stream_id": "s_1", "model": "m", "mode": "sentinel", "budget_tokens": None}
ARGS = {"query": "pizza"}
RESULT_OK = {"id": "t1", "name": "places.search", "ok": True, "result": {}, "duration_ms": 1.0,
             "attempts": 1, "cached": False, "performance_warning": False}  # fmt: skip


def stream(*body: tuple[str, dict[str, Any]], reason: str = "stop") -> list[dict[str, Any]]:
    events = [("stream.begin", BEGIN), *body]
    n = len(events) + 1
    done = {"reason": reason, "usage": {}, "metrics": metrics(n)}
    return [
        {"id": i, "event": e, "data": d} for i, (e, d) in enumerate([*events, ("done", done)], 1)
    ]


def metrics(frames: int) -> dict[str, Any]:
    return {"ttft_ms": 1.0, "duration_ms": 2.0, "tokens_per_s": None, "frames": frames}


def result_frames(body: str, value: object, **end: object) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("result.begin", {"id": "r1", "schema": "AssistantReply"}),
        ("result.delta", {"id": "r1", "chunk": body}),
        ("result.end", {"id": "r1", "length": len(body.encode()), "value": value,
                        "repaired": False, "degraded": False, **end}),
    ]  # fmt: skip


CALL_TEXT = sentinels.begin(FrameKind.TOOL_CALL, "t1", "places.search") + '{"query": "pizza"}'
CALL_END = sentinels.end(FrameKind.TOOL_CALL, "t1")
GOOD = stream(
    ("text.delta", {"chunk": "hi "}),
    ("tool.call", {"id": "t1", "name": "places.search", "args": ARGS}),
    ("tool.result", RESULT_OK),
    *result_frames('{"answer": "a"}', {"answer": "a"}),
)


def findings_of(frames: list[dict[str, Any]], scripts: list[str] | None = None) -> Findings:
    out = Findings()
    script = scripts if scripts is not None else [CALL_TEXT + CALL_END]
    check_stream(frames, {"input": "x"}, out, script_texts=script)
    return out


def test_a_good_stream_passes() -> None:
    assert findings_of(GOOD).failures == []


def _renumber(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [{**f, "id": i} for i, f in enumerate(frames, 1)]
    out[-1]["data"] = {**out[-1]["data"], "metrics": metrics(len(out))}
    return out


@pytest.mark.parametrize(
    ("frames", "scripts", "needle"),
    [
        ([*GOOD[:2], {**GOOD[2], "id": 4}, *GOOD[3:]], None, "ids are not 1..n"),
        (_renumber([GOOD[1], GOOD[0], *GOOD[2:]]), None, "not stream.begin"),
        (_renumber([*GOOD, GOOD[-1]]), None, "2 done frames"),
        (_renumber([*GOOD[:3], *GOOD[4:]]), None, "not followed by its tool.result"),
        (_renumber([*GOOD[:2], *GOOD[3:]]), None, "no tool.call announced"),
        (GOOD, [CALL_TEXT], "came before its END"),
        (GOOD, [f'{CALL_TEXT[:-2]}"x"}}{CALL_END}'], "not the body"),
        (stream(*result_frames('{"answer": 1}', {"answer": 1})), None, "schema: result r1"),
        (stream(*result_frames('{"a": "b"}', {"answer": "b"})), None, "not what its deltas"),
        (stream(*result_frames("{}", {"answer": "x"}, length=9)), None, "length 9"),
        (stream(*result_frames("{}", {"answer": "x"}, degraded=True)), None, "without diagnost"),
        (stream(("text.delta", {"chunk": sentinels.end(FrameKind.RESULT, "r1")})), None, "as text"),
        (stream(*result_frames("{}", {})[:2]), None, "never ended"),
        (stream(("error", {"code": "X", "message": "m", "retryable": True})), None, "done.reason"),
        (stream(("tool.result", {**RESULT_OK, "result": "\u27e6"})), None, "sentinel character"),
        (stream(("tool.call", {"id": "t1", "name": "x"})), None, "tool.call.json: (data): 'args'"),
        (stream(("text.delta", {"chunk": "a", "raw": 1})), None, "text.delta.json: (data): Add"),
        (stream(("json.delta", {"id": "o 1", "chunk": ""})), None, "json.delta.json: id: 'o 1'"),
        (stream(("shout", {})), None, "breaks schemas/frames/shout.json: no such event"),
    ],
)
def test_each_broken_stream_is_caught(
    frames: list[dict[str, Any]], scripts: list[str] | None, needle: str
) -> None:
    failures = findings_of(frames, scripts).failures
    assert any(needle in f for f in failures), failures


def test_the_frame_schema_check_names_each_broken_key() -> None:
    assert frame_schema_errors("tool.result", RESULT_OK) == []
    bad = {**RESULT_OK, "attempts": -1, "cached": "no"}
    assert frame_schema_errors("tool.result", bad) == [
        "attempts: -1 is less than the minimum of 0",
        "cached: 'no' is not of type 'boolean'",
    ]


def test_schema_failures_are_counted_apart() -> None:
    out = findings_of(stream(*result_frames('{"answer": 1}', {"answer": 1})))
    assert out.schema_failures == 1


@pytest.mark.parametrize(
    ("expected", "actual", "ok"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": 0}, {"a": 0.0}, True),
        ([1, 2], [1, 2, 3], False),
        ({"a": {"$absent": True}}, {"b": 1}, True),
        ({"a": {"$absent": True}}, {"a": None}, False),
        ({"$contains": "ell"}, "hello", True),
        ({"$contains": {"id": "x"}}, [{"id": "y"}, {"id": "x", "n": 1}], True),
        ({"$excludes": "z"}, "hello", True),
        ({"$gte": 2, "$lte": 3}, 4, False),
        ({"$type": "number"}, 3, True),
        ({"$len": 2}, "ab", True),
        ({"$one_of": ["stop", "length"]}, "error", False),
        ({"$regex": "^s_"}, "s_1", True),
    ],
)
def test_matching(expected: object, actual: object, ok: bool) -> None:
    assert matches(expected, actual) is ok
