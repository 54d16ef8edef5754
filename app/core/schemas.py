"""The schemas frames are validated against, compiled once, and the registry that names them.

docs/protocol.md: every OBJECT and RESULT frame names a schema; ``json.end``/``result.end`` must
carry a value valid against it, degrading to a minimal valid object when repair fails. So a
schema is only usable once we know three things about it, checked here, at registration:

1. it is a JSON Schema (Draft 2020-12 metaschema), every ``$ref`` in it resolves locally
   (the gateway never fetches schemas), and it is small enough to put in a prompt;
2. its validator is compiled, once (a ``CompiledSchema``, cached by content);
3. some value satisfies it, and we can build one: ``CompiledSchema.fallback``, the smallest
   value found by :class:`_Synthesiser`. A schema we cannot build a value for is refused
   up front (a 422), because otherwise the guarantee's last resort would have nothing to send.

Caller-supplied schemas fail with :class:`RequestError` (422 ``INVALID_SCHEMA``); for our
own pydantic models the same error is a bug, caught by the tests. The built-in schemas are
generated from pydantic models, never hand-written, so the JSON Schema the model is shown,
the validator and the Python types cannot drift apart. ``Any`` (``{}``) accepts any value.
"""

# Theory of operation (the synthesiser)
# -------------------------------------
#
# ``_Synthesiser.candidates(schema)`` yields values in order of preference ("smallest
# first": required properties only, enum -> first value, oneOf/anyOf -> first branch, strings
# "" or padded to minLength, numbers at 0 or their lower bound, arrays [] or minItems
# copies); ``first(schema)`` returns the first candidate jsonschema accepts. Building is
# approximate (keywords it does not model, like ``pattern`` or ``not``, are simply not
# aimed for) and validation is exact, so a value it returns is always valid. Work is
# bounded (nesting depth and a step budget), so a hostile inline schema (``minItems: 10**9``,
# self-referencing ``$ref``) is refused instead of hanging the server.

from __future__ import annotations

import contextlib
import functools
import math
import re
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

import attrs
import orjson
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import (
    Draft202012Validator,
    FormatChecker,
    validators,
)
from jsonschema.exceptions import ValidationError, best_match
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

from toolforge.core.patterns import (
    FORMAT_EXAMPLES,
    PatternError,
    compile_pattern,
    example,
    format_checker,
    is_pattern,
    pattern_budget,
)
from toolforge.errors import ErrorCode, RequestError

__all__ = [
    "ANY",
    "MAX_SCHEMA_BYTES",
    "NO_FALLBACK",
    "Action",
    "AssistantReply",
    "CompiledSchema",
    "DiagnosticError",
    "Diagnostics",
    "Mode",
    "PlaceTarget",
    "SchemaRegistry",
    "TimeTarget",
    "builtin_registry",
    "compile_schema",
    "is_compiled",
    "model_schema",
]

ANY: Final = "Any"
# An inline schema is shown to the model in the prompt and compiled per request; one larger
# than a frame (docs/protocol.md: 64 KB) is a mistake, and the limit bounds the compile cache's
# memory.
MAX_SCHEMA_BYTES: Final = 64 * 1024
# The names the sentinel grammar accepts (tokenizer ``_NAME_RE``, api ``SchemaName``).
_NAME_RE: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
# Synthesis bounds: nesting of schemas followed, and steps (candidates tried + nodes built).
_MAX_SYNTH_DEPTH: Final = 32
_MAX_SYNTH_STEPS: Final = 20_000
_MAX_SYNTH_ITEMS: Final = 1024
_MAX_SYNTH_CHARS: Final = 65_536
_COMPILE_CACHE_SIZE: Final = 256

_CLOSED = ConfigDict(extra="forbid")


# --- the built-in models (docs/protocol.md) -----------------------------------------------------


class DiagnosticError(BaseModel):
    """One validator error: where (a JSON path like $.target.kind) and what."""

    model_config = _CLOSED

    path: str
    message: str


class Diagnostics(BaseModel):
    """Set by the gateway, never by the model: why this object is a degraded fallback."""

    model_config = _CLOSED

    error: str
    last_validator_errors: list[DiagnosticError]


class AssistantReply(BaseModel):
    """The final answer to the user."""

    model_config = _CLOSED

    answer: str = Field(description="The answer, in plain text.")
    # ``default=[]``, not a factory, so the JSON Schema states the default (pydantic copies it).
    citations: list[str] = Field(
        default=[], description="Sources the answer relies on (ids or URLs)."
    )
    # readOnly (JSON Schema: owned by the gateway, not the writer): constrained mode's grammar
    # leaves it out, so a small model cannot spend its max_tokens filling it in (constrained mode).
    diagnostics: Diagnostics | None = Field(default=None, json_schema_extra={"readOnly": True})


class Mode(StrEnum):
    """What the action does."""

    SEARCH = "search"
    BOOK = "book"


class PlaceTarget(BaseModel):
    """A place, by id."""

    model_config = _CLOSED

    kind: Literal["place"]
    id: str


class TimeTarget(BaseModel):
    """A time, as ISO 8601 text."""

    model_config = _CLOSED

    kind: Literal["time"]
    at: str


class Action(BaseModel):
    """One step the assistant takes: search for or book a target."""

    model_config = _CLOSED

    mode: Mode
    target: Annotated[PlaceTarget | TimeTarget, Field(discriminator="kind")]


class _NoTitles(GenerateJsonSchema):
    """pydantic's schema without the ``title`` noise: shorter prompts for small models."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: Any, mode: Any = "validation") -> JsonSchemaValue:
        out = super().generate(schema, mode=mode)
        out.pop("title", None)
        for definition in out.get("$defs", {}).values():
            definition.pop("title", None)
        return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of ``model`` as the gateway shows and validates it."""
    return model.model_json_schema(schema_generator=_NoTitles)


# --- compiling --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class CompiledSchema:
    """A checked JSON Schema, its compiled validator and a value known to satisfy it.

    Treat ``schema`` and ``fallback`` as read-only: instances are shared through a cache.
    """

    name: str
    schema: Mapping[str, Any]
    validator: Any  # a jsonschema Draft202012Validator (untyped library)
    fallback: object

    def is_valid(self, value: object) -> bool:
        with pattern_budget():
            return bool(self.validator.is_valid(value))

    def errors(self, value: object) -> Iterator[Any]:
        """The validator's errors for ``value``; backtracking patterns share one budget."""
        with pattern_budget():
            yield from self.validator.iter_errors(value)

    def require_fallback(self) -> object:
        """``fallback``; a schema compiled without one (a tool's parameters) is a bug here."""
        if self.fallback is NO_FALLBACK:
            raise ValueError(f"schema {self.name!r} was compiled without a fallback value")
        return self.fallback

    def fallback_with_defaults(self) -> object:
        """Like ``fallback``, plus the optional properties that declare a non-null default
        (``AssistantReply`` gets ``"citations": []``, as in docs/protocol.md's degraded example)."""
        fallback = self.require_fallback()
        value = _Synthesiser(self.validator, _resolver(self.schema), with_defaults=True).build(
            self.schema
        )
        return fallback if value is _NOTHING else value


def _invalid(name: str, problem: str) -> RequestError:
    return RequestError(
        ErrorCode.INVALID_SCHEMA, f"schema {name!r} is not usable: {problem}", http_status=422
    )


def compile_schema(
    schema: object, *, name: str = "inline", fallback: bool = True
) -> CompiledSchema:
    """Check ``schema`` and compile it (cached by content). Raises 422 ``INVALID_SCHEMA``.

    ``fallback``: the schema must have a value the gateway can build (OBJECT/RESULT frames
    and answers, which degrade to it). A tool's parameters never need one: an invalid
    call goes back to the model, and a tool never runs on made-up arguments; such a
    schema's ``fallback`` is :data:`NO_FALLBACK`.
    """
    key = _cache_key(schema, name, fallback)
    found = _cached(key)
    if found is None:
        found = _compile(*key)
        _CACHE[key] = found
        while len(_CACHE) > _COMPILE_CACHE_SIZE:
            with contextlib.suppress(KeyError):  # another thread evicted it first
                _CACHE.popitem(last=False)
    return found


def is_compiled(schema: object, *, name: str = "inline", fallback: bool = True) -> bool:
    """Whether :func:`compile_schema` would answer from its cache (nothing is compiled;
    a schema it would refuse is not compiled)."""
    try:
        return _cached(_cache_key(schema, name, fallback)) is not None
    except RequestError:
        return False


# By (name, canonical bytes, needs a fallback); least recently used out. Explicit, not
# functools.lru_cache, so that planning can ask what is compiled without compiling it.
# Request schemas are compiled in a worker thread: every step here is one dict operation.
_CACHE: Final[OrderedDict[tuple[str, bytes, bool], CompiledSchema]] = OrderedDict()


def _cached(key: tuple[str, bytes, bool]) -> CompiledSchema | None:
    try:
        found = _CACHE[key]
        _CACHE.move_to_end(key)
    except KeyError:
        return None
    return found


def _cache_key(schema: object, name: str, fallback: bool) -> tuple[str, bytes, bool]:
    if not isinstance(schema, Mapping):
        raise _invalid(name, "a schema must be a JSON object")
    try:
        blob = orjson.dumps(schema)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise _invalid(name, f"not JSON-serialisable ({exc})") from exc
    if len(blob) > MAX_SCHEMA_BYTES:
        raise _invalid(name, f"{len(blob)} bytes, over the {MAX_SCHEMA_BYTES}-byte limit")
    return name, blob, fallback


def _compile(name: str, blob: bytes, needs_fallback: bool) -> CompiledSchema:
    # Decoded from the canonical bytes, so a caller mutating their dict cannot reach the cache.
    schema: dict[str, Any] = orjson.loads(blob)
    cls = _validator_class(schema)
    try:
        problem = best_match(_meta_validator(cls).iter_errors(schema))
    except RecursionError:
        raise _invalid(name, "nested too deeply") from None
    if problem is not None:
        where = problem.json_path.replace("$", "schema", 1)
        raise _invalid(name, f"{where}: {problem.message}")
    refs = _check_reach(schema, name)
    registry = _registry(schema)
    resolver = registry.resolver(_root_uri(schema))
    for ref in refs:
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise _invalid(name, f"$ref {ref!r} does not resolve") from None
    validator = cls(schema, registry=registry, format_checker=format_checker())
    value: object = NO_FALLBACK
    if needs_fallback:
        synth = _Synthesiser(validator, resolver, with_defaults=False)
        value = synth.build(schema)
        if value is _NOTHING:
            raise _invalid(
                name,
                "the gateway cannot construct any value that satisfies it, and a frame "
                "of this schema must fall back to one when the model's stays invalid; "
                "simplify contradictory or recursive required parts",
            )
    return CompiledSchema(name=name, schema=schema, validator=validator, fallback=value)


# --- what a schema may reach (nothing outside itself) -----------------------------------


# Draft 2020-12 unless the schema names another draft jsonschema knows ($schema: 4, 6,
# 7, 2019-09); an unknown $schema is a name only (never fetched) and gets 2020-12.
def _validator_class(schema: Mapping[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an unknown $schema
        base = validators.validator_for(schema, default=Draft202012Validator)
    return _safe_validator(base)


@functools.cache
def _safe_validator(base: Any) -> Any:
    """``base`` with ``pattern``/``patternProperties`` run by the linear-time engine.

    jsonschema's ``evolve`` (every ``$ref``, every subschema) picks the class again from a
    ``$schema`` it meets, which would be the stock class, with Python's backtracking
    ``re``: this one's ``evolve`` keeps to the safe classes.
    """
    if base in _SAFE:
        return base
    cls = validators.extend(
        base, {"pattern": _pattern_keyword, "patternProperties": _pattern_properties_keyword}
    )

    def evolve(self: Any, **changes: Any) -> Any:
        schema = changes.setdefault("schema", self.schema)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            target = _safe_validator(validators.validator_for(schema, default=type(self)))
        for field in attrs.fields(type(self)):
            if field.init and field.alias not in changes:
                changes[field.alias] = getattr(self, field.name)
        return target(**changes)

    cls.evolve = evolve
    _SAFE.add(cls)
    return cls


_SAFE: Final[set[Any]] = set()


@functools.cache
def _meta_validator(cls: Any) -> Any:
    """The metaschema's validator, reading ``format: regex`` with our pattern engine
    (jsonschema's own check uses Python's ``re``, which refuses ECMA-262's ``\\p{L}``)."""
    meta = cls.META_SCHEMA
    return validators.validator_for(meta, default=cls)(meta, format_checker=_REGEX_ONLY)


_REGEX_ONLY: Final = FormatChecker([])
_REGEX_ONLY.checks("regex", raises=PatternError)(is_pattern)


def _pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "string"):
        return
    compiled = compile_pattern(pattern)
    if not compiled.search(instance):
        why = " (it could not be checked in time)" if compiled.starved() else ""
        yield ValidationError(f"{instance!r} does not match {pattern!r}{why}")


def _pattern_properties_keyword(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        compiled = compile_pattern(pattern)
        for key, value in instance.items():
            if compiled.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _refuse_retrieval(uri: str) -> Any:
    # A schema is the caller's; whatever it names outside itself is never fetched.
    raise referencing.exceptions.NoSuchResource(uri)


def _registry(schema: Mapping[str, Any]) -> Any:
    """A registry holding ``schema`` (and its embedded resources) that cannot retrieve."""
    resource = referencing.jsonschema.specification_with(
        str(schema.get("$schema", "")), default=referencing.jsonschema.DRAFT202012
    ).create_resource(schema)
    registry_type: Any = referencing.Registry  # attrs-made: mypy misreads its fields
    registry = registry_type(retrieve=_refuse_retrieval).with_resource(_root_uri(schema), resource)
    try:
        return registry.crawl()  # embedded resources and anchors, found up front
    except (AttributeError, TypeError):
        # referencing reads draft 7's ``dependencies: {"a": ["b"]}`` as a schema and
        # fails; pointers still resolve lazily without the crawl.
        return registry


def _root_uri(schema: Mapping[str, Any]) -> str:
    root = schema.get("$id")
    return root if isinstance(root, str) else ""


def _resolver(schema: Mapping[str, Any]) -> Any:
    return _registry(schema).resolver(_root_uri(schema))


# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS: Final = frozenset({"const", "enum", "default", "examples", "example"})
_REF_KEYWORDS: Final = ("$ref", "$dynamicRef", "$recursiveRef")


def _walk(schema: object, name: str) -> Iterator[tuple[dict[str, Any], str, int]]:
    """Every schema object in ``schema`` with its JSON path and depth, iteratively (no
    recursion on caller input), skipping the data keywords' values."""
    stack: list[tuple[object, str, int]] = [(schema, "schema", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > 256:
            raise _invalid(name, "nested too deeply")
        if isinstance(node, dict):
            yield node, path, depth
            stack.extend(
                (v, f"{path}.{k}", depth + 1) for k, v in node.items() if k not in _DATA_KEYWORDS
            )
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node))


def _check_reach(schema: Mapping[str, Any], name: str) -> list[str]:
    """Refuse what would reach outside the request: a reference that is not a local
    ``#`` pointer or anchor, a nested ``$id`` that names another document, and a pattern
    no engine can run safely (each 422, naming where). Returns the references, all local."""
    refs: list[str] = []
    for node, path, depth in _walk(schema, name):
        for key in _REF_KEYWORDS:
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            refs.append(ref)
            if not ref.startswith("#"):
                raise _invalid(
                    name,
                    f"{path}.{key} {ref!r} is not local: only '#...' references are "
                    "allowed (the gateway never fetches schemas)",
                )
        nested_id = node.get("$id")
        if depth > 0 and isinstance(nested_id, str) and _absolute(nested_id):
            raise _invalid(
                name,
                f"{path}.$id {nested_id!r} names another document: a part's $id may only "
                "name it within this schema (a relative name, or '#anchor')",
            )
        by_name = node.get("patternProperties")
        patterns = [node.get("pattern"), *(by_name if isinstance(by_name, dict) else ())]
        for pattern in patterns:
            if isinstance(pattern, str):
                try:
                    compile_pattern(pattern)
                except PatternError as exc:
                    raise _invalid(name, f"{path}: pattern {pattern!r}: {exc}") from None
    return refs


def _absolute(uri: str) -> bool:
    """A URI with a scheme or a host of its own (``https://…``, ``urn:…``, ``//host``)."""
    head = uri.split("#", 1)[0]
    return head.startswith("//") or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", head) is not None


# --- the registry -----------------------------------------------------------------------


class SchemaRegistry:
    """Schema names -> compiled schemas. ``scoped()`` gives one request its own layer.

    The gateway's registry holds the built-ins (``builtin_registry()``) and whatever the
    tool packs register at startup; a request's inline schemas go into a ``scoped()`` child
    so that they are visible to that request only and can never shadow a registered name.
    """

    def __init__(self, parent: SchemaRegistry | None = None) -> None:
        self._parent = parent
        self._own: dict[str, CompiledSchema] = {}
        self._all: Mapping[str, CompiledSchema] | None = None  # all(), until a registration

    def scoped(self) -> SchemaRegistry:
        """A child registry: lookups fall through to this one, registrations stay local."""
        return SchemaRegistry(self)

    def register(self, name: str, schema: Mapping[str, Any]) -> CompiledSchema:
        """Register a trusted JSON Schema (tool packs). Raises 422 on a bad or taken name."""
        if not _NAME_RE.fullmatch(name):
            raise RequestError(
                ErrorCode.INVALID_SCHEMA,
                f"bad schema name {name!r}: use 1-128 of A-Z a-z 0-9 _ . : -",
                http_status=422,
            )
        if name in self:
            raise RequestError(
                ErrorCode.INVALID_SCHEMA,
                f"schema name {name!r} is already registered; pick another name",
                http_status=422,
            )
        compiled = compile_schema(schema, name=name)
        self._own[name] = compiled
        self._all = None
        return compiled

    def register_model(self, name: str, model: type[BaseModel]) -> CompiledSchema:
        """Register the JSON Schema generated from a pydantic model."""
        return self.register(name, model_schema(model))

    def register_inline(self, name: str, schema: object) -> CompiledSchema:
        """A caller-supplied ``{"name", "schema"}`` (docs/protocol.md): checked, then registered
        here.

        Raises :class:`RequestError` (422 ``INVALID_SCHEMA``) naming the problem.
        """
        if not isinstance(schema, Mapping):
            raise _invalid(name, "a schema must be a JSON object")
        return self.register(name, schema)

    def get(self, name: str) -> CompiledSchema:
        """The schema called ``name``; 422 ``UNKNOWN_SCHEMA`` listing the known ones."""
        registry: SchemaRegistry | None = self
        while registry is not None:
            found = registry._own.get(name)
            if found is not None:
                return found
            registry = registry._parent
        raise RequestError(
            ErrorCode.UNKNOWN_SCHEMA,
            f"unknown schema {name!r}; known: {', '.join(self.names())}, "
            'or give an inline {"name", "schema"}',
            http_status=422,
        )

    def all(self) -> Mapping[str, CompiledSchema]:
        """Every schema visible from here, by name, read-only. The gateway's registry
        builds it once (until the next registration); a request's scoped layer with no
        inline schemas shares it."""
        if self._parent is None:
            if self._all is None:
                self._all = MappingProxyType(dict(self._own))
            return self._all
        if not self._own:
            return self._parent.all()
        return MappingProxyType({**self._parent.all(), **self._own})

    def names(self) -> list[str]:
        """Every name visible from here, sorted."""
        out: set[str] = set()
        registry: SchemaRegistry | None = self
        while registry is not None:
            out.update(registry._own)
            registry = registry._parent
        return sorted(out)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()


def builtin_registry() -> SchemaRegistry:
    """A fresh registry with ``Any``, ``AssistantReply`` and ``Action`` (docs/protocol.md)."""
    registry = SchemaRegistry()
    registry.register(ANY, {})
    registry.register_model("AssistantReply", AssistantReply)
    registry.register_model("Action", Action)
    return registry


# --- the synthesiser (see "Theory of operation" above) ----------------------------------


class _Nothing:
    """No value: distinct from every JSON value, None included."""


_NOTHING: Final = _Nothing()
# The ``fallback`` of a schema compiled without one (a tool's parameters).
NO_FALLBACK: Final = _NOTHING


class _OutOfSteps(Exception):
    pass


_OBJECT_HINTS: Final = (
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "minProperties",
    "dependentRequired",
)
_ARRAY_HINTS: Final = ("items", "prefixItems", "minItems", "contains", "uniqueItems")
_STRING_HINTS: Final = ("minLength", "maxLength", "pattern")
_NUMBER_HINTS: Final = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ALL_TYPES: Final = ("null", "object", "array", "string", "integer", "boolean")


class _Synthesiser:
    """Builds the smallest value it can find that satisfies a schema; see the top comment."""

    def __init__(self, validator: Any, resolver: Any, *, with_defaults: bool) -> None:
        self._validator = validator
        self._resolver = resolver
        self._with_defaults = with_defaults
        self._steps = 0

    def build(self, schema: object) -> object:
        """A valid value for ``schema`` (the root or a part of it), or ``_NOTHING``."""
        try:
            return self.first(schema, 0)
        except (_OutOfSteps, RecursionError):
            return _NOTHING

    def _step(self) -> None:
        self._steps += 1
        if self._steps > _MAX_SYNTH_STEPS:
            raise _OutOfSteps

    def valid(self, schema: object, value: object) -> bool:
        self._step()
        try:
            return bool(self._validator.evolve(schema=schema).is_valid(value))
        except referencing.exceptions.Unresolvable:
            return False

    def first(self, schema: object, depth: int) -> object:
        for candidate in self.candidates(schema, depth):
            if self.valid(schema, candidate):
                return candidate
        return _NOTHING

    def _deref(self, schema: object, depth: int) -> object:
        """Inline a top-level ``$ref`` (siblings kept: 2020-12 applies both)."""
        while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            depth += 1
            if depth > _MAX_SYNTH_DEPTH:
                return False
            try:
                target = self._resolver.lookup(schema["$ref"]).contents
            except referencing.exceptions.Unresolvable:
                return False
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = _merge(target, rest) if rest else target
        return schema

    def candidates(self, schema: object, depth: int) -> Iterator[object]:
        self._step()
        if depth > _MAX_SYNTH_DEPTH:
            return
        schema = self._deref(schema, depth)
        if schema is True:
            yield None
            return
        if not isinstance(schema, dict):
            return  # False, or garbage
        if "const" in schema:
            yield schema["const"]
            return
        if isinstance(schema.get("enum"), list):
            yield from schema["enum"]
            return
        if isinstance(schema.get("allOf"), list):
            merged: object = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = _merge(merged, self._deref(part, depth))
            yield from self.candidates(merged, depth + 1)
            return
        for key in ("oneOf", "anyOf"):
            if isinstance(schema.get(key), list):
                rest = {k: v for k, v in schema.items() if k != key}
                for branch in schema[key]:
                    yield from self.candidates(_merge(rest, self._deref(branch, depth)), depth + 1)
                return
        for kind in _types(schema):
            yield from self._of_type(kind, schema, depth)

    def _of_type(self, kind: str, schema: dict[str, Any], depth: int) -> Iterator[object]:
        match kind:
            case "null":
                yield None
            case "boolean":
                yield False
            case "string":
                yield from _strings(schema)
            case "integer" | "number":
                yield from _numbers(schema, integer=kind == "integer")
            case "array":
                value = self._array(schema, depth)
                if value is not _NOTHING:
                    yield value
            case "object":
                value = self._object(schema, depth)
                if value is not _NOTHING:
                    yield value
            case _:
                return

    def _object(self, schema: dict[str, Any], depth: int) -> object:
        props = schema.get("properties", {})
        props = props if isinstance(props, dict) else {}
        out: dict[str, object] = {}

        def add(key: str) -> bool:
            value = self.first(_property_schema(schema, props, key), depth + 1)
            if value is _NOTHING:
                return False
            out[key] = value
            return True

        required = schema.get("required", [])
        for key in required if isinstance(required, list) else []:
            if isinstance(key, str) and key not in out and not add(key):
                return _NOTHING
        dependent = schema.get("dependentRequired", {})
        if isinstance(dependent, dict):
            for key in list(out):
                for extra in dependent.get(key, []):
                    if isinstance(extra, str) and extra not in out and not add(extra):
                        return _NOTHING
        if self._with_defaults:
            for key, sub in props.items():
                default = sub.get("default") if isinstance(sub, dict) else None
                if key not in out and default is not None and self.valid(sub, default):
                    out[key] = default
        want = schema.get("minProperties", 0)
        want = want if isinstance(want, int) else 0
        for key in props:
            if len(out) >= want:
                break
            if key not in out:
                add(key)
        spare = 0
        while len(out) < want and spare < _MAX_SYNTH_ITEMS:
            spare += 1
            if f"p{spare}" not in out and not add(f"p{spare}"):
                return _NOTHING
        self._steps += len(out)
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> object:
        want = schema.get("minItems", 0)
        if not isinstance(want, int) or want > _MAX_SYNTH_ITEMS:
            return _NOTHING
        prefix = schema.get("prefixItems", [])
        prefix = prefix if isinstance(prefix, list) else []
        out: list[object] = []
        for sub in prefix[:want]:
            value = self.first(sub, depth + 1)
            if value is _NOTHING:
                return _NOTHING
            out.append(value)
        items = schema.get("items", True)
        if len(out) < want:
            if schema.get("uniqueItems") is True:
                distinct: list[object] = []
                for candidate in self.candidates(items, depth + 1):
                    if candidate not in distinct and self.valid(items, candidate):
                        distinct.append(candidate)
                        if len(out) + len(distinct) == want:
                            break
                out.extend(distinct)
            else:
                value = self.first(items, depth + 1)
                if value is _NOTHING:
                    return _NOTHING
                out.extend([value] * (want - len(out)))
        if "contains" in schema:
            count = schema.get("minContains", 1)
            count = count if isinstance(count, int) and count <= _MAX_SYNTH_ITEMS else 1
            have = sum(1 for v in out if self.valid(schema["contains"], v))
            if have < count:
                value = self.first(schema["contains"], depth + 1)
                if value is _NOTHING:
                    return _NOTHING
                out.extend([value] * (count - have))
        self._steps += len(out)
        return out


def _types(schema: dict[str, Any]) -> tuple[str, ...]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list):
        return tuple(t for t in declared if isinstance(t, str))
    for hints, kind in (
        (_OBJECT_HINTS, "object"),
        (_ARRAY_HINTS, "array"),
        (_STRING_HINTS, "string"),
        (_NUMBER_HINTS, "number"),
    ):
        if any(h in schema for h in hints):
            return (kind,)
    return _ALL_TYPES


def _strings(schema: dict[str, Any]) -> Iterator[str]:
    """Strings to try: the format's example, the pattern's, then plain padding."""
    lo = schema.get("minLength", 0)
    lo = lo if isinstance(lo, int) and 0 <= lo <= _MAX_SYNTH_CHARS else 0
    hi = schema.get("maxLength")
    hi = hi if isinstance(hi, int) else None
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_EXAMPLES:
        yield FORMAT_EXAMPLES[fmt]
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        found = example(pattern, min_length=lo, max_length=hi)
        if found is not None:
            yield found
    yield "x" * lo


def _property_schema(schema: dict[str, Any], props: dict[str, Any], key: str) -> object:
    if key in props:
        return props[key]
    patterns = schema.get("patternProperties", {})
    if isinstance(patterns, dict):
        for pattern, sub in patterns.items():
            try:
                if compile_pattern(pattern).search(key):
                    return sub
            except PatternError:
                continue
    extra = schema.get("additionalProperties", True)
    return extra if isinstance(extra, dict | bool) else True


def _numbers(schema: dict[str, Any], *, integer: bool) -> Iterator[object]:
    """0 if allowed, else the bounds and what lies just inside them; validation picks."""

    def num(key: str) -> float | None:
        v = schema.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    lo, hi = num("minimum"), num("maximum")
    xlo, xhi = num("exclusiveMinimum"), num("exclusiveMaximum")
    step = num("multipleOf")
    if xlo is not None:
        lo = max(lo, math.floor(xlo) + 1.0) if lo is not None else math.floor(xlo) + 1.0
    if xhi is not None:
        hi = min(hi, math.ceil(xhi) - 1.0) if hi is not None else math.ceil(xhi) - 1.0
    starts: list[float] = [0.0]
    if lo is not None:
        starts.append(math.ceil(lo))
    if hi is not None:
        starts.append(math.floor(hi))
    for start in starts:
        if not math.isfinite(start) or abs(start) > 2**53:
            continue
        value = start
        if step and step > 0:
            value = math.ceil(start / step) * step
        if value == int(value):
            yield int(value)
        elif not integer:
            yield value
    if not integer:
        # Non-integral windows: (0.5, 0.7), exclusive float bounds, fractional multipleOf.
        a = num("minimum") if num("minimum") is not None else xlo
        b = num("maximum") if num("maximum") is not None else xhi
        if a is not None and b is not None:
            yield (a + b) / 2
        if a is not None:
            yield a
        if step:
            yield step
        # A number that must not be an integer (oneOf [integer, number]) needs one
        # non-integral candidate even without bounds.
        yield 0.5


def _merge(a: object, b: object) -> object:
    """Both schemas' keywords in one (allOf, $ref siblings, a oneOf branch + its parent).

    Approximate on purpose (the result is validated against the real schema): properties
    and required are unioned, types intersected, other keywords taken from ``b``.
    """
    if a is False or b is False:
        return False
    if not isinstance(a, dict):
        return b
    if not isinstance(b, dict):
        return a
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    if "type" in a and "type" in b:
        ta, tb = _types(a), _types(b)
        both = [t for t in ta if t in tb]
        if "integer" not in both and {"integer", "number"} <= {*ta} | {*tb}:
            both.append("integer")  # integer ⊂ number
        out["type"] = both
    return out
