"""The JSON guarantee (docs/protocol.md): every ``json.end``/``result.end`` value is schema-valid.

When a frame's body ends, the session asks :func:`finish_frame` what to do, then follows
the answer; the policy lives here, pure and testable, and only the model call is the
session's (it is I/O):

    finish_frame(text, parsed, schema)
      ├── Valid(value)                    parsed strictly and validates
      ├── Repaired(value, via="local")    json_repair fixed the syntax, and it validates
      └── NeedsModelRepair(text, errors)  -> the session renders ``prompts/repair.txt``
                                             (render_repair_prompt), calls the model once
                                             at temperature 0, then:
          after_model_repair(reply, schema, errors)
            ├── Repaired(value, via="model")
            └── Degraded(value, errors, ...)   minimal valid object + diagnostics

    end_fields(outcome) -> {"value", "repaired", "degraded"} for the END frame.

Why this order: local repair is free and fixes what small models get wrong most (trailing
commas, single quotes, a missing closing brace), but it is only syntactic (``json_repair``,
once, on the whole body, never per chunk, so it costs O(n) once per frame); a missing
required key or a wrong enum needs the model, told exactly what is wrong (path + message);
and if that fails too the stream must still go on, so the last resort is
``CompiledSchema.fallback``, a value proven at registration to exist.

Diagnostics (``{"error": "schema_repair_failed", "last_validator_errors": [...]}``) go
*in band*, as a ``diagnostics`` property of the value, when the schema allows it
(``AssistantReply`` does). When it does not (a closed caller schema), the value is the bare
minimal object and :func:`end_fields` reports the diagnostics *out of band*, as a
``diagnostics`` field of the END frame next to ``degraded: true``.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any, Final, Literal, assert_never

import orjson
import referencing.exceptions
from json_repair import repair_json

from toolforge.core.protocol.sentinels import CLOSE, OPEN
from toolforge.core.schemas import CompiledSchema, compile_schema
from toolforge.errors import ToolForgeError

__all__ = [
    "MAX_ERRORS",
    "REPAIR_FAILED",
    "Degraded",
    "FinalOutcome",
    "NeedsModelRepair",
    "Outcome",
    "RepairLimits",
    "Repaired",
    "Valid",
    "ValidatorError",
    "after_model_repair",
    "degrade",
    "end_fields",
    "finish_frame",
    "give_up",
    "local_repair",
    "minimal_valid",
    "render_repair_prompt",
    "validate",
]

REPAIR_FAILED: Final = "schema_repair_failed"
# Enough for a model to fix a frame in one go, short enough for a 4k-token context.
MAX_ERRORS: Final = 20
_MAX_MESSAGE_CHARS: Final = 200
_SCAN_ERRORS: Final = 200  # errors read from jsonschema before sorting and capping
_INT_MIN: Final = -(2**63)  # the strict-JSON number range (app/core/json_validator.py)
_INT_MAX: Final = 2**64 - 1
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FENCE: Final = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)

SchemaLike = CompiledSchema | Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RepairLimits:
    """``max_chars``/``max_depth`` are docs/protocol.md's frame limits (64 KB, 16 levels).

    ``max_anomalies`` bounds the damage local repair is tried on (see ``_anomalies``).
    json_repair is superlinear on some inputs (measured with 0.64: ``'{"' * 16000`` 40 s,
    ``'{1}' * 2000`` 15 s, 12 KB of ``"x, x, ..., \\\\",}`` 2 s); behind the screen the worst
    we found by fuzzing at 64 KB was 0.25 s. More damage than that is no slip; the model
    gets it.
    """

    max_chars: int = 64 * 1024
    max_depth: int = 16
    max_anomalies: int = 32


@dataclass(frozen=True, slots=True)
class ValidatorError:
    """One reason a value fails its schema: a JSON path (``$.target.kind``) and a message.

    ``keyword`` is the JSON Schema keyword that failed (``required``, ``enum``, ...), for
    tool-argument rejections that must name the constraint (docs/tools.md).
    """

    path: str
    message: str
    keyword: str = ""

    def to_dict(self) -> dict[str, str]:
        """The ``last_validator_errors`` item (docs/protocol.md): ``{"path", "message"}``."""
        return {"path": self.path, "message": self.message}


# --- outcomes: a closed union ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Valid:
    """The body parsed strictly and validates: send it as is."""

    value: object


@dataclass(frozen=True, slots=True)
class Repaired:
    """A repair worked; ``errors`` are what was wrong before (for logs and metrics)."""

    value: object
    via: Literal["local", "model"]
    errors: tuple[ValidatorError, ...]


@dataclass(frozen=True, slots=True)
class NeedsModelRepair:
    """Local repair could not help: ask the model once (``render_repair_prompt``)."""

    text: str
    errors: tuple[ValidatorError, ...]


@dataclass(frozen=True, slots=True)
class Degraded:
    """Repair failed: a minimal valid value; the frame is marked degraded, the stream goes on.

    ``in_band`` says whether ``diagnostics`` is inside ``value`` or must travel beside it.
    """

    value: object
    errors: tuple[ValidatorError, ...]
    diagnostics: dict[str, object]
    in_band: bool


Outcome = Valid | Repaired | NeedsModelRepair | Degraded
FinalOutcome = Valid | Repaired | Degraded


# --- validation -------------------------------------------------------------------------


def _compiled(schema: SchemaLike) -> CompiledSchema:
    return schema if isinstance(schema, CompiledSchema) else compile_schema(schema)


def validate(schema: SchemaLike, value: object) -> list[ValidatorError]:
    """Why ``value`` fails ``schema`` (empty: it is valid). Sorted by path, at most 20.

    Formats are asserted (``toolforge.core.patterns.format_checker``). A failed
    ``oneOf``/``anyOf`` is reported by the branch the value was aiming at (the one its
    discriminator names, else the one with fewest errors), since "is not valid under any
    of the given schemas" tells a small model nothing.
    """
    compiled = _compiled(schema)
    found: list[ValidatorError] = []
    try:
        for n, error in enumerate(compiled.errors(value)):
            if n >= _SCAN_ERRORS:
                break
            found.extend(_specific(error))
    except RecursionError:
        found.append(ValidatorError("$", "the value or schema nests too deeply to check", "$ref"))
    except referencing.exceptions.Unresolvable as exc:
        found.append(ValidatorError("$", _clip(f"schema reference does not resolve: {exc}")))
    unique = dict.fromkeys(found)
    return sorted(unique, key=lambda e: (_path_key(e.path), e.message))[:MAX_ERRORS]


def _specific(error: Any) -> list[ValidatorError]:
    context = list(error.context or ())
    instance = error.instance
    if error.validator not in ("oneOf", "anyOf") or not context:
        return [_make(error.absolute_path, error.message, str(error.validator))]
    base = list(error.absolute_path)
    by_branch: dict[int, list[Any]] = {}
    for sub in context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    schema = error.schema if isinstance(error.schema, dict) else {}
    disc = schema.get("discriminator")  # OpenAPI's, as pydantic writes it for tagged unions
    prop = disc.get("propertyName") if isinstance(disc, dict) else None
    if isinstance(prop, str):
        mapping = disc.get("mapping") if isinstance(disc, dict) else None
        tags = list(mapping) if isinstance(mapping, dict) else []
        one_of = f" (one of {tags})" if tags else ""
        if not isinstance(instance, dict):
            message = f"{instance!r} is not an object with a {prop!r}{one_of}"
            return [_make(base, message, "discriminator")]
        if prop not in instance:
            return [_make(base, f"{prop!r} is a required property{one_of}", "discriminator")]
        at_tag = [*base, prop]
        chosen = [
            i
            for i, subs in by_branch.items()
            if not any(list(s.absolute_path) == at_tag for s in subs)
        ]
        if len(chosen) != 1:
            message = f"{instance[prop]!r} is not a valid {prop!r}{one_of}"
            return [_make(at_tag, message, "discriminator")]
        branch = chosen[0]
    else:
        # Branches that fail on the value's type at this very path were not aimed at.
        fitting = [
            i
            for i, subs in sorted(by_branch.items())
            if not any(s.validator == "type" and list(s.absolute_path) == base for s in subs)
        ]
        if not fitting:
            return [_make(base, error.message, str(error.validator))]
        branch = min(fitting, key=lambda i: len(by_branch[i]))
    return [e for sub in by_branch[branch] for e in _specific(sub)]


def _make(path: Iterable[object], message: str, keyword: str) -> ValidatorError:
    return ValidatorError(_json_path(path), _clip(message), keyword)


def _json_path(parts: Iterable[object]) -> str:
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif isinstance(part, str) and _IDENTIFIER.fullmatch(part):
            out.append(f".{part}")
        else:
            out.append(f"[{orjson.dumps(str(part)).decode()}]")
    return "".join(out)


def _path_key(path: str) -> tuple[tuple[int, int, str], ...]:
    # Natural order: $.a[2] before $.a[10]; fields before indexes at the same level.
    parts = re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(\"(?:[^\"\\]|\\.)*\")\]", path)
    return tuple((1, int(i), "") if i else (0, 0, name or quoted) for name, i, quoted in parts)


def _clip(message: str) -> str:
    # jsonschema quotes the whole failing instance; a 64 KB object is no message.
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    return message[: _MAX_MESSAGE_CHARS - 1] + "…"


# --- strict JSON and local repair -------------------------------------------------------


def _strict_problem(value: object, max_depth: int) -> str | None:
    """Why ``value`` is not strict RFC 8259 JSON within ``max_depth``, or None.

    json_repair happily returns NaN, lone surrogates or huge integers; the END frame may not.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= max_depth:
                return f"nested deeper than {max_depth}"
            if isinstance(node, dict):
                if not all(isinstance(k, str) for k in node):
                    return "non-string key"
                stack.extend((k, depth + 1) for k in node)
                stack.extend((v, depth + 1) for v in node.values())
            else:
                stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return "lone surrogate in a string"
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, int):
            if not _INT_MIN <= node <= _INT_MAX:
                return "integer out of range"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return "NaN or Infinity"
        else:
            return f"not a JSON value ({type(node).__name__})"
    return None


def _syntax_error(problem: str) -> ValidatorError:
    return ValidatorError("$", _clip(f"not valid JSON: {problem}"), "json")


def _strict_parse(text: str, limits: RepairLimits) -> tuple[object, ValidatorError | None]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return None, _syntax_error(str(exc))
    problem = _strict_problem(value, limits.max_depth)
    return value, (_syntax_error(problem) if problem else None)


# The anomaly screen: a tolerant, linear pass over JSON-ish tokens that counts what does not
# fit the JSON grammar (a stray character, a bare word where a key or value goes, a missing
# comma or colon, a mismatched bracket, a second top-level value) and recovers by taking the
# token as what was probably meant. Slips small models make cost 0-2 each (trailing commas,
# single quotes, Python literals and a missing closing bracket cost nothing); garbage costs
# one per token. It only gates json_repair; json_repair does the repair.
_TOKEN: Final = re.compile(
    r"""(?P<ws>\s+)"""
    r"""|(?P<str>"[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')"""
    r"""|(?P<open>["'].*)"""  # an unclosed string runs to the end: a body cut short
    r"""|(?P<punct>[{}\[\],:])"""
    r"""|(?P<word>[A-Za-z0-9_.+\-]+)"""
    r"""|(?P<other>.)""",
    re.DOTALL,
)
# Brackets inside strings: prose has few, but dense ones make json_repair quadratic (it
# wonders at each whether the string really ended: 16 000 "{" in a string take 1.8 s). Up to
# eight per anomaly allowed, so 256 by default.
_BRACKET: Final = re.compile(r"[{}\[\]]")
_BRACKETS_PER_ANOMALY: Final = 8
_LITERAL: Final = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|True|False|None")
_S_VALUE, _S_KEY, _S_COLON, _S_AFTER = range(4)


def _anomalies(text: str, limits: RepairLimits) -> int:
    """How far ``text`` is from JSON (see above); stops counting past the budget."""
    budget, max_depth = limits.max_anomalies, 2 * limits.max_depth
    stack: list[str] = []
    state, bad, brackets = _S_VALUE, 0, 0
    for match in _TOKEN.finditer(text):
        kind, tok = match.lastgroup, match.group()
        if kind == "ws":
            continue
        if kind in ("str", "open"):
            bad += kind == "open"
            if kind == "str" and tok[-2] == "\\":
                # An escaped backslash just before the closing quote: json_repair takes the
                # quote for escaped and retries at every comma in the string (quadratic).
                bad += tok.count(",")
            brackets += len(_BRACKET.findall(tok))
            if brackets > budget * _BRACKETS_PER_ANOMALY:
                return budget + 1
        if bad > budget:
            break
        if state == _S_COLON:
            if tok == ":":
                state = _S_VALUE
                continue
            bad, state = bad + 1, _S_VALUE  # missing colon: read the token as the value
        if state == _S_AFTER:
            if not stack:
                bad += 1  # a second top-level value, or trailing garbage
                continue
            if tok == ",":
                state = _S_KEY if stack[-1] == "{" else _S_VALUE
                continue
            if tok not in ("}", "]"):
                bad += 1  # missing comma: read the token as the next member
                state = _S_KEY if stack[-1] == "{" else _S_VALUE
        if tok in ("}", "]") and kind == "punct" and stack:
            bad += (tok == "]") != (stack[-1] == "[")  # mismatched closer
            stack.pop()  # closes: an empty container, after a value, or a trailing comma
            state = _S_AFTER
        elif state == _S_KEY:
            if kind in ("str", "open", "word"):
                bad += kind == "word"  # an unquoted key
                state = _S_COLON
            else:
                bad += 1
        elif tok in ("{", "[") and kind == "punct":
            stack.append(tok)
            if len(stack) > max_depth:
                return budget + 1
            state = _S_KEY if tok == "{" else _S_VALUE
        elif kind in ("str", "open", "word"):
            bad += kind == "word" and not _LITERAL.fullmatch(tok)
            state = _S_AFTER
        else:
            bad += 1  # stray punctuation or a character JSON has no use for
    return bad


def _repair_syntax(text: str, limits: RepairLimits) -> tuple[object, list[ValidatorError]]:
    """json_repair once over the whole text: (value, []) or (None, why not)."""
    stripped = text.strip()
    if not stripped:
        return None, [_syntax_error("the body is empty")]
    if len(text) > limits.max_chars:
        return None, [_syntax_error(f"over {limits.max_chars} characters, not repaired")]
    if _anomalies(stripped, limits) > limits.max_anomalies:
        return None, [_syntax_error("too damaged to repair locally")]
    try:
        value = repair_json(stripped, return_objects=True, skip_json_loads=True)
    except Exception:  # RecursionError, ValueError("nesting ..."), anything: no repair
        return None, [_syntax_error("could not be repaired")]
    if not isinstance(value, dict | list):
        # json_repair mends objects and arrays; for anything else it returns "" (its "found
        # nothing"), which is no repair at all.
        return None, [_syntax_error("no JSON object or array found")]
    problem = _strict_problem(value, limits.max_depth)
    if problem is not None:
        return None, [_syntax_error(f"after repair: {problem}")]
    return value, []


def local_repair(
    text: str, schema: SchemaLike, *, limits: RepairLimits = RepairLimits()
) -> object | None:
    """The syntactically repaired value of ``text`` if it now validates, else None.

    Never raises on any text. Returns None when ``text`` already is valid JSON (a repair of
    syntax cannot fix a value) and when it is longer than ``limits.max_chars``. Note a
    repaired JSON ``null`` is indistinguishable from failure here; ``finish_frame`` is not
    affected (it uses the outcome types).
    """
    compiled = _compiled(schema)
    value, ok, _ = _local(text, compiled, limits)
    return value if ok else None


def _local(
    text: str, compiled: CompiledSchema, limits: RepairLimits
) -> tuple[object, bool, list[ValidatorError]]:
    """(value, it validates, errors to show the model)."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        syntax = _syntax_error(str(exc))
    else:
        return None, False, []
    value, problems = _repair_syntax(text, limits)
    if problems:
        return None, False, [syntax]
    errors = validate(compiled, value)
    if errors:
        # Tell the model the syntax error and what else is wrong once it is fixed.
        return None, False, [syntax, *errors][:MAX_ERRORS]
    return value, True, []


# --- the last resort ----------------------------------------------------------------------


def minimal_valid(schema: SchemaLike) -> object:
    """The smallest value found that satisfies ``schema`` (a fresh copy each call).

    Required properties only; enum -> first value; const; oneOf/anyOf (discriminated unions
    included) -> first branch that works; ``$ref`` resolved; strings "" or padded to
    minLength; numbers 0 or at their minimum; booleans false; arrays [] or minItems copies.
    """
    return copy.deepcopy(_compiled(schema).require_fallback())


def _diagnostics(errors: Sequence[ValidatorError]) -> dict[str, object]:
    return {
        "error": REPAIR_FAILED,
        "last_validator_errors": [e.to_dict() for e in errors[:MAX_ERRORS]],
    }


def give_up(schema: SchemaLike, errors: Sequence[ValidatorError]) -> Degraded:
    """The degraded outcome: minimal valid value, diagnostics in band when allowed."""
    compiled = _compiled(schema)
    diagnostics = _diagnostics(errors)
    base = copy.deepcopy(compiled.fallback_with_defaults())
    candidates: list[object] = [{"diagnostics": diagnostics}]
    if isinstance(base, dict):
        candidates.insert(0, {**base, "diagnostics": diagnostics})
    for candidate in candidates:
        if compiled.is_valid(candidate):
            return Degraded(candidate, tuple(errors), diagnostics, in_band=True)
    if not compiled.is_valid(base):
        base = copy.deepcopy(compiled.require_fallback())
    return Degraded(base, tuple(errors), diagnostics, in_band=False)


def degrade(schema: SchemaLike, errors: Sequence[ValidatorError]) -> object:
    """``minimal_valid`` plus ``diagnostics`` when the schema allows it (see the module doc)."""
    return give_up(schema, errors).value


# --- the decision API ---------------------------------------------------------------------


def finish_frame(
    text: str,
    parsed: object,
    schema: SchemaLike,
    *,
    limits: RepairLimits = RepairLimits(),
) -> Valid | Repaired | NeedsModelRepair:
    """Decide a frame at its END: ``text`` is the whole body; ``parsed`` is the value the
    strict streaming validator produced, or the ``ToolForgeError`` it raised instead."""
    compiled = _compiled(schema)
    if not isinstance(parsed, ToolForgeError):
        errors = validate(compiled, parsed)
        if not errors:
            return Valid(parsed)
        return NeedsModelRepair(text, tuple(errors))
    value, ok, errors = _local(text, compiled, limits)
    if ok:
        return Repaired(value, "local", (_syntax_error(parsed.message),))
    if not errors:  # the text parses after all (say, the framer hit a limit)
        errors = [_syntax_error(parsed.message)]
    return NeedsModelRepair(text, tuple(errors))


def _extract(reply: str) -> str:
    """The JSON in a model's repair reply: without code fences or frame sentinels."""
    text = reply.strip()
    if OPEN in text and CLOSE in text:
        text = text.split(CLOSE, 1)[1].split(OPEN, 1)[0].strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def after_model_repair(
    reply: str | None,
    schema: SchemaLike,
    errors: Sequence[ValidatorError],
    *,
    limits: RepairLimits = RepairLimits(),
) -> Repaired | Degraded:
    """Judge the model's repair ``reply`` (None: the repair call failed or timed out).

    The reply is parsed strictly, else repaired locally once; a value that validates is
    ``Repaired(via="model")``; otherwise ``Degraded`` with the reply's own validator errors
    (or ``errors``, the ones sent to the model, when there was no usable reply).
    """
    compiled = _compiled(schema)
    if reply is None or not reply.strip():
        return give_up(compiled, errors)
    text = _extract(reply)
    if len(text) > limits.max_chars:
        return give_up(compiled, [_syntax_error(f"repair over {limits.max_chars} characters")])
    value, problem = _strict_parse(text, limits)
    if problem is None:
        latest = validate(compiled, value)
        if not latest:
            return Repaired(value, "model", tuple(errors))
        return give_up(compiled, latest)
    fixed, ok, latest = _local(text, compiled, limits)
    if ok:
        return Repaired(fixed, "model", tuple(errors))
    # A reply that is not JSON even after local repair says nothing about the schema: the
    # errors worth reporting are then the ones the model was asked to fix.
    if any(e.keyword != "json" for e in latest):
        return give_up(compiled, latest)
    return give_up(compiled, errors)


def render_repair_prompt(
    template: str, *, schema: SchemaLike, text: str, errors: Sequence[ValidatorError]
) -> str:
    """Fill ``prompts/repair.txt`` (read by the caller: core does no I/O)."""
    compiled = _compiled(schema)
    return Template(template).safe_substitute(
        schema=orjson.dumps(compiled.schema).decode(),
        text=text,
        errors="\n".join(f"- {e.path}: {e.message}" for e in errors) or "- (none reported)",
    )


def end_fields(outcome: FinalOutcome) -> dict[str, object]:
    """``value``, ``repaired``, ``degraded`` (and out-of-band ``diagnostics``) for END."""
    match outcome:
        case Valid(value=value):
            return {"value": value, "repaired": False, "degraded": False}
        case Repaired(value=value):
            return {"value": value, "repaired": True, "degraded": False}
        case Degraded(value=value, diagnostics=diagnostics, in_band=in_band):
            fields: dict[str, object] = {"value": value, "repaired": False, "degraded": True}
            if not in_band:
                fields["diagnostics"] = diagnostics
            return fields
        case _:
            assert_never(outcome)
