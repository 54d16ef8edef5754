"""Model text in, wire frames out: the tokenizer plus a JSON validator per frame. No I/O.

``Framer.feed(text)`` returns the frames of SPEC §3 that ``text`` completes:

    tokenizer event        OBJECT frame      RESULT frame       TOOL_CALL frame
    ---------------        ------------      ------------       ---------------
    Text                   text.delta        text.delta         text.delta
    FrameBegin             json.begin        result.begin       (nothing yet)
    FrameDelta             json.delta        result.delta       (nothing: args are held)
    FrameEnd               json.end          result.end         tool.call

Every body is validated as it streams, so a broken body fails at the first bad character
rather than at END. A tool call is announced only after its END sentinel arrived and its
arguments parsed strictly: never on a prefix that happens to parse (SPEC §3).

A violation of either the framing or the JSON ends the framer: it returns an ``error``
frame last and ``error`` holds the exception; the session decides what happens next
(end the stream now; the repair policy of the tools issue will plug in here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from app.core.events import (
    Event,
    FrameBegin,
    FrameDelta,
    FrameEnd,
    FrameKind,
    Text,
    Violation,
)
from app.core.json_validator import StreamingJSONValidator
from app.core.tokenizer import DEFAULT_MAX_FRAME_BYTES, SentinelTokenizer
from app.core.wire import (
    ERROR,
    JSON_BEGIN,
    JSON_DELTA,
    JSON_END,
    RESULT_BEGIN,
    RESULT_DELTA,
    RESULT_END,
    TEXT_DELTA,
    TOOL_CALL,
    Frame,
)
from app.errors import ModelBehaviorError

__all__ = ["Framer", "OpenBody"]

_BEGIN = {FrameKind.OBJECT: JSON_BEGIN, FrameKind.RESULT: RESULT_BEGIN}
_DELTA = {FrameKind.OBJECT: JSON_DELTA, FrameKind.RESULT: RESULT_DELTA}
_END = {FrameKind.OBJECT: JSON_END, FrameKind.RESULT: RESULT_END}


@dataclass(slots=True)
class OpenBody:
    """The frame being read: its kind, id, schema or tool name, and its validator."""

    kind: FrameKind
    id: str
    name: str
    validator: StreamingJSONValidator


class Framer:
    """Sans-IO: feed model text, get wire frames. See the module docstring."""

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_depth: int = 16,
    ) -> None:
        self._tokenizer = SentinelTokenizer(max_frame_bytes=max_frame_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._max_depth = max_depth
        self._open: OpenBody | None = None
        self.error: ModelBehaviorError | None = None
        self.frames_by_kind: dict[FrameKind, int] = dict.fromkeys(FrameKind, 0)

    @property
    def open_frame_id(self) -> str | None:
        """The id of the frame being read, if any."""
        return self._tokenizer.open_frame_id

    def feed(self, text: str) -> list[Frame]:
        if self.error is not None:
            return []
        return self._translate(self._tokenizer.feed(text))

    def close(self) -> list[Frame]:
        if self.error is not None:
            return []
        return self._translate(self._tokenizer.close())

    def _translate(self, events: list[Event]) -> list[Frame]:
        out: list[Frame] = []
        for ev in events:
            try:
                self._one(ev, out)
            except ModelBehaviorError as exc:
                self.error = exc
                out.append(Frame(ERROR, exc.to_dict()))
                break
        return out

    def _one(self, ev: Event, out: list[Frame]) -> None:
        match ev:
            case Text(text=text):
                out.append(Frame(TEXT_DELTA, {"chunk": text}))
            case FrameBegin(kind=kind, id=fid, name=name):
                validator = StreamingJSONValidator(
                    max_depth=self._max_depth, max_bytes=self._max_frame_bytes, frame_id=fid
                )
                self._open = OpenBody(kind, fid, name, validator)
                if kind is not FrameKind.TOOL_CALL:
                    out.append(Frame(_BEGIN[kind], {"id": fid, "schema": name}))
            case FrameDelta(id=fid, chunk=chunk):
                body = self._open
                assert body is not None and body.id == fid
                body.validator.feed(chunk)
                if body.kind is not FrameKind.TOOL_CALL:
                    out.append(Frame(_DELTA[body.kind], {"id": fid, "chunk": chunk}))
            case FrameEnd(kind=kind, id=fid):
                body = self._open
                assert body is not None and body.id == fid
                self._open = None
                value = body.validator.close()
                self.frames_by_kind[kind] += 1
                if kind is FrameKind.TOOL_CALL:
                    out.append(Frame(TOOL_CALL, {"id": fid, "name": body.name, "args": value}))
                else:
                    out.append(
                        Frame(
                            _END[kind],
                            {
                                "id": fid,
                                "length": body.validator.size,
                                "value": value,
                                "repaired": False,
                                "degraded": False,
                            },
                        )
                    )
            case Violation(error=error):
                raise error
            case _:
                assert_never(ev)
