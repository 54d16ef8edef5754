"""The case format's shorthands expand to the scripted upstream's own format, and typos in a
case are errors, not silently weaker cases."""

from __future__ import annotations

import re
from typing import Any

import pytest

from toolforge.core.protocol.sentinels import CLOSE, OPEN
from toolforge.eval.conformance.case import CaseFormatError, expand_script, expand_value, parse_case
from toolforge.eval.scripted_upstream import Script

LB, RB = OPEN, CLOSE  # the goldens below spell the sentinels out, as a model writes them


def texts(script: dict[str, Any]) -> list[str]:
    return [s["text"] for s in script["steps"] if "text" in s]


@pytest.mark.parametrize(
    ("chunks", "pieces"),
    [
        (4, ["abcd", "efgh", "ij"]),
        ("chars", list("abcdefghij")),
        ([3, 1, 5], ["abc", "d", "efghi", "j"]),
        ([20], ["abcdefghij"]),
    ],
)
def test_chunks_cut_a_step_into_steps(chunks: object, pieces: list[str]) -> None:
    script = expand_script([{"text": "abcdefghij", "chunks": chunks, "delay_ms": 2}])
    assert texts(script) == pieces
    assert all(s.get("delay_ms") == 2 for s in script["steps"] if "text" in s)


def test_frame_steps_write_the_sentinels() -> None:
    script = expand_script(
        [
            {"tool_call": {"id": "t1", "name": "places.search", "args": {"query": "x"}}},
            {"object": {"schema": "Any", "body": "{'a': 1,"}},
            {"result": {"value": {"answer": "ok"}}, "chunks": 1000},
            {"result": {"id": "r2", "value": 1, "end": False}},
        ]
    )
    call, obj, res = "TOOL_CALL id=t1", "OBJECT id=o1", "RESULT id=r1"
    assert texts(script) == [
        f'{LB}BEGIN_{call} name=places.search{RB}{{"query":"x"}}{LB}END_{call}{RB}',
        f"{LB}BEGIN_{obj} schema=Any{RB}{{'a': 1,{LB}END_{obj}{RB}",
        f'{LB}BEGIN_{res} schema=AssistantReply{RB}{{"answer":"ok"}}{LB}END_{res}{RB}',
        f"{LB}BEGIN_RESULT id=r2 schema=AssistantReply{RB}1",
    ]


def test_plain_strings_repeat_and_the_automatic_finish() -> None:
    script = expand_script({"steps": ["a", {"text": "b", "repeat": 3}]})
    assert script["steps"] == [{"text": "a"}, *[{"text": "b"}] * 3, {"finish": "stop"}]
    assert expand_script({"steps": ["a"], "finish": "length"})["steps"][-1] == {"finish": "length"}
    assert expand_script({"steps": ["a"], "finish": None})["steps"] == [{"text": "a"}]
    assert expand_script({"steps": ["a"], "end": "rst"})["steps"] == [{"text": "a"}]
    explicit = [{"text": "a"}, {"finish": "stop", "usage": {"completion_tokens": 1}}]
    assert expand_script(explicit)["steps"] == explicit
    Script.from_json(expand_script({"steps": ["a"], "end": "hang"}))  # the upstream accepts it


def test_repeat_macro_and_raw_bytes() -> None:
    assert expand_value({"a": [{"$repeat": "xy", "times": 3}]}) == {"a": ["xyxyxy"]}
    step = expand_script([{"raw_bytes": "data: \u00ff\n\n"}])["steps"][0]
    assert step["raw"].encode("utf-8", "surrogateescape") == b"data: \xff\n\n"
    with pytest.raises(CaseFormatError):
        expand_value({"$repeat": "x", "times": 2, "extra": 1})


BASE: dict[str, Any] = {"name": "n", "category": "valid_json", "description": "d"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**BASE, "expect": {"done_reasons": "stop"}}, "unknown expect keys"),
        ({**BASE, "client": {"mode": "teleport"}}, "unknown client mode"),
        ({**BASE, "client": {"mode": "cancel", "after": 3}}, "does not take ['after']"),
        ({**BASE, "upstream": [[{"text": "a", "chunks": 0}]]}, '"chunks"'),
        ({**BASE, "upstream": [[{"result": {"valu": 1}}]]}, "unknown result keys"),
        ({**BASE, "upstream": "fake"}, '"upstream"'),
        ({"category": "c", "description": "d"}, "'name' is required"),
    ],
)
def test_typos_are_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(CaseFormatError, match=re.escape(message)):
        parse_case(raw)


def test_a_real_case_has_no_script() -> None:
    case = parse_case({**BASE, "upstream": "real"})
    assert case.real and case.upstream is None and case.script_texts == []
