"""AG-UI: ``POST /v1/agui`` runs an agent as the AG-UI protocol says, over SSE
(docs/agui.md).

Thin: the body is the protocol's ``RunAgentInput`` (checked with the ``ag-ui-protocol``
package's own model), translated into the OpenAI-compatible proxy's request — the run's
messages (a user's images and documents as Chat Completions parts, refused by name where
the upstream cannot read them, as on the proxy), its ``tools`` as the client's functions
(AG-UI's frontend tools), its ``context`` as a system message, ``forwardedProps.toolforge``
as the proxy's extension — and started like every stream
(:meth:`toolforge.runtime.stream_service.Streams.open`). The frames are written by
:class:`toolforge.core.protocol.agui.RunWriter`.

An approval is an interrupt: the run finishes with it while the stream waits for the
decision; the next run's ``resume`` sends it (a ``Approve`` command, on whichever replica
runs the stream) and carries on from the frame after the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson
from ag_ui.core import (
    DataSource,
    DocumentPart,
    FileSource,
    ImagePart,
    RunAgentInput,
    TextPart,
    ToolMessage,
    UrlSource,
)
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from toolforge.api.auth import ApiKey, request_key
from toolforge.api.body import ClientGone, read_body
from toolforge.api.deps import Gateway, GatewayDep
from toolforge.api.json_depth import check_depth
from toolforge.api.models import ChatCompletionRequest, ToolForgeExtension
from toolforge.api.proxy import chat_planner
from toolforge.api.remote_run import RemoteRunResponse
from toolforge.api.retry_after import retry_headers
from toolforge.api.run_stream import RunStreamResponse
from toolforge.api.stream_slot import SlotHeld, StreamSlot
from toolforge.core.input_content import accepted_input, check_parts
from toolforge.core.protocol.agui import RunWriter, parse_interrupt_id
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.cluster import RemoteStream
from toolforge.runtime.commands import Approve
from toolforge.runtime.stream_service import Started

__all__ = ["router"]

router = APIRouter(tags=["agui"])


def _bad(message: str, field: str = "(body)") -> RequestError:
    return RequestError(
        ErrorCode.BAD_REQUEST,
        message,
        details=[{"field": field, "message": message}],
        http_status=422,
    )


def _parse(body: bytes, max_depth: int) -> RunAgentInput:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"the body is not valid JSON: {exc}") from exc
    check_depth(body, raw, max_depth)
    try:
        return RunAgentInput.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise _bad(f"invalid '{field}': {first['msg']}", field) from exc


def _text(content: Any, field: str) -> str:
    """A message's content as text: a string, or text parts (other parts are refused)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(content or ()):
        text = getattr(part, "text", None)
        if getattr(part, "type", None) != "text" or not isinstance(text, str):
            raise _bad(
                f"content part type {getattr(part, 'type', None)!r} is not supported: send text",
                f"{field}[{i}]",
            )
        parts.append(text)
    return "".join(parts)


def _part(part: Any, field: str) -> dict[str, Any]:
    """A user message's content part as a Chat Completions part: an image as
    ``image_url`` (its URL, or its bytes as a data: URL), a document as ``file`` (its
    bytes as ``file_data``, or the provider's handle as ``file_id``). What Chat
    Completions cannot carry is refused by name."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart | DocumentPart):
        source = part.source
        data = (
            f"data:{source.mime_type};base64,{source.value}"
            if isinstance(source, DataSource)
            else None
        )
        if isinstance(part, ImagePart):
            if isinstance(source, FileSource):
                raise _bad(
                    "an image by a provider's file handle cannot be passed on: send its "
                    "bytes (a data source) or its URL",
                    field,
                )
            return {"type": "image_url", "image_url": {"url": data or source.value}}
        if isinstance(source, UrlSource):
            raise _bad(
                "a document by URL cannot be passed on: send its bytes (a data source) or "
                "the provider's file handle",
                field,
            )
        file: dict[str, Any] = {"file_data": data} if data else {"file_id": source.value}
        meta = part.metadata
        if isinstance(meta, dict) and isinstance(meta.get("filename"), str):
            file["filename"] = meta["filename"]
        return {"type": "file", "file": file}
    raise _bad(
        f"content part type {getattr(part, 'type', None)!r} is not passed on: send text, "
        "image or document parts",
        field,
    )


def _user_content(content: Any, field: str) -> str | list[dict[str, Any]]:
    """A user message's content: a string, text parts joined (every chat template reads
    a string), or Chat Completions parts where it holds an image or a document."""
    if isinstance(content, str):
        return content
    parts = [_part(part, f"{field}[{j}]") for j, part in enumerate(content or ())]
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


# An AG-UI content part's type -> the kind of content it is (core/input_content).
_PART_KINDS: Final[Mapping[str, str]] = MappingProxyType({"image": "image", "document": "file"})


def check_content(run: RunAgentInput, accepts: frozenset[str], upstream: str) -> None:
    """Refuse, by its place in the run's ``messages``, the first image or document part
    the upstream (``UPSTREAM_KIND`` ``upstream``) is not sent: the check the proxy and the
    Responses API make (:func:`toolforge.core.input_content.check_parts`), a 400 naming
    ``messages[i].content[j]``. Call it on a run :func:`chat_messages` has read."""
    for i, message in enumerate(run.messages):
        content = getattr(message, "content", None)
        if message.role == "user" and isinstance(content, list):
            types = [{"type": getattr(part, "type", None)} for part in content]
            check_parts(types, f"messages[{i}].content", accepts, upstream, _PART_KINDS)


def chat_messages(run: RunAgentInput) -> list[dict[str, Any]]:
    """The run's messages (and its context, first) as chat messages. Reasoning and
    activity messages are the front-end's own: they are not sent to the model."""
    out: list[dict[str, Any]] = []
    if run.context:
        lines = "\n".join(f"- {c.description}: {c.value}" for c in run.context)
        out.append({"role": "system", "content": f"Context:\n{lines}"})
    for i, message in enumerate(run.messages):
        role = message.role
        field = f"messages[{i}].content"
        if role == "user":
            out.append({"role": "user", "content": _user_content(message.content, field)})
        elif role in ("system", "developer"):
            out.append({"role": "system", "content": _text(message.content, field)})
        elif role == "assistant":
            said: dict[str, Any] = {"role": "assistant", "content": message.content}
            calls = getattr(message, "tool_calls", None)
            if calls:
                said["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                    for call in calls
                ]
            out.append(said)
        elif isinstance(message, ToolMessage):
            content = message.content
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": content if isinstance(content, str) else _text(content, field),
                }
            )
    return out


def _request(gw: Gateway, run: RunAgentInput) -> ChatCompletionRequest:
    props = run.forwarded_props if isinstance(run.forwarded_props, dict) else {}
    try:
        extension = ToolForgeExtension.model_validate(props.get("toolforge") or {})
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(["forwardedProps", "toolforge", *(str(p) for p in first["loc"])])
        raise _bad(f"invalid '{field}': {first['msg']}", field) from exc
    messages = chat_messages(run)
    # An image or document the upstream is not sent is refused by name, before any model
    # call (docs/agui.md, "Images and documents"), as on the proxy.
    settings = gw.settings
    kind = settings.upstream_kind
    check_content(run, accepted_input(kind, settings.upstream_input), kind)
    body: dict[str, Any] = {
        "model": props.get("model") or settings.model_id,
        "messages": messages,
        "stream": True,
    }
    if run.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or {"type": "object"},
                },
            }
            for tool in run.tools
        ]
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise _bad(str(first["msg"]).removeprefix("Value error, ")) from exc
    return request.model_copy(update={"toolforge": extension})


@router.post("/v1/agui", summary="Run an agent over AG-UI (SSE)", response_model=None)
async def run_agent(request: Request, gw: GatewayDep) -> Response:
    key = request_key(request)
    try:
        body = await read_body(
            request.receive, request.headers.get("content-length"), gw.settings.max_body_bytes
        )
        run = _parse(body, gw.settings.max_request_depth)
        if run.resume:
            return await _resume(gw, run, key)
        req = _request(gw, run)
        # The run may stop at an approval: its stream waits for the next request.
        plan = chat_planner(gw, req, key, api="agui", waits_at_approval=True)

        slot = await StreamSlot.take(request.app, key)  # one of the key's streams
        try:
            with slot.starting():
                opened = await gw.streams.open(plan, owner=None if key is None else key.name)
        except BaseException:
            await slot.release()
            raise
    except ToolForgeError as exc:
        return JSONResponse(
            {"error": exc.to_dict()}, status_code=exc.http_status, headers=retry_headers(exc)
        )
    except ClientGone:
        return Response(status_code=499)
    assert isinstance(opened, Started)
    session = opened.session
    writer = RunWriter(
        thread_id=run.thread_id,
        run_id=run.run_id,
        stream_id=session.id,
        workflow=session.plan.workflow is not None,
    )
    return SlotHeld(RunStreamResponse(session, writer, after=0, primary=True), slot)


async def _resume(gw: Gateway, run: RunAgentInput, key: ApiKey | None) -> Response:
    """A run that answers an interrupt: the decision goes to the stream, and the run
    carries on from the frame after the call."""
    if len(run.resume or ()) != 1:
        raise _bad("'resume' answers one interrupt: the one the last run finished with", "resume")
    entry = (run.resume or [])[0]
    found = parse_interrupt_id(entry.interrupt_id)
    if found is None:
        raise _bad(f"interrupt {entry.interrupt_id!r} is not one of this gateway's", "resume")
    stream_id, call_id, after = found
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    approved = entry.status == "resolved" and payload.get("approve") is True
    await gw.streams.command(
        stream_id, Approve(call_id, approved), None if key is None else key.name
    )
    stream = await gw.streams.find(stream_id, None if key is None else key.name)
    if isinstance(stream, RemoteStream):
        # Another replica runs it: its mirrored frames, re-encoded here. Whether it is a
        # workflow run is the plan's, which lives there: this run names it as the first did.
        props = run.forwarded_props if isinstance(run.forwarded_props, dict) else {}
        named = props.get("toolforge")
        workflow = isinstance(named, dict) and named.get("workflow") is not None
        writer = RunWriter(
            thread_id=run.thread_id, run_id=run.run_id, stream_id=stream_id, workflow=workflow
        )
        return RemoteRunResponse(stream, writer, after=after)
    writer = RunWriter(
        thread_id=run.thread_id,
        run_id=run.run_id,
        stream_id=stream_id,
        workflow=stream.plan.workflow is not None,
    )
    return RunStreamResponse(stream, writer, after=after, primary=stream.reader_joined(after))
