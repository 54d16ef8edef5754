"""The official JSON Schema Test Suite (Draft 2020-12) against the gateway's validator.

Every case the suite marks valid or invalid is checked through ``compile_schema``, the one
door every schema of the gateway goes through (tool parameters, OBJECT schemas, the
proxy's ``response_format``). A schema the gateway refuses must be refused for a reason
``docs/schemas.md`` documents; none may be accepted and then judged differently from the
suite. Two deliberate departures, both documented:

- ``format`` is asserted (the suite's ``format.json`` says annotation-only by default):
  those cases are run from ``optional/format/`` instead, for the formats the gateway
  checks, where the suite says what a valid value is.
- ``pattern`` follows ECMA-262 as RE2 runs it; the suite's ``optional/ecmascript-regex``
  is not claimed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import corpora
from toolforge.core.schemas import compile_schema
from toolforge.errors import RequestError

# Why the gateway refuses a schema, as its message says: each is in docs/schemas.md.
DOCUMENTED_REFUSALS = (
    "a schema must be a JSON object",  # boolean schemas at the root
    "is not local",  # $ref / $dynamicRef to another document: never fetched
    "names another document",  # an embedded resource ($id inside the schema)
)
# The formats whose optional/format cases the validator must agree with.
ASSERTED_FORMATS = ("date", "date-time", "time", "email", "ipv4", "ipv6", "uuid", "uri")
# Cases the gateway judges differently from the suite, each for a documented reason
# (docs/schemas.md). Listed by description, so a new disagreement fails, and so does a
# listed one that stops disagreeing (the list must be kept true).
GAPS: dict[str, str] = {
    # A custom metaschema is never fetched: an unknown $schema validates as 2020-12.
    "no validation: invalid number, but it still validates": "metaschema not fetched",
    # rfc3339-validator (jsonschema's date-time/time checker) refuses second 60.
    "a valid date-time with a leap second, UTC": "leap second",
    "a valid date-time with a leap second, with minus offset": "leap second",
    "a valid time string with leap second, Zulu": "leap second",
    "valid leap second, zero time-offset": "leap second",
    "valid leap second, commonly used in practice": "leap second",
    "valid leap second, positive time-offset": "leap second",
    "valid leap second, large positive time-offset": "leap second",
    "valid leap second, negative time-offset": "leap second",
    "valid leap second, large negative time-offset": "leap second",
}


def _cases(path: Path) -> list[Any]:
    out = []
    for group in json.loads(path.read_text(encoding="utf-8")):
        out.append(pytest.param(group, id=f"{path.stem}: {group['description']}"[:120]))
    return out


def _suite() -> Path:
    return corpora.test_suite() / "draft2020-12"


def _required() -> list[Any]:
    root = _suite()
    return [
        case
        for path in sorted(root.glob("*.json"))
        if path.name != "format.json"
        for case in _cases(path)
    ]


def _formats() -> list[Any]:
    root = _suite() / "optional" / "format"
    return [case for name in ASSERTED_FORMATS for case in _cases(root / f"{name}.json")]


def _check(group: dict[str, Any]) -> None:
    try:
        compiled = compile_schema(group["schema"], name="suite", fallback=False)
    except RequestError as exc:
        assert any(why in exc.message for why in DOCUMENTED_REFUSALS), exc.message
        return
    for test in group["tests"]:
        got = compiled.is_valid(test["data"])
        agrees = test["valid"] if test["description"] not in GAPS else not test["valid"]
        assert got == agrees, f"{test['description']}: {test['data']!r}"


@pytest.mark.parametrize("group", _required())
def test_required_cases(group: dict[str, Any]) -> None:
    _check(group)


@pytest.mark.parametrize("group", _formats())
def test_asserted_formats(group: dict[str, Any]) -> None:
    _check(group)


def test_remote_references_are_refused_not_fetched() -> None:
    """refRemote.json's schemas point at http://localhost:1234: every one that reaches
    outside itself is refused by name, before anything could be fetched."""
    refused = 0
    for group in json.loads((_suite() / "refRemote.json").read_text(encoding="utf-8")):
        with pytest.raises(RequestError) as info:
            compile_schema(group["schema"], name="remote", fallback=False)
        assert any(why in info.value.message for why in DOCUMENTED_REFUSALS)
        refused += 1
    assert refused > 5
