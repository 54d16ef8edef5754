"""The AI SDK's UI message stream (``x-vercel-ai-ui-message-stream: v1``, what ``useChat``
reads), written from the engine's frames. Pure.

``POST /v1/ui/chat`` runs the OpenAI-compatible proxy's plan and session (docs/ui-stream.md);
each chunk is an SSE ``data:`` line, and the stream ends with ``data: [DONE]``:

    frame                         chunks
    ----------------------------  ------------------------------------------------------------
    (start)                       start (the assistant message's id), start-step
    text.delta, result.end        text-start (once per part), text-delta
    reasoning.delta               reasoning-start (once per part), reasoning-delta
    tool.call                     the open part ends (text-end / reasoning-end);
                                  tool-input-start, tool-input-delta (the whole input, valid
                                  JSON), tool-input-available; a server tool's are
                                  ``providerExecuted`` (the client does not run it)
    tool.call that needs          … and tool-approval-request, then finish-step, finish and
    an approval                   [DONE]: the client's next request answers it (the SDK's
                                  approval part) and the message goes on
    tool.result (a server tool)   tool-output-available, tool-output-error, or
                                  tool-output-denied (a refused approval)
    error                         error (its message); the stream ends
    done                          the open part ends; finish-step, finish (its reason), [DONE]

A workflow run (``toolforge.workflow``) holds its text back and sends its answer
(:class:`toolforge.core.protocol.answer.WorkflowAnswer`) as one text part at the end.

An approval's id is ``{stream_id}.{call_id}.{frame_id}``: the stream that waits, the call,
and the frame to go on after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

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
from toolforge.errors import ErrorCode, RequestError

__all__ = [
    "DONE_LINE",
    "HEADERS",
    "UIStreamWriter",
    "approval_answer",
    "chat_messages",
    "file_kind",
]

DONE_LINE: Final = b"data: [DONE]\n\n"
# What the SDK's transport checks for (its UI_MESSAGE_STREAM_HEADERS).
HEADERS: Final[Mapping[str, str]] = {
    "x-vercel-ai-ui-message-stream": "v1",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}
_FINISH: Final = {"stop": "stop", "length": "length"}
_DENIED: Final = "TOOL_APPROVAL_DENIED"


def _chunk(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class UIStreamWriter:
    """One assistant message's UI stream, from a stream's frames (module docstring): SSE
    bytes in (:meth:`batch`), SSE bytes out. ``ended`` once ``[DONE]`` is written."""

    def __init__(self, *, message_id: str, stream_id: str, workflow: bool = False) -> None:
        self._answer = WorkflowAnswer() if workflow else None  # held to the end, then sent
        self._message_id = message_id
        self._stream_id = stream_id
        self._open: tuple[str, str] | None = None  # ("text" | "reasoning", part id)
        self._text_head = b""  # the open text part's text-delta, up to the delta
        self._parts = 0
        self._client_calls = 0
        self.started = False
        self.ended = False
        self.interrupted_at: int | None = None

    def start(self) -> list[dict[str, Any]]:
        self.started = True
        return [{"type": "start", "messageId": self._message_id}, {"type": "start-step"}]

    def _close(self, out: list[dict[str, Any]]) -> None:
        if self._open is not None:
            kind, part = self._open
            out.append({"type": f"{kind}-end", "id": part})
            self._open = None

    def _delta(self, kind: str, chunk: str, out: list[dict[str, Any]]) -> None:
        if self._open is None or self._open[0] != kind:
            self._close(out)
            self._parts += 1
            self._open = (kind, f"{kind[0]}{self._parts}")
            self._text_head = (
                b'data: {"type":"text-delta","id":' + orjson.dumps(self._open[1]) + b',"delta":'
            )
            out.append({"type": f"{kind}-start", "id": self._open[1]})
        out.append({"type": f"{kind}-delta", "id": self._open[1], "delta": chunk})

    def _end(self, finish: str, out: list[dict[str, Any]]) -> None:
        self._close(out)
        out.append({"type": "finish-step"})
        out.append({"type": "finish", "finishReason": finish})
        self.ended = True

    def frame(self, frame_id: int, event: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chunks for one frame (maybe none)."""
        out: list[dict[str, Any]] = []
        if self.ended:
            return out
        if self._answer is not None and event in HELD:
            self._answer.frame(event, data)
        elif event == TEXT_DELTA:
            self._delta("text", data["chunk"], out)
        elif event == RESULT_END:
            self._delta("text", orjson.dumps(data["value"]).decode(), out)
        elif event == REASONING_DELTA:
            self._delta("reasoning", data["chunk"], out)
        elif event == TOOL_CALL:
            self._call(frame_id, data, out)
        elif event == TOOL_RESULT:
            call_id = data["id"]
            if data["ok"]:
                out.append(
                    {"type": "tool-output-available", "toolCallId": call_id,
                     "output": data.get("result"), "providerExecuted": True}
                )  # fmt: skip
            elif (data.get("error") or {}).get("code") == _DENIED:
                out.append({"type": "tool-output-denied", "toolCallId": call_id})
            else:
                error = data.get("error") or {}
                out.append(
                    {"type": "tool-output-error", "toolCallId": call_id,
                     "errorText": f"{error.get('code')}: {error.get('message')}",
                     "providerExecuted": True}
                )  # fmt: skip
        elif event == ERROR:
            self._close(out)
            out.append({"type": "error", "errorText": f"{data['code']}: {data['message']}"})
            self.ended = True
        elif event == DONE:
            reason = data["reason"]
            answer = None if self._answer is None else self._answer.text
            if answer is not None and reason == "stop":
                self._delta("text", answer, out)
            finish = "tool-calls" if self._client_calls else _FINISH.get(reason, "other")
            self._end(finish, out)
        return out

    def _call(self, frame_id: int, data: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        self._close(out)
        call_id, name = data["id"], data["name"]
        server = data.get("executor") != "client"
        extra: dict[str, Any] = {"providerExecuted": True} if server else {}
        out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name, **extra})
        out.append(
            {"type": "tool-input-delta", "toolCallId": call_id,
             "inputTextDelta": orjson.dumps(data["args"]).decode()}
        )  # fmt: skip
        out.append(
            {"type": "tool-input-available", "toolCallId": call_id, "toolName": name,
             "input": data["args"], **extra}
        )  # fmt: skip
        if not server:
            self._client_calls += 1
        elif data.get("needs_approval"):
            out.append(
                {"type": "tool-approval-request", "toolCallId": call_id,
                 "approvalId": f"{self._stream_id}.{call_id}.{frame_id}"}
            )  # fmt: skip
            self.interrupted_at = frame_id
            self._end("other", out)

    def batch(self, encoded: bytes) -> bytes:
        """The chunks for one batch of encoded frames (``id/event/data`` blocks), with
        the first ones in front and ``[DONE]`` after the last."""
        out = [_chunk(chunk) for chunk in self.start()] if not self.started else []
        for block in encoded.split(b"\n\n"):
            if not block or self.ended:
                continue
            id_line, event_line, data_line = block.split(b"\n", 2)
            open_ = self._open
            if event_line == b"event: text.delta" and open_ is not None and open_[0] == "text":
                # the per-token path: data: {"chunk":<this>} spliced in, as _chunk writes it
                out.append(self._text_head + data_line[15:-1] + b"}\n\n")
                continue
            chunks = self.frame(
                int(id_line[4:]), event_line[7:].decode(), orjson.loads(data_line[6:])
            )
            out.extend(_chunk(chunk) for chunk in chunks)
        body = b"".join(out)
        return body + DONE_LINE if self.ended else body


# -- UI messages -> chat messages ---------------------------------------------------------------


def _bad(field: str, message: str) -> RequestError:
    return RequestError(
        ErrorCode.BAD_REQUEST,
        f"invalid '{field}': {message}",
        details=[{"field": field, "message": message}],
        http_status=422,
    )


def _user_content(parts: Sequence[Any], field: str) -> str | list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "file":
            out.append(_file(part, f"{field}[{i}]"))
        elif kind in ("step-start", "reasoning") or str(kind).startswith("data-"):
            continue
        else:
            raise _bad(f"{field}[{i}]", f"part type {kind!r} is not supported in this message")
    if all(part["type"] == "text" for part in out):
        return "".join(part["text"] for part in out)
    return out


def _file(part: Mapping[str, Any], field: str) -> dict[str, Any]:
    """A ``file`` part as a Chat Completions part: an image (by its ``mediaType``) as
    ``image_url``, any other file as ``file``, whose bytes Chat Completions carries only
    inline (a data: URL)."""
    url = part.get("url")
    if not isinstance(url, str) or not url:
        raise _bad(field, "a file part needs its 'url' (a URL or a data: URL)")
    if file_kind(part) == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    if not url.startswith("data:"):
        raise _bad(field, "a file that is not an image is passed on as its bytes: a data: URL")
    file = {"file_data": url}
    if isinstance(part.get("filename"), str):
        file["filename"] = part["filename"]
    return {"type": "file", "file": file}


def file_kind(part: Mapping[str, Any]) -> str | None:
    """The kind of content a UI message part is (core/input_content): a ``file`` part is
    an image when its ``mediaType`` says so, a file otherwise; other parts are not
    content the upstream may refuse."""
    if part.get("type") != "file":
        return None
    return "image" if str(part.get("mediaType", "")).startswith("image/") else "file"


def _tool_name(part: Mapping[str, Any]) -> str | None:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        name = part.get("toolName")
        return name if isinstance(name, str) else None
    return kind.removeprefix("tool-") if kind.startswith("tool-") else None


def chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The chat messages of ``useChat``'s UI messages. An assistant message's tool parts
    become its ``tool_calls``, and those with an output (or an error, or a refused
    approval) the ``tool`` messages after it; reasoning and data parts stay in the UI."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise _bad(field, "a message is an object with 'role' and 'parts'")
        role, parts = message.get("role"), message.get("parts")
        if not isinstance(parts, list):
            raise _bad(f"{field}.parts", "a list of parts")
        if role in ("user", "system"):
            out.append({"role": role, "content": _user_content(parts, f"{field}.parts")})
            continue
        if role != "assistant":
            raise _bad(f"{field}.role", f"{role!r}: use user, system or assistant")
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in parts:
            if not isinstance(part, Mapping):
                continue
            name = _tool_name(part)
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                text.append(part["text"])
            elif name is not None and isinstance(part.get("toolCallId"), str):
                call_id = part["toolCallId"]
                state = part.get("state")
                arguments = orjson.dumps(part.get("input")).decode()
                call = {"name": name, "arguments": arguments}
                calls.append({"id": call_id, "type": "function", "function": call})
                if state == "output-available":
                    output = part.get("output")
                    content = output if isinstance(output, str) else orjson.dumps(output).decode()
                elif state == "output-error":
                    content = orjson.dumps({"error": part.get("errorText")}).decode()
                elif state == "output-denied":
                    content = orjson.dumps({"error": "the user refused this call"}).decode()
                else:
                    continue  # no output yet: the call goes without a result
                results.append({"role": "tool", "tool_call_id": call_id, "content": content})
        said: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            said["tool_calls"] = calls
        if said["content"] is not None or calls:
            out.append(said)
        out.extend(results)
    return out


def approval_answer(messages: Sequence[Any]) -> tuple[str, str, int, bool, str] | None:
    """The approval the last assistant message answers, if it answers one of this
    gateway's: ``(stream_id, call_id, frame_id, approved, message_id)``."""
    last = messages[-1] if messages else None
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        return None
    for part in last.get("parts") or ():
        approval = part.get("approval") if isinstance(part, Mapping) else None
        if part.get("state") != "approval-responded" or not isinstance(approval, Mapping):
            continue
        stream_id, _, rest = str(approval.get("id", "")).partition(".")
        call_id, _, frame = rest.rpartition(".")
        if stream_id.startswith("s_") and call_id and frame.isdigit():
            approved = approval.get("approved") is True
            return stream_id, call_id, int(frame), approved, str(last.get("id", ""))
    return None
