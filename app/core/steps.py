"""The workflow runner's rules (SPEC §7, seed 001), outside the message history. No I/O.

The turn engine (:class:`~toolforge.core.engine.Conversation`) runs a workflow by asking
a :class:`WorkflowPolicy` at four points; the policy owns every counter and never sees a
socket, a clock or the message list's wire format:

    when                              the engine asks                  the policy answers
    --------------------------------  -------------------------------  -----------------------
    before each model turn            begin_turn()                     MAX_ITERATIONS past
                                                                       max_iterations turns
    building the turn's request       hints()                          constrained mode: the
                                                                       arguments narrowed to
                                                                       earlier results
    a turn with no tool call          no_call(text)                    calls rescued from the
                                                                       text, or a retry nudge;
                                                                       RETRIES_EXHAUSTED
    before running each call          check_call(name, args)           run it, or refuse it
                                                                       with a step.nudge
                                                                       (premature terminal,
                                                                       prerequisite, unknown
                                                                       tool); *_EXHAUSTED
    after each call                   record(name, args, envelope)     steps and tool errors
    after the turn's calls            end_batch()                      the terminal result, or
                                                                       TOOL_ERRORS_EXHAUSTED

The pieces are seed 001's, each usable alone: :class:`StepTracker` (required steps done),
:class:`StepEnforcer` (premature terminal calls, tiers 1-3, and prerequisites, by name or
argument-matched), :class:`ErrorTracker` (the retry and tool-error budgets, each reset on
progress). Every budget allows ``max`` in a row and fails on the next one: a terminal tool
called early is nudged at tiers 1, 2 and 3 and refused for good the fourth time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jsonschema import Draft202012Validator

from toolforge.core.messages import content_text, first_user_index
from toolforge.core.redact import redact_text
from toolforge.core.rescue import RescuedCall, canonical_tool_name, rescue_tool_calls
from toolforge.core.workflow import RESPOND, Prerequisite, WorkflowDef
from toolforge.errors import ErrorCode, WorkflowError, workflow_error

__all__ = [
    "ErrorTracker",
    "Nudge",
    "Refusal",
    "StepEnforcer",
    "StepTracker",
    "TurnHints",
    "UserValues",
    "WorkflowNudges",
    "WorkflowPolicy",
]

_MAX_VALUES: Final = 64  # narrowed argument values per prerequisite (the grammar's enum)
# A grounded argument (WorkflowDef.grounded): 1 to _GROUNDED_WORDS words, each one of the
# user's first message (at most _USER_WORDS distinct ones, each at most 32 characters).
_GROUNDED_WORDS: Final = 6
_USER_WORDS: Final = 64
_WORD: Final = re.compile(r"[A-Za-z0-9]{1,32}")
# English function words: a grounded string made of them says nothing ("at if", "for a"),
# and a 135M model picks them (they are the likeliest tokens), so they are not offered.
_FUNCTION_WORDS: Final = frozenset(
    "a about after all also am an and any are as at be been before but by can could did do "
    "does for from had has have he her him his how i if in into is it its me my no nor not "
    "of on or our ours she so some than that the their them then there these they this "
    "those to too us very was we were what when where which while who whom why will with "
    "would you your".split()
)
# Times of day in the user's words: "7pm", "7:30 p.m.", "19:00", "noon", "midnight".
_TIME: Final = re.compile(
    r"\b(?:(?P<hour>\d{1,2})(?::(?P<minute>[0-5]\d))?\s?(?P<half>[ap])\.?m\b\.?"
    r"|(?P<h24>[01]?\d|2[0-3]):(?P<m24>[0-5]\d)\b"
    r"|(?P<word>noon|midnight)\b)",
    re.IGNORECASE,
)
_NAMED_TIMES: Final = {"noon": "12:00", "midnight": "00:00"}
_NUMBER_WORDS: Final = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}
_NUMBER: Final = re.compile(r"\b(?:\d{1,6}|" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)
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
    unknown: str = "There is no function named '{name}'. Call one of: {tools}."


@dataclass(frozen=True, slots=True)
class Nudge:
    """A correction for the model: the ``step.nudge`` frame's ``kind``, ``tier``, ``message``."""

    kind: str  # "step", "prerequisite", "retry", "unknown_tool"
    tier: int
    message: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call not run: its ``tool.result`` error ``code``, the nudge that answers it, and,
    when a budget ran out, the error that ends the workflow once the refusal is out."""

    code: ErrorCode
    nudge: Nudge
    fatal: WorkflowError | None = None


@dataclass(frozen=True, slots=True)
class TurnHints:
    """What a workflow asks of the next turn's request (constrained mode's grammar):
    ``narrowed``: tool -> its input schema with argument-matched arguments reduced to the
    values earlier results hold (None: no such value yet, the tool is left out);
    ``allow_result``: whether the turn may end with a RESULT frame instead of a call;
    ``free_text``: whether text may come before the call."""

    narrowed: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    allow_result: bool = True
    free_text: bool = True


# -- seed 001's pieces ------------------------------------------------------------------------


@dataclass(slots=True)
class StepTracker:
    """Which required steps are done: control flow, not memory (seed 001, P0-1)."""

    required_steps: Sequence[str]
    completed_steps: dict[str, None] = field(default_factory=dict)

    def record(self, tool_name: str) -> None:
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
    ) -> None:
        self.tracker = StepTracker(list(required_steps))
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
                found: Iterator[object] = _values_under(data, prereq.result_key)
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


# Failures that are about the arguments' shape or the request, not the matched value.
_NOT_THE_VALUE: Final = frozenset(
    {
        ErrorCode.TOOL_ARGS_INVALID,
        ErrorCode.INVALID_JSON,
        ErrorCode.ARGUMENTS_TOO_LARGE,
        ErrorCode.TOOL_CALL_LIMIT,
        ErrorCode.TOOL_NOT_FOUND,
        ErrorCode.TOOL_NOT_ALLOWED,
        ErrorCode.STEP_REQUIRED,
        ErrorCode.PREREQUISITE_MISSING,
        ErrorCode.TOOL_APPROVAL_DENIED,
        ErrorCode.TOOL_APPROVAL_TIMEOUT,
    }
)


def _key(value: object) -> str:
    """A JSON value as a hashable key (an id is a string; anything else its repr)."""
    return value if isinstance(value, str) else repr(value)


@dataclass(frozen=True, slots=True)
class UserValues:
    """What the user's first message says, for grounded arguments: its words (as written
    and in lower case, distinct, at most 64), the times of day it names as 24-hour
    ``"HH:MM"`` ("7pm", "7:30 p.m.", "19:00", "noon"), and the whole numbers it states
    ("2", "two"; not the parts of a time)."""

    words: tuple[str, ...] = ()
    times: tuple[str, ...] = ()
    numbers: tuple[int, ...] = ()


def user_values(messages: Sequence[Mapping[str, Any]]) -> UserValues:
    """The :class:`UserValues` of the first user message."""
    first = first_user_index(messages)
    text = content_text(messages[first].get("content"), " ") if first >= 0 else ""
    words: dict[str, None] = {}
    for word in _WORD.findall(text):
        for form in (word, word.lower()):
            if len(words) < _USER_WORDS:
                words[form] = None
    times: dict[str, None] = {}
    for m in _TIME.finditer(text):
        if m["word"]:
            times[_NAMED_TIMES[m["word"].lower()]] = None
            continue
        hour, minute = int(m["hour"] or m["h24"]), int(m["minute"] or m["m24"] or 0)
        if m["half"]:
            if not 1 <= hour <= 12:
                continue
            hour = hour % 12 + (12 if m["half"].lower() == "p" else 0)
        times[f"{hour:02d}:{minute:02d}"] = None
    rest = _TIME.sub(" ", text)
    numbers: dict[int, None] = {}
    for m in _NUMBER.finditer(rest):
        numbers[int(m[0]) if m[0].isdigit() else _NUMBER_WORDS[m[0].lower()]] = None
    return UserValues(tuple(words), tuple(times)[:_USER_WORDS], tuple(numbers)[:_USER_WORDS])


def user_words(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The words of the first user message (:class:`UserValues`)."""
    return list(user_values(messages).words)


def words_pattern(words: Sequence[str]) -> str | None:
    """A JSON Schema ``pattern`` for 1 to 6 of ``words`` separated by spaces, or None
    when there are none. Words are letters and digits only: nothing needs escaping."""
    if not words:
        return None
    alternatives = "|".join(words)
    return f"^({alternatives})( ({alternatives})){{0,{_GROUNDED_WORDS - 1}}}$"


def _grounded(
    schema: Mapping[str, Any], args: Sequence[str], pattern: str | None, said: UserValues
) -> Mapping[str, Any]:
    """``schema`` with each argument of ``args`` held to what the user said: a plain
    string to ``pattern`` (the user's words); a string with a ``pattern`` of its own to the
    user's times and words that match it; a whole number to the user's numbers within its
    bounds. An argument the user said nothing usable for is left as it is."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return schema
    changed = dict(props)
    for arg in args:
        prop = props.get(arg)
        if not isinstance(prop, Mapping):
            continue
        kind = prop.get("type", "string")
        if kind == "string" and "pattern" not in prop:
            if pattern is not None:
                changed[arg] = {**prop, "type": "string", "pattern": pattern}
            continue
        values: list[object]
        if kind == "string":
            own = _compiled(prop["pattern"])
            candidates = (*said.times, *said.words)
            values = [v for v in candidates if own is not None and own.search(v)]
        elif kind in ("integer", "number"):
            fits = Draft202012Validator(prop).is_valid  # its bounds, multipleOf, type
            values = [n for n in said.numbers if fits(n)]
        else:
            continue
        if values:
            changed[arg] = {**prop, "enum": values}
    return {**schema, "properties": changed}


def _compiled(pattern: object) -> re.Pattern[str] | None:
    """A schema's ``pattern`` as a Python regex (JSON Schema's ECMA dialect shares the
    subset schemas use), or None when Python cannot read it."""
    if not isinstance(pattern, str):
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _values_under(data: object, key: str, depth: int = 0) -> Iterator[object]:
    """Scalar values stored under ``key`` anywhere in ``data`` (JSON-like)."""
    if depth > 16:
        return
    if isinstance(data, Mapping):
        for k, v in data.items():
            if k == key and isinstance(v, str | int) and not isinstance(v, bool):
                yield v
            elif isinstance(v, Mapping | list):
                yield from _values_under(v, key, depth + 1)
    elif isinstance(data, list):
        for item in data:
            yield from _values_under(item, key, depth + 1)


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
    """One run of a workflow: see the module docstring.

    ``tools``: the tools the model may call by name (the workflow's, ``respond``
    included); ``schemas``: their input schemas (for narrowing); ``compactor``: the hook
    for context compaction, called with the messages before each turn (None: none).
    """

    def __init__(
        self,
        workflow: WorkflowDef,
        *,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
        nudges: WorkflowNudges | None = None,
        compactor: Compactor | None = None,
    ) -> None:
        self.workflow = workflow
        self.nudges = nudges or WorkflowNudges()
        self.compactor = compactor
        self._schemas = schemas or {}
        self.steps = StepEnforcer(
            workflow.required_steps, workflow.terminal_tools, workflow.prerequisites
        )
        self.errors = ErrorTracker(workflow.max_retries_per_step, workflow.max_tool_errors)
        self.iterations = 0
        self.nudge_count = 0
        self.rescued = 0
        self.last_text = ""
        self.result: object = None
        self.result_tool: str | None = None  # the terminal tool that ended the run
        self.finished = False
        self.failure: WorkflowError | None = None  # the error that ended the run, if one did
        self.history: list[Mapping[str, Any]] = []  # the messages of the last turn sent
        self._batch: list[bool] = []  # this turn's calls: ran successfully or not
        self._terminal: tuple[str, object] | None = None
        # The grounded arguments' words, from the first user message (prepare()), less the
        # words of grounded calls whose results gave the workflow nothing (record()).
        self._said: UserValues | None = None
        self._spent_words: set[str] = set()
        # (tool, argument) -> argument-matched values whose call failed for good.
        self._failed_values: dict[tuple[str, str], set[str]] = {}

    # -- before a turn ------------------------------------------------------------------------

    def begin_turn(self) -> None:
        """One more model turn, or MAX_ITERATIONS."""
        if self.iterations >= self.workflow.max_iterations:
            raise self.fail(
                ErrorCode.MAX_ITERATIONS,
                f"the workflow made {self.iterations} model turns (max_iterations) without "
                f"a successful terminal tool ({self._terminals()})",
            )
        self.iterations += 1
        self._batch = []

    def prepare(self, messages: list[Mapping[str, Any]]) -> Any:
        """The messages to send this turn: compacted by the hook, if one is plugged in."""
        self.history = messages
        if self._said is None and self.workflow.grounded:
            self._said = user_values(messages)
        if self.compactor is None:
            return messages
        return self.compactor(messages, self.steps.summary_hint())

    def hints(self) -> TurnHints:
        """Argument-matched prerequisites as grammar constraints (``narrow``)."""
        narrowed: dict[str, Mapping[str, Any] | None] = {}
        if self.workflow.narrow:
            for tool, prereqs in self.workflow.prerequisites.items():
                schema = self._schemas.get(tool)
                for prereq in prereqs:
                    if prereq.match_arg is None or schema is None:
                        continue
                    props = schema.get("properties")
                    if not isinstance(props, Mapping) or prereq.match_arg not in props:
                        continue
                    values = self.steps.values(prereq)
                    failed = self._failed_values.get((tool, prereq.match_arg))
                    if failed:
                        values = [v for v in values if _key(v) not in failed]
                    if not values:
                        narrowed[tool] = None
                        break
                    # Only the argument changes: the rest of the schema is shared, not copied.
                    changed = dict(schema)
                    changed["properties"] = {**props, prereq.match_arg: {"enum": values}}
                    narrowed[tool] = changed
                    schema = changed
            said = self._said or UserValues()
            unsaid = self._spent_words | _FUNCTION_WORDS
            pattern = words_pattern([w for w in said.words if w.lower() not in unsaid])
            for tool, args in self.workflow.grounded.items():
                base = narrowed.get(tool, self._schemas.get(tool))
                if base is not None:
                    narrowed[tool] = _grounded(base, args, pattern, said)
            if self.steps.tracker.is_satisfied() and any(
                narrowed.get(t, True) is not None for t in self.workflow.terminal_tools
            ):
                # Every required step is done and a terminal tool can be called: the steps
                # already done are not offered again (a small model repeats its last call).
                for tool in self.steps.completed_steps:
                    if tool not in self.workflow.terminal_tools:
                        narrowed[tool] = None
        return TurnHints(narrowed=narrowed, allow_result=False, free_text=False)

    # -- a turn without a call -----------------------------------------------------------------

    def no_call(self, text: str) -> list[RescuedCall] | Nudge:
        """Calls rescued from ``text`` (``rescue``), else a retry nudge; RETRIES_EXHAUSTED
        after ``max_retries_per_step`` in a row."""
        self.last_text = text
        if self.workflow.rescue and text:
            found = rescue_tool_calls(text, self.workflow.tools)
            if found:
                self.rescued += 1
                return found[:1]  # one call per turn, as the model was taught
        return self._retry("retry", self.nudges.retry.format(tools=self._listed()))

    def _retry(self, kind: str, message: str) -> Nudge:
        self.errors.record_retry()
        if self.errors.retries_exhausted:
            raise self.fail(
                ErrorCode.RETRIES_EXHAUSTED,
                f"the model made no usable tool call {self.errors.retries} turns in a row "
                f"(max_retries_per_step {self.workflow.max_retries_per_step})",
            )
        self.nudge_count += 1
        return Nudge(kind, min(self.errors.retries, 3), message)

    # -- each call ------------------------------------------------------------------------------

    def canonical(self, name: str) -> str | None:
        """The workflow's tool that ``name`` means (case, ``_`` for ``.``), or None."""
        if name in self.workflow.tools:
            return name
        return canonical_tool_name(name, self.workflow.tools)

    def check_call(self, name: str, args: object) -> Refusal | None:
        """Run the call (None), or refuse it with a nudge (and maybe end the workflow)."""
        if name not in self.workflow.tools:
            nudge = self._retry_or_fatal(
                "unknown_tool", self.nudges.unknown.format(name=name, tools=self._listed())
            )
            return Refusal(ErrorCode.TOOL_NOT_FOUND, *nudge)
        self.errors.reset_retries()  # a known tool: the model is calling again
        steps = self.steps
        if steps.is_premature(name):
            tier = steps.premature()
            pending = steps.pending()
            fatal = None
            if tier == 0:
                tier = 3
                fatal = self.fail(
                    ErrorCode.STEP_ENFORCEMENT_EXHAUSTED,
                    f"the model called terminal tool {name} before the required steps "
                    f"{steps.premature_attempts} times; pending: {', '.join(pending)}",
                )
            message = self.nudges.step[tier - 1].format(
                tool=name, pending=", ".join(pending), next=pending[0]
            )
            self.nudge_count += 1
            return Refusal(ErrorCode.STEP_REQUIRED, Nudge("step", tier, message), fatal)
        unmet = steps.unmet(name, args)
        if unmet is not None:
            ok = steps.violation()
            if unmet.match_arg is not None and unmet.tool in steps.completed_steps:
                shown = ", ".join(str(v) for v in steps.values(unmet)[:16]) or "(none)"
                message = self.nudges.matched.format(
                    tool=name, missing=unmet.tool, arg=unmet.match_arg, values=shown
                )
            else:
                message = self.nudges.prerequisite.format(tool=name, missing=unmet.tool)
            fatal = None
            if not ok:
                fatal = self.fail(
                    ErrorCode.PREREQUISITE_EXHAUSTED,
                    f"the model called {name} without its prerequisite {unmet.tool} "
                    f"{steps.prereq_violations} times in a row",
                )
            self.nudge_count += 1
            tier = min(steps.prereq_violations, 3)
            return Refusal(
                ErrorCode.PREREQUISITE_MISSING, Nudge("prerequisite", tier, message), fatal
            )
        return None

    def _retry_or_fatal(self, kind: str, message: str) -> tuple[Nudge, WorkflowError | None]:
        try:
            return self._retry(kind, message), None
        except WorkflowError as exc:
            return Nudge(kind, 3, message), exc

    def record(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        """A call ran (or the engine refused it: bad JSON, over the call limit)."""
        ok = bool(envelope.get("ok"))
        self._batch.append(ok)
        if not ok:
            self._note_failed_values(name, args, envelope)
            return
        data = envelope.get("data")
        self.steps.record(name, args, data)
        grounded = self.workflow.grounded.get(name)
        if grounded and isinstance(args, Mapping) and self._fruitless(name, data):
            # Its words led nowhere: the next turns choose among the others (a small model
            # otherwise repeats the same query until max_iterations).
            self._spend(args, grounded)
        if name in self.workflow.terminal_tools and self._terminal is None:
            self._terminal = (name, data)

    def _note_failed_values(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        """A call that failed for good on an argument-matched value (the booking of a
        place that is closed or full): that value is not offered again, so the next try
        names another. Argument errors and retryable failures say nothing of the value."""
        errors = envelope.get("errors")
        first = errors[0] if isinstance(errors, list | tuple) and errors else None
        if not isinstance(first, Mapping) or not isinstance(args, Mapping):
            return
        if first.get("retryable") or first.get("code") in _NOT_THE_VALUE:
            return
        for prereq in self.workflow.prerequisites.get(name, ()):
            if prereq.match_arg is not None and prereq.match_arg in args:
                failed = self._failed_values.setdefault((name, prereq.match_arg), set())
                failed.add(_key(args[prereq.match_arg]))
                self._spend_exhausted(prereq, failed)

    def _spend_exhausted(self, prereq: Prerequisite, failed: set[str]) -> None:
        """A grounded call whose every matched value has now failed led nowhere either:
        its words are spent too, so the next search is not the same one again."""
        grounded = self.workflow.grounded.get(prereq.tool)
        if not grounded or prereq.result_key is None:
            return
        for args, data in self.steps.calls(prereq.tool):
            values = [_key(v) for v in _values_under(data, prereq.result_key)]
            if values and all(v in failed for v in values) and isinstance(args, Mapping):
                self._spend(args, grounded)

    def _spend(self, args: Mapping[str, object], grounded: Sequence[str]) -> None:
        """The words of a grounded call's arguments are not offered again."""
        for arg in grounded:
            value = args.get(arg)
            if isinstance(value, str):
                self._spent_words.update(w.lower() for w in _WORD.findall(value))

    def _fruitless(self, name: str, data: object) -> bool:
        """Whether a result of ``name`` gives no value to any argument-matched
        prerequisite that takes its values from ``name``'s results (a search that found
        nothing to book). False when no such prerequisite exists: nothing says so."""
        keys = [
            p.result_key
            for prereqs in self.workflow.prerequisites.values()
            for p in prereqs
            if p.tool == name and p.match_arg is not None and p.result_key is not None
        ]
        return bool(keys) and not any(
            next(_values_under(data, key), None) is not None for key in keys
        )

    def end_batch(self) -> tuple[str, object] | None:
        """After the turn's calls: the terminal tool and its result if one succeeded;
        TOOL_ERRORS_EXHAUSTED after ``max_tool_errors`` failing turns in a row."""
        if self._terminal is not None:
            self.finished = True
            self.result_tool, self.result = self._terminal
            return self._terminal
        if not self._batch:  # every call was refused: the refusals have their own budgets
            return None
        success = all(self._batch)
        self.errors.record_result(success)
        if success:
            self.steps.progress()
        elif self.errors.tool_errors_exhausted:
            raise self.fail(
                ErrorCode.TOOL_ERRORS_EXHAUSTED,
                f"tool calls failed {self.errors.tool_errors} turns in a row "
                f"(max_tool_errors {self.workflow.max_tool_errors})",
            )
        return None

    # -- reporting ---------------------------------------------------------------------------

    def summary(self) -> dict[str, object]:
        """``done.workflow``: the steps completed and pending, iterations, nudges."""
        return {
            "name": self.workflow.name,
            "completed_steps": list(self.steps.completed_steps),
            "pending_steps": self.steps.pending(),
            "iterations": self.iterations,
            "nudges": self.nudge_count,
            "rescued": self.rescued,
            "finished": self.finished,
        }

    def fail(self, code: ErrorCode, message: str) -> WorkflowError:
        """A failure with the context seed 001 asks for."""
        context: dict[str, object] = {
            "workflow": self.workflow.name,
            "completed_steps": list(self.steps.completed_steps),
            "pending_steps": self.steps.pending(),
            "iterations": self.iterations,
            "last_text": redact_text(self.last_text[-_LAST_TEXT_CHARS:]),
        }
        error = workflow_error(code, f"workflow {self.workflow.name!r}: {message}", context=context)
        self.failure = error
        return error

    def _terminals(self) -> str:
        return ", ".join(sorted(self.workflow.terminal_tools))

    def _listed(self) -> str:
        return ", ".join(self.workflow.tools)

    @staticmethod
    def respond_data(args: object) -> dict[str, object]:
        """The built-in ``respond`` tool's result: the answer it carries."""
        content = args.get("content") if isinstance(args, Mapping) else None
        return {"content": content if isinstance(content, str) else ""}

    @property
    def responds(self) -> bool:
        return RESPOND in self.workflow.tools
