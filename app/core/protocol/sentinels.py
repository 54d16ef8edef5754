"""The sentinel syntax of the emission contract (docs/protocol.md), rendered and recognised here
and nowhere else: the tokenizer, the grammar, the engine, the conformance checks and the
tests take their brackets, patterns and renderings from this module.

    frame         := begin body end
    begin         := "⟦BEGIN_" KIND " id=" id " " ("schema" | "name") "=" name "⟧"
    end           := "⟦END_" KIND " id=" id "⟧"
    KIND          := "OBJECT" | "TOOL_CALL" | "RESULT"   (TOOL_CALL: name=, others: schema=)
"""

from __future__ import annotations

import re
from typing import Final

from toolforge.core.events import FrameKind

__all__ = [
    "CLOSE",
    "ESCAPES",
    "ID_CHARS",
    "ID_RE",
    "MAX_ID_CHARS",
    "MAX_NAME_CHARS",
    "MAX_SENTINEL_CHARS",
    "NAME_RE",
    "OPEN",
    "SENTINEL_RE",
    "TOOL_CALL_BEGIN_RE",
    "begin",
    "end",
    "escape",
    "frame",
]

OPEN: Final = "\u27e6"  # ⟦
CLOSE: Final = "\u27e7"  # ⟧

ID_CHARS: Final = r"[A-Za-z0-9_.:\-]"
"""The characters of ids and names: what tool and schema names use (``places.search``,
``AssistantReply``, ``ns:tool-v2``)."""
MAX_ID_CHARS: Final = 64
MAX_NAME_CHARS: Final = 128

# The longest valid sentinel is ``⟦BEGIN_TOOL_CALL id=<64> name=<128>⟧`` = 219 chars;
# a committed sentinel that runs past this many characters is malformed.
MAX_SENTINEL_CHARS: Final = 256

_ID: Final = f"{ID_CHARS}{{1,{MAX_ID_CHARS}}}"
_NAME: Final = f"{ID_CHARS}{{1,{MAX_NAME_CHARS}}}"

ID_RE: Final = re.compile(_ID)
"""A frame id (``fullmatch``): what the tokenizer accepts and the grammar writes."""
NAME_RE: Final = re.compile(_NAME)
"""A schema or tool name (``fullmatch``), as for :data:`ID_RE`."""
SENTINEL_RE: Final = re.compile(
    f"{OPEN}(?:BEGIN|END)_(?:OBJECT|TOOL_CALL|RESULT) id={_ID}(?: (?:schema|name)={_NAME})?{CLOSE}"
)
"""Any whole sentinel (to find one that leaked where none may be)."""
TOOL_CALL_BEGIN_RE: Final = re.compile(f"{OPEN}BEGIN_TOOL_CALL id=({_ID}) name=({_NAME}){CLOSE}")
"""A tool call's BEGIN; groups: the id and the tool name."""

ESCAPES: Final = {OPEN: "\\u27e6", CLOSE: "\\u27e7"}
"""What a sentinel character becomes inside a JSON string: the six visible characters of
its JSON escape. Models must write them so (docs/protocol.md); tool results are escaped so."""


def begin(kind: FrameKind, id: str, name: str) -> str:
    """``⟦BEGIN_<KIND> id=<id> schema|name=<name>⟧``, with ``id`` and ``name`` as given:
    unchecked, so that tests can write broken sentinels too (the tokenizer judges)."""
    return f"{OPEN}BEGIN_{kind.value} id={id} {kind.name_attribute}={name}{CLOSE}"


def end(kind: FrameKind, id: str) -> str:
    """``⟦END_<KIND> id=<id>⟧``."""
    return f"{OPEN}END_{kind.value} id={id}{CLOSE}"


def frame(kind: FrameKind, id: str, name: str, body: str) -> str:
    """A whole frame: BEGIN, ``body`` as given, END."""
    return begin(kind, id, name) + body + end(kind, id)


def escape(text: str) -> str:
    """``text`` with each sentinel character replaced by its JSON escape (see ESCAPES)."""
    if OPEN not in text and CLOSE not in text:
        return text
    return text.replace(OPEN, ESCAPES[OPEN]).replace(CLOSE, ESCAPES[CLOSE])
