"""toolforge.core.tool_specs: canonical types, allow/deny, argument validation, sizes,
escaping, keys."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from tests.strategies import json_values
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import (
    MAX_ARGS_BYTES,
    PermanentToolError,
    ToolArgumentsError,
    ToolEnvelope,
    ToolError,
    ToolInvocationRecord,
    ToolRegistry,
    ToolSpec,
    TransientToolError,
    derive_call_key,
    escape_sentinels,
    escape_sentinels_json,
    is_allowed,
    json_path,
    measure_json,
    parse_args,
    validate_args,
)
from toolforge.errors import ErrorCode, ToolForgeError


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sku: str = Field(min_length=2)
    qty: int = Field(ge=1)


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")
    party_size: int = Field(ge=1, le=20, description="guests")
    time: str = Field(pattern=r"^\d\d:\d\d$")
    items: list[Item] = Field(default_factory=list, max_length=30)


async def _noop(args: Any) -> object:
    return None


def spec(name: str = "orders.create", **kw: Any) -> ToolSpec[Any]:
    fields: dict[str, Any] = {"description": "d", "args_model": Order, "fn": _noop}
    fields.update(kw)
    return ToolSpec(name=name, **fields)


JSON = json_values(
    max_leaves=20,
    integers=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    keys=st.text(max_size=8),
    max_list_size=4,
    max_dict_size=4,
)


# -- ToolSpec -----------------------------------------------------------------------------


def test_input_schema_is_derived_from_the_args_model_and_cannot_be_passed() -> None:
    s = spec()
    assert s.input_schema == Order.model_json_schema()
    assert s.input_schema["properties"]["party_size"]["maximum"] == 20
    with pytest.raises(TypeError):
        ToolSpec(  # type: ignore[call-arg]
            name="x", description="d", args_model=Order, fn=_noop, input_schema={}
        )


def test_spec_defaults_follow_spec_section_5() -> None:
    s = spec()
    assert (s.retries, s.retry_delay_s, s.timeout_s) == (2, 2.0, None)
    assert (s.idempotent, s.needs_approval, s.model_facing) == (False, False, True)


def test_redact_keys_are_normalised() -> None:
    assert spec(redact_keys=frozenset({"Contact-Phone"})).redact_keys == {"contact_phone"}


@pytest.mark.parametrize("bad", ["", "two words", "⟦x⟧"])
def test_tool_names_must_be_plain(bad: str) -> None:
    with pytest.raises(ValueError):
        spec(bad)


@pytest.mark.parametrize("kw", [{"retries": -1}, {"retry_delay_s": -1.0}, {"timeout_s": 0.0}])
def test_nonsense_limits_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        spec(**kw)


def test_to_dict_is_the_public_description() -> None:
    d = spec(redact_keys=frozenset({"b", "a"})).to_dict()
    assert d["input_schema"] == Order.model_json_schema()
    assert d["redact_keys"] == ["a", "b"]
    assert "fn" not in d and "args_model" not in d
    orjson.dumps(d)  # JSON as it is


# -- registry, allow and deny -------------------------------------------------------------


def registry() -> ToolRegistry:
    return ToolRegistry([spec("a"), spec("b"), spec("internal", model_facing=False)])


def test_register_refuses_duplicates() -> None:
    reg = registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register(spec("a"))
    assert reg.names() == ["a", "b", "internal"] and len(reg) == 3 and "a" in reg


@pytest.mark.parametrize(
    ("allow", "deny", "shown"),
    [
        (None, (), ["a", "b"]),
        (None, ("a",), ["b"]),
        (["b"], (), ["b"]),
        (["a", "b"], ["b"], ["a"]),
        ([], (), []),
        (["internal"], (), []),
    ],
)
def test_visible_and_runnable_agree(
    allow: list[str] | None, deny: tuple[str, ...], shown: list[str]
) -> None:
    reg = registry()
    assert [s.name for s in reg.visible(allow, deny)] == shown
    for name in reg.names():
        if name in shown:
            assert reg.check_allowed(name, allow, deny).name == name
        else:
            with pytest.raises(ToolError) as info:
                reg.check_allowed(name, allow, deny)
            assert info.value.code is ErrorCode.TOOL_NOT_ALLOWED


def test_unknown_tool_is_not_found_and_lists_what_exists() -> None:
    with pytest.raises(ToolError) as info:
        registry().check_allowed("nope", None, ["b"])
    assert info.value.code is ErrorCode.TOOL_NOT_FOUND
    assert "available tools: a" in info.value.message


@given(
    allow=st.none() | st.lists(st.sampled_from(["a", "b", "internal", "zz"])),
    deny=st.lists(st.sampled_from(["a", "b", "internal", "zz"])),
)
def test_a_tool_runs_exactly_when_it_is_shown(allow: list[str] | None, deny: list[str]) -> None:
    reg = registry()
    shown = {s.name for s in reg.visible(allow, deny)}
    for s in reg:
        assert (s.name in shown) == is_allowed(s, allow, deny)


# -- validation ---------------------------------------------------------------------------


def test_valid_arguments_become_the_model() -> None:
    got = validate_args(spec(), {"party_size": 4, "time": "19:00"})
    assert isinstance(got, Order) and got.party_size == 4


def test_arguments_may_come_as_json_text() -> None:
    assert validate_args(spec(), '{"party_size": 2, "time": "19:00"}').party_size == 2
    assert validate_args(spec(), b'{"party_size": 3, "time": "19:00"}').party_size == 3


def details_of(raw: object) -> tuple[ToolArgumentsError, list[dict[str, str]]]:
    with pytest.raises(ToolArgumentsError) as info:
        validate_args(spec(), raw)
    assert info.value.code is ErrorCode.TOOL_ARGS_INVALID
    assert info.value.details is not None
    return info.value, info.value.details


def test_a_rejection_names_the_json_path_and_the_constraint() -> None:
    err, details = details_of({"party_size": 21, "time": "7pm"})
    assert {d["path"] for d in details} == {"$.party_size", "$.time"}
    by_path = {d["path"]: d for d in details}
    assert by_path["$.party_size"]["constraint"] == "less_than_equal(le=20)"
    assert by_path["$.time"]["constraint"] == r"string_pattern_mismatch(pattern=^\d\d:\d\d$)"
    assert err.message.startswith("2 invalid arguments for orders.create: ")
    assert "$.party_size: Input should be less than or equal to 20 [less_than_equal(le=20)]" in (
        err.message
    )
    assert err.retryable is False
    assert err.to_dict()["details"] == details


def test_nested_paths_missing_extra_and_strict_types() -> None:
    _, details = details_of(
        {"party_size": "4", "items": [{"sku": "ok", "qty": 1}, {"sku": "x"}], "extra": 1}
    )
    got = {(d["path"], d["constraint"].split("(")[0]) for d in details}
    assert got == {
        ("$.party_size", "int_type"),  # strict: "4" is not an integer
        ("$.time", "missing"),
        ("$.items[1].sku", "string_too_short"),
        ("$.items[1].qty", "missing"),
        ("$.extra", "extra_forbidden"),
    }


def test_input_values_are_never_echoed() -> None:
    err, _ = details_of({"party_size": "sk-secretsecret", "time": "19:00"})
    assert "secret" not in err.message and "secret" not in str(err.details)


def test_a_non_object_is_reported_at_the_root() -> None:
    _, details = details_of([1, 2])
    assert details == [
        {"path": "$", "constraint": "model_type", "message": "Input should be an object"}
    ]


def test_a_flood_of_violations_is_listed_up_to_a_bound() -> None:
    err, details = details_of({"party_size": 1, "time": "10:00", **{f"k{i}": i for i in range(25)}})
    assert len(details) == 20 and err.message.endswith("; and 5 more")


def test_bad_json_text_is_invalid_json() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        validate_args(spec(), '{"party_size": 4,')
    assert info.value.code is ErrorCode.INVALID_JSON
    for bad in ('{"a": NaN}', '{"a": 1,}', b'"\\ud800"' + b"\xff"):
        with pytest.raises(ToolArgumentsError):
            validate_args(spec(), bad)


def test_a_value_that_is_not_json_is_rejected() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        validate_args(spec(), {"party_size": object()})
    assert info.value.code is ErrorCode.TOOL_ARGS_INVALID


def test_too_large_arguments_are_refused_before_parsing() -> None:
    big = "x" * MAX_ARGS_BYTES
    for raw in ({"time": big}, orjson.dumps({"time": big}).decode()):
        with pytest.raises(ToolArgumentsError) as info:
            validate_args(spec(), raw)
        assert info.value.code is ErrorCode.ARGUMENTS_TOO_LARGE
    # Too large text is refused without being parsed at all.
    with pytest.raises(ToolArgumentsError) as info:
        parse_args("[" * (MAX_ARGS_BYTES + 1))
    assert info.value.code is ErrorCode.ARGUMENTS_TOO_LARGE


def test_a_broken_validator_is_a_typed_error() -> None:
    class Broken(BaseModel):
        x: int

        def model_post_init(self, _ctx: Any) -> None:
            raise TypeError("bug")

    with pytest.raises(ToolError) as info:
        validate_args(spec(args_model=Broken), {"x": 1})
    assert info.value.code is ErrorCode.TOOL_FAILED


@given(JSON)
def test_validation_returns_a_model_or_raises_our_error(raw: object) -> None:
    try:
        validate_args(spec(), raw)
    except ToolForgeError:
        pass


@given(st.text() | st.binary())
def test_validation_of_any_text_returns_a_model_or_raises_our_error(raw: str | bytes) -> None:
    try:
        validate_args(spec(), raw)
    except ToolForgeError:
        pass


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        ((), "$"),
        (("a",), "$.a"),
        (("items", 0, "qty"), "$.items[0].qty"),
        (("odd key",), '$["odd key"]'),
        (("1x",), '$["1x"]'),
    ],
)
def test_json_path(loc: tuple[int | str, ...], path: str) -> None:
    assert json_path(loc) == path


# -- sizes --------------------------------------------------------------------------------


def test_size_is_compact_utf8_json() -> None:
    value = {"k": "é" * 10}  # {"k":"…"}: 8 bytes of syntax + 20 of UTF-8
    assert measure_json(value, limit=28, code=ErrorCode.TOOL_OUTPUT_TOO_LARGE, what="r") == (
        orjson.dumps(value)
    )
    with pytest.raises(ToolError) as info:
        measure_json(value, limit=27, code=ErrorCode.TOOL_OUTPUT_TOO_LARGE, what="result")
    assert info.value.code is ErrorCode.TOOL_OUTPUT_TOO_LARGE
    assert info.value.details == [{"size": "28", "limit": "27"}]
    with pytest.raises(ToolError) as info:
        measure_json({1, 2} | {object()}, limit=9, code=ErrorCode.TOOL_OUTPUT_TOO_LARGE, what="r")
    assert info.value.code is ErrorCode.TOOL_OUTPUT_INVALID


# -- sentinel escaping --------------------------------------------------------------------


def test_sentinels_become_visible_escapes_in_every_string_and_key() -> None:
    value = {
        "note": "⟦END_TOOL_CALL id=1⟧",
        "⟦k⟧": ["a⟦b", {"deep": ["⟧"]}],
        "n": 1,
        "ok": "plain ⟨text⟩",
    }
    assert escape_sentinels(value) == {
        "note": "\\u27e6END_TOOL_CALL id=1\\u27e7",
        "\\u27e6k\\u27e7": ["a\\u27e6b", {"deep": ["\\u27e7"]}],
        "n": 1,
        "ok": "plain ⟨text⟩",
    }
    # The JSON text carries an escaped backslash: it decodes to the escape, never to ⟦.
    text = orjson.dumps(escape_sentinels("⟦")).decode()
    assert text == '"\\\\u27e6"' and json.loads(text) == "\\u27e6"


def test_escaping_works_on_serialised_json_too() -> None:
    blob = orjson.dumps({"a": "x⟦y"})
    assert orjson.loads(escape_sentinels_json(blob)) == {"a": "x\\u27e6y"}
    assert escape_sentinels_json(b'{"a":1}') == b'{"a":1}'


def test_escaping_a_value_that_is_not_json_is_a_typed_error() -> None:
    with pytest.raises(ToolError) as info:
        escape_sentinels(object())
    assert info.value.code is ErrorCode.TOOL_OUTPUT_INVALID


def _replace_everywhere(value: object) -> object:
    if isinstance(value, str):
        return sentinels.escape(value)
    if isinstance(value, list):
        return [_replace_everywhere(v) for v in value]
    if isinstance(value, dict):
        return {sentinels.escape(k): _replace_everywhere(v) for k, v in value.items()}
    return value


SENTINELISH = st.text(alphabet=st.sampled_from('⟦⟧ab\\u"é\n'), max_size=12)
JSON_WITH_SENTINELS = st.recursive(
    st.none() | st.integers(-10, 10) | SENTINELISH,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(SENTINELISH, children, max_size=4)
    ),
    max_leaves=15,
)


@given(JSON_WITH_SENTINELS)
def test_escaping_equals_replacing_in_every_string(value: object) -> None:
    escaped = escape_sentinels(value)
    assert escaped == _replace_everywhere(value)
    text = orjson.dumps(escaped).decode()
    assert "⟦" not in text and "⟧" not in text


# -- call keys ----------------------------------------------------------------------------


def test_call_keys_are_sha256_over_every_part() -> None:
    base = derive_call_key("idem-1", "c1", "bookings.create", {"a": 1, "b": [1, 2]})
    assert len(base) == 64 and int(base, 16) >= 0
    assert base == derive_call_key("idem-1", "c1", "bookings.create", {"b": [1, 2], "a": 1})
    others = {
        derive_call_key("idem-2", "c1", "bookings.create", {"a": 1, "b": [1, 2]}),
        derive_call_key("idem-1", "c2", "bookings.create", {"a": 1, "b": [1, 2]}),
        derive_call_key("idem-1", "c1", "places.search", {"a": 1, "b": [1, 2]}),
        derive_call_key("idem-1", "c1", "bookings.create", {"a": 2, "b": [1, 2]}),
    }
    assert base not in others and len(others) == 4
    with pytest.raises(ToolArgumentsError):
        derive_call_key("k", "c", "t", {1: object()})


# -- envelope, record, errors -------------------------------------------------------------


def test_envelope_shapes() -> None:
    ok = ToolEnvelope.success({"x": 1}, [{"code": "w", "message": "m"}])
    assert ok.to_dict() == {
        "ok": True,
        "data": {"x": 1},
        "warnings": [{"code": "w", "message": "m"}],
        "errors": [],
    }
    failed = ToolEnvelope.failure(TransientToolError("busy"))
    assert failed.to_dict() == {
        "ok": False,
        "data": None,
        "warnings": [],
        "errors": [{"code": "TOOL_UNAVAILABLE", "message": "busy", "retryable": True}],
    }


def test_record_to_dict_has_the_canonical_fields() -> None:
    record = ToolInvocationRecord("c1", "t", {"a": 1}, {"r": 2}, None, 1.0, 2.0, 1)
    assert list(record.to_dict()) == [
        "call_id",
        "name",
        "args",
        "result",
        "error",
        "started_at",
        "ended_at",
        "attempts",
    ]


def test_tool_errors_are_in_the_error_tree() -> None:
    err = PermanentToolError("full", code=ErrorCode.BOOKING_FULL, details=[{"reason": "full"}])
    assert isinstance(err, ToolForgeError) and err.retryable is False
    assert err.to_dict() == {
        "code": "BOOKING_FULL",
        "message": "full",
        "retryable": False,
        "details": [{"reason": "full"}],
    }
    assert PermanentToolError("x").code is ErrorCode.TOOL_FAILED
    assert TransientToolError("x").retryable is True
