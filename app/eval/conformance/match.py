"""How a case's expected values are compared with what came back.

``matches(expected, actual)``:

* an object matches an object that has every expected key with a matching value (a
  subset: unlisted keys are free); ``{"key": {"$absent": true}}`` requires the key to be
  missing;
* a list matches a list of the same length, item by item;
* an operator object tests the value: ``{"$contains": x}`` (substring, or list item),
  ``{"$excludes": x}``, ``{"$gte": n}``, ``{"$lte": n}``, ``{"$type": "string"}`` (JSON
  type names), ``{"$len": n}``, ``{"$one_of": [a, b]}``, ``{"$regex": "..."}``,
  ``{"$any": true}`` (anything, key present); several operators in one object all apply;
* anything else must be equal, and of the same JSON type (``1`` is not ``true``, but
  ``0`` is ``0.0``: JSON has one number type).

``comparable(frames)`` strips what legitimately differs between two runs of the same
stream (the stream id, timings) so determinism cases can compare whole streams.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["OPERATORS", "comparable", "first_difference", "json_type", "matches"]

OPERATORS: Final = frozenset(
    {"$contains", "$excludes", "$gte", "$lte", "$type", "$len", "$one_of", "$regex", "$any"}
)
# Fields that differ between two runs of the same stream, by event.
_VOLATILE: Final = {
    "stream.begin": ("stream_id",),
    "tool.result": ("duration_ms",),
    "done": ("metrics",),
}


def json_type(value: object) -> str:
    """The JSON type name of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, Sequence):
        return "array"
    return type(value).__name__


def _is_operator(expected: Mapping[str, Any]) -> bool:
    return bool(expected) and all(k in OPERATORS for k in expected)


def _operator(op: str, arg: Any, actual: Any) -> bool:
    match op:
        case "$any":
            return True
        case "$contains" | "$excludes":
            if isinstance(actual, str):
                found = isinstance(arg, str) and arg in actual
            elif isinstance(actual, list):
                found = any(matches(arg, item) for item in actual)
            else:
                return False
            return found if op == "$contains" else not found
        case "$gte" | "$lte":
            if json_type(actual) not in ("integer", "number"):
                return False
            return bool(actual >= arg if op == "$gte" else actual <= arg)
        case "$type":
            kind = json_type(actual)
            return kind == arg or (arg == "number" and kind == "integer")
        case "$len":
            return isinstance(actual, str | list | dict) and len(actual) == arg
        case "$one_of":
            return any(matches(option, actual) for option in arg)
        case "$regex":
            return isinstance(actual, str) and re.search(arg, actual) is not None
    raise ValueError(f"unknown operator {op}")


def matches(expected: Any, actual: Any) -> bool:
    """Whether ``actual`` satisfies ``expected`` (see the module docstring)."""
    if isinstance(expected, Mapping):
        if _is_operator(expected):
            return all(_operator(op, arg, actual) for op, arg in expected.items())
        if not isinstance(actual, Mapping):
            return False
        for key, want in expected.items():
            if isinstance(want, Mapping) and want.get("$absent") is True:
                if key in actual:
                    return False
            elif key not in actual or not matches(want, actual[key]):
                return False
        return True
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    kinds = {json_type(expected), json_type(actual)}
    if kinds <= {"integer", "number"}:  # JSON has one number type: 0 matches 0.0
        return bool(expected == actual)
    return len(kinds) == 1 and bool(expected == actual)


def comparable(frames: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{"id","event","data"}`` frames without the fields that vary from run to run."""
    out = []
    for frame in frames:
        data = dict(frame["data"])
        for key in _VOLATILE.get(frame["event"], ()):
            data.pop(key, None)
        out.append({"id": frame["id"], "event": frame["event"], "data": data})
    return out


def first_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> str | None:
    """A short description of where two frame lists first differ, or None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"frame {i + 1} differs: {_short(x)} vs {_short(y)}"
    if len(a) != len(b):
        return f"{len(a)} frames vs {len(b)}"
    return None


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
