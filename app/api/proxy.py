"""The OpenAI-compatible proxy (docs/proxy.md): ``POST /v1/chat/completions``, ``/v1/models``.

Thin, like every route: parse the body (OpenAI's error shape for every refusal), plan it
(:func:`toolforge.runtime.completion_plan.plan_completion`), start a
:class:`~toolforge.runtime.session.StreamSession` — the same engine, driver, backpressure,
cancellation and artifacts as ``POST /v1/stream`` — and write its frames as OpenAI chunks
(:class:`toolforge.core.protocol.openai.ChunkWriter`) or one completion
(:class:`~toolforge.core.protocol.openai.CompletionBuilder`). docs/proxy.md is the user's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.types import Receive

from toolforge.api.auth import ApiKey, allowed_tools, check_workflow, own, request_key
from toolforge.api.body import read_body
from toolforge.api.deps import Gateway, GatewayDep
from toolforge.api.json_depth import check_depth
from toolforge.api.models import ChatCompletionRequest
from toolforge.api.retry_after import retry_headers
from toolforge.api.run_stream import until_disconnect
from toolforge.api.sse import FrameStreamResponse
from toolforge.core.input_content import accepted_input, check_messages
from toolforge.core.protocol.openai import ChunkWriter, CompletionBuilder, error_body
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.completion_plan import plan_completion, plan_workflow_completion
from toolforge.runtime.frame_log import decode_events
from toolforge.runtime.planner import StreamPlan
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_service import Started

__all__ = [
    "COMMENT_PING",
    "chat_planner",
    "complete",
    "failure_status",
    "openai_error",
    "router",
    "until_done",
]

router = APIRouter(tags=["openai"])

# How a workflow run fails (docs/proxy.md): the model did not follow it within its budgets.
_WORKFLOW_FAILURES: Final = frozenset(
    {
        ErrorCode.STEP_ENFORCEMENT_EXHAUSTED,
        ErrorCode.PREREQUISITE_EXHAUSTED,
        ErrorCode.RETRIES_EXHAUSTED,
        ErrorCode.TOOL_ERRORS_EXHAUSTED,
        ErrorCode.MAX_ITERATIONS,
        ErrorCode.CONTEXT_BUDGET_EXCEEDED,
    }
)
_FAILURE_STATUS: Final[Mapping[str, int]] = {
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.INTERNAL: 500,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,  # the request's to shorten, as OpenAI answers
}
# The keep-alive of an OpenAI-shaped stream (the proxy's, the Responses API's): an SSE
# comment, which the SDKs skip (an event they would not).
COMMENT_PING: Final = b": ping\n\n"
_STARTED: Final = int(time.time())


def failure_status(code: str) -> int:
    """The HTTP status of a completion (or a response) that failed before any output, as
    the OpenAI SDKs read it: 504 for the upstream's timeout, 500 for the gateway's own
    fault, 422 for a workflow the model did not finish (not retried by the SDKs), 400 for a
    prompt longer than the model's context, 502 for any other failure of the upstream."""
    if code in _WORKFLOW_FAILURES:
        return 422
    return _FAILURE_STATUS.get(code, 502)


def openai_error(exc: ToolForgeError, status: int | None = None) -> JSONResponse:
    """A refusal as OpenAI writes one (``{"error": {message, type, param, code}}``): the
    SDKs raise the matching exception class (400 BadRequestError, 404 NotFoundError, ...).
    Caller errors are 400 here, as OpenAI's are, not the 422 of ``/v1/stream``."""
    code = status or exc.http_status
    if code == 422:
        code = 400
    body = error_body(str(exc.code), exc.message, code)
    if exc.details:
        body["error"]["param"] = exc.details[0].get("field")
    return JSONResponse(body, status_code=code, headers=retry_headers(exc))


def _parse(body: bytes, max_depth: int) -> ChatCompletionRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}") from exc
    check_depth(body, raw, max_depth)  # 422 here, not a 500 when it is written
    try:
        return ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        field = ".".join(str(p) for p in first["loc"]) or "(body)"
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = (
                f"unknown parameter '{field}'; docs/proxy.md lists every parameter the proxy "
                "takes (ToolForge's own go in the 'toolforge' extension object)"
            )
        raise RequestError(
            ErrorCode.BAD_REQUEST,
            f"invalid '{field}': {message}" if field != "(body)" else message,
            details=[{"field": field, "message": message}],
        ) from exc


def chat_planner(
    gw: Gateway,
    req: ChatCompletionRequest,
    key: ApiKey | None,
    *,
    api: str | None = None,
    waits_at_approval: bool = False,
) -> Callable[[str], Awaitable[StreamPlan]]:
    """How a Chat Completions-shaped request is planned, for every front door that speaks
    one (the proxy, AG-UI, the UI message stream): ``key``'s tool allowlist and workflow
    checked now (a 403 before any stream starts), then, per stream id, the proxy's plan
    (the workflow's run when it names one), owned by ``key``. ``api`` labels the plan's
    record (``prompt.json``); ``waits_at_approval``: a run that may stop at an approval
    keeps its stream for the next request (``on_disconnect: continue``)."""
    if key is not None and req.toolforge.server_tools:
        allowed_tools(key, req.toolforge.server_tools, ())
    workflow = req.toolforge.workflow
    run = None if workflow is None else check_workflow(key, gw.planner.resolve_workflow(workflow))

    async def plan(stream_id: str) -> StreamPlan:
        if run is not None:  # the gateway runs it; the answer is its result
            built = await plan_workflow_completion(gw.planner, req, stream_id, run)
        else:
            built = await plan_completion(
                gw.planner,
                req,
                stream_id,
                tools_template=gw.proxy_tools_template,
                nudges=gw.proxy_nudges,
            )
        built = own(built, key)
        if api is None and not waits_at_approval:
            return built
        return dataclasses.replace(
            built,
            prompt_record={**built.prompt_record, "api": api}
            if api is not None
            else built.prompt_record,
            on_disconnect="continue"
            if waits_at_approval and built.approval_tools
            else built.on_disconnect,
        )

    return plan


@router.post(
    "/v1/chat/completions",
    summary="OpenAI-compatible chat completions, with the small-model guardrails",
    response_model=None,
)
async def chat_completions(request: Request, gw: GatewayDep) -> Response:
    """The route as FastAPI documents it. Requests are served by
    :class:`toolforge.api.fastpath.GatewayApp`, which calls :func:`complete` itself, past
    FastAPI's stack (bench/RESULTS.md, B1p)."""
    return await complete(
        gw, request.receive, request.headers.get("content-length"), request_key(request)
    )


async def complete(
    gw: Gateway, receive: Receive, declared: str | None, key: ApiKey | None = None
) -> Response:
    """``POST /v1/chat/completions``: read the body (``declared``: its Content-Length),
    parse, plan, start the session; every refusal in OpenAI's error shape. ``key``: the
    API key admitted (docs/security.md): its tool allowlist bounds ``server_tools``, and it owns
    the stream."""
    try:
        body = await read_body(receive, declared, gw.settings.max_body_bytes)
        settings = gw.settings
        req = _parse(body, settings.max_request_depth)
        # An image or file part the upstream is not sent is refused by name, before any
        # model call (docs/proxy.md, "Images and files"), as the Responses API does.
        kind = settings.upstream_kind
        check_messages(req.messages, accepted_input(kind, settings.upstream_input), kind)
        plan = chat_planner(gw, req, key)
        # The same start as every stream's: resumable on any replica, with Redis.
        opened = await gw.streams.open(
            plan, owner=None if key is None else key.name, primary=req.stream
        )
    except ToolForgeError as exc:
        return openai_error(exc)
    assert isinstance(opened, Started)  # no Idempotency-Key here: nothing to replay
    session = opened.session
    stream_plan = session.plan
    stream_id = session.id
    runs_workflow = stream_plan.workflow is not None
    completion_id = "chatcmpl-" + stream_id[2:]
    created = int(time.time())
    mode = stream_plan.mode.name
    headers = {
        "X-ToolForge-Mode": mode,
        "X-ToolForge-Guardrails": ",".join(
            k for k, on in stream_plan.prompt_record["guardrails"].items() if on
        ),
    }
    if req.stream:
        writer = ChunkWriter(
            stream_id=stream_id,
            completion_id=completion_id,
            created=created,
            model=req.model,
            include_usage=req.stream_options is not None and req.stream_options.include_usage,
            mode=mode,
            workflow=runs_workflow,
        )
        return FrameStreamResponse(
            session,
            primary=True,
            ping_interval_s=gw.settings.ping_interval_s,
            headers=headers,
            encoder=_with_role(writer),
            ping=COMMENT_PING,
        )
    await until_done(session, receive)
    builder = CompletionBuilder(
        stream_id=stream_id,
        completion_id=completion_id,
        created=created,
        model=req.model,
        mode=mode,
        workflow=runs_workflow,
    )
    builder.feed(decode_events(session.log.encoded_after(0)))
    guardrails = builder.toolforge.get("guardrails") or {}
    headers["X-Stream-Id"] = session.id
    for action, count in sorted(guardrails.items()):
        headers[f"X-ToolForge-{action.replace('_', '-').title()}"] = str(count)
    if builder.error is not None:
        error = builder.error
        status = failure_status(error["code"])
        payload = error_body(error["code"], error["message"], status)
        payload["error"]["retryable"] = error["retryable"]
        if error.get("details"):  # a workflow's steps, iterations, last text (docs/proxy.md)
            payload["error"]["details"] = error["details"]
        payload["toolforge"] = builder.toolforge
        return JSONResponse(payload, status_code=status, headers=headers)
    return Response(orjson.dumps(builder.build()), media_type="application/json", headers=headers)


def _with_role(writer: ChunkWriter) -> Any:
    """The writer's encoder, with the role chunk in front of the first batch."""

    def encode(batch: bytes) -> bytes:
        if not writer.started:
            return writer.first() + writer.batch(batch)
        return writer.batch(batch)

    return encode


async def until_done(session: StreamSession, receive: Receive) -> None:
    """Wait for a non-streaming request's stream to end; a client that leaves first
    cancels it (docs/protocol.md: the upstream closed within 50 ms)."""
    ended = asyncio.ensure_future(session.wait())
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait((ended, gone), return_when=asyncio.FIRST_COMPLETED)
        if not ended.done():
            session.client_left()
            await ended
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone


@router.get("/v1/models", summary="The models this gateway serves (OpenAI-compatible)")
async def list_models(gw: GatewayDep) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": gw.settings.model_id,
                "object": "model",
                "created": _STARTED,
                "owned_by": "toolforge",
            }
        ],
    }
