"""The OpenAI chat-completions wire, written from the engine's frames. Pure.

The proxy (``POST /v1/chat/completions``) runs the same engine and session as
``POST /v1/stream``: its frames land in the same frame log. This module turns them into
what the OpenAI SDKs read, one way for each kind of response:

    frame                          streaming chunk (``delta``)              completion
    -----------------------------  ---------------------------------------  ----------------------
    (first)                        ``{"role": "assistant", "content": ""}``
    text.delta                     ``{"content": chunk}``                   message.content
    reasoning.delta                ``{"reasoning_content": chunk}``         …reasoning_content
    result.end (a JSON answer)     ``{"content": "<the value as JSON>"}``   message.content
    tool.call, executor "client"   ``{"tool_calls": [{index, id, type,      message.tool_calls
                                   function: {name, arguments}}]}``
    error                          ``{"error": {message, type, code}}``     an HTTP error
                                   (the SDKs raise on it), then ``[DONE]``
    done                           ``finish_reason``, then the ``usage``    finish_reason, usage
                                   chunk if asked for, then ``[DONE]``
    others                         nothing (server tools, stream.begin, …: their trace is
                                   in the ``toolforge`` extension field)

A workflow run (``toolforge.workflow``) answers with its terminal tool's result and nothing
else: the model's text between calls is not the answer (it stays in the artifacts), and
the last ``result.end`` — the gateway's, for the terminal tool that ended the run — is the
content when the run ends well, as a ``respond`` call's ``content`` text or as JSON. The
``toolforge`` field carries ``done.workflow`` (steps, iterations, nudges, rescues).

Every chunk and the completion carry a ``toolforge`` extension object at the end (the
stream id, the mode, what the guardrails did): the SDKs keep unknown fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
from toolforge.core.protocol.sse_blocks import END, event_data

__all__ = ["DONE_LINE", "ChunkWriter", "CompletionBuilder", "error_body", "finish_reason"]

DONE_LINE: Final = b"data: [DONE]\n\n"

# Done.reason -> finish_reason (the engine's own reasons for an ended stream map to "stop";
# an error has its own chunk before).
_FINISH: Final = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def finish_reason(reason: str, handed_calls: bool) -> str:
    """OpenAI's ``finish_reason`` for a stream that ended with ``reason``: ``tool_calls``
    exactly when calls went back to the client (a ``respond`` call is an answer)."""
    if handed_calls:
        return "tool_calls"
    finish = _FINISH.get(reason, "stop")
    return "stop" if finish == "tool_calls" else finish


def error_body(code: str, message: str, status: int = 500) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {message, type, param, code}}``."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream's usage as OpenAI's object (total computed where it was not sent)."""
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not isinstance(completion, int):
        chunks = usage.get("completion_chunks")
        completion = chunks if isinstance(chunks, int) else 0
    if not isinstance(prompt, int):
        prompt = 0
    total = usage.get("total_tokens")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total if isinstance(total, int) else prompt + completion,
    }


class _Trace:
    """What every kind of response reports in its ``toolforge`` field."""

    def __init__(self, stream_id: str, mode: str) -> None:
        self.ext: dict[str, Any] = {"stream_id": stream_id, "mode": mode}
        self.server_tools: list[dict[str, Any]] = []
        self.handed = 0

    def frame(self, event: str, data: Mapping[str, Any]) -> None:
        if event == TOOL_CALL and data.get("executor") == "client":
            self.handed += 1
        elif event == TOOL_CALL:
            self.server_tools.append({"id": data["id"], "name": data["name"], "args": data["args"]})
        elif event == TOOL_RESULT:
            for call in self.server_tools:
                if call["id"] == data["id"]:
                    call["ok"] = data["ok"]
                    call["result" if data["ok"] else "error"] = data.get(
                        "result" if data["ok"] else "error"
                    )
                    break
            else:  # a call refused before it ran (a workflow's rule): a result alone
                self.server_tools.append(
                    {"id": data["id"], "name": data["name"], "ok": False, "error": data["error"]}
                )
        elif event == RESULT_END:
            self.ext["repaired"] = data["repaired"]
            self.ext["degraded"] = data["degraded"]
            if "diagnostics" in data:
                self.ext["diagnostics"] = data["diagnostics"]
        elif event == DONE:
            self.ext["guardrails"] = dict(data.get("guardrails") or {})
            if self.server_tools:
                self.ext["server_tools"] = self.server_tools
            if data.get("workflow") is not None:
                self.ext["workflow"] = data["workflow"]


class ChunkWriter:
    """The streaming response: each batch of encoded frames from the frame log (SSE
    bytes, ``encode_frame``'s) in, ``chat.completion.chunk`` SSE lines out."""

    def __init__(
        self,
        *,
        stream_id: str,
        completion_id: str,
        created: int,
        model: str,
        include_usage: bool,
        mode: str,
        workflow: bool = False,
    ) -> None:
        self._include_usage = include_usage
        self._trace = _Trace(stream_id, mode)
        self._answer = WorkflowAnswer() if workflow else None
        self._calls = 0
        head = orjson.dumps(
            {"id": completion_id, "object": "chat.completion.chunk", "created": created}
        )[:-1]
        model_json = orjson.dumps(model)
        # Per token: the template, with the frame's own JSON string spliced in (it is
        # already escaped) — no dict built, no dumps (bench/gateway.py's proxy arm).
        self._prefix = b"data: " + head + b',"model":' + model_json + b',"choices":[{"index":0,'
        self._text_head = self._prefix + b'"delta":{"content":'
        self._text_tail = b'},"finish_reason":null}]}\n\n'
        self.started = False
        self.ended = False

    def first(self) -> bytes:
        """The first chunk: the assistant's role."""
        self.started = True
        return self._chunk({"role": "assistant", "content": ""}, None)

    def _chunk(self, delta: Mapping[str, Any], finish: str | None) -> bytes:
        return (
            self._prefix
            + b'"delta":'
            + orjson.dumps(delta)
            + b',"finish_reason":'
            + orjson.dumps(finish)
            + b"}]}\n\n"
        )

    def _whole(self, body: Mapping[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def batch(self, encoded: bytes) -> bytes:
        """The chunks for one batch of encoded frames (several ``id/event/data`` blocks)."""
        out: list[bytes] = []
        text = self._answer is None  # a workflow's text between calls is not the answer
        for block in encoded.split(END):
            if not block:
                continue
            event, data = event_data(block)
            if event == b"text.delta":  # the per-token path: {"chunk":"..."} spliced in
                if text:
                    out.append(self._text_head + data[9:-1] + self._text_tail)
                continue
            out.append(self.frame(event.decode(), orjson.loads(data)))
        return b"".join(out)

    def frame(self, event: str, data: Mapping[str, Any]) -> bytes:
        """The chunk(s) for one frame, or nothing."""
        self._trace.frame(event, data)
        answer = self._answer
        if answer is not None and event != DONE:
            answer.frame(event, data)
            if event in (TEXT_DELTA, RESULT_END):
                return b""  # held: the run's answer is known at its end
        if event == TEXT_DELTA:
            return self._chunk({"content": data["chunk"]}, None)
        if event == REASONING_DELTA:
            return self._chunk({"reasoning_content": data["chunk"]}, None)
        if event == RESULT_END:
            return self._chunk({"content": orjson.dumps(data["value"]).decode()}, None)
        if event == TOOL_CALL and data.get("executor") == "client":
            index = self._calls
            self._calls += 1
            call = {
                "index": index,
                "id": data["id"],
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": orjson.dumps(data["args"]).decode(),
                },
            }
            return self._chunk({"tool_calls": [call]}, None)
        if event == ERROR:
            self.ended = True
            body = error_body(data["code"], data["message"])
            body["error"]["retryable"] = data["retryable"]
            return self._whole(body) + DONE_LINE
        if event == DONE:
            if self.ended:  # the error chunk ended the response already
                return b""
            self.ended = True
            finish = finish_reason(data["reason"], self._trace.handed > 0)
            last = b""
            if answer is not None and answer.text is not None and data["reason"] == "stop":
                last = self._chunk({"content": answer.text}, None)
            last += self._chunk({}, finish)[:-3] + b',"toolforge":'
            last += orjson.dumps(self._trace.ext) + b"}\n\n"
            if self._include_usage:
                usage = orjson.loads(self._prefix[6:] + b'"delta":{}}]}')
                usage["choices"] = []
                usage["usage"] = _usage(data["usage"])
                last += self._whole(usage)
            return last + DONE_LINE
        return b""


class CompletionBuilder:
    """The non-streaming response: the stream's frames in, one ``chat.completion`` out."""

    def __init__(
        self,
        *,
        stream_id: str,
        completion_id: str,
        created: int,
        model: str,
        mode: str,
        workflow: bool = False,
    ) -> None:
        self._head = {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
        }
        self._trace = _Trace(stream_id, mode)
        self._answer = WorkflowAnswer() if workflow else None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self.error: Mapping[str, Any] | None = None
        self._done: Mapping[str, Any] | None = None

    def feed(self, events: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        for event, data in events:
            self._trace.frame(event, data)
            if self._answer is not None and event in HELD:
                self._answer.frame(event, data)
                continue
            if event == TEXT_DELTA:
                self._content.append(data["chunk"])
            elif event == REASONING_DELTA:
                self._reasoning.append(data["chunk"])
            elif event == RESULT_END:
                self._content.append(orjson.dumps(data["value"]).decode())
            elif event == TOOL_CALL and data.get("executor") == "client":
                self._calls.append(
                    {
                        "id": data["id"],
                        "type": "function",
                        "function": {
                            "name": data["name"],
                            "arguments": orjson.dumps(data["args"]).decode(),
                        },
                    }
                )
            elif event == ERROR:
                self.error = data
            elif event == DONE:
                self._done = data

    def build(self) -> dict[str, Any]:
        done = self._done or {"reason": "stop", "usage": {}}
        if self._answer is not None and self._answer.text is not None:
            self._content = [self._answer.text]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._content) if self._content or not self._calls else None,
        }
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = self._calls
        return {
            **self._head,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(done["reason"], bool(self._calls)),
                }
            ],
            "usage": _usage(done["usage"]),
            "toolforge": self._trace.ext,
        }

    @property
    def toolforge(self) -> Mapping[str, Any]:
        return self._trace.ext
