"""The WebSocket transport's messages: the frame log's SSE blocks re-encoded as the JSON
objects ``GET /v1/stream/ws`` sends (docs/websocket.md), sans-IO.

Each frame goes out as ``{"id": N, "event": NAME, "data": {...}}``: the block's three
fields, the ``data`` bytes as they were encoded. Two message framings, chosen by the
client with the WebSocket subprotocol (``Sec-WebSocket-Protocol``, RFC 6455 §1.9):

* none offered (or only ones the gateway does not speak): one frame per message;
* :data:`SUBPROTOCOL`: one message per batch the frame log hands over, its frames as JSON
  lines (``\\n`` between two, none after the last). A message of one frame is the same
  bytes in both framings.

Why a framing of several frames: ASGI has one ``send`` per WebSocket message, and the
server frames and writes each message by itself (one ``write`` system call each), where
SSE writes every frame of a batch with one ``send``. At full speed, one frame per message
cost 1.6-2.0 times ``/v1/stream``'s CPU per token (docs/performance.md, "Wire formats").

The re-encoding is a few ``bytes.replace`` over the whole batch, never a loop over its
frames: a block is ``id: N\\nevent: NAME\\ndata: JSON\\n\\n`` and nothing inside one holds a
newline (``toolforge.core.protocol.sse_blocks``), so each separator is found by ``replace``
alone (150 ns a frame in batches of 8, against 500 for splitting and splicing each block).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["SUBPROTOCOL", "frame_lines", "select_subprotocol"]

SUBPROTOCOL: Final = "toolforge.frames.v1"
"""The subprotocol of several frames per message, as JSON lines. ``v1`` names this
message framing, not the frames (the same objects in both framings): another framing
would be offered under another name."""

_ID: Final = len(b"id: ")
_END: Final = len(b"\n\n")


def select_subprotocol(offered: Iterable[str]) -> str | None:
    """The subprotocol to accept from those a client offered, in its order of preference;
    ``None`` (accept with none, one frame per message) when it offered none the gateway
    speaks."""
    return SUBPROTOCOL if SUBPROTOCOL in offered else None


def frame_lines(batch: bytes) -> bytes:
    """A non-empty batch of SSE blocks as JSON lines, one frame object per line: the
    message of :data:`SUBPROTOCOL`, or split on ``\\n`` the messages of one frame each."""
    return (
        b'{"id":'
        + batch[_ID:-_END]
        .replace(b"\nevent: ", b',"event":"')
        .replace(b"\ndata: ", b'","data":')
        .replace(b"\n\nid: ", b'}\n{"id":')
        + b"}"
    )
