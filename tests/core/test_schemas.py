"""The schema registry: built-ins generated from pydantic (docs/protocol.md), inline schemas checked
before use (docs/protocol.md: a bad one is a 422 naming the problem), ``Any`` accepts anything."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.core.schemas import (
    ANY,
    MAX_SCHEMA_BYTES,
    Action,
    AssistantReply,
    SchemaRegistry,
    builtin_registry,
    compile_schema,
    is_compiled,
    model_schema,
)
from toolforge.errors import ErrorCode, RequestError

# The degraded object of docs/protocol.md, verbatim.
SEED_DEGRADED = {
    "answer": "",
    "citations": [],
    "diagnostics": {
        "error": "schema_repair_failed",
        "last_validator_errors": [{"path": ".field", "message": "expected string"}],
    },
}

JSON = json_values(
    max_leaves=20, integers=st.integers(-(2**63), 2**63), max_list_size=4, max_dict_size=4
)


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return builtin_registry()


def test_builtins_are_generated_from_the_pydantic_models(registry: SchemaRegistry) -> None:
    assert registry.names() == ["Action", ANY, "AssistantReply"]
    assert registry.get("Action").schema == model_schema(Action)
    assert registry.get("AssistantReply").schema == model_schema(AssistantReply)
    assert registry.get(ANY).schema == {}


def test_the_seed_degraded_example_is_a_valid_assistant_reply(registry: SchemaRegistry) -> None:
    assert registry.get("AssistantReply").is_valid(SEED_DEGRADED)
    AssistantReply.model_validate(SEED_DEGRADED)


def test_action_has_an_enum_and_a_discriminated_union(registry: SchemaRegistry) -> None:
    schema = registry.get("Action").schema
    assert schema["$defs"]["Mode"]["enum"] == ["search", "book"]
    assert schema["properties"]["target"]["discriminator"]["propertyName"] == "kind"
    action = registry.get("Action")
    assert action.is_valid({"mode": "book", "target": {"kind": "time", "at": "19:00"}})
    assert not action.is_valid({"mode": "book", "target": {"kind": "time", "id": "p1"}})
    assert not action.is_valid({"mode": "buy", "target": {"kind": "place", "id": "p1"}})


def test_schemas_carry_no_title_noise(registry: SchemaRegistry) -> None:
    assert "title" not in str(registry.get("Action").schema)


@pytest.mark.parametrize("name", ["Action", "AssistantReply"])
def test_fallbacks_satisfy_the_pydantic_models_too(registry: SchemaRegistry, name: str) -> None:
    model = {"Action": Action, "AssistantReply": AssistantReply}[name]
    model.model_validate(registry.get(name).fallback)


def test_the_fallback_with_defaults_is_the_seed_shape(registry: SchemaRegistry) -> None:
    reply = registry.get("AssistantReply")
    assert reply.fallback == {"answer": ""}
    assert reply.fallback_with_defaults() == {"answer": "", "citations": []}


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_accepts_every_json_value(value: Any) -> None:
    assert builtin_registry().get(ANY).is_valid(value)


def test_unknown_name_is_a_typed_422(registry: SchemaRegistry) -> None:
    with pytest.raises(RequestError) as info:
        registry.get("Nope")
    assert info.value.code is ErrorCode.UNKNOWN_SCHEMA
    assert info.value.http_status == 422
    assert "'Nope'" in info.value.message and "AssistantReply" in info.value.message


def test_inline_schema_is_accepted_in_a_scope_only(registry: SchemaRegistry) -> None:
    scope = registry.scoped()
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer", "minimum": 1}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    compiled = scope.register_inline("Point", point)
    assert scope.get("Point") is compiled
    assert scope.get("AssistantReply") is registry.get("AssistantReply")  # falls through
    assert compiled.fallback == {"x": 1, "y": 0}
    assert compiled.is_valid({"x": 3, "y": -1}) and not compiled.is_valid({"x": 0, "y": 0})
    assert "Point" not in registry and "Point" in scope
    assert "Point" not in registry.scoped()  # another request never sees it
    assert dict(scope.all()) == {name: scope.get(name) for name in scope.names()}
    assert "Point" not in registry.all()


def test_all_is_built_once_and_follows_registrations(registry: SchemaRegistry) -> None:
    everything = registry.all()
    assert registry.all() is everything and registry.scoped().all() is everything
    assert dict(everything) == {name: registry.get(name) for name in registry.names()}
    registry.register("Extra", {"type": "string"})
    assert "Extra" not in everything and registry.all()["Extra"] is registry.get("Extra")
    with pytest.raises(TypeError):
        registry.all()["x"] = registry.get("Extra")  # type: ignore[index]


BAD_SCHEMAS = [
    ({"type": "strin"}, "schema.type"),
    ({"properties": {"a": {"minLength": -1}}}, "schema.properties.a.minLength"),
    ({"required": "a"}, "schema.required"),
    ({"$ref": "#/$defs/Missing"}, "'#/$defs/Missing' does not resolve"),
    ({"$ref": "https://example.com/s.json"}, "is not local"),
    ({"not": {}}, "cannot construct any value"),
    ({"type": "string", "minLength": 3, "maxLength": 1}, "cannot construct any value"),
    ({"type": "array", "minItems": 10**9}, "cannot construct any value"),
    ({"$ref": "#"}, "cannot construct any value"),
    (
        {
            "$defs": {"N": {"required": ["n"], "properties": {"n": {"$ref": "#/$defs/N"}}}},
            "$ref": "#/$defs/N",
        },
        "cannot",
    ),
    ([{"type": "string"}], "must be a JSON object"),
    ({"enum": ["x" * MAX_SCHEMA_BYTES]}, "byte limit"),
]


@pytest.mark.parametrize(("schema", "problem"), BAD_SCHEMAS)
def test_bad_inline_schema_is_a_422_naming_the_problem(
    registry: SchemaRegistry, schema: Any, problem: str
) -> None:
    with pytest.raises(RequestError) as info:
        registry.scoped().register_inline("Bad", schema)
    assert info.value.code is ErrorCode.INVALID_SCHEMA
    assert info.value.http_status == 422
    assert problem in info.value.message
    assert "'Bad'" in info.value.message


@pytest.mark.parametrize("name", ["AssistantReply", "Any", "has space", "", "x" * 129, "⟦x"])
def test_inline_names_must_be_new_and_well_formed(registry: SchemaRegistry, name: str) -> None:
    with pytest.raises(RequestError) as info:
        registry.scoped().register_inline(name, {"type": "object"})
    assert info.value.code is ErrorCode.INVALID_SCHEMA


def test_the_same_inline_name_twice_is_refused(registry: SchemaRegistry) -> None:
    scope = registry.scoped()
    scope.register_inline("Twice", {"type": "string"})
    with pytest.raises(RequestError, match="already registered"):
        scope.register_inline("Twice", {"type": "string"})


def test_compiled_schemas_are_cached_by_content() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    first = compile_schema(schema, name="Q")
    assert compile_schema(dict(schema), name="Q") is first
    schema["required"] = []  # the caller's dict is not the cached one
    assert first.schema["required"] == ["q"]


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date-time", "2026-11-27T19:00:00Z", "not a date"),
        ("date", "2026-11-27", "2026-13-01"),
        ("time", "19:00:00+01:00", "7pm"),
        ("email", "ana@example.com", "ana at example"),
        ("uuid", "9b2f6a3e-1c4d-4e8f-9a0b-1c2d3e4f5a6b", "9b2f6a3e"),
        ("ipv4", "192.0.2.7", "300.1.1.1"),
        ("uri", "https://example.com/a?b=1", "not a uri"),
    ],
)
def test_formats_are_asserted_and_their_fallback_is_valid(fmt: str, good: str, bad: str) -> None:
    compiled = compile_schema({"type": "string", "format": fmt})
    assert compiled.is_valid(good)
    assert not compiled.is_valid(bad)
    assert compiled.is_valid(compiled.fallback)


def test_is_compiled_answers_from_the_cache_without_compiling() -> None:
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}
    assert not is_compiled(schema, name="cached.parameters", fallback=False)
    first = compile_schema(schema, name="cached.parameters", fallback=False)
    assert is_compiled(dict(schema), name="cached.parameters", fallback=False)
    assert not is_compiled(schema, name="cached.parameters", fallback=True)  # another use
    assert compile_schema(schema, name="cached.parameters", fallback=False) is first
    assert not is_compiled({"$ref": "http://example.com/x"}, name="remote")  # refused
    assert not is_compiled([], name="not an object")
