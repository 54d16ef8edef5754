"""bench.bfcl's pure parts: the data it loads, the tool it offers, and both scores.

The AST check is a port of bfcl-eval's (bench/bfcl_checker.py), so besides hand-written
replies it is held to an invariant over the whole category: each case's own possible
answer, sent back as the call, is accurate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.bfcl import (
    CASES,
    Case,
    Verdict,
    alone_lines,
    ask,
    data_dir,
    load_cases,
    openai_tool,
    request_body,
    score,
)
from bench.bfcl_checker import check_simple, standardize
from toolforge.eval.scripted_upstream import ScriptedUpstream

# simple_python_0 and a dotted one, as the data has them (BFCL's own dialect).
TRIANGLE = Case(
    "simple_python_0",
    [{"role": "user", "content": "Find the area of a triangle with base 10 and height 5."}],
    {
        "name": "calculate_triangle_area",
        "description": "Calculate the area of a triangle given its base and height.",
        "parameters": {
            "type": "dict",
            "properties": {
                "base": {"type": "integer", "description": "The base of the triangle."},
                "height": {"type": "integer", "description": "The height of the triangle."},
                "unit": {"type": "string", "description": "The unit of measure."},
            },
            "required": ["base", "height"],
        },
    },
    {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}},
)
EVENT = Case(
    "event",
    [{"role": "user", "content": "Find concerts in New York on April 1, 2024."}],
    {
        "name": "events.find",
        "description": "Find events.",
        "parameters": {
            "type": "dict",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "date": {"type": "string", "description": "The date."},
                "budget": {"type": "float", "description": "At most this much."},
                "genres": {"type": "array", "items": {"type": "string"}, "description": "G."},
                "seat": {"type": "dict", "description": "Where to sit.", "properties": {}},
            },
            "required": ["city", "date"],
        },
    },
    {
        "events.find": {
            "city": ["New York", "NYC"],
            "date": ["2024-04-01", "April 1, 2024"],
            "budget": [50.0, ""],
            "genres": [["rock", "jazz"], ""],
            "seat": [{"row": ["A"], "section": ["front", ""]}, ""],
        }
    },
)


def reply(*calls: tuple[str, Any], content: str | None = None) -> dict[str, Any]:
    """A chat completion's message with these calls (arguments: an object, or raw text)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(calls)
        ]
        or None,
    }


# -- the data ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases(data_dir())


def test_the_loader_finds_every_simple_python_case_with_its_answer(cases: list[Case]) -> None:
    assert len(cases) == CASES == 400
    assert len({c.id for c in cases}) == 400
    assert cases[0].id == "simple_python_0" and cases[-1].id == "simple_python_399"
    for case in cases:
        assert [m["role"] for m in case.messages] == ["user"]
        assert list(case.answer) == [case.function["name"]]


def _first(values: list[Any]) -> Any:
    """The first possible value that is not the optional marker ``""``, as a model would
    write it: a dict's (or a list of dicts') possible values reduced the same way."""
    value = next(v for v in values if v != "")
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if any(x != "" for x in v)}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_first([v]) for v in value]
    return value


def test_each_cases_own_answer_is_accurate(cases: list[Case]) -> None:
    """The checker's port accepts the ground truth of all 400 cases: the first possible
    value of every parameter that has one besides ``""``."""
    rejected = []
    for case in cases:
        ((name, params),) = case.answer.items()
        args = {p: _first(values) for p, values in params.items() if any(v != "" for v in values)}
        verdict = score(case, reply((name.replace(".", "_"), args)))
        if not (verdict.parsed and verdict.accurate):
            rejected.append((case.id, verdict))
    assert rejected == []


# -- what is offered --------------------------------------------------------------------


def test_the_function_is_offered_as_bfcl_offers_it_to_openai_style_endpoints() -> None:
    tool = openai_tool(EVENT.function)
    fn = tool["function"]
    assert tool["type"] == "function"
    assert fn["name"] == "events_find"  # OpenAI names allow no dot
    assert fn["description"].endswith("Note that the provided function is in Python 3 syntax.")
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["properties"]["budget"] == {
        "type": "number",
        "format": "float",
        "description": "At most this much. This is a float type value.",
    }
    assert params["properties"]["genres"]["type"] == "array"
    assert params["properties"]["seat"]["type"] == "object"
    assert EVENT.function["parameters"]["type"] == "dict"  # the case itself is untouched
    assert EVENT.function["name"] == "events.find"


def test_both_arms_get_one_deterministic_body() -> None:
    body = request_body(TRIANGLE, "SmolLM2-135M-Instruct")
    assert body["messages"] == TRIANGLE.messages
    assert [t["function"]["name"] for t in body["tools"]] == ["calculate_triangle_area"]
    assert body["temperature"] == 0 and isinstance(body["seed"], int)
    assert "tool_choice" not in body  # the default, as a user sends it


# -- the scores -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "verdict"),
    [
        # Parsed and accurate: the required arguments, the optional one left out or right.
        (reply(("calculate_triangle_area", {"base": 10, "height": 5})), Verdict(True, True)),
        (
            reply(("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})),
            Verdict(True, True),
        ),
        # Not a call at all.
        (None, Verdict(False, False, "no reply")),
        (
            {"role": "assistant", "content": "The area is 25."},
            Verdict(False, False, "no call: text"),
        ),
        ({"role": "assistant", "content": "", "tool_calls": []}, Verdict(False, False, "no call")),
        # A call, but not one usable call to the function.
        (
            reply(("calculate_triangle_area", {"base": 10, "height": 5}), ("x", {})),
            Verdict(False, False, "2 calls"),
        ),
        (reply(("respond", {"text": "25"})), Verdict(False, False, "called 'respond'")),
        (
            reply(("calculate_triangle_area", '{"base": 10, "height": 5')),
            Verdict(False, False, "arguments not JSON"),
        ),
        (
            reply(("calculate_triangle_area", "[10, 5]")),
            Verdict(False, False, "arguments not an object"),
        ),
        (
            reply(("calculate_triangle_area", {"base": 10})),
            Verdict(False, False, "missing required height"),
        ),
        # Parsed, but BFCL's AST says no: a wrong value, a wrong type, an extra argument.
        (
            reply(("calculate_triangle_area", {"base": 10, "height": 6})),
            Verdict(True, False, "value_error:others"),
        ),
        (
            reply(("calculate_triangle_area", {"base": 10.0, "height": 5})),
            Verdict(True, False, "type_error:simple"),
        ),
        (
            reply(("calculate_triangle_area", {"base": "10", "height": 5})),
            Verdict(True, False, "type_error:simple"),
        ),
        (
            reply(("calculate_triangle_area", {"base": 10, "height": 5, "color": "red"})),
            Verdict(True, False, "simple_function_checker:unexpected_param"),
        ),
        (
            reply(("calculate_triangle_area", {"base": 10, "height": 5, "unit": "cm"})),
            Verdict(True, False, "value_error:string"),
        ),
        (
            reply(("calculate_triangle_area", {"base": True, "height": 5})),
            Verdict(True, False, "type_error:simple"),
        ),
    ],
)
def test_parse_rate_and_ast_accuracy_on_hand_written_replies(
    message: dict[str, Any] | None, verdict: Verdict
) -> None:
    assert score(TRIANGLE, message) == verdict


@pytest.mark.parametrize(
    ("args", "accurate", "error_type"),
    [
        ({"city": "New York", "date": "2024-04-01"}, True, ""),
        # Strings: case, spaces and ,./-_*^ do not count.
        ({"city": "new york", "date": "April 1 2024"}, True, ""),
        ({"city": "NEW-YORK", "date": "april 1, 2024"}, True, ""),
        ({"city": "Newark", "date": "2024-04-01"}, False, "value_error:string"),
        # A float parameter takes an integer (Python would convert it), not a string.
        ({"city": "NYC", "date": "2024-04-01", "budget": 50}, True, ""),
        ({"city": "NYC", "date": "2024-04-01", "budget": 49.5}, False, "value_error:others"),
        ({"city": "NYC", "date": "2024-04-01", "budget": "50"}, False, "type_error:simple"),
        # Lists: item by item, in order, strings standardised.
        ({"city": "NYC", "date": "2024-04-01", "genres": ["Rock", "JAZZ"]}, True, ""),
        (
            {"city": "NYC", "date": "2024-04-01", "genres": ["jazz", "rock"]},
            False,
            "value_error:list/tuple",
        ),
        # An item of the wrong type: bfcl-eval's nested type check lets it through when
        # "" is among the possible values (it is not a list to check against), and then
        # the value check refuses it.
        (
            {"city": "NYC", "date": "2024-04-01", "genres": ["rock", 1]},
            False,
            "value_error:list/tuple",
        ),
        # Dicts: key by key; an optional key ("" among its values) may be left out.
        ({"city": "NYC", "date": "2024-04-01", "seat": {"row": "a"}}, True, ""),
        (
            {"city": "NYC", "date": "2024-04-01", "seat": {"section": "front"}},
            False,
            "value_error:dict_key",
        ),
        (
            {"city": "NYC", "date": "2024-04-01", "seat": {"row": "B"}},
            False,
            "value_error:dict_value",
        ),
    ],
)
def test_the_ast_check_follows_bfcl_rules(
    args: dict[str, Any], accurate: bool, error_type: str
) -> None:
    verdict = score(EVENT, reply(("events_find", args)))
    assert verdict == Verdict(True, accurate, error_type)


def test_a_possible_answer_parameter_without_the_optional_marker_must_be_given() -> None:
    answer = {"f": {"a": [1], "b": [2]}}  # b is not required, but has no "" among its values
    function = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a"],
        },
    }
    assert check_simple(function, [{"f": {"a": 1, "b": 2}}], answer).valid
    missing = check_simple(function, [{"f": {"a": 1}}], answer)
    assert (missing.valid, missing.error_type) == (
        False,
        "simple_function_checker:missing_optional",
    )
    assert check_simple(function, [], answer).error_type == "simple_function_checker:wrong_count"
    two = [{"f": {"a": 1, "b": 2}}, {"f": {"a": 1, "b": 2}}]
    assert check_simple(function, two, answer).error_type == "simple_function_checker:wrong_count"
    assert check_simple(function, [{"g": {"a": 1}}], answer).error_type == (
        "simple_function_checker:wrong_func_name"
    )


def test_standardize_is_bfcls() -> None:
    assert standardize("April 1, 2024") == standardize("april 1 2024") == "april12024"
    assert standardize("it's 5*3^2 / x_y") == 'it"s532xy'


def test_the_items_of_a_list_are_type_checked() -> None:
    function = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
            "required": ["xs"],
        },
    }
    answer = {"f": {"xs": [[1, 2]]}}
    assert check_simple(function, [{"f": {"xs": [1, 2]}}], answer).valid
    wrong = check_simple(function, [{"f": {"xs": [1, "2"]}}], answer)
    assert (wrong.valid, wrong.error_type) == (False, "type_error:nested")
    assert check_simple(function, [{"f": {"xs": [2, 1]}}], answer).error_type == (
        "value_error:list/tuple"
    )


# -- one request, on loopback -------------------------------------------------------------


def completion(message: dict[str, Any], finish: str = "tool_calls") -> str:
    return json.dumps(
        {
            "id": "c1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
    )


async def test_ask_sends_the_body_and_judges_what_comes_back_over_http() -> None:
    """Against a real HTTP server: the body sent, a call judged, and an upstream that
    fails (a 500, a connection reset) recorded as a failed case, never a crash."""
    good = reply(("calculate_triangle_area", {"base": 10, "height": 5}))
    scripts = [
        {"end": "status", "status": 200, "body": completion(good)},
        {"end": "status", "status": 200, "body": completion({"content": "It is 25."}, "stop")},
        {"end": "status", "status": 500, "body": '{"error": {"message": "boom"}}'},
        {"end": "rst"},
        {"end": "rst"},  # the retry after a dropped connection fails too
    ]
    async with (
        ScriptedUpstream(scripts) as up,
        httpx.AsyncClient(timeout=10) as client,
    ):
        url = f"{up.base_url}/chat/completions"
        called = await ask(client, url, "proxy", TRIANGLE, "m")
        prose = await ask(client, url, "alone", TRIANGLE, "m")
        failed = await ask(client, url, "proxy", TRIANGLE, "m")
        reset = await ask(client, url, "proxy", TRIANGLE, "m")
    assert up.requests[0].json == request_body(TRIANGLE, "m")
    assert (called.verdict, called.status, called.finish_reason) == (
        Verdict(True, True),
        200,
        "tool_calls",
    )
    assert called.to_json()["tool_calls"] == good["tool_calls"]
    assert prose.verdict == Verdict(False, False, "no call: text")
    assert prose.to_json()["content"] == "It is 25."
    assert failed.verdict == Verdict(False, False, "HTTP 500") and "boom" in failed.error
    assert reset.verdict == Verdict(False, False, "error") and reset.status is None


def test_the_alone_arm_is_taken_from_an_earlier_run_in_the_cases_order(
    cases: list[Case], tmp_path: Path
) -> None:
    earlier = tmp_path / "earlier.jsonl"
    picked = [cases[8], cases[0]]
    lines = [
        {"id": cases[0].id, "arm": "proxy", "reason": "p0"},
        {"id": cases[0].id, "arm": "alone", "reason": "a0"},
        {"id": cases[8].id, "arm": "alone", "reason": "a8"},
    ]
    earlier.write_text("".join(json.dumps(line) + "\n" for line in lines))
    got = [json.loads(line)["reason"] for line in alone_lines(earlier, picked)]
    assert got == ["a8", "a0"]  # the alone lines only, in the order asked
    with pytest.raises(SystemExit, match=rf"1 cases \(first: {cases[1].id}\)"):
        alone_lines(earlier, [cases[0], cases[1]])


async def test_the_plan_cost_arm_plans_each_case_as_the_proxy_does() -> None:
    from bench.bfcl_plan_cost import measure

    out = await measure(rounds=2, limit=5)
    assert out["requests"] == 10
    assert 0 < out["p50_ms"] <= out["p95_ms"] <= out["max_ms"]
    # the first turn's grammar is written: a call to the one function, narrowed
    assert out["grammar_p50_chars"] > 500
