"""What a conversation's policy decides, as values. No I/O.

The turn engine (:class:`~toolforge.core.engine.Conversation`) asks its policy at four
points and acts on the answer; it never reads the policy's counters. Each answer is a
frozen value of a small closed union, matched with ``assert_never``:

    when                          the engine calls          the policy answers
    ----------------------------  ------------------------  --------------------------------
    before each model turn        begin_turn(messages)      Proceed(messages, hints) | Fail
    a turn with no tool call      no_call(text)             Accept | Retry(nudge) |
                                                            Rescue(calls) | Fail
    before running each call      check_call(name, args)    Run(name) | Respond(name,
                                                            data) | Refuse(name, code,
                                                            nudge, fatal)
    after the turn's calls        end_batch()               Continue | Complete(tool,
                                                            result) | Fail

and it tells the policy each call's outcome (``record``). What the policy knows leaves it
as one value, :class:`WorkflowSummary` (``done.workflow``, the run record, the Python
runner), never as attributes.

A plain stream has no workflow: its policy is :data:`OPEN`, which never objects (every
call runs under its own name, a turn without a call is the answer, nothing completes
early), so the engine has one code path. A workflow's is
:class:`~toolforge.core.steps.WorkflowPolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from toolforge.core.rescue import RescuedCall
from toolforge.errors import ErrorCode, WorkflowError

__all__ = [
    "ACCEPT",
    "CONTINUE",
    "OPEN",
    "Accept",
    "AfterBatch",
    "AfterText",
    "BeforeCall",
    "BeforeTurn",
    "Complete",
    "Continue",
    "Fail",
    "Nudge",
    "OpenPolicy",
    "Proceed",
    "Refuse",
    "Rescue",
    "Respond",
    "Retry",
    "Run",
    "TurnHints",
    "TurnPolicy",
    "WorkflowSummary",
]

Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Nudge:
    """A correction for the model: the ``step.nudge`` frame's ``kind``, ``tier``, ``message``."""

    kind: str  # "step", "prerequisite", "retry", "unknown_tool"
    tier: int
    message: str


@dataclass(frozen=True, slots=True)
class TurnHints:
    """What a workflow asks of the next turn's request (constrained mode's grammar):
    ``narrowed``: tool -> its input schema with argument-matched arguments reduced to the
    values earlier results hold (None: no such value yet, the tool is left out);
    ``allow_result``: whether the turn may end with a RESULT frame instead of a call;
    ``free_text``: whether text may come before the call; ``tool_choice``: OpenAI's
    ``tool_choice`` for a backend that takes one (native mode), None to keep the mode's."""

    narrowed: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    allow_result: bool = True
    free_text: bool = True
    tool_choice: object = None


# -- before a turn --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proceed:
    """Request the turn with ``messages`` (compacted by the policy's hook, if it has one);
    ``hints``: the policy's constraints on the turn (None: the mode's own request)."""

    messages: Messages
    hints: TurnHints | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The policy's budget ran out: ``error`` ends the conversation (an ``error`` frame,
    then ``done``)."""

    error: WorkflowError


# -- a turn without a call -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accept:
    """The turn's text is the answer: the conversation ends."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Ask again: the turn's text, then ``nudge`` as the user's reply (a ``step.nudge``)."""

    nudge: Nudge


@dataclass(frozen=True, slots=True)
class Rescue:
    """The model wrote its call as text: run ``calls`` as the turn's own."""

    calls: tuple[RescuedCall, ...]


# -- each call --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Run the call, as tool ``name`` (the policy's spelling of the name the model wrote)."""

    name: str


@dataclass(frozen=True, slots=True)
class Respond:
    """The built-in ``respond`` tool (``name``): nothing runs; ``data`` is its result."""

    name: str
    data: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Refuse:
    """Do not run the call (named ``name``): its ``tool.result`` error ``code``, the nudge
    that answers it, and, when a budget ran out, the error that ends the conversation once
    both are out."""

    name: str
    code: ErrorCode
    nudge: Nudge
    fatal: WorkflowError | None = None


# -- after the turn's calls --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Continue:
    """Go on: the calls' results go back to the model."""


@dataclass(frozen=True, slots=True)
class Complete:
    """A terminal tool succeeded: its ``result`` is the stream's RESULT, the answer."""

    tool: str
    result: object


ACCEPT: Final = Accept()
CONTINUE: Final = Continue()

BeforeTurn = Proceed | Fail
AfterText = Accept | Retry | Rescue | Fail
BeforeCall = Run | Respond | Refuse
AfterBatch = Continue | Complete | Fail


@dataclass(frozen=True, slots=True)
class WorkflowSummary:
    """What a workflow run knows, as one value: its steps, counters and outcome.

    ``to_dict()`` is ``done.workflow``; ``result_tool``/``result`` the terminal call that
    ended it (``finished``); ``failure`` the error that ended it instead, if one did;
    ``messages`` the messages of the last turn sent (before compaction)."""

    name: str
    completed_steps: tuple[str, ...] = ()
    pending_steps: tuple[str, ...] = ()
    iterations: int = 0
    nudges: int = 0
    rescued: int = 0
    finished: bool = False
    result_tool: str | None = None
    result: object = None
    failure: WorkflowError | None = None
    messages: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, object]:
        """``done.workflow``: the steps completed and pending, iterations, nudges."""
        return {
            "name": self.name,
            "completed_steps": list(self.completed_steps),
            "pending_steps": list(self.pending_steps),
            "iterations": self.iterations,
            "nudges": self.nudges,
            "rescued": self.rescued,
            "finished": self.finished,
        }


class TurnPolicy(Protocol):
    """What the engine asks of a conversation's policy (see the module docstring)."""

    def begin_turn(self, messages: Messages) -> BeforeTurn:
        """Before each model turn: proceed with these messages and hints, or fail."""
        ...

    def no_call(self, text: str) -> AfterText:
        """After a turn that made no tool call: accept, retry, rescue, or fail."""
        ...

    def check_call(self, name: str, args: object, *, parsed: bool = True) -> BeforeCall:
        """Before running a call (``parsed``: its arguments are valid JSON; a call whose
        arguments are not is refused by the engine, and only named here)."""
        ...

    def record(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        """A call ran, or the engine refused it: its envelope."""
        ...

    def end_batch(self) -> AfterBatch:
        """After the turn's calls: continue, complete with a terminal result, or fail."""
        ...

    def step_hint(self) -> str | None:
        """The hint a compacted history carries (None: the engine's own)."""
        ...

    def summary(self) -> WorkflowSummary | None:
        """What the policy knows (None: no workflow)."""
        ...


class OpenPolicy:
    """The policy of a plain stream: it never objects."""

    __slots__ = ()

    def begin_turn(self, messages: Messages) -> BeforeTurn:
        return Proceed(messages)

    def no_call(self, text: str) -> AfterText:
        return ACCEPT

    def check_call(self, name: str, args: object, *, parsed: bool = True) -> BeforeCall:
        return Run(name)

    def record(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        return None

    def end_batch(self) -> AfterBatch:
        return CONTINUE

    def step_hint(self) -> str | None:
        return None

    def summary(self) -> WorkflowSummary | None:
        return None


OPEN: Final = OpenPolicy()
"""The one :class:`OpenPolicy`: it holds no state."""
