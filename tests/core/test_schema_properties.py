"""Properties of the schema path, over generated schemas:

- every fallback value the gateway builds for an OBJECT schema validates against it;
- every value the compiled grammar admits, parsed, validates against the schema (for the
  keywords the grammar enforces exactly: docs/schemas.md's table);
- every value valid against the schema is admitted by the grammar when written in the
  schema's property order (the grammar does not forbid what the schema allows).
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.gbnf_matcher import parse
from tests.strategies import json_values
from toolforge.core.gbnf import json_value_grammar
from toolforge.core.schemas import compile_schema
from toolforge.errors import RequestError

# Patterns the grammar converts exactly (anchored or not), and formats whose grammar
# shape is exactly what validation checks.
PATTERNS = ["^[0-9]{5}$", "^[A-Z]-[0-9]+$", "^[0-2][0-9]:[0-5][0-9]$", "[a-z]+", "^ab", "x$"]
EXACT_FORMATS = ["uuid", "ipv4"]
ANY_FORMATS = [*EXACT_FORMATS, "date", "date-time", "time", "email", "uri"]
_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
_FORMAT_VALUES: dict[str, st.SearchStrategy[str]] = {
    "uuid": st.uuids().map(str),
    "ipv4": st.ip_addresses(v=4).map(str),
}

# Each strategy draws a pair: a schema, and a strategy of values valid against it.
Pair = tuple[dict[str, Any], st.SearchStrategy[Any]]


def _strings(formats: list[str]) -> st.SearchStrategy[Pair]:
    def bounded(lo: int, extra: int) -> Pair:
        schema = {"type": "string", "minLength": lo, "maxLength": lo + extra}
        return schema, st.text(_PRINTABLE, min_size=lo, max_size=lo + extra)

    def patterned(p: str) -> Pair:
        # Python's "$" also matches before a final newline, which JSON Schema's (ECMA-262,
        # RE2) does not: those strings are not valid values.
        values = st.from_regex(p, alphabet=_PRINTABLE).filter(lambda v: "\n" not in v)
        return {"type": "string", "pattern": p}, values

    def formatted(f: str) -> Pair:
        return {"type": "string", "format": f}, _FORMAT_VALUES.get(f, st.nothing())

    return st.one_of(
        st.just(({"type": "string"}, st.text(_PRINTABLE, max_size=8))),
        st.builds(bounded, st.integers(0, 4), st.integers(0, 6)),
        st.sampled_from(PATTERNS).map(patterned),
        st.sampled_from(formats).map(formatted),
    )


def _scalars(formats: list[str]) -> st.SearchStrategy[Pair]:
    def integers(lo: int, span: int) -> Pair:
        return {"type": "integer", "minimum": lo, "maximum": lo + span}, st.integers(lo, lo + span)

    def enum(values: list[Any]) -> Pair:
        return {"enum": values}, st.sampled_from(values)

    return st.one_of(
        _strings(formats),
        st.builds(integers, st.integers(-50, 50), st.integers(0, 200)),
        st.just(({"type": "boolean"}, st.booleans())),
        st.just(({"type": "null"}, st.none())),
        st.lists(
            st.sampled_from(["a", "b", 1, None, True]), min_size=1, max_size=3, unique=True
        ).map(enum),
    )


def _pairs(formats: list[str]) -> st.SearchStrategy[Pair]:
    def containers(inner: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
        def obj(props: dict[str, Pair], required: set[str]) -> Pair:
            schema = {
                "type": "object",
                "properties": {k: p[0] for k, p in props.items()},
                "required": sorted(required),
                "additionalProperties": False,
            }
            values = st.fixed_dictionaries(
                {k: p[1] for k, p in props.items() if k in required},
                optional={k: p[1] for k, p in props.items() if k not in required},
            )
            return schema, values

        objects = st.dictionaries(
            st.sampled_from(["id", "name", "at", "qty", "tags"]), inner, min_size=1, max_size=4
        ).flatmap(
            lambda props: st.sets(st.sampled_from(sorted(props))).map(
                lambda required: obj(props, required)
            )
        )

        def arr(item: Pair, lo: int, extra: int) -> Pair:
            schema = {"type": "array", "items": item[0], "minItems": lo, "maxItems": lo + extra}
            return schema, st.lists(item[1], min_size=lo, max_size=lo + extra)

        arrays = st.builds(arr, inner, st.integers(0, 2), st.integers(0, 3))
        return st.one_of(objects, arrays)

    return st.recursive(_scalars(formats), containers, max_leaves=6)


def _schemas(formats: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return _pairs(formats).map(lambda pair: pair[0])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas(ANY_FORMATS))
def test_every_fallback_value_validates(schema: dict[str, Any]) -> None:
    try:
        compiled = compile_schema(schema, name="generated")
    except RequestError as exc:
        assert "cannot construct any value" in exc.message, exc.message
        return
    assert compiled.is_valid(compiled.require_fallback())
    assert compiled.is_valid(compiled.fallback_with_defaults())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=_pairs(EXACT_FORMATS), data=st.data())
def test_what_the_grammar_admits_validates(pair: Pair, data: st.DataObject) -> None:
    schema, valid = pair
    compiled = compile_schema(schema, name="generated", fallback=False)
    grammar = parse(json_value_grammar(schema))
    candidates = [
        data.draw(valid),
        data.draw(json_values(max_leaves=6, integers=st.integers(-(2**53), 2**53))),
    ]
    for value in candidates:
        text = orjson.dumps(value).decode()
        if grammar.accepts(text):
            assert compiled.is_valid(orjson.loads(text)), (schema, text)


def _in_order(schema: dict[str, Any], value: object) -> object:
    """``value`` with each object's members in the schema's declared order."""
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        return {k: _in_order(props[k], value[k]) for k in props if k in value}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_in_order(schema["items"], v) for v in value]
    return value


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=_pairs(EXACT_FORMATS), data=st.data())
def test_the_grammar_admits_every_valid_value(pair: Pair, data: st.DataObject) -> None:
    schema, valid = pair
    grammar = parse(json_value_grammar(schema))
    value = _in_order(schema, data.draw(valid))
    assert compile_schema(schema, name="generated", fallback=False).is_valid(value)
    text = orjson.dumps(value).decode()
    assert grammar.accepts(text), (schema, text)
