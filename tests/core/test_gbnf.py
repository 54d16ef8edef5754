"""GBNF for constrained mode: the grammars parse as llama.cpp parses them, accept the frames
a well-behaved model writes and reject malformed ones (tests/core/gbnf_matcher.py decides).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tests.core.gbnf_matcher import Grammar, GrammarSyntaxError, parse
from tests.strategies import json_values
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import (
    DEFAULT_MAX_TEXT_CHARS,
    FrameGrammar,
    TurnIds,
    frame_grammar,
    json_value_grammar,
    next_turn_ids,
)
from toolforge.core.protocol import sentinels
from toolforge.core.schemas import Action, AssistantReply, model_schema
from toolforge.tools.bookings import BookingsCreateArgs
from toolforge.tools.places import PlacesSearchArgs

L, R = sentinels.OPEN, sentinels.CLOSE
PLACES = PlacesSearchArgs.model_json_schema()
BOOKINGS = BookingsCreateArgs.model_json_schema()
REPLY = model_schema(AssistantReply)
ACTION = model_schema(Action)
TOOLS = {"places.search": PLACES, "bookings.create": BOOKINGS}
IDS = TurnIds(call="t1", objects=("o1", "o2"), result="r1")


def demo(ids: TurnIds = IDS, *, allow_tools: bool = True, objects: bool = True) -> Grammar:
    text = frame_grammar(
        tools=TOOLS,
        result=("AssistantReply", REPLY),
        objects={"Action": ACTION} if objects else None,
        ids=ids,
        allow_tools=allow_tools,
    )
    return parse(text)


def call(body: str, *, name: str = "places.search", begin: str = "t1", end: str = "t1") -> str:
    tool = FrameKind.TOOL_CALL
    return sentinels.begin(tool, begin, name) + body + sentinels.end(tool, end)


def result(body: str, *, schema: str = "AssistantReply", rid: str = "r1") -> str:
    return sentinels.frame(FrameKind.RESULT, rid, schema, body)


def obj(body: str, oid: str = "o1", schema: str = "Action") -> str:
    return sentinels.frame(FrameKind.OBJECT, oid, schema, body)


def value_grammar(schema: Mapping[str, Any] | bool, **kwargs: Any) -> Grammar:
    return parse(json_value_grammar(schema, **kwargs))


# --- the frame grammar ----------------------------------------------------------------------

ACCEPTED = {
    "demo call": "Let me look. " + call('{"query": "pizza", "open_at": "19:00"}'),
    "no text": call('{"query":"pizza"}'),
    "every argument": call('{"query":"pizza","radius_km":2.5,"open_at":null,"limit":10}'),
    "newlines": call('{\n  "query": "pizza"\n}'),
    "booking": call(
        '{"place_id": "trattoria-roma", "time": "19:30", "party_size": 2, "guest_name": "Ann"}',
        name="bookings.create",
    ),
    "result": "Done. " + result('{"answer": "Two places are open.", "citations": ["p1"]}'),
    "escaped sentinel": result('{"answer": "a \\u27e6 b \\u27E7 \\n \\" \\\\ é \\ud83d\\ude00"}'),
    "objects": obj('{"mode":"search","target":{"kind":"place","id":"p1"}}')
    + " then "
    + obj('{"mode":"book","target":{"kind":"time","at":"19:00"}}', "o2")
    + result('{"answer":"ok"}'),
    "text up to the bound": "x" * DEFAULT_MAX_TEXT_CHARS + result('{"answer":"ok"}'),
    "multi-line text": "Line one.\nLine two.\t" + result('{"answer":"ok"}'),
}

REJECTED = {
    "END id differs": call('{"query":"pizza"}', end="t2"),
    "id not this turn's": call('{"query":"pizza"}', begin="t2", end="t2"),
    "raw sentinel in a string": call('{"query":"pizza ' + L + 'x"}'),
    "raw control char in a string": call('{"query":"piz\nza"}'),
    "lone surrogate escape": call('{"query":"\\ud83d"}'),
    "missing required key": call('{"open_at":"19:00"}'),
    "extra key": call('{"query":"pizza","price":"cheap"}'),
    "pattern": call('{"query":"pizza","open_at":"7pm"}'),
    "integer range": call(
        '{"place_id":"a","time":"19:00","party_size":21}', name="bookings.create"
    ),
    "half-hour slots only": call(
        '{"place_id":"a","time":"19:15","party_size":2}', name="bookings.create"
    ),
    "unknown tool": call('{"query":"pizza"}', name="places.delete"),
    "wrong enum": obj('{"mode":"fly","target":{"kind":"place","id":"p1"}}')
    + result('{"answer":"ok"}'),
    "union branch mixed": obj('{"mode":"book","target":{"kind":"place","at":"19:00"}}')
    + result('{"answer":"ok"}'),
    "text after the result": result('{"answer":"ok"}') + " Bye.",
    "text after the call": call('{"query":"pizza"}') + " ",
    "two calls": call('{"query":"pizza"}') + call('{"query":"sushi"}'),
    "nested frame": call('{"query":' + result('{"answer":"ok"}') + "}"),
    "unframed JSON": '{"answer":"ok"}',
    "no frame": "I cannot help.",
    "wrong result schema": result('{"answer":"ok"}', schema="Action"),
    "result id": result('{"answer":"ok"}', rid="r2"),
    "text too long": "x" * (DEFAULT_MAX_TEXT_CHARS + 1) + result('{"answer":"ok"}'),
    "sentinel in the text": f"a {L} b" + result('{"answer":"ok"}'),
    "close sentinel in the text": f"a {R} b" + result('{"answer":"ok"}'),
    "three spaces": call('{   "query":"pizza"}'),
    "space before the body": call(' {"query":"pizza"}'),
    "trailing comma": call('{"query":"pizza",}'),
    "single quotes": call("{'query':'pizza'}"),
    "leading zero": call('{"query":"pizza","limit":05}'),
    "diagnostics are the gateway's (readOnly)": result('{"answer":"ok","diagnostics":null}'),
}


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_well_formed_turns_are_accepted(text: str) -> None:
    assert demo().accepts(text)


@pytest.mark.parametrize("text", REJECTED.values(), ids=REJECTED.keys())
def test_malformed_turns_are_rejected(text: str) -> None:
    assert not demo().accepts(text)


def test_the_grammar_reads_like_the_sentinel_grammar() -> None:
    text = FrameGrammar(tools=TOOLS, result=("AssistantReply", REPLY)).for_turn(IDS)
    lines = text.splitlines()
    assert lines[0] == "root ::= text ( call-1 | call-2 | result )"
    assert 'call-1 ::= "\\u27E6BEGIN_TOOL_CALL id=t1 name=places.search\\u27E7"' in text
    assert all(line.isascii() for line in lines)  # sentinels written as \u escapes
    assert len({line.split(" ::= ")[0] for line in lines}) == len(lines)  # names unique
    assert all(re.fullmatch(r"[A-Za-z0-9-]+ ::= .+", line) for line in lines)
    assert "object-1" not in text  # no object schemas: no OBJECT frames


def test_without_tools_only_the_result_is_left() -> None:
    g = demo(allow_tools=False)
    assert not g.accepts(call('{"query":"pizza"}'))
    assert g.accepts(result('{"answer":"ok"}'))
    bare = FrameGrammar(tools={}, result=("AssistantReply", REPLY)).for_turn(IDS)
    assert "TOOL_CALL" not in bare


def test_a_tool_name_no_sentinel_can_carry_is_left_out() -> None:
    text = FrameGrammar(
        tools={"bad name": {}, "ok": {}}, result=("AssistantReply", REPLY)
    ).for_turn(IDS)
    assert "name=ok" in text and "bad name" not in text


def test_objects_are_bounded_by_the_ids_of_the_turn() -> None:
    two = obj('{"mode":"search","target":{"kind":"place","id":"p1"}}')
    second = two.replace("id=o1", "id=o2")
    third = two.replace("id=o1", "id=o3")
    g = demo()  # ids o1, o2
    assert g.accepts(two + second + result('{"answer":"ok"}'))
    assert not g.accepts(two + second + third + result('{"answer":"ok"}'))
    assert not g.accepts(second + result('{"answer":"ok"}'))  # o2 before o1
    assert not g.accepts(two + two + result('{"answer":"ok"}'))  # o1 twice


def test_text_bound_is_a_parameter() -> None:
    bare = frame_grammar(tools={}, result=("Any", {}), ids=IDS, max_text_chars=0)
    g = parse(bare)
    assert g.accepts(result("[1]", schema="Any"))
    assert not g.accepts("x" + result("[1]", schema="Any"))
    assert "text" not in bare


def test_the_turn_grammar_is_cached_and_only_the_ids_change() -> None:
    grammar = FrameGrammar(tools=TOOLS, result=("AssistantReply", REPLY))
    first = grammar.next_turn(set())
    second = grammar.next_turn({"t1"})
    assert "id=t1 " in first and "id=t1 " not in second and "id=t2 " in second
    assert first.replace("t1", "t2") == second


# --- ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (set(), ("t1", ("o1", "o2", "o3", "o4"), "r1")),
        ({"t1"}, ("t2", ("o1", "o2", "o3", "o4"), "r1")),
        ({"t1", "t2", "o1", "r1"}, ("t3", ("o2", "o3", "o4", "o5"), "r2")),
        ({"t9", "t10", "x7", "call_1", "tt3"}, ("t11", ("o1", "o2", "o3", "o4"), "r1")),
    ],
)
def test_next_turn_ids_never_reuse_a_seen_id(
    seen: set[str], expected: tuple[str, tuple[str, ...], str]
) -> None:
    ids = next_turn_ids(seen)
    assert (ids.call, ids.objects, ids.result) == expected
    assert not {ids.call, *ids.objects, ids.result} & seen


@pytest.mark.parametrize(
    ("call_id", "objects", "result_id"),
    [("t 1", (), "r1"), ("t1", ("o1",), "t1"), ("", (), "r1"), ("t1", ("⟦",), "r1")],
)
def test_turn_ids_are_checked(call_id: str, objects: tuple[str, ...], result_id: str) -> None:
    with pytest.raises(ValueError):
        TurnIds(call=call_id, objects=objects, result=result_id)


# --- JSON Schema features -------------------------------------------------------------------

# (schema, accepted JSON texts, rejected JSON texts)
FEATURES: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "required and optional in order": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
            "required": ["b"],
            "additionalProperties": False,
        },
        ['{"b":""}', '{"a":1,"b":"x"}', '{"b":"x","c":[1,{"d":null}]}', '{"a":-1,"b":"","c":2}'],
        ["{}", '{"a":1}', '{"b":"x","a":1}', '{"b":"x","z":1}', '{"b":"x",}', '{,"b":"x"}'],
    ),
    "all optional": (
        {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}},
        ["{}", "{ }", '{"a":true}', '{"b":null}', '{"a":false,"b":null}'],
        ['{"b":null,"a":true}', '{"a":1}', '{"c":1}', '{"a":true,}'],
    ),
    "additionalProperties schema": (
        {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
            "additionalProperties": {"type": "integer"},
        },
        ['{"id":"x"}', '{"id":"x","n":1,"m":2}'],
        ['{"id":"x","n":"1"}', '{"n":1,"id":"x"}'],
    ),
    "a map": (
        {"type": "object", "additionalProperties": {"type": "number"}},
        ["{}", '{"a":1.5,"b":-2e3}'],
        ['{"a":"x"}'],
    ),
    "an open object": (
        {"type": "object"},
        ["{}", '{"a":{"b":[1,"x",null]}}'],
        ["[]", '{"a"}'],
    ),
    "array bounds": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        ["[1]", "[1, 2, 3]", "[ 1 ]"],
        ["[]", "[1,2,3,4]", '["1"]', "[1,]"],
    ),
    "array without bounds": (
        {"type": "array", "items": {"enum": ["a", "b"]}},
        ["[]", '["a","b","a"]'],
        ['["c"]'],
    ),
    "string length": (
        {"type": "string", "minLength": 2, "maxLength": 3},
        ['"ab"', '"abc"', '"\\n\\u00e9"', '"a\\ud83d\\ude00"', '"éé"'],
        ['"a"', '"abcd"', '"\\ud83d"', '"\\u27e6"'],
    ),
    "string escapes": (
        {"type": "string"},
        ['""', '"\\"\\\\\\/\\b\\f\\n\\r\\t"', '"\\u0041\\uD834\\uDD1E"', '"\x7f"'],
        ['"\\x41"', '"\\u00"', '"\\uDD1E"', '"\t"', '"' + L + '"', '"' + R + '"'],
    ),
    "enum": (
        {"enum": ["a", 1, None, {"k": [True]}, "⟦x⟧"]},
        ['"a"', "1", "null", '{"k":[true]}', '"\\u27e6x\\u27e7"'],
        ['"b"', "2", '{"k": [true]}', '"⟦x⟧"'],
    ),
    "const": ({"const": "place"}, ['"place"'], ['"time"', "place"]),
    "integer range": (
        {"type": "integer", "minimum": -2, "exclusiveMaximum": 3},
        ["-2", "-1", "0", "1", "2"],
        ["-3", "3", "1.0", "01", "-0"],
    ),
    "integer lower bound": (
        {"type": "integer", "exclusiveMinimum": 0},
        ["1", "10", "1234567890123456"],
        ["0", "-1", "12345678901234567", "1.5"],
    ),
    "integer": ({"type": "integer"}, ["-5", "0", "42"], ["+1", "1e3", "--1"]),
    "number": (
        {"type": "number"},
        ["0", "-0.5", "1.25e-3", "3E+2", "10"],
        ["1.", ".5", "+1", "NaN", "Infinity", "01", "1e"],
    ),
    "non-negative number": ({"type": "number", "minimum": 0}, ["0", "2.5"], ["-1", "-0.5"]),
    "number range, strict below": (  # places.search's radius_km: > 0, <= 50
        {"type": "number", "exclusiveMinimum": 0, "maximum": 50},
        ["50", "50.0", "0.5", "0.05", "0.100", "49.99", "5", "12.25", "10"],
        ["50.5", "51", "0", "0.0", "00.5", "-1", "1e1", "100", "5.", "50.01"],
    ),
    "number range, negative": (
        {"type": "number", "minimum": -20, "exclusiveMaximum": -1},
        ["-20", "-20.000", "-1.5", "-19.99", "-2"],
        ["-1", "-1.0", "-20.5", "-21", "0", "1", "-0.5", "-0"],
    ),
    "number range around zero": (
        {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1},
        ["0", "0.0", "-0.5", "0.999", "-0.001"],
        ["1", "-1", "1.0", "-1.0", "-0", "-0.0", "2"],
    ),
    "number, only an upper bound": (
        {"type": "number", "maximum": 7.5},
        ["7", "7.5", "-123456.5", "0"],
        ["8", "10", "75"],
    ),
    "number, draft 4 boolean exclusive": (
        {"type": "number", "minimum": 1, "exclusiveMinimum": True},
        ["1.5", "2", "1000000"],
        ["1", "1.0", "0.5"],
    ),
    "integer range, wide": (
        {"type": "integer", "minimum": 7, "maximum": 10_000},
        ["7", "9", "10", "99", "100", "1234", "9999", "10000"],
        ["6", "0", "10001", "07", "20000", "99999"],
    ),
    "integer range, fractional bounds": (
        {"type": "integer", "minimum": -2.5, "maximum": 3.5},
        ["-2", "0", "3"],
        ["-3", "4", "2.5"],
    ),
    "integer, only an upper bound": (
        {"type": "integer", "maximum": -5},
        ["-5", "-6", "-1000"],
        ["-4", "0", "5"],
    ),
    "boolean and null": (
        {"type": ["boolean", "null"]},
        ["true", "false", "null"],
        ["0", '"true"', "True"],
    ),
    "type list": (
        {"type": ["string", "integer"], "maxLength": 1},
        ['"a"', "7"],
        ['"ab"', "null"],
    ),
    "anyOf": (
        {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "null"}], "default": None},
        ['"a"', "null"],
        ['"ab"', "0"],
    ),
    "oneOf with a shared parent": (
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}},
            "required": ["kind"],
            "oneOf": [
                {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}},
                {"properties": {"kind": {"const": "b"}}},
            ],
            "additionalProperties": False,
        },
        ['{"kind":"a"}', '{"kind":"a","x":1}', '{"kind":"b"}'],
        ['{"kind":"c"}', '{"kind":"b","x":1}'],
    ),
    "allOf": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ],
        },
        ['{"a":1,"b":"x"}'],
        ['{"a":1}', '{"b":"x"}'],
    ),
    "$defs and definitions": (
        {
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/P"}, "q": {"$ref": "#/definitions/Q"}},
            "required": ["p", "q"],
            "additionalProperties": False,
            "$defs": {"P": {"type": "integer", "minimum": 1, "maximum": 2}},
            "definitions": {"Q": {"type": "array", "items": {"$ref": "#/$defs/P"}}},
        },
        ['{"p":1,"q":[2,1]}', '{"p":2,"q":[]}'],
        ['{"p":3,"q":[]}', '{"p":1,"q":[0]}'],
    ),
    "a recursive tree": (
        {
            "$ref": "#/$defs/Node",
            "$defs": {
                "Node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    },
                    "required": ["v"],
                    "additionalProperties": False,
                }
            },
        },
        ['{"v":1}', '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}'],
        ['{"v":1,"kids":[{}]}', '{"kids":[]}'],
    ),
    "readOnly": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "id": {"type": "string", "readOnly": True}},
            "required": ["a"],
        },
        ['{"a":"x"}'],
        ['{"a":"x","id":"1"}'],
    ),
    "format date-time is its shape": (
        {"type": "string", "format": "date-time"},
        ['"2024-01-01T00:00:00Z"', '"2024-01-01T19:30:00.5+02:00"'],
        ['"not a date"', '"2024-13-01T00:00:00Z"', '"2024-01-01 00:00:00"', "1"],
    ),
    "format date, uuid and email are their shapes": (
        {
            "type": "object",
            "properties": {
                "d": {"type": "string", "format": "date"},
                "u": {"type": "string", "format": "uuid"},
                "e": {"type": "string", "format": "email"},
            },
            "required": ["d", "u", "e"],
        },
        ['{"d":"2026-11-27","u":"9b2f6a3e-1c4d-4e8f-9a0b-1c2d3e4f5a6b","e":"a.b@ex.org"}'],
        [
            '{"d":"27/11/2026","u":"9b2f6a3e-1c4d-4e8f-9a0b-1c2d3e4f5a6b","e":"a.b@ex.org"}',
            '{"d":"2026-11-27","u":"9b2f6a3e","e":"a.b@ex.org"}',
            '{"d":"2026-11-27","u":"9b2f6a3e-1c4d-4e8f-9a0b-1c2d3e4f5a6b","e":"nobody"}',
        ],
    ),
    "format with a pattern: the pattern wins": (
        {"type": "string", "format": "date", "pattern": "^[0-9]{8}$"},
        ['"20261127"'],
        ['"2026-11-27"'],
    ),
    "pattern": (
        {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
        ['"00:00"', '"19:05"', '"23:59"'],
        ['"24:00"', '"7pm"', '"19:60"', '"19:00 "'],
    ),
    "pattern classes and groups": (
        {"type": "string", "pattern": "^(?:\\d{3}-)?\\w+[^a-c]?\\.x{1,2}$"},
        ['"123-ab_9.x"', '"Z.xx"', '"ad.x"', '"aé.x"'],
        ['"12-a.x"', '"a.xxx"', '"a-b.x"'],
    ),
    "pattern alternatives": (
        {"type": "string", "pattern": "^(cat|dog)s?$"},
        ['"cat"', '"dogs"'],
        ['"cats?"', '"fish"'],
    ),
    "alternatives anchored apart fall back": (
        {"type": "string", "pattern": "^cat|dog$", "maxLength": 5},
        ['"catch"', '"a dog"'],
        ['"hotdog"'],
    ),
    "pattern and maxLength": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        ['"abc"'],
        ['"abcd"', '"ABC"', '""'],
    ),
    "unsupported pattern falls back to the string": (
        {"type": "string", "pattern": "^(?=a)\\s+$", "maxLength": 2},
        ['"ab"', '"  "', '""'],
        ['"abc"'],
    ),
    "unanchored pattern: a match anywhere": (
        {"type": "string", "pattern": "[0-9]"},
        ['"7"', '"a7"', '"7a"', '"ab 7 cd"'],
        ['"x"', '""', "1"],
    ),
    "pattern anchored at the start only": (
        {"type": "string", "pattern": "^[A-Z]-"},
        ['"A-"', '"B-123 anything"'],
        ['"xA-"', '"A"'],
    ),
    "pattern anchored at the end only": (
        {"type": "string", "pattern": "[0-9]{5}$"},
        ['"12345"', '"order 12345"'],
        ['"12345 "', '"1234"'],
    ),
    "unanchored alternation": (
        {"type": "string", "pattern": "cat|dog"},
        ['"a dog"', '"cats"'],
        ['"cow"'],
    ),
    "an escaped dollar is a literal, not an anchor": (
        {"type": "string", "pattern": "^[0-9]+\\$"},
        ['"12$"', '"12$ more"'],
        ['"12"'],
    ),
    "unsupported keyword: a generic value": (
        {"not": {"type": "string"}},
        ['"a"', "1", "[{}]"],
        ["[1,]"],
    ),
    "prefixItems: generic items": (
        {"type": "array", "prefixItems": [{"type": "integer"}]},
        ["[1]", '["x", {}]'],
        ["{}"],
    ),
    "false branches are dropped": (
        {"anyOf": [False, {"type": "integer"}]},
        ["1"],
        ['"a"'],
    ),
}


@pytest.mark.parametrize(("schema", "good", "bad"), FEATURES.values(), ids=FEATURES.keys())
def test_schema_features(schema: dict[str, Any], good: list[str], bad: list[str]) -> None:
    g = value_grammar(schema)
    for text in good:
        # JSON, valid against the schema or, where the grammar is looser than the schema
        # (documented), caught by the guarantee afterwards
        assert g.accepts(text), text
        orjson.loads(text)
    for text in bad:
        assert not g.accepts(text), text


def test_builtin_and_demo_schemas_have_exact_shapes() -> None:
    action = value_grammar(ACTION)
    assert action.accepts('{"mode":"search","target":{"kind":"place","id":"p1"}}')
    assert action.accepts('{"mode": "book", "target": {"kind": "time", "at": "19:00"}}')
    assert not action.accepts('{"mode":"book","target":{"kind":"time","id":"p1"}}')
    reply = value_grammar(REPLY)
    assert reply.accepts('{"answer":"ok","citations":[]}')
    assert not reply.accepts('{"citations":[],"answer":"ok"}')
    assert not reply.accepts('{"answer":"ok","diagnostics":null}')
    places = value_grammar(PLACES)
    assert places.accepts('{"query":"pizza","radius_km":5,"limit":1}')
    assert not places.accepts('{"query":""}')  # minLength 1
    assert not places.accepts('{"query":"pizza","radius_km":-1}')  # exclusiveMinimum 0


def test_generic_values_nest_at_most_max_depth() -> None:
    g = value_grammar({}, max_depth=2)
    assert g.accepts("[[1]]") and g.accepts('{"a":{"b":"c"}}')
    assert not g.accepts("[[[1]]]") and not g.accepts('[{"a":[]}]')
    deep = value_grammar(
        {"type": "object", "properties": {"a": {}}, "required": ["a"]}, max_depth=2
    )
    assert deep.accepts('{"a":[1]}')
    assert not deep.accepts('{"a":[[1]]}')  # the object itself is one level


def test_default_depth_is_the_json_limit() -> None:
    g = value_grammar({})
    assert g.accepts("[" * 16 + "]" * 16)
    assert not g.accepts("[" * 17 + "]" * 17)


def test_a_token_budget_bounds_what_the_schema_leaves_unbounded() -> None:
    # max_tokens=256: strings up to 64 characters, arrays and open objects up to 2 members
    budget = {"max_tokens": 256}
    text = value_grammar({"type": "string"}, **budget)
    assert text.accepts('"' + "0" * 64 + '"') and not text.accepts('"' + "0" * 65 + '"')
    declared = value_grammar({"type": "string", "maxLength": 80}, **budget)
    assert declared.accepts('"' + "0" * 80 + '"')  # the schema's own bound is kept
    pattern = value_grammar({"type": "string", "pattern": "^0+$"}, **budget)
    assert pattern.accepts('"' + "0" * 64 + '"') and not pattern.accepts('"' + "0" * 65 + '"')
    array = value_grammar({"type": "array", "items": {"type": "integer"}}, **budget)
    assert array.accepts("[1,2]") and not array.accepts("[1,2,3]")
    assert value_grammar({"type": "array", "maxItems": 6}, **budget).accepts("[1,2,3,4,5,6]")
    assert value_grammar({"type": "array", "minItems": 6}, **budget).accepts("[1,2,3,4,5,6]")
    mapping = value_grammar({"additionalProperties": {"type": "integer"}}, **budget)
    assert mapping.accepts('{"a":1,"b":2}') and not mapping.accepts('{"a":1,"b":2,"c":3}')
    generic = value_grammar({}, **budget)
    assert generic.accepts('[[1,2],{"k":"' + "x" * 64 + '"}]')
    assert not generic.accepts("[1,2,3]") and not generic.accepts('"' + "x" * 65 + '"')
    frames = demo(ids=IDS)  # without a budget: nothing added
    assert frames.accepts(result('{"answer":"' + "0" * 5000 + '"}'))


def test_only_reached_rules_are_written() -> None:
    text = json_value_grammar({"type": "boolean"})
    assert text == 'root ::= boolean\nboolean ::= "true" | "false"\n'


def test_large_bounds_stay_within_llama_cpp_limits() -> None:
    text = json_value_grammar(
        {
            "type": "object",
            "properties": {
                "long": {"type": "string", "minLength": 5000},
                "wide": {"type": "array", "maxItems": 100_000},
                "span": {"type": "integer", "minimum": 0, "maximum": 10_000},
            },
        }
    )
    counts = [int(n) for n in re.findall(r"\{(\d+)", text)]
    assert max(counts) <= 1000  # llama.cpp refuses repetitions past 2,000 rules
    parse(text)


def test_the_matcher_refuses_what_llama_cpp_refuses() -> None:
    with pytest.raises(GrammarSyntaxError, match="undefined"):
        parse("root ::= a\n")
    with pytest.raises(GrammarSyntaxError, match="group"):
        parse('root ::= ( "a" "b" ){2,5}\n')
    with pytest.raises(GrammarSyntaxError, match="escape"):
        parse('root ::= "\\q"\n')


# --- property: values made to satisfy a schema are accepted ----------------------------------


def values(schema: object, doc: Mapping[str, Any]) -> st.SearchStrategy[object]:
    """Values of ``schema`` in the spelling the grammar steers to: declared key order,
    optional keys present or not, no undeclared keys where ``properties`` are given."""
    if not isinstance(schema, Mapping) or not schema:
        return json_values(
            max_leaves=6,
            integers=st.integers(-(10**6), 10**6),
            floats=None,
            text=st.text(max_size=5),
            keys=st.text(max_size=3),
            max_list_size=3,
            max_dict_size=3,
        )
    if "$ref" in schema:
        return st.deferred(lambda: values(_pointer(doc, schema["$ref"]), doc))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([values(branch, doc) for branch in schema[key]])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        parts = {
            k: values(v, doc) if k in required else st.none() | st.tuples(values(v, doc))
            for k, v in props.items()
            if k in required or not v.get("readOnly")
        }

        def build(drawn: dict[str, object]) -> dict[str, object]:
            out: dict[str, object] = {}
            for k in props:  # declared order
                if k in required:
                    out[k] = drawn[k]
                elif isinstance(drawn.get(k), tuple):
                    out[k] = drawn[k][0]  # type: ignore[index]
            return out

        return st.fixed_dictionaries(parts).map(build)
    if kind == "array":
        return st.lists(
            values(schema.get("items", {}), doc),
            min_size=schema.get("minItems", 0),
            max_size=schema.get("maxItems", 4),
        )
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: len(s) <= schema.get("maxLength", 10**9)
            )
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 20))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(10**9)), schema.get("maximum", 10**9))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1e9))
        # A bounded number is written positionally (the grammar has no exponent for it).
        return st.floats(low, schema.get("maximum", 1e9), allow_nan=False).filter(
            lambda x: (
                x > schema.get("exclusiveMinimum", -1e10)
                and "e" not in repr(x) + orjson.dumps(x).decode()
            )
        )
    if kind == "boolean":
        return st.booleans()
    return st.none()


def _pointer(doc: Mapping[str, Any], ref: str) -> object:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def spell(value: object, style: int) -> str:
    """JSON text as different writers spell it (compact, spaced, all-ASCII escapes)."""
    if style == 0:
        text = orjson.dumps(value).decode()
    elif style == 1:
        text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    else:
        text = json.dumps(value, ensure_ascii=True)
    return sentinels.escape(text)


SCHEMAS = {"places": PLACES, "bookings": BOOKINGS, "reply": REPLY, "action": ACTION}
GRAMMARS = {name: value_grammar(schema) for name, schema in SCHEMAS.items()}
FRAMES = demo()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(sorted(SCHEMAS)), style=st.integers(0, 2))
def test_values_of_a_schema_are_accepted(data: st.DataObject, name: str, style: int) -> None:
    schema = SCHEMAS[name]
    value = data.draw(values(schema, schema))
    assert Draft202012Validator(schema).is_valid(value)  # the strategy makes valid values
    assert GRAMMARS[name].accepts(spell(value, style))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    text=st.text(
        st.characters(exclude_characters=[L, R], exclude_categories=["Cs"]),
        max_size=DEFAULT_MAX_TEXT_CHARS,
    ).filter(lambda t: not re.search("[\x00-\x08\x0b-\x1f\x7f]", t)),
)
def test_any_text_then_a_valid_frame_is_accepted(data: st.DataObject, text: str) -> None:
    args = data.draw(values(PLACES, PLACES))
    assert FRAMES.accepts(text + call(spell(args, 0)))
    reply = data.draw(values(REPLY, REPLY))
    assert FRAMES.accepts(text + result(spell(reply, 1)))


# --- numeric ranges, exactly ----------------------------------------------------------------

_BOUND = st.one_of(st.none(), st.integers(-120, 120))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lo=_BOUND,
    hi=_BOUND,
    strict=st.tuples(st.booleans(), st.booleans()),
    kind=st.sampled_from(["integer", "number"]),
    values=st.lists(
        st.tuples(
            st.integers(-150, 150),
            st.one_of(st.none(), st.text("0123456789", min_size=1, max_size=4)),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_whole_bounds_are_exact(
    lo: int | None,
    hi: int | None,
    strict: tuple[bool, bool],
    kind: str,
    values: list[tuple[int, str | None]],
) -> None:
    """With whole-number bounds, a positional numeral is accepted exactly when it is in
    range (an integer's never has a fraction; "-0" is never written)."""
    if lo is not None and hi is not None:
        # An empty range falls back to the plain type (the schema cannot be met).
        assume(
            lo + strict[0] + strict[1] <= hi
            if kind == "integer"
            else lo < hi or (not any(strict) and lo == hi)
        )
    schema: dict[str, Any] = {"type": kind}
    if lo is not None:
        schema["exclusiveMinimum" if strict[0] else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if strict[1] else "maximum"] = hi
    grammar = value_grammar(schema)
    validator = Draft202012Validator(schema)
    for whole, fraction in values:
        if kind == "integer" and fraction is not None:
            continue
        texts = [str(whole)] if fraction is None else [f"{whole}.{fraction}"]
        if whole == 0 and fraction is not None and fraction.strip("0"):
            texts.append(f"-0.{fraction}")
        for text in texts:
            value = int(text) if fraction is None else float(Decimal(text))
            assert grammar.accepts(text) == validator.is_valid(value), (schema, text)


def test_an_array_of_strings_shares_one_strings_budget() -> None:
    """Under max_tokens, each string member gets max_chars / max_items characters, so a
    model looping inside every member still closes its frame within the turn."""
    reply = value_grammar(REPLY, max_tokens=768)  # 192 characters a string, 6 members
    answer = "a" * 192
    for n, length in ((6, 32), (1, 32), (0, 0)):
        citations = ",".join(f'"{"c" * length}"' for _ in range(n))
        assert reply.accepts(f'{{"answer":"{answer}","citations":[{citations}]}}'), (n, length)
    assert not reply.accepts(f'{{"answer":"{answer}","citations":["{"c" * 33}"]}}')
    # A declared maxLength, or no max_tokens, keeps the strings as they were.
    declared = {"type": "array", "items": {"type": "string", "maxLength": 100}}
    assert value_grammar(declared, max_tokens=768).accepts(f'["{"d" * 100}"]')
    assert value_grammar(REPLY).accepts(f'{{"answer":"x","citations":["{"c" * 500}"]}}')


@pytest.mark.parametrize(
    "pattern",
    [
        "^(Paris|Paris, France|New York)$",
        "^(12\\.50|ORD\\-7781|a\\/b|x \\(y\\))$",
        "^(Zürich|東京|café au lait)$",
        "^(a||b)$",  # an empty option: the general parser's
        "^(a|b)+$",  # quantified: the general parser's
        "(a|b)",  # unanchored
        "^(a)(b)$",  # two groups
        '^(say "hi"|x)$',  # a quote: escaped in the literal
        "^(\\d|x)$",  # a class: not literal
    ],
)
def test_a_group_of_literal_options_reads_as_the_general_parser_reads_it(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Provenance writes the user's words as one group of literal alternatives; that form is
    # read by one regex (bench: the general parser took most of a plain request's plan).
    # The grammar must be the very text the general parser writes.
    from toolforge.core import gbnf

    schema = {"type": "string", "pattern": pattern}
    fast = json_value_grammar(schema)
    monkeypatch.setattr(gbnf, "_literal_group", lambda _body: None)
    assert json_value_grammar(schema) == fast
    if pattern.startswith("^(Paris"):
        g = parse(fast)
        assert g.accepts('"Paris, France"') and not g.accepts('"Paris, Texas"')
