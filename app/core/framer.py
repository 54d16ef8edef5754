"""Model text in, wire frames out: the tokenizer plus a JSON validator per frame. No I/O.

``Framer.feed(text)`` returns, in order, the wire frames of docs/protocol.md that ``text``
completes, and one ``BodyClosed`` value at each frame's END:

    tokenizer event        OBJECT frame      RESULT frame       TOOL_CALL frame
    ---------------        ------------      ------------       ---------------
    Text                   text.delta        text.delta         text.delta
    FrameBegin             json.begin        result.begin       (nothing yet)
    FrameDelta             json.delta        result.delta       (nothing: args are held)
    FrameEnd               BodyClosed        BodyClosed         BodyClosed

The END frames (``json.end``, ``result.end``, ``tool.call``) are the session's to emit,
because deciding them may take I/O: a schema repair asks the model again, and a tool
call pauses the model and runs the tool. ``BodyClosed`` carries what the decision needs:
the body's text and either its strictly parsed value or the JSON error that stopped it.

Each body is validated as it streams. A JSON error does not end the stream: the body is
kept (the tokenizer caps it at the frame limit) and judged at END, where an OBJECT or
RESULT body goes to repair and a tool call's arguments go back to the model as an
``invalid_json`` result. A tool call is therefore never announced on a prefix that
happens to parse (docs/protocol.md). A *framing* violation, by contrast, ends the framer: it
returns an ``error`` frame last and ``error`` holds the exception (see the tokenizer's
docstring for why framing errors are sticky).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, assert_never

from toolforge.core.events import (
    Event,
    FrameBegin,
    FrameDelta,
    FrameEnd,
    FrameKind,
    Text,
    Violation,
)
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.core.protocol.frames import (
    Error,
    Frame,
    JsonBegin,
    JsonDelta,
    ResultBegin,
    ResultDelta,
    TextDelta,
)
from toolforge.core.tokenizer import DEFAULT_MAX_FRAME_BYTES, SentinelTokenizer
from toolforge.errors import JSONError, ModelBehaviorError

__all__ = ["BodyClosed", "Framer"]

_BEGIN: Final[dict[FrameKind, type[JsonBegin | ResultBegin]]] = {
    FrameKind.OBJECT: JsonBegin,
    FrameKind.RESULT: ResultBegin,
}
_DELTA: Final[dict[FrameKind, type[JsonDelta | ResultDelta]]] = {
    FrameKind.OBJECT: JsonDelta,
    FrameKind.RESULT: ResultDelta,
}


@dataclass(frozen=True, slots=True)
class BodyClosed:
    """A frame's END arrived. Exactly one of ``value`` / ``error`` is meaningful:
    ``error`` is None when the body parsed strictly, and ``value`` is then its value."""

    kind: FrameKind
    id: str
    name: str  # schema name, or tool name
    text: str
    value: object
    error: JSONError | None
    length: int  # UTF-8 bytes of the body


@dataclass(slots=True)
class _OpenBody:
    kind: FrameKind
    id: str
    name: str
    validator: StreamingJSONValidator
    chunks: list[str] = field(default_factory=list)
    error: JSONError | None = None


class Framer:
    """Sans-IO: feed model text, get wire frames and ``BodyClosed`` decisions to make."""

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_depth: int = 16,
        seen_ids: set[str] | None = None,
    ) -> None:
        self._tokenizer = SentinelTokenizer(max_frame_bytes=max_frame_bytes, seen_ids=seen_ids)
        self._max_frame_bytes = max_frame_bytes
        self._max_depth = max_depth
        self._open: _OpenBody | None = None
        self.error: ModelBehaviorError | None = None

    @property
    def open_frame_id(self) -> str | None:
        """The id of the frame being read, if any."""
        return self._tokenizer.open_frame_id

    def feed(self, text: str) -> list[Frame | BodyClosed]:
        if self.error is not None:
            return []
        return self._translate(self._tokenizer.feed(text))

    def close(self) -> list[Frame | BodyClosed]:
        if self.error is not None:
            return []
        return self._translate(self._tokenizer.close())

    def _translate(self, events: list[Event]) -> list[Frame | BodyClosed]:
        out: list[Frame | BodyClosed] = []
        for ev in events:
            match ev:
                case Text(text=text):
                    out.append(TextDelta(text))
                case FrameBegin(kind=kind, id=fid, name=name):
                    validator = StreamingJSONValidator(
                        max_depth=self._max_depth, max_bytes=self._max_frame_bytes, frame_id=fid
                    )
                    self._open = _OpenBody(kind, fid, name, validator)
                    if kind is not FrameKind.TOOL_CALL:
                        out.append(_BEGIN[kind](fid, name))
                case FrameDelta(id=fid, chunk=chunk):
                    body = self._open
                    assert body is not None and body.id == fid
                    body.chunks.append(chunk)
                    if body.error is None:
                        try:
                            body.validator.feed(chunk)
                        except JSONError as exc:
                            body.error = exc
                    if body.kind is not FrameKind.TOOL_CALL:
                        out.append(_DELTA[body.kind](fid, chunk))
                case FrameEnd(id=fid):
                    body = self._open
                    assert body is not None and body.id == fid
                    self._open = None
                    out.append(self._close_body(body))
                case Violation(error=error):
                    self.error = error
                    out.append(Error.of(error))
                case _:
                    assert_never(ev)
        return out

    @staticmethod
    def _close_body(body: _OpenBody) -> BodyClosed:
        text = "".join(body.chunks)
        value: object = None
        if body.error is None:
            try:
                value = body.validator.close()
            except JSONError as exc:  # e.g. an empty body, or a value left unfinished
                body.error = exc
        return BodyClosed(
            body.kind, body.id, body.name, text, value, body.error, len(text.encode("utf-8"))
        )
