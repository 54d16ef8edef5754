"""BFCL's AST check of one ``simple_python`` answer, ported: is the call the right one?

bfcl-eval judges a ``simple_*`` case with ``simple_function_checker``
(``bfcl_eval/eval_checker/ast_eval/ast_checker.py``). That module is not importable here:
it imports ``MODEL_CONFIG_MAPPING``, which imports every model handler bfcl-eval ships
(anthropic, mistralai, cohere, google-genai, ...), dependencies the gateway does not have
and the bench should not pull in. So this is a port of its rules for Python, kept to the
original's order and wording, so that a verdict here is the verdict bfcl-eval would give:

1. exactly one call (``wrong_count``);
2. the function's name, as offered (``wrong_func_name``);
3. every ``required`` parameter present (``missing_required``);
4. each given parameter declared by the function and named in the possible answer
   (``unexpected_param``);
5. its type, by the function's declared Python type (``integer`` → ``int``, ``float`` →
   ``float`` and an ``int`` is accepted for it, ``array``/``tuple`` → ``list`` with one
   level of item types, ``dict``, ``boolean``, ``string``/``any`` → ``str``); a value
   whose type is the possible answer's instead is a "variable" and only compared;
6. its value, one of the possible answer's: strings compared case-insensitively without
   spaces and ``,./-_*^`` (``"April 1, 2024"`` matches ``"april 1 2024"``), lists item by
   item in the same way, dicts key by key, anything else by ``==``;
7. a possible-answer parameter left out only where ``""`` is among its values
   (``missing_optional``).

Functions: BFCL writes the function in its own dialect (``"type": "dict"``, ``"float"``,
``"tuple"``); the checker reads that dialect, not the JSON Schema the model was offered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

__all__ = ["Check", "check_simple", "standardize"]

_PYTHON_TYPES: Final[dict[str, type]] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_NESTED: Final = ("array", "tuple")  # types whose items are checked too (one level)
_NOISE: Final = re.compile(r"[ \,\.\/\-\_\*\^]")


@dataclass(frozen=True, slots=True)
class Check:
    """A verdict: ``valid``, or the error type and message bfcl-eval would report."""

    valid: bool
    error_type: str = ""
    error: str = ""


_VALID: Final = Check(True)


def standardize(text: str) -> str:
    """A string as the checker compares it: lower case, without spaces and ``,./-_*^``,
    single quotes as double quotes."""
    return _NOISE.sub("", text).lower().replace("'", '"')


def check_simple(
    function: Mapping[str, Any],
    calls: Sequence[Mapping[str, Mapping[str, Any]]],
    answer: Mapping[str, Mapping[str, list[Any]]],
) -> Check:
    """The verdict on ``calls`` (each ``{name: arguments}``) for ``function`` (BFCL's
    dialect), given ``answer`` (``{name: {param: [possible values]}}``)."""
    if len(calls) != 1:
        return Check(False, "simple_function_checker:wrong_count", "Wrong number of functions.")
    name = function["name"]
    call = calls[0]
    if name not in call:
        return Check(
            False,
            "simple_function_checker:wrong_func_name",
            f"Function name {name!r} not found in model output.",
        )
    possible = next(iter(answer.values()))
    details = function["parameters"]["properties"]
    args = call[name]
    for param in function["parameters"].get("required", []):
        if param not in args:
            return Check(
                False,
                "simple_function_checker:missing_required",
                f"Missing required parameter: {param!r}.",
            )
    for param, given in args.items():
        if param not in details or param not in possible:
            return Check(
                False,
                "simple_function_checker:unexpected_param",
                f"Unexpected parameter: {param!r}.",
            )
        verdict = _check_param(param, given, details[param], possible[param])
        if not verdict.valid:
            return verdict
    for param, values in possible.items():
        if param not in args and "" not in values:
            return Check(
                False,
                "simple_function_checker:missing_optional",
                f"Optional parameter {param!r} not provided and not marked as optional.",
            )
    return _VALID


def _check_param(param: str, value: Any, detail: Mapping[str, Any], possible: list[Any]) -> Check:
    declared = detail["type"]
    expected = _PYTHON_TYPES[declared]
    nested = _PYTHON_TYPES[detail["items"]["type"]] if declared in _NESTED else None
    if declared == "float" and type(value) is int:  # Python would convert it
        value = float(value)
    typed = _type_check(param, value, possible, declared, expected, nested)
    if not typed.valid:
        return typed.check
    if not typed.is_variable:
        if expected is dict:
            return _dict_check(param, value, possible)
        if expected is list and nested is dict:
            return _list_dict_check(param, value, possible)
        if expected is str:
            return _string_check(param, value, possible)
        if expected is list:
            return _list_check(param, value, possible)
    if value not in possible:
        return Check(
            False,
            "value_error:others",
            f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible}.",
        )
    return _VALID


@dataclass(frozen=True, slots=True)
class _Typed:
    valid: bool
    is_variable: bool = False
    check: Check = _VALID


def _answer_type(possible: list[Any]) -> type | None:
    """The type of the first possible value that is not ``""`` (the optional marker)."""
    for item in possible:
        if item != "":
            return type(item)
    return None


def _type_check(
    param: str,
    value: Any,
    possible: list[Any],
    declared: str,
    expected: type,
    nested: type | None,
) -> _Typed:
    answer_type = _answer_type(possible)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return _Typed(True, is_variable)
        elements = cast("list[Any]", value)
        for item in possible:
            # Every element must have the item type, judged against each possible value in
            # turn; one that is not a list (the optional marker "") lets the value through,
            # as in the original.
            ok = True
            if type(item) is list:
                for element in elements:
                    inner = _type_check(param, element, item, str(nested), nested, None)
                    if not inner.valid:
                        ok = False
                        break
            if ok:
                return _Typed(True, is_variable)
        error = Check(
            False,
            "type_error:nested",
            f"Nested type checking failed for parameter {param!r}. Expected outer type "
            f"{declared} with inner type {nested}. Parameter value: {value!r}.",
        )
        return _Typed(False, check=error)
    if answer_type is not None and type(value) is answer_type:
        return _Typed(True, True)
    return _Typed(
        False,
        check=Check(
            False,
            "type_error:simple",
            f"Incorrect type for parameter {param!r}. Expected type {declared}, got "
            f"{type(value).__name__}. Parameter value: {value!r}.",
        ),
    )


def _string_check(param: str, value: str, possible: list[Any]) -> Check:
    wanted = [standardize(p) for p in possible if type(p) is str]
    if standardize(value) not in wanted:
        return Check(
            False,
            "value_error:string",
            f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible}. "
            "Case insensitive.",
        )
    return _VALID


def _standard_items(items: Sequence[Any]) -> list[Any]:
    return [standardize(v) if type(v) is str else v for v in items]


def _list_check(param: str, value: list[Any], possible: list[Any]) -> Check:
    wanted = [_standard_items(p) for p in possible]
    if _standard_items(value) not in wanted:
        return Check(
            False,
            "value_error:list/tuple",
            f"Invalid value for parameter {param!r}: {value!r}. Expected one of {possible}.",
        )
    return _VALID


def _dict_check(param: str, value: dict[str, Any], possible: list[Any]) -> Check:
    result = Check(False, "dict_checker:unclear")
    for answer in possible:
        if answer == "":
            continue
        result = _one_dict(value, answer)
        if result.valid:
            return _VALID
    return result


def _one_dict(value: Mapping[str, Any], answer: Mapping[str, list[Any]]) -> Check:
    for key, item in value.items():
        if key not in answer:
            return Check(False, "value_error:dict_key", f"Unexpected dict key parameter: {key!r}.")
        wanted = _standard_items(answer[key])
        if (standardize(item) if type(item) is str else item) not in wanted:
            return Check(
                False,
                "value_error:dict_value",
                f"Invalid value for parameter {key!r}: {item!r}. Expected one of {wanted}.",
            )
    for key, values in answer.items():
        if key not in value and "" not in values:
            return Check(False, "value_error:dict_key", f"Missing dict key parameter: {key!r}.")
    return _VALID


def _list_dict_check(param: str, value: list[Any], possible: list[Any]) -> Check:
    result = Check(False, "list_dict_checker:unclear")
    for answer in possible:
        if len(value) != len(answer):
            result = Check(
                False, "value_error:list_dict_count", "Wrong number of dictionaries in the list."
            )
            continue
        for item, wanted in zip(value, answer, strict=True):
            result = _dict_check(param, item, [wanted])
            if not result.valid:
                break
        else:
            return _VALID
    return result
