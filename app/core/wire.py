"""The wire protocol's frames (SPEC §3) and their SSE encoding. Pure functions, no I/O.

A ``Frame`` is what the client receives: an event name and a JSON object. The session
numbers frames (the SSE ``id``, strictly increasing from 1) and encodes each exactly once,
here, into the bytes that are written, replayed on resume and replayed for an idempotent
retry, so those are byte-identical by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import orjson

__all__ = [
    "DONE",
    "ERROR",
    "JSON_BEGIN",
    "JSON_DELTA",
    "JSON_END",
    "PING_BYTES",
    "RESULT_BEGIN",
    "RESULT_DELTA",
    "RESULT_END",
    "STREAM_BEGIN",
    "TEXT_DELTA",
    "TOOL_CALL",
    "TOOL_RESULT",
    "Frame",
    "encode_frame",
]

STREAM_BEGIN: Final = "stream.begin"
TEXT_DELTA: Final = "text.delta"
JSON_BEGIN: Final = "json.begin"
JSON_DELTA: Final = "json.delta"
JSON_END: Final = "json.end"
TOOL_CALL: Final = "tool.call"
TOOL_RESULT: Final = "tool.result"
RESULT_BEGIN: Final = "result.begin"
RESULT_DELTA: Final = "result.delta"
RESULT_END: Final = "result.end"
ERROR: Final = "error"
DONE: Final = "done"

# A ping carries no id: it is not part of the stream's frame sequence, so it never moves
# a client's Last-Event-ID, is never replayed and never breaks byte-identical replays.
PING_BYTES: Final = b"event: ping\ndata: {}\n\n"


@dataclass(frozen=True, slots=True)
class Frame:
    """One server-to-client event before numbering."""

    event: str
    data: dict[str, object]


def encode_frame(seq: int, frame: Frame) -> bytes:
    """``id: <seq>``, ``event: <name>`` and one compact ``data:`` line.

    orjson escapes every control character inside strings, so the JSON never contains a
    raw CR or LF and one ``data:`` line always suffices (SSE splits events on those).
    """
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        seq,
        frame.event.encode(),
        orjson.dumps(frame.data),
    )
