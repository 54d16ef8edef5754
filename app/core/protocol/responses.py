"""The Responses API wire (Open Responses), written from the engine's frames. Pure.

``POST /v1/responses`` runs the same plan, engine and session as the OpenAI-compatible
proxy (docs/responses.md): its request becomes the proxy's neutral request
(:func:`chat_messages` turns the input items into chat messages), and the frames that land
in the frame log are written here as the semantic events of the Responses API, each with
its ``sequence_number`` (from 0, one per event, no gaps):

    frame                         events
    ----------------------------  ------------------------------------------------------------
    (start)                       response.created, response.in_progress
    text.delta                    (a message item opens: output_item.added,
                                  content_part.added) response.output_text.delta
    result.end (a JSON answer)    as text.delta, the value as JSON text
    reasoning.delta               (a reasoning item opens) response.reasoning.delta
    tool.call                     the open item closes; a function_call item:
                                  output_item.added, function_call_arguments.delta (the
                                  whole arguments, validated JSON: never a prefix that does
                                  not parse), function_call_arguments.done, output_item.done
    tool.result of a server tool  a function_call_output item (the call's call_id, the
                                  result as JSON text): output_item.added, output_item.done.
                                  A client tool's call has no output item: the client
                                  answers it (previous_response_id). Server tools are also
                                  listed in the ``toolforge`` field
    error                         remembered; the response ends ``failed`` with it
    done                          the open item closes (…text.done, content_part.done,
                                  output_item.done), then response.completed, or
                                  response.incomplete (the token limit, a cancel), or
                                  response.failed (an error)

A workflow run (``toolforge.workflow``) answers with its terminal tool's result, as on the
proxy: the text between calls is held back, and the last ``result.end`` (a ``respond``
call's words, or the result as JSON) is the message, written at ``done``.

:class:`ResponseWriter` is both the streaming encoder (:meth:`ResponseWriter.batch`, SSE
bytes in and out) and the builder of the one response object that a non-streaming request
returns and ``GET /v1/responses/{id}`` reads (:meth:`ResponseWriter.resource`). The time
comes in as an argument: ``completed_at`` is the caller's clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

from toolforge.core.input_content import check_parts
from toolforge.core.native_tools import to_openai_name
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
    "CANCELLED_REASONS",
    "ResponseWriter",
    "chat_messages",
    "check_content",
    "output_items_of",
    "sse_event",
]

# done.reason values that mean the response was stopped before its end.
CANCELLED_REASONS: Final = frozenset({"cancelled", "client_disconnected", "shutdown"})
_ROLES: Final = frozenset({"user", "system", "developer", "assistant"})
_TEXT_DELTA_HEAD: Final = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":'
)
_TEXT_DELTA_TAIL: Final = b',"logprobs":[]}\n\n'


def sse_event(event: Mapping[str, Any]) -> bytes:
    """One event as SSE: its ``type`` is the SSE event name too (as OpenAI sends them)."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if not isinstance(completion, int):
        chunks = usage.get("completion_chunks")
        completion = chunks if isinstance(chunks, int) else 0
    prompt = prompt if isinstance(prompt, int) else 0
    total = usage.get("total_tokens")
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": total if isinstance(total, int) else prompt + completion,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


class ResponseWriter:
    """One response's events and its object, from the stream's frames (module docstring).

    ``echo``: the request's fields as the response object repeats them (model, tools,
    tool_choice, text, temperature, ...), built by the route. ``stream_id`` and ``mode``
    go in the ``toolforge`` extension field, with what the guardrails did and the server
    tools' calls."""

    def __init__(
        self,
        *,
        response_id: str,
        created_at: int,
        echo: Mapping[str, Any],
        stream_id: str,
        mode: str,
        workflow: bool = False,
    ) -> None:
        self.id = response_id
        # A workflow run answers with its terminal tool's result, at its end: the model's
        # text between calls is not the answer (it stays in the artifacts), as on the proxy.
        self._answer = WorkflowAnswer() if workflow else None
        self._key = response_id.removeprefix("resp_")
        self._created_at = created_at
        self._echo = dict(echo)
        self._seq = 0
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self._incomplete: dict[str, str] | None = None
        self._usage: dict[str, Any] | None = None
        self._completed_at: int | None = None
        self._open: dict[str, Any] | None = None  # the message or reasoning item being written
        # the open item's text, as JSON strings (the frames' own bytes on the per-token path)
        self._text: list[bytes] = []
        self._delta_head = b""  # the open message's output_text.delta, up to its delta
        self._items = 0
        self.toolforge: dict[str, Any] = {"stream_id": stream_id, "mode": mode}
        self._server_tools: list[dict[str, Any]] = []
        self.started = False
        self.ended = False

    @property
    def echo(self) -> Mapping[str, Any]:
        """The request's fields as the response object repeats them."""
        return self._echo

    # -- the response object ---------------------------------------------------------------

    def resource(self) -> dict[str, Any]:
        """The response object as it stands (in_progress until ``done``)."""
        echo = self._echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._created_at,
            "completed_at": self._completed_at,
            "status": self.status,
            "incomplete_details": self._incomplete,
            "model": echo.get("model", ""),
            "previous_response_id": echo.get("previous_response_id"),
            "instructions": echo.get("instructions"),
            "output": [dict(item) for item in self.output],
            "error": self.error,
            "tools": echo.get("tools", []),
            "tool_choice": echo.get("tool_choice", "auto"),
            "truncation": "disabled",
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "text": echo.get("text", {"format": {"type": "text"}}),
            "top_p": echo.get("top_p", 1.0),
            "presence_penalty": echo.get("presence_penalty", 0.0),
            "frequency_penalty": echo.get("frequency_penalty", 0.0),
            "top_logprobs": 0,
            "temperature": echo.get("temperature", 1.0),
            "reasoning": echo.get("reasoning"),
            "usage": self._usage,
            "max_output_tokens": echo.get("max_output_tokens"),
            "max_tool_calls": echo.get("max_tool_calls"),
            "store": echo.get("store", True),
            "background": False,
            "service_tier": "default",
            "metadata": echo.get("metadata") or {},
            "safety_identifier": echo.get("safety_identifier"),
            "prompt_cache_key": None,
            "toolforge": dict(self.toolforge),
        }

    @property
    def output_text(self) -> str:
        """The text of the response's message items, joined (the SDKs' ``output_text``)."""
        return "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )

    # -- events ----------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``: the first two events."""
        self.started = True
        return [
            self._event("response.created", response=self.resource()),
            self._event("response.in_progress", response=self.resource()),
        ]

    def _item_id(self, prefix: str) -> str:
        self._items += 1
        return f"{prefix}_{self._key}_{self._items}"

    def _begin(self, kind: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        open_ = self._open
        if open_ is not None and open_["type"] == kind:
            return open_
        self._close(out)
        if kind == "message":
            item: dict[str, Any] = {
                "type": "message",
                "id": self._item_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part: dict[str, Any] = {
                "type": "output_text",
                "text": "",
                "annotations": [],
                "logprobs": [],
            }
        else:
            item = {"type": "reasoning", "id": self._item_id("rs"), "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        index = len(self.output)
        self.output.append(item)
        self._open = item
        self._text = []
        self._delta_head = (
            b'"item_id":' + orjson.dumps(item["id"]) + b',"output_index":%d' % index
            + b',"content_index":0,"delta":'
        )  # fmt: skip
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        out.append(
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        )
        return item

    def _close(self, out: list[dict[str, Any]]) -> None:
        item = self._open
        if item is None:
            return
        self._open = None
        index = self.output.index(item)
        text = "".join(orjson.loads(b"[" + b",".join(self._text) + b"]"))
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "message":
            part: dict[str, Any] = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": [],
            }
            out.append(self._event("response.output_text.done", **where, text=text, logprobs=[]))
            item["status"] = "completed"
        else:
            part = {"type": "reasoning_text", "text": text}
            out.append(self._event("response.reasoning.done", **where, text=text))
        out.append(self._event("response.content_part.done", **where, part=part))
        item["content"] = [part]
        out.append(self._event("response.output_item.done", output_index=index, item=dict(item)))

    def _delta(self, kind: str, chunk: str, out: list[dict[str, Any]]) -> None:
        item = self._begin(kind, out)
        self._text.append(orjson.dumps(chunk))
        name = "response.output_text.delta" if kind == "message" else "response.reasoning.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        out.append(
            self._event(
                name,
                item_id=item["id"],
                output_index=len(self.output) - 1,
                content_index=0,
                delta=chunk,
                **extra,
            )
        )

    def _call(self, data: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        self._close(out)
        arguments = orjson.dumps(data["args"]).decode()
        item: dict[str, Any] = {
            "type": "function_call",
            "id": self._item_id("fc"),
            "call_id": data["id"],
            "name": data["name"],
            "arguments": "",
            "status": "in_progress",
        }
        index = len(self.output)
        self.output.append(item)
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        where = {"item_id": item["id"], "output_index": index}
        out.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
        out.append(
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=data["name"],
                arguments=arguments,
            )
        )
        item["arguments"] = arguments
        item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=index, item=dict(item)))

    def _call_output(self, data: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        """A server tool's result: a ``function_call_output`` item answering its call's
        ``function_call`` item (the same ``call_id``), its output as JSON text."""
        ok = data["ok"]
        output = orjson.dumps(data.get("result") if ok else {"error": data.get("error")})
        item: dict[str, Any] = {
            "type": "function_call_output",
            "id": self._item_id("fco"),
            "call_id": data["id"],
            "output": "",
            "status": "in_progress",
        }
        index = len(self.output)
        self.output.append(item)
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        item["output"] = output.decode()
        item["status"] = "completed"
        out.append(self._event("response.output_item.done", output_index=index, item=dict(item)))

    def _server_tool(self, event: str, data: Mapping[str, Any]) -> bool:
        """The server tools' trace (the ``toolforge`` field); for a result, whether its
        call was seen (a call refused before it ran has a result alone, and no item)."""
        if event == TOOL_CALL:
            self._server_tools.append(
                {"id": data["id"], "name": data["name"], "args": data["args"]}
            )
            return True
        called = True
        for call in self._server_tools:
            if call["id"] == data["id"]:
                break
        else:  # refused before it ran (a workflow's rule): the result alone
            call = {"id": data["id"], "name": data["name"]}
            self._server_tools.append(call)
            called = False
        call["ok"] = data["ok"]
        call["result" if data["ok"] else "error"] = data.get("result" if data["ok"] else "error")
        return called

    def frame(self, event: str, data: Mapping[str, Any], *, now: int) -> list[dict[str, Any]]:
        """The events for one frame (maybe none). ``now``: the caller's clock, in Unix
        seconds, for ``completed_at``."""
        out: list[dict[str, Any]] = []
        if self._answer is not None and event in HELD:
            self._answer.frame(event, data)
        elif event == TEXT_DELTA:
            self._delta("message", data["chunk"], out)
        elif event == REASONING_DELTA:
            self._delta("reasoning", data["chunk"], out)
        elif event == RESULT_END:
            self._delta("message", orjson.dumps(data["value"]).decode(), out)
            self.toolforge["repaired"] = data["repaired"]
            self.toolforge["degraded"] = data["degraded"]
        elif event == TOOL_CALL:
            if data.get("executor") != "client":
                self._server_tool(event, data)
            self._call(data, out)
        elif event == TOOL_RESULT:
            if self._server_tool(event, data):
                self._call_output(data, out)
        elif event == ERROR:
            self.error = {"code": str(data["code"]), "message": data["message"]}
        elif event == DONE:
            self._finish(data, now, out)
        return out

    def _finish(self, data: Mapping[str, Any], now: int, out: list[dict[str, Any]]) -> None:
        if data.get("workflow") is not None:
            self.toolforge["workflow"] = data["workflow"]
        answer = None if self._answer is None else self._answer.text
        if answer is not None and self.error is None and data["reason"] == "stop":
            self._delta("message", answer, out)
        self._close(out)
        self.ended = True
        self._usage = _usage(data.get("usage") or {})
        self._completed_at = now
        self.toolforge["guardrails"] = dict(data.get("guardrails") or {})
        if self._server_tools:
            self.toolforge["server_tools"] = self._server_tools
        reason = data["reason"]
        if self.error is not None:
            self.status, kind = "failed", "response.failed"
        elif reason == "length":
            self.status, kind = "incomplete", "response.incomplete"
            self._incomplete = {"reason": "max_output_tokens"}
        elif reason in CANCELLED_REASONS:
            self.status, kind = "cancelled", "response.incomplete"
            self._incomplete = {"reason": reason}
        else:
            self.status, kind = "completed", "response.completed"
        out.append(self._event(kind, response=self.resource()))

    def feed(self, events: Iterable[tuple[str, Mapping[str, Any]]], *, now: int) -> None:
        """Every frame of a stream at once (the non-streaming response)."""
        if not self.started:
            self.start()
        for event, data in events:
            self.frame(event, data, now=now)

    def batch(self, encoded: bytes, *, now: int) -> bytes:
        """The SSE events for one batch of encoded frames (``id/event/data`` blocks), with
        the first two events in front of the first batch."""
        out = [sse_event(event) for event in self.start()] if not self.started else []
        join = b"".join
        in_text = self._in_text()  # a message item is open: text deltas take the fast path
        for block in encoded.split(b"\n\n"):
            if not block:
                continue
            # b"id: N\nevent: NAME\ndata: JSON" (orjson leaves no newline in the JSON)
            _, event_line, data_line = block.split(b"\n", 2)
            if in_text and event_line == b"event: text.delta":
                # The per-token path: the frame's JSON string spliced into the event, no
                # dict built (the same bytes as sse_event's, tests/core/test_wire_encoders.py);
                # one join, not four concatenations (bench.gateway --formats, B2).
                chunk = data_line[15:-1]  # data: {"chunk":<this>}
                self._text.append(chunk)
                seq = self._seq
                self._seq = seq + 1
                out.append(
                    join(
                        (_TEXT_DELTA_HEAD, b"%d," % seq, self._delta_head, chunk, _TEXT_DELTA_TAIL)
                    )
                )
                continue
            events = self.frame(event_line[7:].decode(), orjson.loads(data_line[6:]), now=now)
            out.extend(sse_event(event) for event in events)
            in_text = self._in_text()
        return join(out)

    def _in_text(self) -> bool:
        open_ = self._open
        return open_ is not None and open_["type"] == "message"


# -- input items -> chat messages ---------------------------------------------------------------


def _bad(field: str, message: str) -> RequestError:
    return RequestError(
        ErrorCode.BAD_REQUEST,
        f"invalid '{field}': {message}",
        details=[{"field": field, "message": message}],
        http_status=400,
    )


def _part(part: Any, field: str) -> dict[str, Any]:
    """One content part as a Chat Completions part."""
    if not isinstance(part, Mapping):
        raise _bad(field, "a content part is an object with a 'type'")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _bad(field, "an input_image needs 'image_url' (a URL or a data: URL)")
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        file: dict[str, Any] = {}
        for key in ("file_data", "filename", "file_id"):
            if isinstance(part.get(key), str):
                file[key] = part[key]
        if "file_data" not in file and "file_id" not in file:
            raise _bad(field, "an input_file needs 'file_data' (a data: URL) or 'file_id'")
        return {"type": "file", "file": file}
    raise _bad(
        field,
        f"content type {kind!r} is not supported: use input_text, input_image, input_file "
        "(or output_text in an assistant message)",
    )


def _content(content: Any, field: str) -> str | list[dict[str, Any]]:
    """A message's content: a string stays a string, and so do text-only parts (joined),
    which every chat template reads; parts with an image or a file stay parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or not content:
        raise _bad(field, "content is a string or a non-empty list of content parts")
    parts = [_part(part, f"{field}[{i}]") for i, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _wire_name(name: str) -> str:
    try:
        return to_openai_name(name)
    except ValueError:  # not one the gateway offers natively: the model gets it as written
        return name


def chat_messages(items: Sequence[Any], instructions: str | None) -> list[dict[str, Any]]:
    """The chat messages of a response's input items (and ``instructions``, first, as a
    system message). A run of ``function_call`` items is one assistant message with
    ``tool_calls`` (joined to the assistant text right before it); a
    ``function_call_output`` is a ``tool`` message; ``reasoning`` items are not sent back
    to the model (the proxy sends none either). Anything else is refused by name."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    last_calls: list[dict[str, Any]] | None = None  # the tool_calls being gathered
    for i, item in enumerate(items):
        field = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(field, "an input item is an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{field}.role", f"{role!r}: use user, system, developer or assistant")
            content = _content(item.get("content"), f"{field}.content")
            messages.append({"role": role, "content": content})
            last_calls = None
        elif kind == "function_call":
            call_id, name, arguments = (item.get(k) for k in ("call_id", "name", "arguments"))
            if not (isinstance(call_id, str) and isinstance(name, str)):
                raise _bad(field, "a function_call needs 'call_id' and 'name'")
            if not isinstance(arguments, str):
                raise _bad(f"{field}.arguments", "the arguments are a JSON string")
            call = {
                "id": call_id,
                "type": "function",
                # as the engine writes its own calls to the model: a server tool's dots are
                # '__' on the wire (places.search is places__search)
                "function": {"name": _wire_name(name), "arguments": arguments},
            }
            if last_calls is None:
                previous = messages[-1] if messages else None
                if previous is not None and previous["role"] == "assistant":
                    last_calls = previous.setdefault("tool_calls", [])
                else:
                    last_calls = []
                    messages.append(
                        {"role": "assistant", "content": None, "tool_calls": last_calls}
                    )
            last_calls.append(call)
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _bad(field, "a function_call_output needs the 'call_id' it answers")
            if not isinstance(output, str):
                text = _content(output, f"{field}.output")
                output = text if isinstance(text, str) else orjson.dumps(text).decode()
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            last_calls = None
        elif kind == "reasoning":
            continue
        else:
            raise _bad(
                f"{field}.type",
                f"{kind!r} items are not supported: send message, function_call, "
                "function_call_output or reasoning items (previous_response_id carries a "
                "stored conversation)",
            )
    return messages


_PART_KINDS: Final = {"input_image": "image", "input_file": "file"}


def check_content(items: Sequence[Any], accepts: frozenset[str], upstream: str) -> None:
    """Refuse, by its place in ``input``, the first image or file part that the upstream
    (``UPSTREAM_KIND`` ``upstream``) is not sent: it takes only the kinds in ``accepts``
    (:func:`toolforge.core.input_content.accepted_input`). Call it on items that
    :func:`chat_messages` has read. The proxy's check is the same function
    (:func:`toolforge.core.input_content.check_parts`)."""
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        where = "output" if item.get("type") == "function_call_output" else "content"
        check_parts(item.get(where), f"input[{i}].{where}", accepts, upstream, _PART_KINDS)


def output_items_of(resource: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The output items of a stored response that go on into the next one's context."""
    return [dict(item) for item in resource.get("output", ())]
