"""What one eval scenario is: a workflow, deterministic tools, a prompt and a grader.

A scenario is data plus a few Python callables (docs/eval.md: "scenarios in Python for fast
iteration"). Tools are the project's canonical :class:`~toolforge.core.tool_specs.ToolSpec`, so
the same definitions run through the gateway's executor or the in-process runner alike.
``build_tools`` makes fresh tools (and fresh state) for every run: a run never sees what
an earlier run did.

``ideal_path`` is the shortest correct sequence of calls. It documents the scenario, gives
``ideal_iterations`` its meaning, and drives the scripted "perfect" model of the offline
tests: a catalog whose ideal path does not pass its own grader is a broken scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from toolforge.core.tool_specs import PermanentToolError, ToolSpec

__all__ = [
    "Call",
    "Grader",
    "Scenario",
    "StrictArgs",
    "ToolBuilder",
    "gated",
    "tool",
]

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class StrictArgs(BaseModel):
    """Arguments of an eval tool: unknown keys are an argument error the model must fix."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call of a run, as the grader sees it: the name, the arguments the model
    gave, and whether the tool succeeded."""

    name: str
    args: Mapping[str, Any]
    ok: bool = True


Grader = Callable[[Mapping[str, Any], Sequence[Call]], bool]
"""``grade(terminal_args, calls)``: whether a run that reached the terminal tool is correct."""

ToolBuilder = Callable[[], list[ToolSpec[Any]]]


def tool(
    name: str,
    description: str,
    args_model: type[ArgsT],
    fn: Callable[[ArgsT], object],
) -> ToolSpec[ArgsT]:
    """A deterministic eval tool over a plain function. No retries (a deterministic error
    is the model's to fix), idempotent, no approval."""

    async def run(args: ArgsT) -> object:
        return fn(args)

    return ToolSpec(
        name=name,
        description=description,
        args_model=args_model,
        fn=run,
        retries=0,
        retry_delay_s=0.0,
        idempotent=True,
    )


def gated(build: ToolBuilder, order: Sequence[str]) -> ToolBuilder:
    """The stateful variant of ``build``: each tool in ``order`` after the first refuses to
    run until the one before it has succeeded in this run, with an error that says so.

    This is what the stateful scenarios of docs/eval.md test: a model that guesses an id
    instead of looking it up gets an error, not an answer. State lives in the closure that
    each call of the returned builder makes afresh.
    """

    def build_gated() -> list[ToolSpec[Any]]:
        done: set[str] = set()
        specs = build()
        out: list[ToolSpec[Any]] = []
        for spec in specs:
            out.append(_gate(spec, order, done))
        return out

    return build_gated


def _gate(spec: ToolSpec[Any], order: Sequence[str], done: set[str]) -> ToolSpec[Any]:
    before = order[order.index(spec.name) - 1] if spec.name in order[1:] else None
    inner = spec.fn

    async def run(args: Any) -> object:
        if before is not None and before not in done:
            raise PermanentToolError(
                f"{spec.name} has no data yet: call {before} first, and use what it returns"
            )
        result = await inner(args)
        done.add(spec.name)
        return result

    return ToolSpec(
        name=spec.name,
        description=spec.description,
        args_model=spec.args_model,
        fn=run,
        retries=spec.retries,
        retry_delay_s=spec.retry_delay_s,
        idempotent=spec.idempotent,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One eval scenario (docs/eval.md: a workflow's data, the tools' fixtures, a validator)."""

    name: str
    tags: frozenset[str]
    description: str
    prompt: str
    build_tools: ToolBuilder = field(repr=False)
    required_steps: tuple[str, ...]
    terminal_tools: tuple[str, ...]
    ideal_path: tuple[tuple[str, Mapping[str, Any]], ...]
    grade: Grader = field(repr=False)
    prerequisites: Mapping[str, tuple[str | Mapping[str, str], ...]] = field(default_factory=dict)
    system: str | None = None
    budget_tokens: int | None = None
    max_iterations: int = 10
    keep_recent: int | None = None  # the workflow's (2 when None): iterations never compacted
    # tool -> argument -> where its value comes from (docs/workflows.md, provenance)
    provenance: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_calls: Mapping[str, int] = field(default_factory=dict)  # the workflow's per-tool budgets
    min_calls: Mapping[str, int] = field(default_factory=dict)  # calls that complete a step

    @property
    def ideal_iterations(self) -> int:
        """Model turns on the shortest correct path: one per call."""
        return len(self.ideal_path)

    def tool_names(self) -> list[str]:
        return [spec.name for spec in self.build_tools()]

    def workflow(self) -> dict[str, Any]:
        """The docs/eval.md workflow this scenario runs (ablations override the guardrails)."""
        body: dict[str, Any] = {
            "name": f"eval.{self.name}",
            "tools": self.tool_names(),
            "required_steps": list(self.required_steps),
            "terminal_tools": list(self.terminal_tools),
            "prerequisites": {k: list(v) for k, v in self.prerequisites.items()},
            "max_iterations": self.max_iterations,
        }
        if self.budget_tokens is not None:
            body["budget_tokens"] = self.budget_tokens
        if self.keep_recent is not None:
            body["keep_recent"] = self.keep_recent
        if self.max_calls:
            body["max_calls"] = dict(self.max_calls)
        if self.min_calls:
            body["min_calls"] = dict(self.min_calls)
        if self.provenance:
            body["provenance"] = {k: dict(v) for k, v in self.provenance.items()}
        return body

    def variant(self, **changes: Any) -> Scenario:
        """A copy with ``changes`` (a new name, tags, tools, budget...)."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        return Scenario(**fields)
