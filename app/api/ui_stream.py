"""The AI SDK's UI message stream: ``POST /v1/ui/chat`` takes what ``useChat``'s
``DefaultChatTransport`` posts and answers with the stream it reads
(``x-vercel-ai-ui-message-stream: v1``), docs/ui-stream.md.

Thin: the UI messages become the OpenAI-compatible proxy's request
(:func:`toolforge.core.protocol.ai_sdk_ui.chat_messages`; a file part the upstream cannot
read is refused by name, as on the proxy), started like every stream;
:class:`toolforge.core.protocol.ai_sdk_ui.UIStreamWriter` writes its frames. A request
whose last assistant message answers one of the gateway's approval requests sends the
decision to the waiting stream and goes on with the same message from the call on.

``POST /v1/stream`` answers the same way when asked (a ``format=ui`` query parameter, or
an ``Accept`` media range with ``x-vercel-ai-ui-message-stream=v1``): the gateway's entry
hands such a request to this route (:func:`ui_chat_scope`), so both paths are one handler,
with the same access, limits, admission, approvals and errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Scope

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
from toolforge.core.protocol.ai_sdk_ui import (
    HEADERS,
    UIStreamWriter,
    approval_answer,
    chat_messages,
    file_kind,
)
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.cluster import RemoteStream
from toolforge.runtime.commands import Approve
from toolforge.runtime.stream_service import Started

__all__ = [
    "ACCEPT_PARAMETER",
    "FORMAT_PARAMETER",
    "UI_CHAT_PATH",
    "UIChatRequest",
    "router",
    "ui_chat_scope",
]

router = APIRouter(tags=["ui-stream"])

UI_CHAT_PATH: Final = "/v1/ui/chat"
_STREAM_PATH: Final = "/v1/stream"
# How a request asks /v1/stream for the UI message stream (docs/ui-stream.md, "On
# /v1/stream"): the query parameter, for clients that only set a URL, and the Accept
# parameter, named after the header the SDK checks on the response.
FORMAT_PARAMETER: Final = "format"
_FORMAT_UI: Final = "ui"
ACCEPT_PARAMETER: Final = "x-vercel-ai-ui-message-stream"
_ACCEPT_VERSION: Final = "v1"
_FORMAT_NEEDLE: Final = FORMAT_PARAMETER.encode() + b"="
_ACCEPT_NEEDLE: Final = ACCEPT_PARAMETER.encode()


def _asked(scope: Scope) -> tuple[list[str], list[str]]:
    """The request's ``format`` values and the values its ``Accept`` header gives
    ``x-vercel-ai-ui-message-stream``, in order (both empty: it asks for neither)."""
    formats: list[str] = []
    query: bytes = scope.get("query_string", b"")
    if _FORMAT_NEEDLE in query:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        formats = [value for name, value in pairs if name == FORMAT_PARAMETER]
    versions: list[str] = []
    for name, value in scope["headers"]:
        if name == b"accept" and _ACCEPT_NEEDLE in value.lower():
            for media_range in value.decode("latin-1").split(","):
                for parameter in media_range.split(";")[1:]:
                    key, _, given = parameter.partition("=")
                    if key.strip().lower() == ACCEPT_PARAMETER:
                        versions.append(given.strip().strip('"'))
    return formats, versions


def ui_chat_scope(scope: Scope) -> Scope:
    """For a ``POST /v1/stream`` that asks for the UI message stream (any ``format``
    value, or the ``Accept`` parameter with any value: the route refuses a wrong one by
    name), the scope of ``POST /v1/ui/chat`` that serves it; ``scope`` itself otherwise,
    unchanged. The gateway's entry calls it first, so the access check, the key's
    concurrent streams and the dispatch all see the route that answers."""
    if scope["path"] != _STREAM_PATH or scope["method"] != "POST":
        return scope
    if _FORMAT_NEEDLE not in scope.get("query_string", b""):  # the hot path: no parsing
        for name, value in scope["headers"]:
            if name == b"accept" and _ACCEPT_NEEDLE in value.lower():
                break
        else:
            return scope
    formats, versions = _asked(scope)
    if not formats and not versions:
        return scope
    return {**scope, "path": UI_CHAT_PATH, "raw_path": UI_CHAT_PATH.encode()}


def _check_asked(scope: Scope) -> None:
    """Refuse, by name, a ``format`` other than ``ui`` or an ``Accept`` parameter other
    than ``v1``: a 422 before the body is read."""
    formats, versions = _asked(scope)
    for value in formats:
        if value != _FORMAT_UI:
            message = (
                f"{value!r} is not a format this gateway answers in; "
                f"'{_FORMAT_UI}' asks for the AI SDK's UI message stream"
            )
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"invalid '{FORMAT_PARAMETER}': {message}",
                http_status=422,
                details=[{"field": FORMAT_PARAMETER, "message": message}],
            )
    for value in versions:
        if value != _ACCEPT_VERSION:
            field = f"Accept: {ACCEPT_PARAMETER}"
            message = f"{value!r} is not a version served; the one served is '{_ACCEPT_VERSION}'"
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"invalid '{field}': {message}",
                http_status=422,
                details=[{"field": field, "message": message}],
            )


class UITool(BaseModel):
    """A tool the browser runs (the SDK's client-side tools): the model may call it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class UIChatRequest(BaseModel):
    """What ``DefaultChatTransport`` posts (``id``, ``messages``, ``trigger``,
    ``messageId``), with the gateway's own fields beside them (its ``body`` option)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(max_length=256)] | None = None
    messages: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=1024)]
    trigger: str | None = None
    messageId: Annotated[str, Field(max_length=256)] | None = None  # the SDK spells it so
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    tools: Annotated[list[UITool], Field(max_length=128)] = Field(default_factory=list)
    toolforge: ToolForgeExtension = Field(default_factory=ToolForgeExtension)


def _parse(body: bytes, max_depth: int) -> UIChatRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}") from exc
    check_depth(body, raw, max_depth)
    try:
        return UIChatRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "(body)"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise RequestError(
            ErrorCode.BAD_REQUEST,
            f"invalid '{field}': {message}",
            details=[{"field": field, "message": message}],
        ) from exc


def check_content(messages: Sequence[Any], accepts: frozenset[str], upstream: str) -> None:
    """Refuse, by its place in ``messages``, the first file part (an image, by its
    ``mediaType``, or another file) the upstream (``UPSTREAM_KIND`` ``upstream``) is not
    sent: the check the proxy and the Responses API make
    (:func:`toolforge.core.input_content.check_parts`), a 400 naming
    ``messages[i].parts[j]``. Call it on messages :func:`chat_messages` has read."""
    for i, message in enumerate(messages):
        if isinstance(message, Mapping) and message.get("role") in ("user", "system"):
            field = f"messages[{i}].parts"
            check_parts(message.get("parts"), field, accepts, upstream, kind_of=file_kind)


def _request(gw: Gateway, ui: UIChatRequest) -> ChatCompletionRequest:
    messages = chat_messages(ui.messages)
    # A file the upstream is not sent is refused by name, before any model call
    # (docs/ui-stream.md, "Images and files"), as on the proxy.
    settings = gw.settings
    kind = settings.upstream_kind
    check_content(ui.messages, accepted_input(kind, settings.upstream_input), kind)
    body: dict[str, Any] = {
        "model": ui.model or settings.model_id,
        "messages": messages,
        "stream": True,
    }
    if ui.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump()} for t in ui.tools]
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise RequestError(
            ErrorCode.BAD_REQUEST, str(first["msg"]).removeprefix("Value error, ")
        ) from exc
    return request.model_copy(update={"toolforge": ui.toolforge})


@router.post(
    UI_CHAT_PATH,
    summary="A chat turn as the AI SDK's UI message stream (useChat)",
    response_model=None,
)
async def ui_chat(request: Request, gw: GatewayDep) -> Response:
    key = request_key(request)
    try:
        _check_asked(request.scope)
        body = await read_body(
            request.receive, request.headers.get("content-length"), gw.settings.max_body_bytes
        )
        ui = _parse(body, gw.settings.max_request_depth)
        answer = approval_answer(ui.messages)
        if answer is not None:
            return await _go_on(gw, answer, key, workflow=ui.toolforge.workflow is not None)
        req = _request(gw, ui)
        # The run may stop at an approval: its stream waits for the next request.
        plan = chat_planner(gw, req, key, api="ui-message-stream", waits_at_approval=True)

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
    writer = UIStreamWriter(
        message_id="msg_" + session.id[2:],
        stream_id=session.id,
        workflow=session.plan.workflow is not None,
    )
    return SlotHeld(
        RunStreamResponse(session, writer, after=0, primary=True, headers=HEADERS), slot
    )


async def _go_on(
    gw: Gateway, answer: tuple[str, str, int, bool, str], key: ApiKey | None, *, workflow: bool
) -> Response:
    """The decision to the waiting stream, then the same message from the call on, from
    whichever replica runs it. ``workflow``: whether the request names a workflow, as the
    first one did (a stream another replica runs has its plan there)."""
    stream_id, call_id, after, approved, message_id = answer
    await gw.streams.command(
        stream_id, Approve(call_id, approved), None if key is None else key.name
    )
    session = await gw.streams.find(stream_id, None if key is None else key.name)
    if isinstance(session, RemoteStream):  # its mirrored frames, re-encoded here
        writer = UIStreamWriter(message_id=message_id, stream_id=stream_id, workflow=workflow)
        return RemoteRunResponse(session, writer, after=after, headers=HEADERS)
    writer = UIStreamWriter(
        message_id=message_id, stream_id=stream_id, workflow=session.plan.workflow is not None
    )
    primary = session.reader_joined(after)
    return RunStreamResponse(session, writer, after=after, primary=primary, headers=HEADERS)
