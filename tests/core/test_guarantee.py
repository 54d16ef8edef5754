"""The JSON guarantee (docs/protocol.md): validator errors with paths, local repair, the
model-repair decision, the minimal valid fallback, degradation — and the invariants that make it a
guarantee: the fallback always validates, and no text makes repair raise."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolforge.core.events import FrameKind
from toolforge.core.guarantee import (
    MAX_ERRORS,
    REPAIR_FAILED,
    Degraded,
    NeedsModelRepair,
    Repaired,
    Valid,
    ValidatorError,
    after_model_repair,
    degrade,
    end_fields,
    finish_frame,
    give_up,
    local_repair,
    minimal_valid,
    render_repair_prompt,
    validate,
)
from toolforge.core.protocol import sentinels
from toolforge.core.schemas import CompiledSchema, builtin_registry, compile_schema
from toolforge.errors import ErrorCode, JSONError

REGISTRY = builtin_registry()
ACTION = REGISTRY.get("Action")
REPLY = REGISTRY.get("AssistantReply")
ANY = REGISTRY.get("Any")
REPAIR_TXT = Path(__file__).resolve().parents[2] / "prompts" / "repair.txt"
CLOSED = compile_schema(
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3}},
        "required": ["n"],
        "additionalProperties": False,
    },
    name="Closed",
)


def syntax_error(message: str = "bad") -> JSONError:
    return JSONError(ErrorCode.JSON_SYNTAX, message, offset=0)


def errors(schema: CompiledSchema, value: Any) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in validate(schema, value)]


# --- validation: paths and messages -------------------------------------------------------

PLACE = {"kind": "place", "id": "p1"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"mode": "search", "target": PLACE}, []),
        (
            {"mode": "buy", "target": PLACE},
            [("$.mode", "'buy' is not one of ['search', 'book']")],
        ),
        (
            {"mode": "book", "target": {"kind": "plane", "id": "p1"}},
            [("$.target.kind", "'plane' is not a valid 'kind' (one of ['place', 'time'])")],
        ),
        (
            {"mode": "book", "target": {"id": "p1"}},
            [("$.target", "'kind' is a required property (one of ['place', 'time'])")],
        ),
        (
            {"mode": "book", "target": "p1"},
            [("$.target", "'p1' is not an object with a 'kind' (one of ['place', 'time'])")],
        ),
        (  # the branch the tag names, not "not valid under any of the given schemas"
            {"mode": "book", "target": {"kind": "time", "id": "p1"}},
            [
                ("$.target", "'at' is a required property"),
                ("$.target", "Additional properties are not allowed ('id' was unexpected)"),
            ],
        ),
        (
            {"mode": "search", "target": {"kind": "place", "id": 7}},
            [("$.target.id", "7 is not of type 'string'")],
        ),
        ({"mode": "search"}, [("$", "'target' is a required property")]),
    ],
)
def test_enum_and_union_violations_name_path_and_problem(
    value: Any, expected: list[tuple[str, str]]
) -> None:
    assert errors(ACTION, value) == expected


def test_paths_index_arrays_and_quote_odd_keys() -> None:
    assert errors(REPLY, {"answer": "a", "citations": ["x", 1]}) == [
        ("$.citations[1]", "1 is not of type 'string'")
    ]
    odd = compile_schema({"properties": {"a b": {"type": "string"}}})
    assert errors(odd, {"a b": 1}) == [('$["a b"]', "1 is not of type 'string'")]


def test_undiscriminated_unions_report_the_closest_branch() -> None:
    schema = compile_schema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "object", "required": ["a", "b"]},
                {"type": "object", "required": ["a"]},
            ]
        }
    )
    assert errors(schema, {}) == [("$", "'a' is a required property")]
    assert errors(schema, 5) == [("$", "5 is not valid under any of the given schemas")]


def test_errors_are_sorted_naturally_capped_and_clipped() -> None:
    schema = compile_schema({"type": "array", "items": {"type": "string"}})
    found = validate(schema, list(range(50)))
    assert len(found) == MAX_ERRORS
    assert [e.path for e in found[:3]] == ["$[0]", "$[1]", "$[2]"]
    assert found[-1].path == "$[19]"
    huge = validate(compile_schema({"type": "string"}), {"k": "v" * 10_000})
    assert len(huge[0].message) <= 200 and huge[0].message.endswith("…")


def test_validate_accepts_a_raw_schema_and_names_the_keyword() -> None:
    (error,) = validate({"type": "object", "required": ["q"]}, {})
    assert error == ValidatorError("$", "'q' is a required property", "required")
    assert error.to_dict() == {"path": "$", "message": "'q' is a required property"}


# --- local repair -------------------------------------------------------------------------

LOCAL_FIXES = [
    ('{"answer": "hi", "citations": ["a", "b",],}', {"answer": "hi", "citations": ["a", "b"]}),
    ("{'answer': 'hi', 'citations': ['a']}", {"answer": "hi", "citations": ["a"]}),
    ('{"answer": "hi", "citations": ["a"]', {"answer": "hi", "citations": ["a"]}),
    ('{"answer": "hi"', {"answer": "hi"}),
    ('{"answer": "hi"}}', {"answer": "hi"}),
]


@pytest.mark.parametrize(("text", "value"), LOCAL_FIXES)
def test_syntax_slips_are_repaired_locally(text: str, value: Any) -> None:
    assert local_repair(text, REPLY) == value
    outcome = finish_frame(text, syntax_error(), REPLY)
    assert isinstance(outcome, Repaired) and outcome.via == "local"
    assert outcome.value == value
    assert end_fields(outcome) == {"value": value, "repaired": True, "degraded": False}


def test_a_valid_frame_is_sent_as_is() -> None:
    value = {"mode": "search", "target": PLACE}
    outcome = finish_frame('{"mode":"search","target":{"kind":"place","id":"p1"}}', value, ACTION)
    assert outcome == Valid(value)
    assert end_fields(outcome) == {"value": value, "repaired": False, "degraded": False}


def test_a_missing_required_key_is_not_fixable_locally() -> None:
    text = '{"citations": ["a"]}'
    assert local_repair(text, REPLY) is None  # valid JSON: a syntax repair cannot help
    outcome = finish_frame(text, {"citations": ["a"]}, REPLY)
    assert outcome == NeedsModelRepair(
        text, (ValidatorError("$", "'answer' is a required property", "required"),)
    )


def test_a_syntax_slip_hiding_a_schema_error_asks_the_model_with_both() -> None:
    text = '{"mode": "buy", "target": {"kind": "place", "id": "p1"},}'
    outcome = finish_frame(text, syntax_error("trailing comma"), ACTION)
    assert isinstance(outcome, NeedsModelRepair)
    assert [(e.path, e.keyword) for e in outcome.errors] == [("$", "json"), ("$.mode", "enum")]
    assert "trailing comma" in outcome.errors[0].message


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "hello",
        "'abc'",
        "tru",
        "[" * 100_000,
        "{" * 50_000,
        '{"a":' * 30_000,
        '{"n": 1e999}',  # json_repair reads inf: not strict JSON
        '{"s": "\\ud800"}',
        "[" * 20 + "]" * 20,  # valid JSON, too deep for a frame
        '{"answer": "' + "x" * 70_000 + '"',  # over the size cap
    ],
)
def test_hostile_text_is_never_repaired_into_something_bad(text: str) -> None:
    assert local_repair(text, ANY) is None
    outcome = finish_frame(text, syntax_error(), ANY)
    assert isinstance(outcome, NeedsModelRepair) and outcome.errors


# Inputs on which json_repair 0.64 is superlinear (seconds to a minute each, measured); the
# anomaly screen must refuse them before json_repair sees them.
PATHOLOGICAL = [
    '{"' * 16_000,
    "{1}" * 2_000,
    "1}{" * 2_000,
    "n]{" * 2_600,
    "'" + "n]{" * 2_000,
    '["' + "n]{" * 2_000,
    '{"a": "' + "k: {" * 4_000,
    "{'a': '" + "n:{" * 4_000 + "'}",
    '{"a": "' + "x, " * 4_000 + '\\\\",}',
    '{"a": "' + "{" * 16_000 + '\n"}',
]


def test_pathological_text_is_refused_fast() -> None:
    started = time.perf_counter()
    for text in PATHOLOGICAL:
        assert local_repair(text, ANY) is None
        assert isinstance(finish_frame(text, syntax_error(), ANY), NeedsModelRepair)
    # Unscreened, the first one alone takes ~40 s; screened, all of them take milliseconds.
    assert time.perf_counter() - started < 5


def test_a_long_answer_cut_short_is_still_repaired_locally() -> None:
    text = '{"answer": "' + "word, word: word. " * 2_000
    value = local_repair(text, REPLY)
    assert isinstance(value, dict) and value["answer"].startswith("word, word")


def test_repairs_are_strict_json() -> None:
    assert local_repair('[{"a": NaN}]', ANY) == [{"a": "NaN"}]  # json_repair quotes it


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.text(max_size=400)
    | st.text(alphabet=st.sampled_from("{}[]\",:'\\ abtrufalsn0123.-e/*`\n"), max_size=400)
)
def test_local_repair_never_raises(text: str) -> None:
    for schema in (ANY, REPLY):
        value = local_repair(text, schema)
        assert value is None or schema.is_valid(value)
        finish_frame(text, syntax_error(), schema)


# --- the model repair ---------------------------------------------------------------------

ASKED = (ValidatorError("$", "'answer' is a required property", "required"),)


@pytest.mark.parametrize(
    "reply",
    [
        '{"answer": "fixed"}',
        '  ```json\n{"answer": "fixed"}\n```  ',
        "```\n{'answer': 'fixed',}\n```",
        sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", '{"answer": "fixed"}'),
    ],
)
def test_a_good_model_reply_is_a_model_repair(reply: str) -> None:
    outcome = after_model_repair(reply, REPLY, ASKED)
    assert outcome == Repaired({"answer": "fixed"}, "model", ASKED)


def test_a_reply_that_still_fails_degrades_with_its_own_errors() -> None:
    outcome = after_model_repair('{"answer": 42}', REPLY, ASKED)
    assert isinstance(outcome, Degraded) and outcome.in_band
    assert outcome.errors == (ValidatorError("$.answer", "42 is not of type 'string'", "type"),)
    assert outcome.value == {
        "answer": "",
        "citations": [],
        "diagnostics": {
            "error": REPAIR_FAILED,
            "last_validator_errors": [
                {"path": "$.answer", "message": "42 is not of type 'string'"}
            ],
        },
    }
    assert end_fields(outcome) == {"value": outcome.value, "repaired": False, "degraded": True}


@pytest.mark.parametrize("reply", [None, "", "Sorry, I cannot help with that."])
def test_no_usable_reply_degrades_with_the_errors_the_model_was_given(reply: str | None) -> None:
    outcome = after_model_repair(reply, REPLY, ASKED)
    assert isinstance(outcome, Degraded)
    assert outcome.errors == ASKED
    assert REPLY.is_valid(outcome.value)


def test_degrade_is_valid_and_carries_diagnostics_in_band() -> None:
    value = degrade(REPLY, ASKED)
    assert validate(REPLY, value) == []
    assert isinstance(value, dict)
    assert value["diagnostics"]["last_validator_errors"] == [e.to_dict() for e in ASKED]
    action = degrade(ACTION, ASKED)  # closed schema: no room for diagnostics
    assert action == {"mode": "search", "target": {"kind": "place", "id": ""}}


def test_diagnostics_go_out_of_band_when_the_schema_is_closed() -> None:
    outcome = give_up(CLOSED, ASKED)
    assert outcome.value == {"n": 3} and not outcome.in_band
    fields = end_fields(outcome)
    assert fields["degraded"] is True
    assert fields["diagnostics"] == {
        "error": REPAIR_FAILED,
        "last_validator_errors": [e.to_dict() for e in ASKED],
    }


def test_any_degrades_to_an_object_of_diagnostics() -> None:
    outcome = give_up(ANY, ASKED)
    assert outcome.in_band and outcome.value == {"diagnostics": outcome.diagnostics}


def test_the_repair_prompt_fills_every_placeholder() -> None:
    template = REPAIR_TXT.read_text(encoding="utf-8")
    found = validate(ACTION, {"mode": "buy"})
    prompt = render_repair_prompt(template, schema=ACTION, text='{"mode": "buy"}', errors=found)
    assert "$schema" not in prompt and "$text" not in prompt and "$errors" not in prompt
    assert '"$defs"' in prompt and '{"mode": "buy"}' in prompt
    assert "- $.mode: 'buy' is not one of ['search', 'book']" in prompt
    assert "- $: 'target' is a required property" in prompt


# --- minimal_valid ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({}, None),
        ({"type": "string"}, ""),
        ({"type": "string", "minLength": 3}, "xxx"),
        ({"type": "integer", "minimum": 5}, 5),
        ({"type": "integer", "maximum": -2}, -2),
        ({"type": "integer", "exclusiveMinimum": 5}, 6),
        ({"type": "integer", "minimum": 5, "multipleOf": 4}, 8),
        ({"type": "number", "exclusiveMinimum": 0.25, "maximum": 0.75}, 0.5),
        ({"type": "boolean"}, False),
        ({"type": ["null", "string"]}, None),
        ({"enum": ["b", "a"]}, "b"),
        ({"const": {"k": 1}}, {"k": 1}),
        ({"type": "array", "items": {"enum": [7]}, "minItems": 2}, [7, 7]),
        (
            {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "uniqueItems": True},
            [1, 2],
        ),
        (
            {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                "minItems": 2,
            },
            ["", False],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                "required": ["b"],
            },
            {"b": 0},
        ),
        (
            {"type": "object", "minProperties": 1, "properties": {"a": {"type": "boolean"}}},
            {"a": False},
        ),
        (
            {
                "$defs": {"T": {"enum": ["t"]}},
                "type": "object",
                "properties": {"t": {"$ref": "#/$defs/T"}},
                "required": ["t"],
            },
            {"t": "t"},
        ),
        ({"oneOf": [{"type": "integer", "minimum": 10, "maximum": 5}, {"type": "string"}]}, ""),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 0.5),  # 0 would match both
        ({"allOf": [{"required": ["a"]}, {"properties": {"a": {"const": 1}}}]}, {"a": 1}),
        ({"anyOf": [{"type": "object", "required": ["x"]}, {"type": "null"}]}, {"x": None}),
    ],
)
def test_minimal_valid_builds_the_smallest_value(schema: dict[str, Any], expected: Any) -> None:
    value = minimal_valid(schema)
    assert validate(schema, value) == []
    if isinstance(expected, float):
        assert isinstance(value, float) and math.isclose(value, expected)
    else:
        assert value == expected


def test_minimal_valid_returns_a_fresh_copy() -> None:
    first = minimal_valid(ACTION)
    assert isinstance(first, dict)
    first["target"]["id"] = "changed"
    assert minimal_valid(ACTION) == {"mode": "search", "target": {"kind": "place", "id": ""}}


# A family of schemas models and callers write: objects with required string / integer /
# boolean / enum / array / nested-object properties, numeric bounds, discriminated oneOf.

_names = st.sampled_from(["a", "b", "id", "kind2", "n", "items", "x y"])
_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3)


def _integer(lo: int, width: int, step: int, exclusive: bool) -> dict[str, Any]:
    bound = "exclusiveMinimum" if exclusive else "minimum"
    return {"type": "integer", bound: lo, "maximum": lo + width + step, "multipleOf": step}


def _number(lo: float, width: float, exclusive: bool) -> dict[str, Any]:
    if exclusive:
        return {"type": "number", "exclusiveMinimum": lo, "exclusiveMaximum": lo + width}
    return {"type": "number", "minimum": lo, "maximum": lo + width}


_leaves = st.one_of(
    st.integers(0, 4).map(
        lambda n: {"type": "string", "minLength": n} if n else {"type": "string"}
    ),
    st.builds(_integer, st.integers(-50, 50), st.integers(0, 9), st.integers(1, 5), st.booleans()),
    st.builds(_number, st.floats(-100, 100), st.floats(0.01, 10), st.booleans()),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(_scalars, min_size=1, max_size=4).map(lambda v: {"enum": v}),
    _scalars.map(lambda v: {"const": v}),
)


def _object(props: dict[str, Any], data: st.DataObject, closed: bool) -> dict[str, Any]:
    required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if closed:
        out["additionalProperties"] = False
    return out


@st.composite
def _compound(draw: st.DrawFn, children: st.SearchStrategy[Any]) -> dict[str, Any]:
    kind = draw(st.sampled_from(["object", "array", "oneOf", "nullable", "anyOf"]))
    if kind == "object":
        props = draw(st.dictionaries(_names, children, max_size=4))
        return _object(props, draw(st.data()), draw(st.booleans()))
    if kind == "array":
        return {"type": "array", "items": draw(children), "minItems": draw(st.integers(0, 3))}
    if kind == "nullable":
        return {"anyOf": [draw(children), {"type": "null"}]}
    if kind == "anyOf":
        return {"anyOf": draw(st.lists(children, min_size=1, max_size=3))}
    branches = []
    for i in range(draw(st.integers(1, 3))):
        props = draw(st.dictionaries(_names.filter(lambda n: n != "kind"), children, max_size=3))
        tagged = {"kind": {"const": f"k{i}"}, **props}
        branch = _object(tagged, draw(st.data()), draw(st.booleans()))
        branch["required"] = ["kind", *(k for k in branch["required"] if k != "kind")]
        branches.append(branch)
    return {"oneOf": branches, "discriminator": {"propertyName": "kind"}}


_schemas = st.recursive(_leaves, lambda children: _compound(children), max_leaves=12)


@st.composite
def _top_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema = draw(_schemas)
    if draw(st.booleans()):  # through $defs/$ref, as pydantic writes models
        return {
            "$defs": {"D": schema},
            "type": "object",
            "properties": {"d": {"$ref": "#/$defs/D"}},
            "required": ["d"],
        }
    return schema


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_top_schemas())
def test_minimal_valid_always_validates(schema: dict[str, Any]) -> None:
    value = minimal_valid(schema)
    assert validate(schema, value) == []
    degraded = degrade(schema, ASKED)
    assert validate(schema, degraded) == []
