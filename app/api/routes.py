"""The HTTP surface of docs/protocol.md (streaming part). Routes stay thin: parse, plan, hand
off."""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import secrets
from collections.abc import Mapping
from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.types import Receive

from toolforge.api.auth import (
    ApiKey,
    KeyDep,
    allowed_tools,
    allowed_workflow,
    check_owner,
    check_workflow,
    own,
    request_key,
)
from toolforge.api.deps import Gateway, GatewayDep
from toolforge.api.json_depth import check_depth
from toolforge.api.models import ApprovalDecision, ClientToolResult, Sampling, StreamRequest
from toolforge.api.sse import FrameStreamResponse, RemoteStreamResponse
from toolforge.core.tools import ToolError
from toolforge.core.workflow import WorkflowDef
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.cluster import RemoteError
from toolforge.runtime.readiness import ReadinessCheck
from toolforge.runtime.session import ClientAnswer, StreamSession

__all__ = ["ClientGone", "local_command", "read_body", "router", "start_stream"]

router = APIRouter()

_MAX_KEY_CHARS: Final = 255
# A forwarded command whose caller's key is not the stream's: check_owner's 403 for it.
_NOBODY: Final = ApiKey(name="", digest=b"")


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body from ASGI ``receive``, refused with 413 as soon as it is known to
    exceed ``limit`` bytes (``declared``: the Content-Length header, if any)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if not parts and not more:  # the usual case: the whole body in one message
            if len(chunk) > limit:
                raise _too_large(limit)
            return chunk
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not more:
            return b"".join(parts)


def _too_large(limit: int) -> RequestError:
    return RequestError(
        ErrorCode.BODY_TOO_LARGE,
        f"request body over {limit} bytes (MAX_BODY_BYTES); send less context",
        http_status=413,
    )


class ClientGone(Exception):
    """The client left while sending its body: nobody is there to answer."""


def _parse(body: bytes, max_depth: int) -> StreamRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}", http_status=422
        ) from exc
    check_depth(body, raw, max_depth)  # 422 here, not a 500 when it is written
    try:
        return StreamRequest.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc) from exc


def _known_fields() -> dict[str, str]:
    """Every request field name -> where it lives, for 'did you mean' hints."""
    known = {name: name for name in StreamRequest.model_fields}
    known.update({name: f"sampling.{name}" for name in Sampling.model_fields})
    return known


_KNOWN_FIELDS = _known_fields()


def _explain(err: Mapping[str, Any]) -> str:
    if err["type"] != "extra_forbidden":
        return str(err["msg"])
    name = str(err["loc"][-1]) if err["loc"] else ""
    hint = difflib.get_close_matches(name, _KNOWN_FIELDS, n=1)
    suggestion = f"; did you mean '{_KNOWN_FIELDS[hint[0]]}'?" if hint else ""
    return f"unknown field{suggestion} (fields: docs/protocol.md)"


def _validation_error(exc: ValidationError) -> RequestError:
    details = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(body)", "message": _explain(err)}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    first = details[0]
    return RequestError(
        ErrorCode.BAD_REQUEST,
        f"invalid field '{first['field']}': {first['message']}"
        + (f" (and {len(details) - 1} more)" if len(details) > 1 else ""),
        http_status=422,
        details=details,
    )


@router.post("/v1/stream", summary="One request in, one SSE stream of typed frames out")
async def stream(
    request: Request,
    gw: GatewayDep,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> Response:
    """The route as FastAPI documents it. Requests are served by
    :class:`toolforge.api.fastpath.GatewayApp`, which reads the same two headers and calls
    :func:`read_body` and :func:`start_stream` itself, past FastAPI."""
    max_bytes = gw.settings.max_body_bytes
    body = await read_body(request.receive, request.headers.get("content-length"), max_bytes)
    return await start_stream(gw, body, idempotency_key, request_key(request))


async def start_stream(
    gw: Gateway, body: bytes, idempotency_key: str | None, key: ApiKey | None = None
) -> Response:
    """``POST /v1/stream`` once the body is read: validate, plan, start the session.
    ``key``: the API key admitted (docs/security.md): its tool allowlist narrows the request's
    tools (shown and runnable alike), it owns the stream, and its Idempotency-Keys are its
    own."""
    if idempotency_key is not None and len(idempotency_key) > _MAX_KEY_CHARS:
        raise RequestError(
            ErrorCode.BAD_REQUEST,
            f"Idempotency-Key is {len(idempotency_key)} characters; at most "
            f"{_MAX_KEY_CHARS} are allowed",
            http_status=422,
        )
    req = _parse(body, gw.settings.max_request_depth)
    workflow: WorkflowDef | None = None
    if key is not None:
        if key.tools is not None:
            visible = (spec.name for spec in gw.executor.registry.visible())
            tools = allowed_tools(key, req.tools, visible)
            req = req.model_copy(update={"tools": tools})
            if req.workflow is not None:  # a workflow's tools are its own: the key bounds them
                workflow = check_workflow(key, gw.planner.resolve_workflow(req.workflow))
        if idempotency_key is not None:  # another key's record is never replayed
            idempotency_key = f"{key.name}:{idempotency_key}"
    body_hash = ""
    if idempotency_key is not None:
        # The parsed body, keys sorted: the same request sent with other spacing or key
        # order is the same request.
        body_hash = hashlib.sha256(
            orjson.dumps(req.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
        stored = gw.registry.replay_for(idempotency_key, body_hash)
        if stored is not None:
            return FrameStreamResponse(
                stored,
                ping_interval_s=gw.settings.ping_interval_s,
                headers={"Idempotent-Replayed": "true"},
            )
        if gw.cluster is not None:  # another replica may hold the key (docs/deployment.md)
            remote = await gw.cluster.replay_for(idempotency_key, body_hash)
            if remote is not None:
                return RemoteStreamResponse(
                    remote,
                    ping_interval_s=gw.settings.ping_interval_s,
                    headers={"Idempotent-Replayed": "true"},
                )
    stream_id = "s_" + secrets.token_hex(10)
    plan = await gw.planner.plan(req, stream_id, idempotency_key, workflow=workflow)
    if idempotency_key is not None and gw.cluster is not None:
        claimed = await gw.cluster.claim(
            idempotency_key, body_hash, stream_id, None if key is None else key.name
        )
        if claimed is not None:  # another replica started it since we looked
            held_hash, holder = claimed
            if held_hash != body_hash:
                raise RequestError(
                    ErrorCode.IDEMPOTENCY_KEY_REUSED,
                    "this Idempotency-Key was used with a different request body; "
                    "use a new key for a new request",
                    http_status=422,
                )
            raise RequestError(
                ErrorCode.IDEMPOTENCY_IN_FLIGHT,
                f"the request with this Idempotency-Key is already streaming as "
                f"{holder!r}; resume it with GET /v1/streams/{holder}",
                http_status=409,
            )
    own(plan, key)
    session = gw.session(plan)
    session.log.attach_primary()  # backpressure from the first frame on
    gw.registry.start(session, idempotency_key=idempotency_key, body_hash=body_hash)
    if gw.cluster is not None:
        gw.cluster.track(session, idempotency_key)  # its resume buffer, in Redis
    # One turn of the loop for the session before the response starts: it sends the
    # upstream request first, so the model starts while we set up the writer (B1, TTFT).
    await asyncio.sleep(0)
    return FrameStreamResponse(session, primary=True, ping_interval_s=gw.settings.ping_interval_s)


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
    session = gw.registry.find(stream_id)
    if session is None and gw.cluster is not None:  # run by another replica, or was
        remote = await gw.cluster.find(stream_id)
        if remote is not None:
            check_owner(key, remote.key, stream_id)  # the key is in the stream's record
            return RemoteStreamResponse(
                remote, after=cursor, ping_interval_s=gw.settings.ping_interval_s
            )
    if session is None:
        session = gw.registry.get(stream_id)  # the 404
    check_owner(key, session.plan.owner, stream_id)
    return FrameStreamResponse(session, after=cursor, ping_interval_s=gw.settings.ping_interval_s)


async def _elsewhere(
    gw: Gateway, op: str, stream_id: str, payload: dict[str, Any], key: ApiKey | None
) -> Any:
    """``op`` for a stream this replica does not run: done by the replica that does
    (through Redis), or the registry's 404. The caller's API key name goes with it: the
    owner replica checks it against the stream's (docs/security.md)."""
    if key is not None:
        payload = {**payload, "api_key": key.name}
    if gw.cluster is not None:
        answer = await gw.cluster.route(op, stream_id, payload)
        if answer is not None:
            status, body = answer
            if status >= 400:
                raise RemoteError(status, body.get("error", {}))
            return body
    return gw.registry.get(stream_id)  # raises the 404


async def local_command(
    gw: Gateway, op: str, stream_id: str, payload: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """A command another replica forwarded for a stream run here: the same answer the
    route would give (``toolforge.runtime.cluster.RedisCluster.route``)."""
    try:
        session = gw.registry.get(stream_id)
        caller = payload.get("api_key")
        if caller is not None or session.plan.owner is not None:
            if caller != session.plan.owner:
                check_owner(_NOBODY, session.plan.owner, stream_id)  # the 403
        if op == "cancel":
            return 200, await _cancel(session)
        if op == "approve":
            decision = ApprovalDecision.model_validate(payload["decision"])
            return 200, _approve(session, str(payload["call_id"]), decision)
        if op == "tool_result":
            result = ClientToolResult.model_validate(payload["result"])
            return 200, _tool_result(session, str(payload["call_id"]), result)
        raise RequestError(ErrorCode.BAD_REQUEST, f"unknown command {op!r}", http_status=400)
    except ToolForgeError as exc:
        return exc.http_status, {"error": exc.to_dict()}
    except ValidationError as exc:
        error = _validation_error(exc)
        return error.http_status, {"error": error.to_dict()}


@router.post("/v1/streams/{stream_id}/cancel", summary="Stop a running stream")
async def cancel(stream_id: str, gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    session = gw.registry.find(stream_id)
    if session is None:
        answer: dict[str, Any] = await _elsewhere(gw, "cancel", stream_id, {}, key)
        return answer
    check_owner(key, session.plan.owner, stream_id)
    return await _cancel(session)


async def _cancel(session: StreamSession) -> dict[str, Any]:
    cancelled = session.cancel("cancelled")
    if cancelled:
        await session.wait()
    return {"stream_id": session.id, "cancelled": cancelled, "reason": session.reason}


@router.post(
    "/v1/streams/{stream_id}/approvals/{call_id}",
    summary="Approve or deny a tool call that needs confirmation",
)
async def approve(
    stream_id: str, call_id: str, decision: ApprovalDecision, gw: GatewayDep, key: KeyDep
) -> dict[str, Any]:
    session = gw.registry.find(stream_id)
    if session is None:
        payload = {"call_id": call_id, "decision": decision.model_dump(mode="json")}
        answer: dict[str, Any] = await _elsewhere(gw, "approve", stream_id, payload, key)
        return answer
    check_owner(key, session.plan.owner, stream_id)
    return _approve(session, call_id, decision)


def _approve(session: StreamSession, call_id: str, decision: ApprovalDecision) -> dict[str, Any]:
    stream_id = session.id
    if not session.approve(call_id, decision.approve):
        pending = ", ".join(session.pending_approvals) or "none"
        raise RequestError(
            ErrorCode.NOT_FOUND,
            f"no tool call {call_id!r} is waiting for approval in stream {stream_id!r} "
            f"(waiting: {pending})",
            http_status=404,
        )
    return {"stream_id": stream_id, "call_id": call_id, "approved": decision.approve}


@router.post(
    "/v1/streams/{stream_id}/tool_results/{call_id}",
    summary="The result of a client-side tool call; the model resumes",
)
async def post_tool_result(
    stream_id: str, call_id: str, result: ClientToolResult, gw: GatewayDep, key: KeyDep
) -> dict[str, Any]:
    """docs/tools.md: ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}`` for a
    ``tool.call`` whose executor is ``client``. 404: no such call waits; 409: answered."""
    session = gw.registry.find(stream_id)
    if session is None:
        payload = {"call_id": call_id, "result": result.model_dump(mode="json")}
        answer: dict[str, Any] = await _elsewhere(gw, "tool_result", stream_id, payload, key)
        return answer
    check_owner(key, session.plan.owner, stream_id)
    return _tool_result(session, call_id, result)


def _tool_result(session: StreamSession, call_id: str, result: ClientToolResult) -> dict[str, Any]:
    stream_id = session.id
    error = None
    if result.error is not None:
        error = ToolError(
            ErrorCode.TOOL_FAILED,
            result.error.message,
            details=[{"client_code": result.error.code}],
        )
    outcome = session.post_tool_result(
        call_id, ClientAnswer(ok=result.ok, result=result.result, error=error)
    )
    if outcome == "duplicate":
        raise RequestError(
            ErrorCode.CONFLICT,
            f"tool call {call_id!r} of stream {stream_id!r} has its result already",
            http_status=409,
        )
    if outcome == "unknown":
        waiting = ", ".join(session.pending_tool_results) or "none"
        raise RequestError(
            ErrorCode.NOT_FOUND,
            f"no client tool call {call_id!r} is waiting for a result in stream "
            f"{stream_id!r} (waiting: {waiting})",
            http_status=404,
        )
    return {"stream_id": stream_id, "call_id": call_id, "accepted": True}


@router.get("/v1/tools", summary="The tools models may call, with their input schemas")
async def list_tools(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """The tools the caller's API key may use (every model-facing tool without keys)."""
    allow = key.tools if key is not None else None
    return {"tools": [spec.to_dict() for spec in gw.executor.registry.visible(allow)]}


@router.get(
    "/v1/workflows", summary="The registered workflows (docs/workflows.md), as their definitions"
)
async def list_workflows(gw: GatewayDep, key: KeyDep) -> dict[str, Any]:
    """Those whose every tool the caller's key may use (docs/security.md), like ``/v1/tools``."""
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
