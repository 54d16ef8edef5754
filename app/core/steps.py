"""The workflow runner's rules (docs/workflows.md), outside the message history. No I/O.

The turn engine (:class:`~toolforge.core.engine.Conversation`) runs a workflow by asking
a :class:`WorkflowPolicy` at four points; the policy owns every counter, answers with a
decision value (:mod:`toolforge.core.decisions`) and never sees a socket, a clock or the
message list's wire format:

    when                         the engine asks            the policy answers
    ---------------------------  -------------------------  ----------------------------------
    before each model turn       begin_turn(messages)       Proceed: the messages (compacted
                                                            by the hook) and, for constrained
                                                            mode, the arguments narrowed
                                                            (:mod:`toolforge.core.grounding`);
                                                            Fail(MAX_ITERATIONS) past
                                                            max_iterations turns
    a turn with no tool call     no_call(text)              Rescue: a call found in the text;
                                                            Retry: a nudge;
                                                            Fail(RETRIES_EXHAUSTED)
    before running each call     check_call(name, args)     Run; Respond (the built-in answer
                                                            tool); Refuse with a step.nudge
                                                            (premature terminal, prerequisite,
                                                            unknown tool), fatal once a
                                                            budget is spent (*_EXHAUSTED)
    after each call              record(name, args, env.)   (steps done, results remembered)
    after the turn's calls       end_batch()                Complete: the terminal result;
                                                            Continue; Fail(TOOL_ERRORS_...)

Its state leaves as one value, :meth:`WorkflowPolicy.summary` (``done.workflow``, the run
record, the Python runner).

The pieces (docs/workflows.md), each usable alone: :class:`StepTracker` (required steps done),
:class:`StepEnforcer` (premature terminal calls, tiers 1-3, and prerequisites, by name or
argument-matched), :class:`ErrorTracker` (the retry and tool-error budgets, each reset on
progress). Every budget allows ``max`` in a row and fails on the next one: a terminal tool
called early is nudged at tiers 1, 2 and 3 and refused for good the fourth time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from toolforge.core.compiler import compile_turn
from toolforge.core.decisions import (
    CONTINUE,
    AfterBatch,
    AfterText,
    BeforeCall,
    BeforeTurn,
    Complete,
    Fail,
    Messages,
    Nudge,
    Proceed,
    Refuse,
    Rescue,
    Respond,
    Retry,
    Run,
    TurnHints,
    WorkflowSummary,
)
from toolforge.core.grounding import Grounding, values_under
from toolforge.core.redact import redact_text
from toolforge.core.rescue import canonical_tool_name, rescue_tool_calls
from toolforge.core.workflow import RESPOND, Prerequisite, WorkflowDef
from toolforge.errors import ErrorCode, WorkflowError, workflow_error

__all__ = [
    "Compactor",
    "ErrorTracker",
    "StepEnforcer",
    "StepTracker",
    "WorkflowNudges",
    "WorkflowPolicy",
]

_MAX_VALUES: Final = 64  # narrowed argument values per prerequisite (the grammar's enum)
_LAST_TEXT_CHARS: Final = 2000


@dataclass(frozen=True, slots=True)
class WorkflowNudges:
    """The corrections the model gets (``prompts/workflow_nudge_*.txt`` and the proxy's
    ``proxy_nudge_required``/``proxy_nudge_unknown``). Placeholders: ``{tool}`` the refused
    tool, ``{pending}`` the steps left, ``{next}`` the first of them, ``{missing}`` the
    prerequisite, ``{arg}``/``{values}`` an argument-matched one's, ``{name}``/``{tools}``
    an unknown tool and the known ones."""

    step: tuple[str, str, str] = (
        "{tool} ends the task, but these steps come first: {pending}. Call {next} now.",
        "Not yet: call {next} before {tool}. Steps still to do: {pending}.",
        "Last warning: {tool} is refused until {pending} is done. Call {next} now.",
    )
    prerequisite: str = "{tool} needs {missing} first. Call {missing} now."
    matched: str = (
        "'{arg}' of {tool} must be a value {missing} returned: {values}. Call {tool} again "
        "with one of them, or call {missing} first."
    )
    retry: str = "Answer by calling one of these functions: {tools}."
    spent: str = "{tool} has made all its {max} calls. Call one of: {tools}."
    unknown: str = "There is no function named '{name}'. Call one of: {tools}."


# -- the pieces, each usable alone ---------------------------------------------------------


@dataclass(slots=True)
class StepTracker:
    """Which required steps are done: control flow, not memory (docs/workflows.md)."""

    required_steps: Sequence[str]
    completed_steps: dict[str, None] = field(default_factory=dict)
    # step -> the successful calls that complete it (the workflow's ``min_calls``)
    min_calls: Mapping[str, int] = field(default_factory=dict)
    _made: dict[str, int] = field(default_factory=dict)

    def record(self, tool_name: str) -> None:
        made = self._made[tool_name] = self._made.get(tool_name, 0) + 1
        if made >= self.min_calls.get(tool_name, 1):
            self.completed_steps[tool_name] = None

    def is_satisfied(self) -> bool:
        return all(step in self.completed_steps for step in self.required_steps)

    def pending(self) -> list[str]:
        return [step for step in self.required_steps if step not in self.completed_steps]

    def summary_hint(self) -> str:
        """The hint a compacted history carries (``[Steps completed: a, b]``)."""
        if not self.completed_steps:
            return "[No steps completed yet]"
        return f"[Steps completed: {', '.join(self.completed_steps)}]"


class StepEnforcer:
    """Premature terminal calls (escalating tiers) and prerequisites, over a
    :class:`StepTracker`; it also remembers what each successful call produced, for
    argument-matched prerequisites."""

    def __init__(
        self,
        required_steps: Sequence[str],
        terminal_tools: Collection[str],
        prerequisites: Mapping[str, Sequence[Prerequisite]] | None = None,
        *,
        max_premature_attempts: int = 3,
        max_prereq_violations: int = 2,
        min_calls: Mapping[str, int] | None = None,
    ) -> None:
        self.tracker = StepTracker(list(required_steps), min_calls=dict(min_calls or {}))
        self.terminal_tools = frozenset(terminal_tools)
        self.prerequisites = dict(prerequisites or {})
        self.max_premature_attempts = max_premature_attempts
        self.max_prereq_violations = max_prereq_violations
        self.premature_attempts = 0
        self.prereq_violations = 0
        # Per tool: the arguments and the result data of each successful call.
        self._done: dict[str, list[tuple[object, object]]] = {}
        self._values: dict[Prerequisite, list[object]] = {}  # values(), until the next record

    @property
    def completed_steps(self) -> dict[str, None]:
        return self.tracker.completed_steps

    def pending(self) -> list[str]:
        return self.tracker.pending()

    def is_premature(self, name: str) -> bool:
        """A terminal tool while required steps are pending."""
        return name in self.terminal_tools and not self.tracker.is_satisfied()

    def premature(self) -> int:
        """Count a premature terminal call; its tier (1-3), or 0 once exhausted."""
        self.premature_attempts += 1
        if self.premature_attempts > self.max_premature_attempts:
            return 0
        return min(self.premature_attempts, 3)

    def unmet(self, name: str, args: object) -> Prerequisite | None:
        """The first prerequisite of calling ``name`` with ``args`` that is not met."""
        for prereq in self.prerequisites.get(name, ()):
            if prereq.tool not in self._done:
                return prereq
            if prereq.match_arg is not None:
                value = args.get(prereq.match_arg) if isinstance(args, Mapping) else None
                if value not in self.values(prereq):
                    return prereq
        return None

    def violation(self) -> bool:
        """Count a prerequisite violation; False once exhausted."""
        self.prereq_violations += 1
        return self.prereq_violations <= self.max_prereq_violations

    def record(self, name: str, args: object, data: object) -> None:
        """A successful call: a step done, its arguments and result remembered."""
        self.tracker.record(name)
        self._done.setdefault(name, []).append((args, data))
        self._values.clear()

    def call_counts(self) -> dict[str, int]:
        """Each tool's successful calls so far."""
        return {tool: len(done) for tool, done in self._done.items()}

    def calls(self, tool: str) -> list[tuple[object, object]]:
        """The successful calls of ``tool`` so far: (arguments, result data)."""
        return list(self._done.get(tool, ()))

    def progress(self) -> None:
        """A batch of calls succeeded: the escalation starts over."""
        self.premature_attempts = 0
        self.prereq_violations = 0

    def values(self, prereq: Prerequisite) -> list[object]:
        """The values an argument-matched prerequisite allows, in order, distinct."""
        cached = self._values.get(prereq)
        if cached is not None:
            return cached
        out: list[object] = []
        for args, data in self._done.get(prereq.tool, ()):
            if prereq.result_key is not None:
                found: Iterator[object] = values_under(data, prereq.result_key)
            elif isinstance(args, Mapping) and prereq.match_arg in args:
                found = iter((args[prereq.match_arg],))
            else:
                continue
            for value in found:
                if value not in out and len(out) < _MAX_VALUES:
                    out.append(value)
        self._values[prereq] = out
        return out

    def summary_hint(self) -> str:
        return self.tracker.summary_hint()


@dataclass(slots=True)
class ErrorTracker:
    """Consecutive retries (no usable call) and tool errors, against their budgets."""

    max_retries: int = 3
    max_tool_errors: int = 2
    retries: int = 0
    tool_errors: int = 0

    def record_retry(self) -> None:
        self.retries += 1

    def reset_retries(self) -> None:
        self.retries = 0

    def record_result(self, success: bool) -> None:
        self.tool_errors = 0 if success else self.tool_errors + 1

    @property
    def retries_exhausted(self) -> bool:
        return self.retries > self.max_retries

    @property
    def tool_errors_exhausted(self) -> bool:
        return self.tool_errors > self.max_tool_errors


# -- the policy the engine consults -----------------------------------------------------------

Compactor = Callable[[list[Mapping[str, Any]], str], Any]
"""Where context compaction plugs in (``toolforge.core.compaction``): given the messages
about to be sent and the step hint, it returns them (compacted or not)."""


class WorkflowPolicy:
    """One run of a workflow (a :class:`~toolforge.core.decisions.TurnPolicy`): see the
    module docstring. Nothing outside reads its state but through :meth:`summary`.

    ``schemas``: the input schemas of the tools the model may call by name (the
    workflow's, ``respond`` included), for narrowing; ``compactor``: the hook for context
    compaction, called with the messages before each turn (None: none).
    """

    def __init__(
        self,
        workflow: WorkflowDef,
        *,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
        nudges: WorkflowNudges | None = None,
        compactor: Compactor | None = None,
    ) -> None:
        self._workflow = workflow
        self._nudges = nudges or WorkflowNudges()
        self._compactor = compactor
        self._steps = StepEnforcer(
            workflow.required_steps,
            workflow.terminal_tools,
            workflow.prerequisites,
            min_calls=workflow.min_calls,
        )
        self._errors = ErrorTracker(workflow.max_retries_per_step, workflow.max_tool_errors)
        self._schemas: Mapping[str, Mapping[str, Any]] = schemas or {}
        self._grounding = Grounding(workflow, self._schemas)
        self._iterations = 0
        self._nudge_count = 0
        self._rescued = 0
        self._last_text = ""
        self._result: tuple[str, object] | None = None  # the terminal call that ended the run
        self._failure: WorkflowError | None = None  # the error that ended the run, if one did
        self._history: tuple[Mapping[str, Any], ...] = ()  # the messages of the last turn sent
        self._batch: list[bool] = []  # this turn's calls: ran successfully or not
        self._terminal: tuple[str, object] | None = None

    # -- before a turn ------------------------------------------------------------------------

    def begin_turn(self, messages: Messages) -> BeforeTurn:
        """One more model turn with ``messages`` (compacted by the hook, if one is plugged
        in) and this turn's hints, or MAX_ITERATIONS."""
        if self._iterations >= self._workflow.max_iterations:
            return Fail(
                self._fail(
                    ErrorCode.MAX_ITERATIONS,
                    f"the workflow made {self._iterations} model turns (max_iterations) "
                    f"without a successful terminal tool ({self._terminals()})",
                )
            )
        self._iterations += 1
        self._batch = []
        self._history = tuple(messages)
        self._grounding.hear(messages)
        if self._compactor is not None:
            messages = self._compactor(_as_list(messages), self._steps.summary_hint())
        return Proceed(messages, self.hints())

    def hints(self) -> TurnHints:
        """This turn's constraint (:func:`toolforge.core.compiler.compile_turn`): only the
        tools legal now, their arguments narrowed to what the run holds (``narrow``);
        never a RESULT frame, never text before the call."""
        workflow = self._workflow
        narrowed = self._grounding.narrowed(self._steps.values) if workflow.narrow else {}
        constraint = compile_turn(
            workflow,
            narrowed,
            self._schemas,
            succeeded=self._steps.completed_steps,
            calls=self._steps.call_counts(),
        )
        return constraint.hints()

    def step_hint(self) -> str:
        """The hint a compacted history carries (``[Steps completed: a, b]``)."""
        return self._steps.summary_hint()

    # -- a turn without a call -----------------------------------------------------------------

    def no_call(self, text: str) -> AfterText:
        """Calls rescued from ``text`` (``rescue``), else a retry nudge; RETRIES_EXHAUSTED
        after ``max_retries_per_step`` in a row."""
        self._last_text = text
        if self._workflow.rescue and text:
            found = rescue_tool_calls(text, self._workflow.tools)
            if found:
                self._rescued += 1
                return Rescue(tuple(found[:1]))  # one call per turn, as the model was taught
        retried = self._retry()
        if isinstance(retried, WorkflowError):
            return Fail(retried)
        return Retry(Nudge("retry", retried, self._nudges.retry.format(tools=self._listed())))

    def _retry(self) -> int | WorkflowError:
        """One more turn without a usable call: the nudge's tier, or RETRIES_EXHAUSTED."""
        self._errors.record_retry()
        if self._errors.retries_exhausted:
            return self._fail(
                ErrorCode.RETRIES_EXHAUSTED,
                f"the model made no usable tool call {self._errors.retries} turns in a row "
                f"(max_retries_per_step {self._workflow.max_retries_per_step})",
            )
        self._nudge_count += 1
        return min(self._errors.retries, 3)

    # -- each call ------------------------------------------------------------------------------

    def check_call(self, name: str, args: object, *, parsed: bool = True) -> BeforeCall:
        """Run the call under the workflow's name for it (case, ``_`` for ``.``), answer
        it in place (``respond``), or refuse it with a nudge (and maybe end the workflow).
        A call whose arguments did not parse is only named: the engine refuses it."""
        tools = self._workflow.tools
        if name not in tools:
            name = canonical_tool_name(name, tools) or name
        if not parsed:
            return Run(name)
        if name not in tools:
            message = self._nudges.unknown.format(name=name, tools=self._listed())
            retried = self._retry()
            if isinstance(retried, WorkflowError):  # the nudge goes out, then the failure
                nudge = Nudge("unknown_tool", 3, message)
                return Refuse(name, ErrorCode.TOOL_NOT_FOUND, nudge, retried)
            nudge = Nudge("unknown_tool", retried, message)
            return Refuse(name, ErrorCode.TOOL_NOT_FOUND, nudge)
        self._errors.reset_retries()  # a known tool: the model is calling again
        steps = self._steps
        budget = self._workflow.max_calls.get(name)
        if budget is not None and len(steps.calls(name)) >= budget:
            others = [t for t in self._workflow.tools if t != name]
            message = self._nudges.spent.format(tool=name, max=budget, tools=", ".join(others))
            retried = self._retry()
            fatal = retried if isinstance(retried, WorkflowError) else None
            tier = 3 if fatal is not None else int(retried)  # type: ignore[arg-type]
            return Refuse(name, ErrorCode.TOOL_CALL_LIMIT, Nudge("budget", tier, message), fatal)
        if steps.is_premature(name):
            tier = steps.premature()
            pending = steps.pending()
            fatal = None
            if tier == 0:
                tier = 3
                fatal = self._fail(
                    ErrorCode.STEP_ENFORCEMENT_EXHAUSTED,
                    f"the model called terminal tool {name} before the required steps "
                    f"{steps.premature_attempts} times; pending: {', '.join(pending)}",
                )
            message = self._nudges.step[tier - 1].format(
                tool=name, pending=", ".join(pending), next=pending[0]
            )
            self._nudge_count += 1
            return Refuse(name, ErrorCode.STEP_REQUIRED, Nudge("step", tier, message), fatal)
        unmet = steps.unmet(name, args)
        if unmet is not None:
            ok = steps.violation()
            if unmet.match_arg is not None and unmet.tool in steps.completed_steps:
                shown = ", ".join(str(v) for v in steps.values(unmet)[:16]) or "(none)"
                message = self._nudges.matched.format(
                    tool=name, missing=unmet.tool, arg=unmet.match_arg, values=shown
                )
            else:
                message = self._nudges.prerequisite.format(tool=name, missing=unmet.tool)
            fatal = None
            if not ok:
                fatal = self._fail(
                    ErrorCode.PREREQUISITE_EXHAUSTED,
                    f"the model called {name} without its prerequisite {unmet.tool} "
                    f"{steps.prereq_violations} times in a row",
                )
            self._nudge_count += 1
            tier = min(steps.prereq_violations, 3)
            nudge = Nudge("prerequisite", tier, message)
            return Refuse(name, ErrorCode.PREREQUISITE_MISSING, nudge, fatal)
        if name == RESPOND:  # the built-in answer tool: nothing to run
            return Respond(name, _respond_data(args))
        return Run(name)

    def record(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        """A call ran (or the engine refused it: bad JSON, over the call limit)."""
        ok = bool(envelope.get("ok"))
        self._batch.append(ok)
        if not ok:
            self._grounding.failed(name, args, envelope, self._steps.calls)
            return
        data = envelope.get("data")
        self._steps.record(name, args, data)
        self._grounding.succeeded(name, args, data)
        if name in self._workflow.terminal_tools and self._terminal is None:
            self._terminal = (name, data)

    def end_batch(self) -> AfterBatch:
        """After the turn's calls: the terminal tool and its result if one succeeded;
        TOOL_ERRORS_EXHAUSTED after ``max_tool_errors`` failing turns in a row."""
        if self._terminal is not None:
            self._result = self._terminal
            return Complete(*self._terminal)
        if not self._batch:  # every call was refused: the refusals have their own budgets
            return CONTINUE
        success = all(self._batch)
        self._errors.record_result(success)
        if success:
            self._steps.progress()
        elif self._errors.tool_errors_exhausted:
            return Fail(
                self._fail(
                    ErrorCode.TOOL_ERRORS_EXHAUSTED,
                    f"tool calls failed {self._errors.tool_errors} turns in a row "
                    f"(max_tool_errors {self._workflow.max_tool_errors})",
                )
            )
        return CONTINUE

    # -- reporting ---------------------------------------------------------------------------

    def summary(self) -> WorkflowSummary:
        """What the run knows now, as one value (``to_dict()`` is ``done.workflow``)."""
        result_tool, result = self._result if self._result is not None else (None, None)
        return WorkflowSummary(
            name=self._workflow.name,
            completed_steps=tuple(self._steps.completed_steps),
            pending_steps=tuple(self._steps.pending()),
            iterations=self._iterations,
            nudges=self._nudge_count,
            rescued=self._rescued,
            finished=self._result is not None,
            result_tool=result_tool,
            result=result,
            failure=self._failure,
            messages=self._history,
        )

    def _fail(self, code: ErrorCode, message: str) -> WorkflowError:
        """A failure with its context (docs/workflows.md: fail loud, with context)."""
        context: dict[str, object] = {
            "workflow": self._workflow.name,
            "completed_steps": list(self._steps.completed_steps),
            "pending_steps": self._steps.pending(),
            "iterations": self._iterations,
            "last_text": redact_text(self._last_text[-_LAST_TEXT_CHARS:]),
        }
        name = self._workflow.name
        error = workflow_error(code, f"workflow {name!r}: {message}", context=context)
        self._failure = error
        return error

    def _terminals(self) -> str:
        return ", ".join(sorted(self._workflow.terminal_tools))

    def _listed(self) -> str:
        return ", ".join(self._workflow.tools)


def _respond_data(args: object) -> dict[str, object]:
    """The built-in ``respond`` tool's result: the answer it carries."""
    content = args.get("content") if isinstance(args, Mapping) else None
    return {"content": content if isinstance(content, str) else ""}


def _as_list(messages: Messages) -> list[Mapping[str, Any]]:
    return messages if isinstance(messages, list) else list(messages)
