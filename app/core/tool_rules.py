"""The tool rules of docs/tools.md for every tool, whatever its source (a Python pack, an MCP
server).

* **REDACTION_REQUIRED**: every tool declares an output redaction *allowlist*
  (:attr:`ToolSpec.output_allowlist`): the only result keys that logs and artifacts keep.
  A tool without one is a start-up error (:func:`check_registry`), never a silent pass.
  ``"*"`` keeps everything and must be written out; an empty allowlist keeps no field.
* **The JSON Schema subset** a tool's input schema may use (:func:`schema_violations`):
  no ``oneOf``/``allOf``/``not``/``if``/``then``/``else``/``patternProperties``/
  ``dependentSchemas``/``unevaluatedProperties``, and no ``$ref`` but a local
  ``#/$defs/<name>``. ``anyOf`` only in the one shape that pydantic writes for an
  optional field and small models handle well: one schema and ``{"type": "null"}``.
  A violation names the keyword and where it is.
* **Names every adapter can send**: a model-facing tool's name must survive the native
  (OpenAI function) encoding, so an MCP tool called ``a__b`` or 70 characters long is
  refused at start-up rather than failing the first native request.

Sans-IO: pure functions over schemas, values and specs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from toolforge.core.native_tools import to_openai_name
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.errors import ErrorCode, ToolForgeError

__all__ = [
    "ALLOW_ALL",
    "UNSUPPORTED_KEYWORDS",
    "ToolConfigError",
    "apply_allowlist",
    "check_registry",
    "check_spec",
    "schema_violations",
]

ALLOW_ALL: Final = "*"
"""An allowlist entry that keeps every field (an explicit choice, not a default)."""

UNSUPPORTED_KEYWORDS: Final = frozenset(
    {
        "oneOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
    }
)
"""Keywords a tool's input schema may not use (docs/tools.md): a small model cannot
follow them reliably, and the gateway could not describe a violation usefully."""

_SUBSCHEMA_MAPS: Final = ("properties", "$defs", "definitions")
_SUBSCHEMAS: Final = ("items", "additionalProperties", "contains", "propertyNames")
_MAX_DEPTH: Final = 64


class ToolConfigError(ToolForgeError):
    """A tool (or a tool source) the gateway refuses to start with: what is wrong and how
    to fix it, one line per problem."""

    http_status = 500

    def __init__(self, message: str, *, details: list[dict[str, str]] | None = None) -> None:
        super().__init__(ErrorCode.TOOL_CONFIG_INVALID, message, details=details)


def schema_violations(schema: object) -> list[str]:
    """Each use of something outside the supported subset, as ``<path>: <what>``; empty
    when the schema is fine. The root must be an object schema (``"type": "object"``)."""
    if not isinstance(schema, Mapping):
        return ["$: an input schema must be a JSON object"]
    problems: list[str] = []
    if schema.get("type") != "object":
        problems.append('$: the root must be {"type": "object"} (tool arguments are an object)')
    problems.extend(_walk(schema))
    return problems


def _walk(root: Mapping[str, Any]) -> Iterator[str]:
    stack: list[tuple[object, str, int]] = [(root, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, Mapping):
            continue
        if depth > _MAX_DEPTH:
            yield f"{path}: nested deeper than {_MAX_DEPTH} levels"
            continue
        for key in sorted(k for k in node if k in UNSUPPORTED_KEYWORDS):
            yield f"{path}: unsupported keyword {key!r}"
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#/$defs/")):
            yield f"{path}: unsupported $ref {ref!r} (only local '#/$defs/<name>' references)"
        any_of = node.get("anyOf")
        if any_of is not None:
            if not _nullable(any_of):
                yield (
                    f"{path}: unsupported keyword 'anyOf' (only one schema or "
                    '{"type": "null"}, an optional value)'
                )
            elif isinstance(any_of, list):
                stack.extend((s, f"{path}.anyOf[{i}]", depth + 1) for i, s in enumerate(any_of))
        for name in _SUBSCHEMA_MAPS:
            children = node.get(name)
            if isinstance(children, Mapping):
                stack.extend((v, f"{path}.{name}.{k}", depth + 1) for k, v in children.items())
        for name in _SUBSCHEMAS:
            if name in node:
                stack.append((node[name], f"{path}.{name}", depth + 1))
        prefix = node.get("prefixItems")
        if isinstance(prefix, list):
            stack.extend((s, f"{path}.prefixItems[{i}]", depth + 1) for i, s in enumerate(prefix))


def _nullable(any_of: object) -> bool:
    if not isinstance(any_of, list) or len(any_of) != 2:
        return False
    nulls = [s for s in any_of if s == {"type": "null"}]
    return len(nulls) == 1


def check_spec(spec: ToolSpec[Any]) -> list[str]:
    """The tool rules' problems with one tool, each a sentence naming the tool."""
    problems: list[str] = []
    if spec.output_allowlist is None:
        problems.append(
            f"{spec.name} ({spec.source}): no output redaction allowlist; declare "
            "output_allowlist (the result keys logs and artifacts may keep, '*' for all)"
        )
    problems.extend(
        f"{spec.name} ({spec.source}) input schema: {p}"
        for p in schema_violations(spec.input_schema)
    )
    if spec.model_facing:
        try:  # every upstream adapter must be able to offer it (native mode: OpenAI names)
            to_openai_name(spec.name)
        except ValueError as exc:
            problems.append(f"{spec.name} ({spec.source}): {exc}")
    return problems


def check_confirmations(specs: Iterable[ToolSpec[Any]]) -> list[str]:
    """The rule for ``confirm_with`` (docs/tools.md): the confirming tool is registered, hidden from
    the model and waits for a person (``needs_approval``); otherwise a model could commit
    what it proposed by itself, or the gateway would call a tool that is not there."""
    by_name = {spec.name: spec for spec in specs}
    problems: list[str] = []
    for spec in by_name.values():
        target = spec.confirm_with
        if target is None:
            continue
        confirm = by_name.get(target)
        where = f"{spec.name} ({spec.source}): confirm_with {target!r}"
        if confirm is None:
            problems.append(f"{where} is not a registered tool")
        elif confirm.model_facing:
            problems.append(f"{where} is model-facing; a confirming tool must not be")
        elif not confirm.needs_approval:
            problems.append(f"{where} does not need approval; a confirming tool must")
        elif confirm.confirm_with is not None:
            problems.append(f"{where} asks for a confirmation itself; one step only")
    return problems


def check_registry(specs: Iterable[ToolSpec[Any]] | ToolRegistry) -> None:
    """Raise :class:`ToolConfigError` listing every tool that breaks the tool rules (and
    the ``confirm_with`` rule; docs/tools.md)."""
    specs = list(specs)
    problems = [p for spec in specs for p in check_spec(spec)]
    problems += check_confirmations(specs)
    if problems:
        raise ToolConfigError(
            f"{len(problems)} tool problem(s) at start-up: " + "; ".join(problems),
            details=[{"problem": p} for p in problems],
        )


def apply_allowlist(value: object, allowlist: frozenset[str] | None) -> object:
    """``value`` with every object key not in ``allowlist`` removed, at any depth (a kept
    key's value is filtered in turn). ``None`` or ``"*"`` keeps everything; a value that
    is not an object or array is kept as is (the allowlist is about fields)."""
    if allowlist is None or ALLOW_ALL in allowlist:
        return value
    return _filter(value, allowlist, 0)


def _filter(value: object, allow: frozenset[str], depth: int) -> object:
    if depth > 256:
        return None
    if isinstance(value, Mapping):
        return {k: _filter(v, allow, depth + 1) for k, v in value.items() if k in allow}
    if isinstance(value, list | tuple):
        return [_filter(v, allow, depth + 1) for v in value]
    return value
