"""What the turn engine asks of its driver, and what the driver answers. Values only.

The engine (:class:`~toolforge.core.engine.conversation.Conversation`) is a generator: it yields
one *action* at a time and is sent that action's *result* (httpx's ``auth_flow`` shape,
openai-agents' ``NextStep*`` values). The table is the whole protocol:

    action        the driver does                               and sends back
    -----------   -------------------------------------------   ---------------------------
    Emit          appends the frames to the stream              None
    CallModel     starts the generation (does not read yet)     the first model event
    ReadModel     appends the frames, reads the next event      the next model event
    StopModel     closes the generation (after reading its      the trailing deltas read,
                  trailing chunks briefly when ``drain``)       a tuple (maybe empty)
    RepairBody    decides the body (guarantee.finish_frame)     its Valid | Repaired |
                                                                NeedsModelRepair
    AskModel      one whole model call (the repair)             a ModelReply
    RunTool       runs the tool (approval, timeout, retries),   a ToolOutcome
                  or waits for the client's result
    RefuseTool    records the refusal (logs, metrics)           None
    Finish        ends the stream: ``done`` with the reason     (nothing: the flow is over)

A *model event* is ``(delta, now)``: an :class:`~toolforge.core.chat.UpstreamDelta` and the
driver's clock reading when it arrived (core has no clock), or :data:`MODEL_END` once
the generation finished. A failure while doing an action (an upstream error, say) is
thrown into the generator (``flow.throw(exc)``): the engine decides what it means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.context import CountTokens
from toolforge.core.guarantee import FinalOutcome
from toolforge.core.protocol.frames import Frame, ToolResult
from toolforge.core.schemas import CompiledSchema
from toolforge.errors import ToolForgeError

__all__ = [
    "MODEL_END",
    "Action",
    "AskModel",
    "CallModel",
    "CountTokens",
    "Emit",
    "Finish",
    "ModelEnd",
    "ModelEvent",
    "ModelReply",
    "ReadModel",
    "RefuseTool",
    "RepairBody",
    "RunTool",
    "StopModel",
    "ToolOutcome",
]


@dataclass(frozen=True, slots=True)
class Emit:
    """Append ``frames`` to the stream, in order. ``outcome``: how the JSON guarantee
    decided the END frame among them, for the driver's logs (None for other frames)."""

    frames: Sequence[Frame]
    outcome: FinalOutcome | None = None


@dataclass(frozen=True, slots=True)
class CallModel:
    """Start one generation of ``request``: a turn of the conversation."""

    request: ChatRequest


class ReadModel:
    """Append ``frames`` (often none), then send the next model event.

    One per upstream delta: the per-token path, so it carries the frames the delta made
    instead of costing an :class:`Emit` round trip of its own, and it is a plain slotted
    class rather than a frozen dataclass, whose ``__init__`` costs twice as much.
    """

    __slots__ = ("frames",)

    def __init__(self, frames: Sequence[Frame] = ()) -> None:
        self.frames = frames

    def __repr__(self) -> str:
        return f"ReadModel({self.frames!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadModel) and list(self.frames) == list(other.frames)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class StopModel:
    """Close the open generation now: a tool call ended the turn. With ``drain`` first
    read what the upstream still sends promptly (finish reason, usage, timings)."""

    drain: bool = False


@dataclass(frozen=True, slots=True)
class RepairBody:
    """Decide a closed OBJECT or RESULT body against ``schema``: valid, repaired locally,
    or in need of a model repair (:func:`toolforge.core.guarantee.finish_frame`). ``parsed`` is
    the strict parser's value or its error. Pure, but a large damaged body can take a
    quarter of a second, so the driver chooses where it runs."""

    text: str
    parsed: object
    schema: CompiledSchema


@dataclass(frozen=True, slots=True)
class AskModel:
    """One whole model call apart from the turn (the repair of a body): read it to its end
    and send back a :class:`ModelReply`."""

    request: ChatRequest
    purpose: str = "repair"


@dataclass(frozen=True, slots=True)
class ModelReply:
    """What an :class:`AskModel` call said: its text (None: the call failed) and the
    deltas that carried usage, for the stream's accounting."""

    text: str | None
    usage: tuple[UpstreamDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class RunTool:
    """Run tool ``name`` on ``args`` for call ``id`` (the ``tool.call`` frame is out).
    ``executor`` "client": the client runs it; wait for the result it posts (docs/tools.md).
    "gateway": the gateway's own confirming call (docs/tools.md, ``ToolSpec.confirm_with``) of a
    tool the model is not shown; it runs on the server, past the model-facing check only."""

    id: str
    name: str
    args: object
    needs_approval: bool = False
    executor: str = "server"


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A finished tool call: its ``tool.result`` frame and the envelope the model gets
    back (each mode renders it its own way)."""

    frame: ToolResult
    envelope: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class RefuseTool:
    """Call ``id`` was refused before running (its ``tool.result`` frame is out): the
    driver records it as it records a run."""

    id: str
    name: str
    error: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Finish:
    """The conversation is over: ``done`` with ``reason``; ``error`` when one ended it
    (its ``error`` frame is already out)."""

    reason: str
    error: ToolForgeError | None = None


@dataclass(frozen=True, slots=True)
class ModelEnd:
    """The generation finished (the upstream's stream ended)."""


MODEL_END: Final = ModelEnd()

ModelEvent = tuple[UpstreamDelta, float] | ModelEnd
Action = (
    Emit
    | CallModel
    | ReadModel
    | StopModel
    | RepairBody
    | AskModel
    | RunTool
    | RefuseTool
    | CountTokens
    | Finish
)
