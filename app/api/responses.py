"""The Responses API (Open Responses): ``POST /v1/responses``, ``GET /v1/responses/{id}``,
``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and
``GET /v1/responses/{id}/input_items``. docs/responses.md is the user's side.

Thin, like the proxy it stands beside: the body is checked
(:class:`toolforge.api.responses_body.ResponsesRequest`, every refusal in OpenAI's error
shape) and translated into the proxy's request, a conversation continued from
``previous_response_id`` starts from the stored one's context, and the plan runs in a
:class:`~toolforge.runtime.session.StreamSession` — the same engine, guardrails,
backpressure, cancellation and artifacts. Its frames are written as Responses events or one
response object by :class:`toolforge.core.protocol.responses.ResponseWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Final, Literal

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import State
from starlette.routing import Match

from toolforge.api.auth import ApiKey, allowed_tools, request_key
from toolforge.api.body import ClientGone, read_body
from toolforge.api.deps import Gateway, GatewayDep
from toolforge.api.proxy import (
    COMMENT_PING,
    chat_planner,
    failure_status,
    openai_error,
    until_done,
)
from toolforge.api.responses_body import ResponsesRequest, parse_request
from toolforge.api.sse import FrameStreamResponse
from toolforge.api.stream_slot import SlotHeld, StreamSlot
from toolforge.core.input_content import accepted_input
from toolforge.core.protocol.responses import ResponseWriter, chat_messages, check_content
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.commands import Cancel
from toolforge.runtime.frame_log import decode_events
from toolforge.runtime.planner import StreamPlan
from toolforge.runtime.response_store import (
    MemoryResponseStore,
    RedisResponseStore,
    ResponseStore,
)
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_service import Started

__all__ = ["router"]


class _OpenAIErrors(APIRoute):
    """These routes' every refusal in OpenAI's error shape, FastAPI's own too (a query
    parameter out of range would otherwise be the gateway's ``/v1/stream`` shape, which
    the SDKs cannot read)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
                field = ".".join(str(p) for p in first["loc"][1:]) or "(request)"
                message = str(first["msg"])
                return openai_error(
                    RequestError(
                        ErrorCode.BAD_REQUEST,
                        f"invalid '{field}': {message}",
                        details=[{"field": field, "message": message}],
                        http_status=400,
                    )
                )
            except ToolForgeError as exc:
                return openai_error(exc)

        return route


router = APIRouter(tags=["responses"], route_class=_OpenAIErrors)

# A cancelled response run by another replica: how long (x 50 ms) to wait for its record.
_REMOTE_END_POLLS: Final = 60


# -- where the app keeps what this API needs --------------------------------------------------


class _Responses:
    """The store and the finishers of running stored responses, one per app (app.state)."""

    def __init__(self, gw: Gateway) -> None:
        settings = gw.settings
        cluster = gw.cluster
        self.store: ResponseStore = (
            RedisResponseStore(cluster.redis, ttl_s=settings.responses_ttl_s)
            if cluster is not None
            else MemoryResponseStore(
                max_records=settings.responses_max_stored, ttl_s=settings.responses_ttl_s
            )
        )
        # what the upstream is sent besides text (images, files): the rest is refused
        self.accepts = accepted_input(settings.upstream_kind, settings.upstream_input)
        self.upstream_kind = settings.upstream_kind
        # response id -> the task that stores it once its stream has ended
        self.finishing: dict[str, asyncio.Task[dict[str, Any]]] = {}


def _state(request: Request, gw: Gateway) -> _Responses:
    state: State = request.app.state
    found: _Responses | None = getattr(state, "responses", None)
    if found is None:
        found = _Responses(gw)
        state.responses = found
    return found


def _bad(message: str, field: str | None = None) -> RequestError:
    details = [{"field": field, "message": message}] if field else None
    return RequestError(ErrorCode.BAD_REQUEST, message, details=details, http_status=400)


def _not_found(response_id: str) -> RequestError:
    return RequestError(
        ErrorCode.NOT_FOUND,
        f"no stored response {response_id!r} (never stored with 'store': true, expired, "
        "deleted, or another key's)",
        http_status=404,
    )


async def _stored(
    state: _Responses, response_id: str, key: ApiKey | None, *, wait: bool = True
) -> dict[str, Any] | None:
    """The stored record of ``response_id`` if ``key`` may read it. ``wait``: a response
    still running on this replica is read once its stream has ended and it is stored
    whole (the next turn of a conversation needs its output)."""
    finishing = state.finishing.get(response_id) if wait else None
    if finishing is not None:
        with contextlib.suppress(Exception):
            await asyncio.shield(finishing)
    record = await state.store.get(response_id)
    if record is None or (key is not None and record.get("owner") != key.name):
        return None
    return record


async def _found(
    state: _Responses, response_id: str, key: ApiKey | None, *, wait: bool = True
) -> dict[str, Any]:
    """:func:`_stored`, or a 404 (in OpenAI's error shape: the router's)."""
    record = await _stored(state, response_id, key, wait=wait)
    if record is None:
        raise _not_found(response_id)
    return record


# -- POST /v1/responses ------------------------------------------------------------------------


@router.post(
    "/v1/responses",
    summary="Create a model response (the Responses API, Open Responses)",
    response_model=None,
)
async def create_response(request: Request, gw: GatewayDep) -> Response:
    key = request_key(request)
    state = _state(request, gw)
    try:
        body = await read_body(
            request.receive, request.headers.get("content-length"), gw.settings.max_body_bytes
        )
        req = parse_request(body, gw.settings.max_request_depth)
        if key is not None and req.toolforge.server_tools:
            allowed_tools(key, req.toolforge.server_tools, ())
        context: list[dict[str, Any]] = []
        earlier: list[dict[str, Any]] = []  # the conversation's items so far, with their ids
        if req.previous_response_id is not None:
            previous = await _found(state, req.previous_response_id, key)
            if previous["response"]["status"] == "in_progress":
                raise RequestError(
                    ErrorCode.CONFLICT,
                    f"response {req.previous_response_id!r} is still in progress; continue "
                    "it once it has ended",
                    http_status=409,
                )
            context = list(previous["context"])
            earlier = [*previous.get("input_items", ()), *previous["response"]["output"]]
        items = req.input_items()
        messages = chat_messages([*context, *items], req.instructions)
        check_content(items, state.accepts, state.upstream_kind)
        if not any(m["role"] != "system" for m in messages):
            raise _bad("'input' holds nothing to answer: give a message", "input")
        created = int(time.time())
        record: dict[str, Any] = {
            "owner": key.name if key is not None else None,
            "context": [*context, *items],
        }

        # planned as the proxy plans its request (the workflow's run when it names one)
        planned = chat_planner(gw, req.chat_request(messages), key, api="responses")

        async def plan(stream_id: str) -> StreamPlan:
            built = await planned(stream_id)
            if req.store:  # readable (in progress) before its first frame
                record["input_items"] = [
                    *earlier,
                    *({"id": f"in_{stream_id[2:]}_{i}", **item} for i, item in enumerate(items)),
                ]
                record["response"] = _writer(req, stream_id, built, created).resource()
                await state.store.put(record["response"]["id"], record)
            return built

        slot = await StreamSlot.take(request.app, key)  # one of the key's streams
        try:
            # The same start as every stream's (idempotency, the session, its resume buffer).
            with slot.starting():
                opened = await gw.streams.open(
                    plan, owner=None if key is None else key.name, primary=req.stream
                )
        except BaseException:
            await slot.release()
            raise
    except ToolForgeError as exc:
        return openai_error(exc)
    except ClientGone:
        return Response(status_code=499)
    assert isinstance(opened, Started)  # no Idempotency-Key here: nothing to replay
    session = opened.session
    writer = _writer(req, session.id, session.plan, created)
    headers = {"X-Stream-Id": session.id, "X-ToolForge-Mode": session.plan.mode.name}
    if req.store:
        response_id = writer.id
        finisher = asyncio.ensure_future(_finish(state, session, writer, record))
        state.finishing[response_id] = finisher
        finisher.add_done_callback(lambda _: state.finishing.pop(response_id, None))
    if req.stream:
        streamed = FrameStreamResponse(
            session,
            primary=True,
            ping_interval_s=gw.settings.ping_interval_s,
            headers=headers,
            encoder=lambda batch: writer.batch(batch, now=int(time.time())),
            ping=COMMENT_PING,
        )
        return SlotHeld(streamed, slot)
    try:
        await until_done(session, request.receive)
    finally:
        await slot.release()
    writer.feed(decode_events(session.log.encoded_after(0)), now=int(time.time()))
    resource = writer.resource()
    if writer.error is not None and not writer.output:  # nothing to show: an HTTP error
        return _failed(writer, headers)
    return Response(orjson.dumps(resource), media_type="application/json", headers=headers)


def _writer(
    req: ResponsesRequest, stream_id: str, plan: StreamPlan, created: int
) -> ResponseWriter:
    return ResponseWriter(
        response_id="resp_" + stream_id[2:],
        created_at=created,
        echo=req.echo(),
        stream_id=stream_id,
        mode=plan.mode.name,
        workflow=plan.workflow is not None,
    )


def _failed(writer: ResponseWriter, headers: dict[str, str]) -> JSONResponse:
    """A response that failed before any output: the OpenAI error the SDKs raise (502 for
    the upstream, 504 for its timeout, 422 for a workflow the model did not finish)."""
    error = writer.error or {}
    code = error.get("code", ErrorCode.INTERNAL)
    status = failure_status(code)
    body = openai_error(ToolForgeError(ErrorCode(code), error.get("message", "")), status).body
    payload = orjson.loads(body)
    payload["response"] = writer.resource()
    return JSONResponse(payload, status_code=status, headers=headers)


async def _finish(
    state: _Responses, session: StreamSession, writer: ResponseWriter, record: dict[str, Any]
) -> dict[str, Any]:
    """Once the stream has ended, store the response whole: its object, and its output
    at the end of the context the next response starts from."""
    await session.wait()
    done = ResponseWriter(
        response_id=writer.id,
        created_at=writer.resource()["created_at"],
        echo=writer.echo,
        stream_id=session.id,
        mode=writer.toolforge["mode"],
        workflow=session.plan.workflow is not None,
    )
    # Through the writer's per-batch path, whose text deltas are spliced bytes: the same
    # object as frame by frame, without a decoded frame and an event dict per token
    # (bench.gateway --formats, B2: the store ran beside the stream's last writes).
    done.batch(b"".join(session.log.encoded_after(0)), now=int(time.time()))
    resource = done.resource()
    final = {**record, "response": resource, "context": [*record["context"], *done.output]}
    await state.store.put(writer.id, final)
    return final


# -- the stored response ---------------------------------------------------------------------


@router.get("/v1/responses/{response_id}", summary="A stored response")
async def get_response(response_id: str, request: Request, gw: GatewayDep) -> Response:
    record = await _found(_state(request, gw), response_id, request_key(request))
    return JSONResponse(record["response"])


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(response_id: str, request: Request, gw: GatewayDep) -> Response:
    state = _state(request, gw)
    await _found(state, response_id, request_key(request))
    await state.store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel", summary="Stop a running response")
async def cancel_response(response_id: str, request: Request, gw: GatewayDep) -> Response:
    """Stops the response's stream if it runs on this replica, and answers with the
    response as it ended (``cancelled``); one that has ended already is answered as it is."""
    state = _state(request, gw)
    key = request_key(request)
    stream_id = "s_" + response_id.removeprefix("resp_")
    record = await _found(state, response_id, key, wait=False)
    if record["response"]["status"] == "in_progress":
        # wherever it runs: forwarded to its replica with Redis
        await gw.streams.command(stream_id, Cancel(), None if key is None else key.name)
        record = await _ended(state, response_id, key)
    return JSONResponse(record["response"])


async def _ended(state: _Responses, response_id: str, key: ApiKey | None) -> dict[str, Any]:
    """The record once its cancelled stream has stored it whole: at once when it ran
    here; from another replica, as soon as that one has written it (a few seconds at
    most), else as it stands."""
    record = await _stored(state, response_id, key)
    for _ in range(_REMOTE_END_POLLS):
        if record is None or record["response"]["status"] != "in_progress":
            break
        await asyncio.sleep(0.05)
        record = await _stored(state, response_id, key)
    if record is None:  # deleted meanwhile
        raise _not_found(response_id)
    return record


@router.get("/v1/responses/{response_id}/input_items", summary="A stored response's input")
async def list_input_items(
    response_id: str,
    request: Request,
    gw: GatewayDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    record = await _found(_state(request, gw), response_id, request_key(request))
    items = list(record["input_items"])
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }
    )


# -- any other path or method under /v1/responses ---------------------------------------------

_ANY_METHOD: Final = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/v1/responses", methods=_ANY_METHOD, include_in_schema=False)
@router.api_route("/v1/responses/{rest:path}", methods=_ANY_METHOD, include_in_schema=False)
async def unrouted(request: Request) -> Response:
    """A path under ``/v1/responses`` that no route above serves (404), or one served with
    another method (405, ``Allow`` naming the methods), in OpenAI's error shape instead of
    Starlette's plain body, so the SDKs raise ``NotFoundError`` with the gateway's message.
    Registered last: every route above is tried first; a route under ``/v1/responses``
    belongs in this router, above these."""
    method, path = request.method, request.url.path
    allowed = sorted(
        {
            allowed_method
            for route in router.routes
            if isinstance(route, APIRoute)
            and route.endpoint is not unrouted
            and route.matches(request.scope)[0] is Match.PARTIAL
            for allowed_method in route.methods or ()
        }
    )
    if not allowed:
        return openai_error(
            RequestError(
                ErrorCode.NOT_FOUND,
                f"no route {method} {path}: the Responses API serves POST /v1/responses, "
                "GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel and "
                "GET /v1/responses/{id}/input_items",
                http_status=404,
            )
        )
    refused = openai_error(
        RequestError(
            ErrorCode.BAD_REQUEST,
            f"{method} is not a method of {path}: use {', '.join(allowed)}",
            http_status=405,
        )
    )
    refused.headers["Allow"] = ", ".join(allowed)
    return refused
