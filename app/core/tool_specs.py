"""Canonical tool types and the pure rules of tool execution (docs/tools.md).

What lives here, and why it is sans-IO:

* :class:`ToolSpec` is the one definition of a tool. Its ``input_schema`` is *derived* from
  the pydantic ``args_model`` (``model_json_schema()``) and cannot be passed in: a
  hand-written schema next to the model is a duplicate that drifts (docs/tools.md).
  Wire formats (OpenAI ``tools[]``, GBNF) are adapters
  over this type, never another definition.
* :class:`ToolInvocationRecord` is what logs and artifacts keep of one call, already
  redacted with the tool's ``redact_keys``; :class:`ToolEnvelope` is what the model and
  the client get back: ``{ok, data, warnings, errors}``.
* :class:`ToolRegistry` answers the two allow/deny questions with one rule, so they cannot
  disagree: a tool may run exactly when it would be shown to the model.
* :func:`validate_args`, :func:`measure_json`, :func:`escape_sentinels` and
  :func:`derive_call_key` are the checks the executor runs around a call. They raise only
  :class:`ToolError` (a :class:`~toolforge.errors.ToolForgeError`), whatever they are given.

The async side (timeouts, retries, the FIFO concurrency gate, approval, the result cache)
is :mod:`toolforge.runtime.executor`. No clock, loop or logging here (app/core is sans-IO:
docs/architecture.md).

JSON here means what orjson writes: compact UTF-8, keys as given (they must be strings),
non-ASCII characters raw (not ``\\u`` escaped), NaN and ±Infinity as ``null``, at most 254
levels of nesting. Sizes are byte counts of that text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import orjson
from pydantic import BaseModel, RootModel, ValidationError

from toolforge.core.protocol import sentinels
from toolforge.core.redact import normalize_key
from toolforge.core.schemas import compile_schema
from toolforge.errors import ErrorCode, RequestError, ToolForgeError

__all__ = [
    "MAX_ARGS_BYTES",
    "MAX_RESULT_BYTES",
    "JsonArgs",
    "ModelQuery",
    "PermanentToolError",
    "ToolArgumentsError",
    "ToolEnvelope",
    "ToolError",
    "ToolFn",
    "ToolInvocationRecord",
    "ToolOutput",
    "ToolRegistry",
    "ToolSpec",
    "TransientToolError",
    "derive_call_key",
    "dump_json",
    "escape_sentinels",
    "escape_sentinels_json",
    "has_sentinels",
    "is_allowed",
    "json_path",
    "measure_json",
    "parse_args",
    "validate_args",
]

MAX_ARGS_BYTES: Final = 32 * 1024
"""docs/protocol.md: tool arguments, as compact UTF-8 JSON. A model that writes more is looping."""
MAX_RESULT_BYTES: Final = 64 * 1024
"""docs/protocol.md: a tool result goes back into the model's context; 64 KB is already ~16k
tokens."""

# The UTF-8 bytes of the sentinel characters, and the bytes their escapes take *inside a
# JSON string* (the backslash itself escaped): what escaping does to serialised JSON.
_SENTINEL_BYTES: Final = tuple(
    (ch.encode("utf-8"), orjson.dumps(esc)[1:-1]) for ch, esc in sentinels.ESCAPES.items()
)
# Details listed in a validation message: enough for any real model, bounded for a flood.
_MAX_LISTED_VIOLATIONS: Final = 20
# Pydantic error context keys that describe Python, not the JSON the model wrote.
_CTX_SKIP: Final = frozenset({"class_name", "error"})

ArgsT = TypeVar("ArgsT", bound=BaseModel)
ToolFn = Callable[[Any], Awaitable[object]]
"""A tool implementation: ``async def fn(args: ArgsModel) -> JSON-able``."""


# -- errors -------------------------------------------------------------------------------


ModelQuery = Callable[[str, type[BaseModel]], Awaitable[tuple[BaseModel, bool]]]
"""How a tool asks the gateway's own model: ``ask(prompt, model_cls)`` returns the answer as a
valid ``model_cls`` and whether it is degraded (the JSON guarantee's minimal value: the
model's JSON was unusable even after one repair). Built by the app over its upstream
(:func:`toolforge.runtime.model_json.ask_json`) and handed to packs that take ``model``."""


class ToolError(ToolForgeError):
    """A tool call that did not produce a result. It goes back to the model as the
    envelope's error (the stream goes on, docs/protocol.md), never as a stream ``error`` frame.

    ``retryable`` is per instance here: whether calling again (after a correction, or
    later) can help. It is what the model reads in the envelope.
    """

    http_status = 422

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool = False,
        details: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(code, message, details=details)
        self.retryable = retryable


class ToolArgumentsError(ToolError):
    """Arguments rejected before execution: bad JSON, too large, or invalid against the
    tool's schema. ``details`` lists each violation as ``{path, constraint, message}``."""


class TransientToolError(ToolError):
    """Raised by a tool when calling again later may succeed (a network blip, a busy
    backend). The executor retries these, and timeouts, with a fixed delay (docs/tools.md)."""

    def __init__(self, message: str, *, details: list[dict[str, str]] | None = None) -> None:
        super().__init__(ErrorCode.TOOL_UNAVAILABLE, message, retryable=True, details=details)


class PermanentToolError(ToolError):
    """Raised by a tool for a failure that the same call will always meet (unknown id, a
    full slot). Never retried. Any other exception a tool raises is treated the same way,
    as ``TOOL_FAILED``, but without a message meant for the model."""

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode = ErrorCode.TOOL_FAILED,
        details: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(code, message, retryable=False, details=details)


# -- canonical types ----------------------------------------------------------------------


class JsonArgs(RootModel[dict[str, Any]]):
    """The arguments of a tool defined by a JSON Schema rather than a pydantic model (an MCP
    server's tools): a JSON object, checked against :attr:`ToolSpec.json_schema` by
    :func:`validate_args`. The tool's function gets this model; ``.root`` is the object."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec(Generic[ArgsT]):
    """One tool: what the model is told, how it is checked and how it runs (docs/tools.md).

    ``input_schema`` is computed from ``args_model`` at construction and is not an
    argument. ``timeout_s=None`` means the executor's default (``TOOL_TIMEOUT_MS``).
    ``redact_keys`` are argument/result keys whose values never reach logs or artifacts
    (on top of :data:`toolforge.core.redact.SENSITIVE_KEYS`); the model and the client still
    see them, since the model supplied them or needs them.

    The fields of docs/tools.md (:mod:`toolforge.core.tool_rules` checks them at start-up):
    ``output_allowlist`` is the result's redaction allowlist, the only result keys that
    logs and artifacts keep (``"*"``: all of them); ``None`` means undeclared, which a
    configured registry refuses. ``source`` says where the tool comes from (``pack:demo``,
    ``mcp:<server>``; ``GET /v1/tools`` shows it). ``json_schema`` is for tools whose
    contract *is* a JSON Schema (MCP): ``args_model`` is then :class:`JsonArgs` and the
    schema is used as given. ``availability`` returns ``None`` when the tool can run now,
    else why not (an MCP server being restarted).

    ``confirm_with`` names the tool that makes this one's proposal real once a person says
    so (the workspace pack's ``facts.propose`` → ``facts.commit``, docs/tools.md): after a
    successful call the gateway itself calls that tool, with this call's result ``data`` as its
    arguments, and the call waits for ``POST …/approvals/{call_id}`` like any ``needs_approval``
    call. The confirming tool must be registered, not model-facing and ``needs_approval``
    (:mod:`toolforge.core.tool_rules` checks it), so the model can neither see it nor run it;
    the model is told the outcome in the proposing call's result (``confirmation``).
    """

    name: str
    description: str
    args_model: type[ArgsT]
    fn: Callable[[ArgsT], Awaitable[object]] = field(repr=False, compare=False)
    redact_keys: frozenset[str] = frozenset()
    timeout_s: float | None = None
    retries: int = 2
    retry_delay_s: float = 2.0
    idempotent: bool = False
    needs_approval: bool = False
    model_facing: bool = True
    confirm_with: str | None = None
    output_allowlist: frozenset[str] | None = None
    source: str = "python"
    json_schema: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    availability: Callable[[], str | None] | None = field(default=None, repr=False, compare=False)
    input_schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() or c in sentinels.ESCAPES for c in self.name):
            raise ValueError(f"tool name {self.name!r} must be non-empty, without spaces")
        if self.retries < 0 or self.retry_delay_s < 0:
            raise ValueError(f"{self.name}: retries and retry_delay_s must be >= 0")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"{self.name}: timeout_s must be > 0")
        keys = frozenset(normalize_key(k) for k in self.redact_keys)
        object.__setattr__(self, "redact_keys", keys)
        if self.output_allowlist is not None:
            object.__setattr__(self, "output_allowlist", frozenset(self.output_allowlist))
        if self.json_schema is None:
            object.__setattr__(self, "input_schema", self.args_model.model_json_schema())
        else:
            if self.args_model is not JsonArgs:
                raise ValueError(f"{self.name}: a json_schema tool takes JsonArgs arguments")
            # A detached copy: the caller's dict cannot change the contract afterwards.
            object.__setattr__(self, "input_schema", orjson.loads(dump_json(self.json_schema)))

    def unavailable_reason(self) -> str | None:
        """Why the tool cannot run now, or ``None`` when it can."""
        return None if self.availability is None else self.availability()

    def to_dict(self) -> dict[str, Any]:
        """The public description (``GET /v1/tools``): everything but the implementation."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "redact_keys": sorted(self.redact_keys),
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "retry_delay_s": self.retry_delay_s,
            "idempotent": self.idempotent,
            "needs_approval": self.needs_approval,
            "model_facing": self.model_facing,
            "confirm_with": self.confirm_with,
            "source": self.source,
            "output_allowlist": (
                None if self.output_allowlist is None else sorted(self.output_allowlist)
            ),
            "available": (reason := self.unavailable_reason()) is None,
            "unavailable_reason": reason,
        }


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool may return instead of bare data: the data, and the source's own
    payload (``raw``), which the executor keeps on the record only (docs/tools.md)."""

    data: object
    raw: object = None


@dataclass(frozen=True, slots=True)
class ToolEnvelope:
    """What one tool call returns, to the model and the client: ``{ok, data, warnings,
    errors}``. ``data`` is ``None`` when ``ok`` is false; ``errors`` are
    :meth:`ToolForgeError.to_dict` payloads (``code``, ``message``, ``retryable``,
    ``details``); ``warnings`` are ``{code, message}``."""

    ok: bool
    data: object = None
    warnings: tuple[dict[str, str], ...] = ()
    errors: tuple[dict[str, object], ...] = ()

    @classmethod
    def success(cls, data: object, warnings: Iterable[dict[str, str]] = ()) -> ToolEnvelope:
        return cls(ok=True, data=data, warnings=tuple(warnings))

    @classmethod
    def failure(
        cls, error: ToolForgeError, warnings: Iterable[dict[str, str]] = ()
    ) -> ToolEnvelope:
        return cls(ok=False, data=None, warnings=tuple(warnings), errors=(error.to_dict(),))

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "data": self.data,
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }


@dataclass(frozen=True, slots=True)
class ToolInvocationRecord:
    """One call, for logs and ``tool_logs.json`` (docs/tools.md). ``args`` and ``result`` are
    redacted with the tool's keys; ``started_at``/``ended_at`` are Unix seconds;
    ``attempts`` is 0 when the tool never ran (rejected, denied or served from cache).

    ``raw`` is the source's own payload (an MCP ``CallToolResult`` as the server sent it),
    for observability in-process only: :meth:`to_dict`, which logs, artifacts and the UI
    use, leaves it out, and it never decides anything (docs/tools.md)."""

    call_id: str
    name: str
    args: object
    result: object
    error: dict[str, object] | None
    started_at: float
    ended_at: float
    attempts: int
    raw: object = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "call_id": self.call_id,
            "name": self.name,
            "args": self.args,
            "result": self.result,
            "error": self.error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "attempts": self.attempts,
        }


# -- registry and allow/deny --------------------------------------------------------------


def is_allowed(spec: ToolSpec[Any], allow: Collection[str] | None, deny: Collection[str]) -> bool:
    """Whether ``spec`` is shown to the model and may run. ``allow=None`` means every
    model-facing tool (docs/protocol.md's default); ``deny`` always wins."""
    if not spec.model_facing or spec.name in deny:
        return False
    return allow is None or spec.name in allow


class ToolRegistry:
    """The tools of one gateway, in registration order.

    ``visible(allow, deny)`` is what the model is shown; ``check_allowed(name, allow,
    deny)`` is what may run, with the same rule (:func:`is_allowed`), so a model cannot run
    a tool it was not shown by guessing its name.
    """

    def __init__(self, specs: Iterable[ToolSpec[Any]] = ()) -> None:
        self._specs: dict[str, ToolSpec[Any]] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec[Any]) -> None:
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec[Any] | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ToolSpec[Any]]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> list[str]:
        return list(self._specs)

    def visible(
        self, allow: Collection[str] | None = None, deny: Collection[str] = ()
    ) -> list[ToolSpec[Any]]:
        """The tools the model is shown, in registration order."""
        return [s for s in self._specs.values() if is_allowed(s, allow, deny)]

    def check_allowed(
        self, name: str, allow: Collection[str] | None = None, deny: Collection[str] = ()
    ) -> ToolSpec[Any]:
        """The spec of a tool the model may run, or a :class:`ToolError`
        (``TOOL_NOT_FOUND`` for names never registered, ``TOOL_NOT_ALLOWED`` otherwise)."""
        spec = self._specs.get(name)
        if spec is None:
            shown = ", ".join(s.name for s in self.visible(allow, deny)) or "none"
            raise ToolError(
                ErrorCode.TOOL_NOT_FOUND, f"no tool named {name!r}; available tools: {shown}"
            )
        if not is_allowed(spec, allow, deny):
            raise ToolError(
                ErrorCode.TOOL_NOT_ALLOWED, f"tool {name!r} is not available in this request"
            )
        return spec


# -- JSON, sizes and escaping -------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dump_json(value: object) -> bytes:
    """``value`` as compact UTF-8 JSON (pydantic models dumped in JSON mode, sets as
    arrays). Raises ``TypeError`` for anything else orjson cannot write."""
    return orjson.dumps(value, default=_json_default)


def measure_json(value: object, *, limit: int, code: ErrorCode, what: str) -> bytes:
    """Serialise ``value`` and check its size against ``limit`` bytes; return the bytes.

    ``code`` is the error for too large (``ARGUMENTS_TOO_LARGE`` or
    ``TOOL_OUTPUT_TOO_LARGE``). A value that is not JSON raises ``TOOL_ARGS_INVALID`` for
    arguments and ``TOOL_OUTPUT_INVALID`` otherwise.
    """
    try:
        blob = dump_json(value)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        bad = (
            ErrorCode.TOOL_ARGS_INVALID
            if code is ErrorCode.ARGUMENTS_TOO_LARGE
            else ErrorCode.TOOL_OUTPUT_INVALID
        )
        err_cls = ToolArgumentsError if bad is ErrorCode.TOOL_ARGS_INVALID else ToolError
        raise err_cls(bad, f"{what} is not JSON: {exc}") from exc
    _check_size(len(blob), limit=limit, code=code, what=what)
    return blob


def _check_size(size: int, *, limit: int, code: ErrorCode, what: str) -> None:
    if size > limit:
        cls = ToolArgumentsError if code is ErrorCode.ARGUMENTS_TOO_LARGE else ToolError
        raise cls(
            code,
            f"{what} is {size} bytes of JSON; the limit is {limit}",
            details=[{"size": str(size), "limit": str(limit)}],
        )


def parse_args(raw: object, *, limit: int = MAX_ARGS_BYTES) -> bytes:
    """Tool arguments as checked compact JSON bytes, from a parsed value or from JSON text.

    ``str``/``bytes`` are JSON text (native tool calls carry their arguments as a
    string): their size is checked *before* parsing, and text that is not strict JSON is
    ``INVALID_JSON`` (docs/tools.md). Anything else is a value already parsed (the framer's).
    Too large is ``ARGUMENTS_TOO_LARGE``.
    """
    if isinstance(raw, str | bytes | bytearray):
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
        _check_size(len(data), limit=limit, code=ErrorCode.ARGUMENTS_TOO_LARGE, what="arguments")
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ToolArgumentsError(
                ErrorCode.INVALID_JSON,
                f"arguments are not valid JSON ({exc.msg} at character {exc.pos}); "
                "send one JSON object",
            ) from exc
    return measure_json(raw, limit=limit, code=ErrorCode.ARGUMENTS_TOO_LARGE, what="arguments")


def json_path(loc: Iterable[int | str]) -> str:
    """A pydantic error location as a JSONPath: ``$``, ``$.party_size``, ``$.items[0]``,
    ``$["odd key"]``."""
    out = ["$"]
    for part in loc:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif part.isidentifier():
            out.append(f".{part}")
        else:
            out.append(f"[{orjson.dumps(part).decode()}]")
    return "".join(out)


def _constraint(err: Mapping[str, Any]) -> str:
    ctx = {k: v for k, v in (err.get("ctx") or {}).items() if k not in _CTX_SKIP}
    if not ctx:
        return str(err["type"])
    args = ", ".join(f"{k}={v}" for k, v in ctx.items())
    return f"{err['type']}({args})"


def validate_args(spec: ToolSpec[ArgsT], raw: object, *, limit: int = MAX_ARGS_BYTES) -> ArgsT:
    """Check ``raw`` (a parsed value or JSON text) against ``spec.args_model``.

    Validation is pydantic's *strict* JSON mode: the JSON Schema the model is shown is the
    contract, so ``"4"`` for an integer is a violation reported like any other, not a
    silent coercion. On failure raises :class:`ToolArgumentsError` (``TOOL_ARGS_INVALID``)
    whose message lists each violation as ``$.path: message [constraint]`` and whose
    ``details`` carry ``{path, constraint, message}``: what a model needs to retry.
    Input values are never echoed (they may be secrets).
    """
    blob = parse_args(raw, limit=limit)
    try:
        args = spec.args_model.model_validate_json(blob, strict=True)
    except ValidationError as exc:
        raise _arguments_error(spec.name, exc) from None
    except Exception as exc:  # a validator with a bug (TypeError, ...) is ours, not the model's
        raise ToolError(
            ErrorCode.TOOL_FAILED,
            f"{spec.name} could not check its arguments ({type(exc).__name__})",
        ) from exc
    if spec.json_schema is not None:
        _check_json_schema(spec, args)
    return args


def _check_json_schema(spec: ToolSpec[Any], args: BaseModel) -> None:
    """Validate a :class:`JsonArgs` value against the tool's JSON Schema; each violation
    is reported like a pydantic one, ``{path, constraint, message}``."""
    try:
        compiled = compile_schema(spec.input_schema, name=f"{spec.name}.parameters", fallback=False)
    except RequestError as exc:  # an MCP server's schema that reaches outside itself
        raise ToolError(ErrorCode.TOOL_FAILED, f"{spec.name}: {exc.message}") from None
    value = args.model_dump(mode="json")
    found = sorted(compiled.errors(value), key=lambda e: list(map(str, e.absolute_path)))
    if not found:
        return
    details = [
        {
            "path": json_path(e.absolute_path),
            "constraint": str(e.validator),
            # jsonschema quotes the instance; the model wrote it, but it may be a secret.
            "message": _schema_message(e),
        }
        for e in found[:_MAX_LISTED_VIOLATIONS]
    ]
    listed = "; ".join(f"{d['path']}: {d['message']} [{d['constraint']}]" for d in details)
    if len(found) > _MAX_LISTED_VIOLATIONS:
        listed += f"; and {len(found) - _MAX_LISTED_VIOLATIONS} more"
    noun = "argument" if len(found) == 1 else "arguments"
    raise ToolArgumentsError(
        ErrorCode.TOOL_ARGS_INVALID,
        f"{len(found)} invalid {noun} for {spec.name}: {listed}",
        details=details,
    )


def _schema_message(error: Any) -> str:
    keyword, expected = str(error.validator), error.validator_value
    if keyword == "required":
        missing = [
            k for k in expected if isinstance(error.instance, dict) and k not in error.instance
        ]
        return f"missing required properties: {', '.join(map(str, missing))}"
    if keyword == "additionalProperties" and isinstance(error.instance, dict):
        return "unexpected properties are not allowed"
    if isinstance(expected, str | int | float | bool | list) and len(repr(expected)) <= 200:
        return f"must satisfy {keyword}={orjson.dumps(expected).decode()}"
    return f"must satisfy {keyword}"


def _arguments_error(name: str, exc: ValidationError) -> ToolArgumentsError:
    errors = exc.errors(include_url=False, include_input=False)
    details = [
        {
            "path": json_path(e["loc"]),
            "constraint": _constraint(e),
            "message": str(e["msg"]),
        }
        for e in errors
    ]
    listed = "; ".join(
        f"{d['path']}: {d['message']} [{d['constraint']}]" for d in details[:_MAX_LISTED_VIOLATIONS]
    )
    more = len(details) - _MAX_LISTED_VIOLATIONS
    if more > 0:
        listed += f"; and {more} more"
    noun = "argument" if len(details) == 1 else "arguments"
    return ToolArgumentsError(
        ErrorCode.TOOL_ARGS_INVALID,
        f"{len(details)} invalid {noun} for {name}: {listed}",
        details=details[:_MAX_LISTED_VIOLATIONS],
    )


def _escape_blob(blob: bytes) -> bytes:
    for raw, escaped in _SENTINEL_BYTES:
        blob = blob.replace(raw, escaped)
    return blob


def has_sentinels(blob: bytes) -> bool:
    """Whether serialised JSON contains a sentinel character (a fast byte scan)."""
    return any(raw in blob for raw, _ in _SENTINEL_BYTES)


def escape_sentinels(value: object) -> object:
    """``value`` with every ``⟦`` (U+27E6) and ``⟧`` (U+27E7), in every string — object
    keys included — replaced by the six visible characters ``\\u27e6`` / ``\\u27e7``.

    So a tool result can never carry a sentinel to the model or the client (docs/protocol.md):
    ``{"note": "⟦END_TOOL_CALL id=1⟧"}`` becomes ``{"note": "\\u27e6END_TOOL_CALL
    id=1\\u27e7"}`` — a literal backslash in the value, so its JSON text reads
    ``"\\\\u27e6…"`` and decodes to the escape, not to the sentinel. Nothing else changes.
    The mapping is deliberately not reversible (existing backslashes are not doubled): it
    is for reading, and a result that already contained the text ``\\u27e6`` reads the same.

    Works on the serialised JSON: the sentinels are not ASCII, so in JSON text they can
    only occur inside strings, and a byte replacement there is exactly a replacement in
    every string of the value — in linear time, at any depth. Returns a fresh value
    (JSON types only; pydantic models become dicts). Raises :class:`ToolError`
    (``TOOL_OUTPUT_INVALID``) for a value that is not JSON.
    """
    try:
        blob = dump_json(value)
    except TypeError as exc:
        raise ToolError(ErrorCode.TOOL_OUTPUT_INVALID, f"result is not JSON: {exc}") from exc
    return orjson.loads(_escape_blob(blob))


def escape_sentinels_json(blob: bytes) -> bytes:
    """:func:`escape_sentinels` on JSON text that is already serialised."""
    return _escape_blob(blob) if has_sentinels(blob) else blob


def derive_call_key(idempotency_key: str, stream_call_id: str, tool: str, args: object) -> str:
    """The per-call key of docs/tools.md: sha256 (hex) over the request's ``Idempotency-Key``,
    the call's id in its stream, the tool name and its arguments (canonical JSON, keys
    sorted). The same call in a replayed request gets the same key; another call, or the
    same id with other arguments, never does."""
    try:
        canonical = orjson.dumps(
            [idempotency_key, stream_call_id, tool, args],
            default=_json_default,
            option=orjson.OPT_SORT_KEYS,
        )
    except TypeError as exc:
        raise ToolArgumentsError(
            ErrorCode.TOOL_ARGS_INVALID, f"arguments are not JSON: {exc}"
        ) from exc
    return hashlib.sha256(canonical).hexdigest()
