"""Events produced by the sentinel tokenizer: immutable values, one closed union.

Consumers dispatch with ``match`` and ``assert_never`` so that adding an event type is a
type error everywhere it is not handled yet (events are values: docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from toolforge.errors import SentinelError

__all__ = [
    "Event",
    "FrameBegin",
    "FrameDelta",
    "FrameEnd",
    "FrameKind",
    "Text",
    "Violation",
]


class FrameKind(StrEnum):
    """The three frame kinds of the emission contract (docs/protocol.md)."""

    OBJECT = "OBJECT"
    TOOL_CALL = "TOOL_CALL"
    RESULT = "RESULT"

    @property
    def name_attribute(self) -> str:
        """The second attribute of this kind's BEGIN sentinel: ``name`` or ``schema``."""
        return "name" if self is FrameKind.TOOL_CALL else "schema"


@dataclass(frozen=True, slots=True)
class Text:
    """Free text outside any frame."""

    text: str


@dataclass(frozen=True, slots=True)
class FrameBegin:
    """A BEGIN sentinel was read in full. ``name`` is the schema name or the tool name."""

    kind: FrameKind
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class FrameDelta:
    """A piece of a frame's body (JSON text), in arrival order."""

    id: str
    chunk: str


@dataclass(frozen=True, slots=True)
class FrameEnd:
    """The END sentinel matching the open frame was read in full."""

    kind: FrameKind
    id: str


@dataclass(frozen=True, slots=True)
class Violation:
    """The model broke the framing grammar. Always the last event the tokenizer emits."""

    error: SentinelError


Event = Text | FrameBegin | FrameDelta | FrameEnd | Violation
