"""The workflow's state compiled into one turn's constraint. No I/O.

Before each model turn the workflow policy (:mod:`toolforge.core.steps`) compiles what
the run may do next into a :class:`TurnConstraint`, and the mode renders it for its
backend (docs/workflows.md, "The compiled constraint"):

    backend                          the constraint is
    -------------------------------  ------------------------------------------------------
    llama-server (constrained mode)  the turn's GBNF: only the legal tools' calls, each
                                     with its narrowed arguments, no text, no result frame
    an OpenAI-compatible or Ollama   the upstream's ``tools`` cut to the legal ones, their
    server (native mode)             parameters narrowed, and ``tool_choice`` naming the one
                                     legal tool (or ``required``)
    anything else (sentinel mode)    nothing before decoding: the call is checked when it
                                     comes, and refused with a nudge

A tool is legal now when:

* it is the first required step not done yet (the steps go in order);
* it is a terminal tool and every required step is done;
* it is a required step already done, and no terminal tool can be called yet (the values
  the end needs must come from somewhere);
* it is another tool not called yet (a tool other than a step or an end is called once,
  unless ``max_calls`` gives it more, or no step is left and no end can be called yet: a
  small model loops on side tools); while the next required step or a terminal tool can
  be called, only if every required argument of it is narrowed to values the run holds
  (a side tool only invention could fill is a detour);
* its prerequisites by name have succeeded, and each argument whose values must come from
  somewhere (an argument-matched prerequisite, a declared provenance,
  :mod:`toolforge.core.provenance`) has a value to take.

A required step already done leaves the choice. While the workflow is unfinished the turn
must be a call: its answer, if it has one, is a call too (``respond``, or a terminal tool
such as ``answer``), so a question no tool fits still has somewhere to go.

When nothing would be legal (a workflow whose next step needs a value no call has
produced), the constraint falls back to every tool the narrowing leaves callable, so that a
turn is never asked with no way to act.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from toolforge.core.decisions import TurnHints
from toolforge.core.workflow import WorkflowDef

__all__ = ["TurnConstraint", "clean_schema", "compile_turn"]


@dataclass(frozen=True, slots=True)
class TurnConstraint:
    """One turn's legal calls: ``tools`` (legal tool -> its input schema narrowed, in the
    workflow's order), ``left_out`` (the workflow's other tools), and whether the turn
    must be a call (``call_required``)."""

    tools: Mapping[str, Mapping[str, Any]]
    left_out: tuple[str, ...] = ()
    call_required: bool = True
    changed: frozenset[str] = frozenset()  # the legal tools whose schema was narrowed

    def hints(self) -> TurnHints:
        """The constraint as the engine's turn hints (constrained mode's grammar): the
        narrowed schemas and the tools left out (the others are as planned, their
        grammar converted once per stream)."""
        narrowed: dict[str, Mapping[str, Any] | None] = {
            t: s for t, s in self.tools.items() if t in self.changed
        }
        narrowed.update(dict.fromkeys(self.left_out))
        free = not self.call_required
        return TurnHints(
            narrowed=narrowed,
            allow_result=free,
            free_text=free,
            tool_choice=self.tool_choice(),
        )

    def tool_choice(self) -> object:
        """OpenAI's ``tool_choice`` for it: the one legal tool by name, ``required`` while a
        call is due, else ``auto``."""
        if self.call_required and len(self.tools) == 1:
            return {"type": "function", "function": {"name": next(iter(self.tools))}}
        return "required" if self.call_required else "auto"

    def json_schema(self) -> dict[str, Any]:
        """The constraint as one JSON Schema for a backend that constrains its output to
        one (Ollama's ``format``, ``response_format`` ``json_schema``): a call,
        ``{"name": <a legal tool>, "arguments": <its narrowed schema>}``."""
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "arguments": clean_schema(schema)},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for name, schema in self.tools.items()
            ]
        }


def compile_turn(
    workflow: WorkflowDef,
    narrowed: Mapping[str, Mapping[str, Any] | None],
    schemas: Mapping[str, Mapping[str, Any]],
    *,
    succeeded: Collection[str],
    calls: Mapping[str, int] | None = None,
) -> TurnConstraint:
    """The turn's :class:`TurnConstraint` (see the module docstring).

    ``narrowed``: tool -> its input schema narrowed by provenance (None: a value it needs
    does not exist yet; absent: unchanged); ``schemas``: every tool's own input schema;
    ``succeeded``: the tools called successfully so far; ``calls``: how many times each
    (for ``max_calls``: a tool whose budget is spent leaves the choice, and one with a
    budget left stays a choice after it is done)."""
    pending = [s for s in workflow.required_steps if s not in succeeded]

    def named_prereqs_met(tool: str) -> bool:
        return all(
            p.match_arg is not None or p.tool in succeeded
            for p in workflow.prerequisites.get(tool, ())
        )

    def schema_of(tool: str) -> Mapping[str, Any] | None:
        return narrowed[tool] if tool in narrowed else schemas.get(tool)

    terminal_callable = not pending and any(
        schema_of(t) is not None and named_prereqs_met(t) for t in workflow.terminal_tools
    )
    # The next step or the end can be made now: a side tool only invention could fill
    # (a free string nothing narrows: the distractors of a flight booking) is a detour.
    step_ready = (
        bool(pending) and schema_of(pending[0]) is not None and named_prereqs_met(pending[0])
    )
    made = calls or {}
    legal: dict[str, Mapping[str, Any]] = {}
    callable_: dict[str, Mapping[str, Any]] = {}
    for tool in workflow.tools:
        schema = schema_of(tool)
        if schema is None:
            continue
        budget = workflow.max_calls.get(tool)
        if budget is not None and made.get(tool, 0) >= budget:
            continue  # its budget is spent
        callable_[tool] = schema
        again = budget is not None and tool in succeeded  # done, with calls left to make
        if tool in workflow.terminal_tools:
            if pending:
                continue
        elif tool in workflow.required_steps:
            if pending and tool != pending[0] and not again:
                continue  # in order: only the first step not done
            if not pending and terminal_callable and budget is None:
                continue  # done, and the end is open: the step leaves the choice
        elif (step_ready or terminal_callable) and not _grounded(schema, schemas.get(tool)):
            continue
        elif tool in succeeded and budget is None and (pending or terminal_callable):
            # Called once already: a small model loops on side tools while a step waits,
            # and repeats its last call once it could finish. (With no step left and no
            # end callable, it may be what makes the end's values: it comes back.)
            continue
        if not named_prereqs_met(tool):
            continue
        legal[tool] = schema
    if not legal:
        legal = callable_
    return TurnConstraint(
        tools=legal,
        left_out=tuple(t for t in workflow.tools if t not in legal),
        call_required=True,
        changed=frozenset(t for t, s in legal.items() if s is not schemas.get(t)),
    )


def _grounded(schema: Mapping[str, Any], own: Mapping[str, Any] | None) -> bool:
    """Whether every required argument of a tool's narrowed ``schema`` is narrowed (its
    values come from somewhere the run holds), not left to its ``own`` schema."""
    props, base = schema.get("properties"), (own or {}).get("properties")
    required = schema.get("required")
    if not isinstance(props, Mapping) or not isinstance(base, Mapping):
        return False
    if not isinstance(required, list):
        return True
    return all(props.get(arg) is not base.get(arg) for arg in required)


def clean_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A narrowed input schema as a backend reads it: an argument narrowed away (``false``)
    is removed from ``properties`` and ``required`` rather than sent as ``false``."""
    props = schema.get("properties")
    out = dict(schema)
    if isinstance(props, Mapping) and any(v is False for v in props.values()):
        out["properties"] = {k: v for k, v in props.items() if v is not False}
        required = schema.get("required")
        if isinstance(required, list):
            out["required"] = [k for k in required if props.get(k) is not False]
        out.setdefault("additionalProperties", False)
    return out
