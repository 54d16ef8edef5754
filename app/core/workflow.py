"""Workflow definitions (docs/workflows.md): data, parsed and validated. No I/O.

A workflow is a document (a file in ``workflows/``, or inline in ``POST /v1/stream``)::

    {"name": "book_a_table",
     "tools": ["places.search", "bookings.create"],
     "required_steps": ["places.search"],
     "terminal_tools": ["bookings.create"],
     "prerequisites": {"bookings.create": [{"tool": "places.search",
                                            "match_arg": "place_id", "result_key": "id"}]},
     "max_iterations": 10, "max_retries_per_step": 3, "max_tool_errors": 2,
     "compaction": "tiered", "keep_recent": 2, "rescue": true, "narrow": true}

:func:`parse_workflow` checks its shape (unknown keys are refused) and these rules
(docs/workflows.md): every tool exists; required steps and terminal tools are among the workflow's
tools; a terminal tool is not a required step; prerequisites name the workflow's tools. A bad
definition is a :class:`~toolforge.errors.RequestError` ``WORKFLOW_INVALID`` that says
what is wrong and where (the file, or ``request``).

A prerequisite is a tool name (``"places.search"``: called successfully before) or an
argument-matched one, ``{"tool", "match_arg", "result_key"?}``: the call's argument
``match_arg`` must be a value the earlier tool produced, found under ``result_key``
anywhere in that tool's successful results (``"id"``: the search's place ids), or, without
``result_key``, the same argument of an earlier successful call of that tool.

``grounded`` (tool → argument names) marks arguments the model must take from the user's
first message: in constrained mode the grammar lets a plain string be only a few of its
words (a search query drawn from "Find pizza near me; ...", never SQL or a made-up term),
a string with a ``pattern`` only its times of day as ``HH:MM`` ("7pm" → "19:00") or words
that match, a number only the numbers it states ("for 2"); an argument the user said
nothing usable for keeps its schema (``toolforge.core.grounding.user_values``). The words of a
grounded call whose result gave an argument-matched prerequisite nothing are not offered
again. Like argument-matched prerequisites it is a narrowing, off with ``narrow: false``.

``respond`` (:data:`RESPOND`) is a built-in tool a workflow may list: the model's answer
as a call, ``{"content": "..."}``; make it a terminal tool for a conversational workflow.

A workflow's ``max_iterations`` also lifts the stream's tool-call limit to
:data:`TOOL_CALLS_PER_ITERATION` calls a turn, so that the stream's own limit does not cut
into the workflow's budgets. The operator's workflows (``WORKFLOWS_DIR``, the Python API)
are trusted with that; one sent inline by a client is not: :class:`WorkflowCaps` bound
its iterations, the tool calls they allow and its ``budget_tokens``, and one over a cap is
refused (``WORKFLOW_INVALID``, 422, naming the cap) rather than quietly clamped.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolforge.core.provenance import Calls, Results, Source, User, parse_sources, source_doc
from toolforge.errors import ErrorCode, RequestError

__all__ = [
    "RESPOND",
    "RESPOND_TOOL",
    "TOOL_CALLS_PER_ITERATION",
    "Prerequisite",
    "WorkflowCaps",
    "WorkflowDef",
    "parse_workflow",
]

TOOL_CALLS_PER_ITERATION: Final = 4
"""Tool calls a workflow may make per model turn (``max_iterations``): the stream's
tool-call limit is raised to this many times the workflow's iterations."""


@dataclass(frozen=True, slots=True)
class WorkflowCaps:
    """The most an untrusted (inline) workflow may ask for; the defaults are the settings'
    (``INLINE_WORKFLOW_MAX_ITERATIONS``, ``INLINE_WORKFLOW_MAX_TOOL_CALLS``,
    ``INLINE_WORKFLOW_MAX_BUDGET_TOKENS``)."""

    max_iterations: int = 16
    max_tool_calls: int = 64
    max_budget_tokens: int = 262_144


RESPOND: Final = "respond"
RESPOND_TOOL: Final[Mapping[str, Any]] = {
    "name": RESPOND,
    "description": "Answer the user in words. Call it when no other tool is needed.",
    "input_schema": {
        "type": "object",
        "properties": {"content": {"type": "string", "minLength": 1, "maxLength": 4000}},
        "required": ["content"],
        "additionalProperties": False,
    },
}
"""The built-in ``respond`` tool's description (the synthetic respond tool, docs/workflows.md)."""

_NAME = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
_ARG = Annotated[str, Field(min_length=1, max_length=64)]


class _MatchedDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: _NAME
    match_arg: Annotated[str, Field(min_length=1, max_length=64)]
    result_key: Annotated[str, Field(min_length=1, max_length=64)] | None = None


class _WorkflowDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _NAME
    description: Annotated[str, Field(max_length=4000)] = ""
    tools: Annotated[list[_NAME], Field(min_length=1, max_length=64)]
    required_steps: list[_NAME] = Field(default_factory=list, max_length=64)
    terminal_tools: Annotated[list[_NAME], Field(min_length=1, max_length=64)]
    prerequisites: dict[_NAME, list[_NAME | _MatchedDoc]] = Field(default_factory=dict)
    max_iterations: Annotated[int, Field(ge=1, le=100)] = 10
    max_retries_per_step: Annotated[int, Field(ge=0, le=20)] = 3
    max_tool_errors: Annotated[int, Field(ge=0, le=20)] = 2
    max_calls: dict[_NAME, Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=dict, max_length=64
    )
    min_calls: dict[_NAME, Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=dict, max_length=64
    )
    compaction: Literal["tiered", "sliding", "none"] = "tiered"
    keep_recent: Annotated[int, Field(ge=0, le=100)] = 2
    budget_tokens: Annotated[int, Field(ge=256)] | None = None
    rescue: bool = True
    narrow: bool = True  # argument-matched prerequisites narrow the constrained grammar
    grounded: dict[_NAME, Annotated[list[_ARG], Field(min_length=1, max_length=16)]] = Field(
        default_factory=dict
    )
    provenance: dict[_NAME, Annotated[dict[_ARG, Any], Field(max_length=64)]] = Field(
        default_factory=dict, max_length=64
    )
    instructions: Annotated[str, Field(max_length=8000)] = ""


@dataclass(frozen=True, slots=True)
class Prerequisite:
    """Before calling a tool, ``tool`` must have succeeded; with ``match_arg``, the call's
    argument of that name must be a value ``tool`` produced (see the module docstring)."""

    tool: str
    match_arg: str | None = None
    result_key: str | None = None

    def to_dict(self) -> str | dict[str, str]:
        if self.match_arg is None:
            return self.tool
        out = {"tool": self.tool, "match_arg": self.match_arg}
        if self.result_key is not None:
            out["result_key"] = self.result_key
        return out


@dataclass(frozen=True, slots=True)
class WorkflowDef:
    """A validated workflow (:func:`parse_workflow`)."""

    name: str
    tools: tuple[str, ...]
    terminal_tools: frozenset[str]
    required_steps: tuple[str, ...] = ()
    prerequisites: Mapping[str, tuple[Prerequisite, ...]] = field(default_factory=dict)
    description: str = ""
    max_iterations: int = 10
    max_retries_per_step: int = 3
    max_tool_errors: int = 2
    # tool -> successful calls it may make (a step meant to be repeated: one report per
    # supplier); without one, a step already done leaves the choice once the end is open.
    max_calls: Mapping[str, int] = field(default_factory=dict)
    # required step -> successful calls that complete it (one report for each of five
    # suppliers): until then the step is still the one to make, and the end waits.
    min_calls: Mapping[str, int] = field(default_factory=dict)
    compaction: str = "tiered"
    keep_recent: int = 2
    budget_tokens: int | None = None
    rescue: bool = True
    narrow: bool = True
    grounded: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    provenance: Mapping[str, Mapping[str, tuple[Source, ...]]] = field(default_factory=dict)
    instructions: str = ""
    source: str = "request"

    @property
    def uses_respond(self) -> bool:
        return RESPOND in self.tools

    def tool_call_limit(self, requested: int) -> int:
        """The stream's tool-call limit under this workflow: ``requested``, lifted to
        :data:`TOOL_CALLS_PER_ITERATION` a turn (the one rule for every front door: the
        stream body, the proxy and the Python runner)."""
        return max(requested, TOOL_CALLS_PER_ITERATION * self.max_iterations)

    def to_dict(self) -> dict[str, Any]:
        """The definition as a document (``GET /v1/workflows``)."""
        return {
            "name": self.name,
            "description": self.description,
            "tools": list(self.tools),
            "required_steps": list(self.required_steps),
            "terminal_tools": sorted(self.terminal_tools),
            "prerequisites": {
                tool: [p.to_dict() for p in prereqs] for tool, prereqs in self.prerequisites.items()
            },
            "max_iterations": self.max_iterations,
            "max_retries_per_step": self.max_retries_per_step,
            "max_tool_errors": self.max_tool_errors,
            "max_calls": dict(self.max_calls),
            "min_calls": dict(self.min_calls),
            "compaction": self.compaction,
            "keep_recent": self.keep_recent,
            "budget_tokens": self.budget_tokens,
            "rescue": self.rescue,
            "narrow": self.narrow,
            "grounded": {tool: list(args) for tool, args in self.grounded.items()},
            "provenance": {
                tool: {
                    arg: [source_doc(s) for s in sources]
                    if len(sources) > 1
                    else source_doc(sources[0])
                    for arg, sources in args.items()
                }
                for tool, args in self.provenance.items()
            },
            "instructions": self.instructions,
            "source": self.source,
        }


def _invalid(source: str, problem: str) -> RequestError:
    return RequestError(
        ErrorCode.WORKFLOW_INVALID,
        f"workflow in {source}: {problem}",
        http_status=422,
    )


def _check_caps(parsed: _WorkflowDoc, caps: WorkflowCaps, source: str) -> None:
    """An untrusted workflow over one of ``caps``: ``WORKFLOW_INVALID`` naming the cap."""
    name = f"{parsed.name!r} ({source})"
    if parsed.max_iterations > caps.max_iterations:
        raise _invalid(
            source,
            f"{name}: max_iterations {parsed.max_iterations} is over this gateway's cap for "
            f"inline workflows, {caps.max_iterations} (INLINE_WORKFLOW_MAX_ITERATIONS); "
            "ask for fewer, or use a registered workflow",
        )
    calls = TOOL_CALLS_PER_ITERATION * parsed.max_iterations
    if calls > caps.max_tool_calls:
        raise _invalid(
            source,
            f"{name}: max_iterations {parsed.max_iterations} allows {calls} tool calls "
            f"({TOOL_CALLS_PER_ITERATION} a turn), over this gateway's cap for inline "
            f"workflows, {caps.max_tool_calls} (INLINE_WORKFLOW_MAX_TOOL_CALLS); ask for at "
            f"most {caps.max_tool_calls // TOOL_CALLS_PER_ITERATION} iterations",
        )
    if parsed.budget_tokens is not None and parsed.budget_tokens > caps.max_budget_tokens:
        raise _invalid(
            source,
            f"{name}: budget_tokens {parsed.budget_tokens} is over this gateway's cap for "
            f"inline workflows, {caps.max_budget_tokens} (INLINE_WORKFLOW_MAX_BUDGET_TOKENS)",
        )


def parse_workflow(
    doc: object,
    *,
    known_tools: Collection[str],
    source: str = "request",
    caps: WorkflowCaps | None = None,
) -> WorkflowDef:
    """``doc`` as a :class:`WorkflowDef`, or ``WORKFLOW_INVALID`` naming the problem.

    ``known_tools``: the tools that exist (the registry's, plus the caller's own for the
    Python API); ``respond`` always exists. ``caps``: the bounds of an untrusted (inline)
    definition; None for the operator's own (files, the Python API).
    """
    try:
        parsed = _WorkflowDoc.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise _invalid(source, f"{where}: {first['msg']}") from None
    if caps is not None:
        _check_caps(parsed, caps, source)
    name = f"{parsed.name!r} ({source})"
    exists = {*known_tools, RESPOND}
    tools = parsed.tools
    if len(set(tools)) != len(tools):
        raise _invalid(source, f"{name}: 'tools' names a tool twice")
    for tool in tools:
        if tool not in exists:
            raise _invalid(
                source,
                f"{name}: tool {tool!r} does not exist; known tools: {', '.join(sorted(exists))}",
            )
    listed = set(tools)
    for key in ("required_steps", "terminal_tools"):
        for tool in getattr(parsed, key):
            if tool not in listed:
                raise _invalid(source, f"{name}: {key} names {tool!r}, which is not in 'tools'")
    for tool in parsed.terminal_tools:
        if tool in parsed.required_steps:
            raise _invalid(
                source,
                f"{name}: terminal tool {tool!r} is also a required step; a terminal tool "
                "ends the workflow, so it cannot be a step before the end",
            )
    prerequisites: dict[str, tuple[Prerequisite, ...]] = {}
    for tool, items in parsed.prerequisites.items():
        if tool not in listed:
            raise _invalid(source, f"{name}: prerequisites of {tool!r}, which is not in 'tools'")
        prereqs: list[Prerequisite] = []
        for item in items:
            prereq = (
                Prerequisite(item)
                if isinstance(item, str)
                else Prerequisite(item.tool, item.match_arg, item.result_key)
            )
            if prereq.tool not in listed:
                raise _invalid(
                    source,
                    f"{name}: {tool!r} has prerequisite {prereq.tool!r}, which is not in 'tools'",
                )
            if prereq.tool == tool:
                raise _invalid(source, f"{name}: {tool!r} cannot be its own prerequisite")
            prereqs.append(prereq)
        prerequisites[tool] = tuple(prereqs)
    for tool in parsed.max_calls:
        if tool not in listed:
            raise _invalid(source, f"{name}: max_calls names {tool!r}, which is not in 'tools'")
    for tool, least in parsed.min_calls.items():
        if tool not in parsed.required_steps:
            raise _invalid(
                source, f"{name}: min_calls names {tool!r}, which is not in 'required_steps'"
            )
        most = parsed.max_calls.get(tool)
        if most is not None and most < least:
            raise _invalid(
                source,
                f"{name}: min_calls for {tool!r} is {least}, more than its max_calls ({most})",
            )
    for tool in parsed.grounded:
        if tool not in listed:
            raise _invalid(source, f"{name}: grounded names {tool!r}, which is not in 'tools'")
    provenance: dict[str, dict[str, tuple[Source, ...]]] = {}
    for tool, declared in parsed.provenance.items():
        if tool not in listed:
            raise _invalid(source, f"{name}: provenance names {tool!r}, which is not in 'tools'")
        for arg, doc in declared.items():
            try:
                sources = parse_sources(doc, where=f"provenance.{tool}.{arg}")
            except ValueError as exc:
                raise _invalid(source, f"{name}: {exc}") from None
            for source_item in sources:
                of = source_item.tool if isinstance(source_item, Results | Calls) else None
                if of is not None and of not in listed:
                    raise _invalid(
                        source,
                        f"{name}: provenance.{tool}.{arg} takes values from "
                        f"{of!r}, which is not in 'tools'",
                    )
            provenance.setdefault(tool, {})[arg] = sources
    # ``grounded`` is the older spelling of provenance "user".
    for tool, grounded_args in parsed.grounded.items():
        for arg in grounded_args:
            provenance.setdefault(tool, {}).setdefault(arg, (User(),))
    return WorkflowDef(
        name=parsed.name,
        tools=tuple(tools),
        terminal_tools=frozenset(parsed.terminal_tools),
        required_steps=tuple(parsed.required_steps),
        prerequisites=prerequisites,
        description=parsed.description,
        max_iterations=parsed.max_iterations,
        max_retries_per_step=parsed.max_retries_per_step,
        max_tool_errors=parsed.max_tool_errors,
        max_calls=dict(parsed.max_calls),
        min_calls=dict(parsed.min_calls),
        compaction=parsed.compaction,
        keep_recent=parsed.keep_recent,
        budget_tokens=parsed.budget_tokens,
        rescue=parsed.rescue,
        narrow=parsed.narrow,
        grounded={tool: tuple(args) for tool, args in parsed.grounded.items()},
        provenance=provenance,
        instructions=parsed.instructions,
        source=source,
    )
