"""The AG-UI wire (the events CopilotKit and the other agent front-ends read), written from
the engine's frames with the ``ag-ui-protocol`` package's own event types and encoder. Pure.

``POST /v1/agui`` runs the OpenAI-compatible proxy's plan and session (docs/agui.md); a
run's frames become AG-UI events:

    frame                         events
    ----------------------------  ------------------------------------------------------------
    (start)                       RUN_STARTED
    text.delta, result.end        TEXT_MESSAGE_START (once per message), TEXT_MESSAGE_CONTENT
    reasoning.delta               REASONING_START, REASONING_MESSAGE_START (once),
                                  REASONING_MESSAGE_CONTENT
    tool.call                     the open message ends (TEXT_MESSAGE_END, or
                                  REASONING_MESSAGE_END + REASONING_END); TOOL_CALL_START,
                                  TOOL_CALL_ARGS (the whole arguments, validated JSON),
                                  TOOL_CALL_END
    tool.call that needs          … and RUN_FINISHED with an ``interrupt`` outcome: the run
    an approval                   ends there; the next run's ``resume`` answers it and goes on
    tool.result (a server tool)   TOOL_CALL_RESULT (the result or the error, as JSON text)
    error                         RUN_ERROR (code, message); the run ends
    done                          the open message ends, RUN_FINISHED (``success``; with the
                                  frontend tools' calls as ``pending_tool_call_ids``)

A workflow run (``forwardedProps.toolforge.workflow``) holds its text back and sends its
answer (:class:`toolforge.core.protocol.answer.WorkflowAnswer`) as one message at the end.

A frontend tool (the run's ``tools``) is called like any function of the proxy: the run
finishes with its call, the front-end runs it, and sends the next run with the result as
a ``tool`` message. An interrupt's id is ``{stream_id}.{call_id}.{frame_id}``: the stream
that waits, the call, and the frame to resume after.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from ag_ui.core import (
    BaseEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

from toolforge.core.protocol.answer import HELD, WorkflowAnswer
from toolforge.core.protocol.frames import (
    DONE,
    ERROR,
    REASONING_DELTA,
    RESULT_END,
    TEXT_DELTA,
    TOOL_CALL,
    TOOL_RESULT,
)

__all__ = ["APPROVAL_REASON", "APPROVAL_SCHEMA", "RunWriter", "parse_interrupt_id"]

APPROVAL_REASON: Final = "tool_approval"
# What a resume's payload answers an approval with.
APPROVAL_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean"}},
    "required": ["approve"],
}
_ENCODER: Final = EventEncoder()


def _content_template() -> tuple[bytes, bytes, bytes]:
    """TEXT_MESSAGE_CONTENT as the package's encoder writes it, cut around its two
    values: the per-token path splices a message id and a frame's JSON string in, and
    writes what the encoder would, without a model built and dumped per token."""
    probe = _ENCODER.encode(TextMessageContentEvent(message_id="\x01", delta="\x02")).encode()
    head, rest = probe.split(b'"\\u0001"')
    mid, tail = rest.split(b'"\\u0002"')
    return head, mid, tail


_CONTENT_HEAD, _CONTENT_MID, _CONTENT_TAIL = _content_template()


def parse_interrupt_id(interrupt_id: str) -> tuple[str, str, int] | None:
    """``(stream_id, call_id, frame_id)`` of an interrupt id this gateway gave, or None."""
    stream_id, _, rest = interrupt_id.partition(".")
    call_id, _, frame = rest.rpartition(".")
    if not (stream_id.startswith("s_") and call_id and frame.isdigit()):
        return None
    return stream_id, call_id, int(frame)


class RunWriter:
    """One AG-UI run's events, from a stream's frames (module docstring): SSE bytes in
    (:meth:`batch`), SSE bytes out. ``ended`` once RUN_FINISHED or RUN_ERROR is written:
    nothing after it belongs to this run."""

    def __init__(
        self, *, thread_id: str, run_id: str, stream_id: str, workflow: bool = False
    ) -> None:
        self._answer = WorkflowAnswer() if workflow else None  # held to the end, then sent
        self._thread_id = thread_id
        self._run_id = run_id
        self._stream_id = stream_id
        self._message: str | None = None  # the open text message
        self._content_head = b""  # its TEXT_MESSAGE_CONTENT, up to the delta
        self._reasoning: str | None = None  # the open reasoning message
        self._messages = 0
        self._client_calls: list[str] = []
        self.started = False
        self.ended = False
        self.interrupted_at: int | None = None  # the frame an interrupt resumes after

    def _id(self, prefix: str) -> str:
        self._messages += 1
        return f"{prefix}_{self._stream_id[2:]}_{self._run_id}_{self._messages}"

    def start(self) -> list[BaseEvent]:
        self.started = True
        return [RunStartedEvent(thread_id=self._thread_id, run_id=self._run_id)]

    def _close(self, out: list[BaseEvent]) -> None:
        if self._message is not None:
            out.append(TextMessageEndEvent(message_id=self._message))
            self._message = None
        if self._reasoning is not None:
            out.append(ReasoningMessageEndEvent(message_id=self._reasoning))
            out.append(ReasoningEndEvent(message_id=self._reasoning))
            self._reasoning = None

    def _text(self, chunk: str, out: list[BaseEvent]) -> None:
        if self._message is None:
            self._close(out)
            self._message = self._id("msg")
            self._content_head = _CONTENT_HEAD + orjson.dumps(self._message) + _CONTENT_MID
            out.append(TextMessageStartEvent(message_id=self._message, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self._message, delta=chunk))

    def _thought(self, chunk: str, out: list[BaseEvent]) -> None:
        if self._reasoning is None:
            self._close(out)
            self._reasoning = self._id("rs")
            out.append(ReasoningStartEvent(message_id=self._reasoning))
            out.append(ReasoningMessageStartEvent(message_id=self._reasoning, role="reasoning"))
        out.append(ReasoningMessageContentEvent(message_id=self._reasoning, delta=chunk))

    def frame(self, frame_id: int, event: str, data: Mapping[str, Any]) -> list[BaseEvent]:
        """The events for one frame (maybe none)."""
        out: list[BaseEvent] = []
        if self.ended:
            return out
        if self._answer is not None and event in HELD:
            self._answer.frame(event, data)
        elif event == TEXT_DELTA:
            self._text(data["chunk"], out)
        elif event == RESULT_END:
            self._text(orjson.dumps(data["value"]).decode(), out)
        elif event == REASONING_DELTA:
            self._thought(data["chunk"], out)
        elif event == TOOL_CALL:
            self._call(frame_id, data, out)
        elif event == TOOL_RESULT:
            content = data.get("result") if data["ok"] else {"error": data.get("error")}
            out.append(
                ToolCallResultEvent(
                    message_id=self._id("tool"),
                    tool_call_id=data["id"],
                    content=orjson.dumps(content).decode(),
                    role="tool",
                )
            )
        elif event == ERROR:
            self._close(out)
            out.append(RunErrorEvent(message=data["message"], code=str(data["code"])))
            self.ended = True
        elif event == DONE:
            answer = None if self._answer is None else self._answer.text
            if answer is not None and data["reason"] == "stop":
                self._text(answer, out)
            self._close(out)
            outcome = RunFinishedSuccessOutcome(pending_tool_call_ids=self._client_calls or None)
            out.append(self._finished(outcome))
        return out

    def _call(self, frame_id: int, data: Mapping[str, Any], out: list[BaseEvent]) -> None:
        parent = self._message
        self._close(out)
        call_id = data["id"]
        out.append(
            ToolCallStartEvent(
                tool_call_id=call_id, tool_call_name=data["name"], parent_message_id=parent
            )
        )
        out.append(
            ToolCallArgsEvent(tool_call_id=call_id, delta=orjson.dumps(data["args"]).decode())
        )
        out.append(ToolCallEndEvent(tool_call_id=call_id))
        if data.get("executor") == "client":
            self._client_calls.append(call_id)
        elif data.get("needs_approval"):
            interrupt = Interrupt(
                id=f"{self._stream_id}.{call_id}.{frame_id}",
                reason=APPROVAL_REASON,
                message=f"The tool {data['name']!r} needs your approval to run.",
                tool_call_id=call_id,
                response_schema=dict(APPROVAL_SCHEMA),
            )
            self.interrupted_at = frame_id
            out.append(self._finished(RunFinishedInterruptOutcome(interrupts=[interrupt])))

    def _finished(self, outcome: Any) -> RunFinishedEvent:
        self.ended = True
        return RunFinishedEvent(thread_id=self._thread_id, run_id=self._run_id, outcome=outcome)

    def batch(self, encoded: bytes) -> bytes:
        """The SSE events for one batch of encoded frames (``id/event/data`` blocks), with
        RUN_STARTED in front of the first."""
        out = [_encode(event) for event in self.start()] if not self.started else []
        for block in encoded.split(b"\n\n"):
            if not block or self.ended:
                continue
            id_line, event_line, data_line = block.split(b"\n", 2)
            if event_line == b"event: text.delta" and self._message is not None:
                # the per-token path (_content_template): data: {"chunk":<this>}
                out.append(self._content_head + data_line[15:-1] + _CONTENT_TAIL)
                continue
            events = self.frame(
                int(id_line[4:]), event_line[7:].decode(), orjson.loads(data_line[6:])
            )
            out.extend(_encode(event) for event in events)
        return b"".join(out)


def _encode(event: BaseEvent) -> bytes:
    return _ENCODER.encode(event).encode()
