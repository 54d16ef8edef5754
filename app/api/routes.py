"""The HTTP surface of docs/protocol.md (streaming part). Routes only translate HTTP: they
read the request, call the runtime (:class:`toolforge.runtime.stream_service.Streams`
starts, finds and commands every stream) and write its answer; errors are the runtime's
typed ones, answered by the app's handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from toolforge.api.auth import (
    ApiKey,
    KeyDep,
    allowed_tools,
    allowed_workflow,
    check_workflow,
    own,
    request_key,
)
from toolforge.api.body import ClientGone, parse_stream_request, read_body
from toolforge.api.deps import Gateway, GatewayDep
from toolforge.api.models import ApprovalDecision, ClientToolResult
from toolforge.api.sse import FrameStreamResponse, RemoteStreamResponse
from toolforge.core.workflow import WorkflowDef
from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.cluster import RemoteStream
from toolforge.runtime.commands import (
    Approve,
    Cancel,
    ClientFailure,
    Command,
    Pause,
    PostToolResult,
    Resume,
    to_wire,
)
from toolforge.runtime.planner import StreamPlan
from toolforge.runtime.readiness import ReadinessCheck
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_service import Replayed, request_hash

__all__ = ["ClientGone", "read_body", "router", "send_command", "start_stream", "stream_response"]

router = APIRouter()
_Route = TypeVar("_Route", bound=Callable[..., Awaitable[dict[str, Any]]])


def stream_response(
    gw: Gateway,
    stream: StreamSession | RemoteStream,
    *,
    after: int = 0,
    primary: bool = False,
    headers: dict[str, str] | None = None,
) -> Response:
    """The SSE response for a stream run here (its frame log) or elsewhere (its resume
    buffer in Redis), from frame ``after`` on."""
    ping_s = gw.settings.ping_interval_s
    if isinstance(stream, RemoteStream):
        return RemoteStreamResponse(stream, after=after, ping_interval_s=ping_s, headers=headers)
    return FrameStreamResponse(
        stream, after=after, primary=primary, ping_interval_s=ping_s, headers=headers
    )


@router.post("/v1/stream", summary="One request in, one SSE stream of typed frames out")
async def stream(
    request: Request,
    gw: GatewayDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> Response:
    """The route as FastAPI documents it (``/docs``, ``/openapi.json``). Requests are
    served by :class:`toolforge.api.fastpath.GatewayApp`, which reads the same two headers
    and calls :func:`read_body` and :func:`start_stream` itself, past FastAPI. Asked with
    ``?format=ui`` or ``Accept: text/event-stream; x-vercel-ai-ui-message-stream=v1``, it
    hands the request to ``POST /v1/ui/chat`` instead (docs/ui-stream.md)."""
    max_bytes = gw.settings.max_body_bytes
    body = await read_body(request.receive, request.headers.get("content-length"), max_bytes)
    return await start_stream(gw, body, idempotency_key, request_key(request))


async def start_stream(
    gw: Gateway, body: bytes, idempotency_key: str | None, key: ApiKey | None = None
) -> Response:
    """``POST /v1/stream`` once the body is read: parse, then the runtime's one start
    sequence. ``key``: the API key admitted (docs/security.md): its tool allowlist narrows
    the request's tools (shown and runnable alike), it owns the stream, and its
    Idempotency-Keys are its own."""
    req = parse_stream_request(body, gw.settings.max_request_depth)
    workflow: WorkflowDef | None = None
    if key is not None and key.tools is not None:
        visible = (spec.name for spec in gw.executor.registry.visible())
        req = req.model_copy(update={"tools": allowed_tools(key, req.tools, visible)})
        if req.workflow is not None:  # a workflow's tools are its own: the key bounds them
            workflow = check_workflow(key, gw.planner.resolve_workflow(req.workflow))
    body_hash = "" if idempotency_key is None else request_hash(req.model_dump(mode="json"))

    scoped = idempotency_key  # the planner's record of the key: the API key's own
    if key is not None and idempotency_key is not None:
        scoped = f"{key.name}:{idempotency_key}"

    async def plan(stream_id: str) -> StreamPlan:
        return own(await gw.planner.plan(req, stream_id, scoped, workflow=workflow), key)

    opened = await gw.streams.open(
        plan,
        owner=None if key is None else key.name,
        idempotency_key=idempotency_key,
        body_hash=body_hash,
    )
    if isinstance(opened, Replayed):
        return stream_response(gw, opened.stream, headers={"Idempotent-Replayed": "true"})
    return stream_response(gw, opened.session, primary=True)


@router.get("/v1/streams/{stream_id}", summary="Resume a stream after Last-Event-ID")
async def resume(
    stream_id: str,
    gw: GatewayDep,
    key: KeyDep,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[
        int | None, Query(ge=0, description="Last-Event-ID for clients that cannot set headers")
    ] = None,
) -> Response:
    cursor = after or 0
    if last_event_id is not None:
        if not last_event_id.strip().isdigit():
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"Last-Event-ID must be a frame id (a whole number), got {last_event_id!r}",
                http_status=422,
            )
        cursor = int(last_event_id)
    found = await gw.streams.find(stream_id, None if key is None else key.name)
    return stream_response(gw, found, after=cursor)


async def send_command(
    gw: Gateway, stream_id: str, command: Command, key: ApiKey | None
) -> dict[str, Any]:
    """Any command for a stream, wherever it runs: the runtime's answer, as JSON."""
    return await gw.streams.command(stream_id, command, None if key is None else key.name)


def _bare_command(command: Cancel | Pause | Resume, summary: str) -> None:
    """``POST /v1/streams/{stream_id}/{name}``: a command without a body (docs/protocol.md)."""

    async def route(stream_id: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
        return await send_command(gw, stream_id, command, key)

    name = to_wire(command)["type"]
    router.post(f"/v1/streams/{{stream_id}}/{name}", summary=summary, name=name)(route)


_bare_command(Cancel(), "Stop a running stream")
_bare_command(Pause(), "Stop reading the model; the stream stays open (PAUSE_MAX_S at most)")
_bare_command(Resume(), "Read the model again after a pause")


def _for_call(what: str, summary: str) -> Callable[[_Route], _Route]:
    """The decorator of ``POST /v1/streams/{stream_id}/{what}/{call_id}``."""
    return router.post(f"/v1/streams/{{stream_id}}/{what}/{{call_id}}", summary=summary)


@_for_call("approvals", "Approve or deny a tool call that needs confirmation")
async def approve(
    stream_id: str, call_id: str, decision: ApprovalDecision, gw: GatewayDep, key: KeyDep
) -> dict[str, Any]:
    return await send_command(gw, stream_id, Approve(call_id, decision.approve), key)


@_for_call("tool_results", "The result of a client-side tool call; the model resumes")
async def post_tool_result(
    stream_id: str, call_id: str, result: ClientToolResult, gw: GatewayDep, key: KeyDep
) -> dict[str, Any]:
    """docs/tools.md: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``
    for a ``tool.call`` whose executor is ``client``. 404: no such call waits; 409:
    answered."""
    error = result.error
    failure = None if error is None else ClientFailure(error.code, error.message)
    command = PostToolResult(call_id, ok=result.ok, result=result.result, error=failure)
    return await send_command(gw, stream_id, command, key)


@router.get("/v1/tools", summary="The tools models may call, with their input schemas")
async def list_tools(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """The tools the caller's API key may use (every model-facing tool without keys)."""
    allow = key.tools if key is not None else None
    return {"tools": [spec.to_dict() for spec in gw.executor.registry.visible(allow)]}


@router.get(
    "/v1/workflows", summary="The registered workflows (docs/workflows.md), as their definitions"
)
async def list_workflows(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """Those whose every tool the caller's key may use (docs/security.md), like
    ``/v1/tools``."""
    return {
        "workflows": [
            w.to_dict() for w in gw.planner.workflows.values() if allowed_workflow(key, w)
        ]
    }


@router.get("/v1/schemas/{name}", summary="A JSON Schema: a frame schema or a tool's input")
async def get_schema(name: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    spec = gw.executor.registry.get(name)
    if spec is not None and spec.model_facing and (key is None or key.allows(name)):
        return dict(spec.input_schema)
    if name in gw.schemas:
        return dict(gw.schemas.get(name).schema)
    allow = key.tools if key is not None else None
    known = [*gw.schemas.names(), *(s.name for s in gw.executor.registry.visible(allow))]
    raise RequestError(
        ErrorCode.NOT_FOUND,
        f"no schema or tool {name!r}; known: {', '.join(known)}",
        http_status=404,
    )


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the upstream answers")
async def readyz(request: Request, key: KeyDep) -> Response:
    """200 ready or 503 unavailable, from a check of the upstream made at most once per
    ``READYZ_CACHE_S`` (``toolforge.runtime.readiness``). The public gets the status only;
    the upstream (its URL without credentials) and the reason go to a caller with a key,
    or to anyone when no keys are configured (the gateway then serves this machine only)."""
    check: ReadinessCheck = request.app.state.readiness
    answer = await check.check()
    status = 200 if answer.ready else 503
    if key is None and getattr(request.app, "access", None) is not None:
        return JSONResponse({"status": "ready" if answer.ready else "unavailable"}, status)
    return JSONResponse(answer.details(check.clock()), status)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request, gw: GatewayDep) -> Response:
    # OpenMetrics when the scraper's Accept asks for it, Prometheus text 0.0.4 otherwise.
    body, content_type = gw.metrics.render(request.headers.get("accept", ""))
    return Response(body, media_type=content_type)
