"""The HTTP surface of SPEC §2 (streaming part). Routes stay thin: parse, plan, hand off."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import secrets
from collections.abc import Mapping
from typing import Annotated, Any

import httpx
import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from app.api.deps import Gateway, GatewayDep
from app.api.models import Sampling, StreamRequest
from app.api.sse import FrameStreamResponse
from app.core.prompt import build_messages, render_system_prompt
from app.errors import ErrorCode, RequestError
from app.runtime.artifacts import RunArtifacts
from app.runtime.session import SessionLimits, StreamPlan, StreamSession
from app.upstream.base import PROFILES, ChatRequest

__all__ = ["router"]

router = APIRouter()


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    too_large = RequestError(
        ErrorCode.BODY_TOO_LARGE,
        f"request body over {limit} bytes (MAX_BODY_BYTES); send less context",
        http_status=413,
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _parse(body: bytes) -> StreamRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}", http_status=422
        ) from exc
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


def _plan(gw: Gateway, req: StreamRequest, stream_id: str) -> StreamPlan:
    settings = gw.settings
    if req.mode in ("constrained", "native"):
        raise RequestError(
            ErrorCode.MODE_UNAVAILABLE,
            f"mode {req.mode!r} is not available on this gateway yet; "
            "use 'sentinel' or 'auto' (works with any OpenAI-compatible upstream)",
            http_status=422,
        )
    # auto -> sentinel: the one mode every OpenAI-compatible upstream supports.
    mode = "sentinel"
    system = render_system_prompt(gw.system_template, result_schema=req.result_schema)
    messages = build_messages(system, req.chat_messages())
    chat = ChatRequest(model=req.model or settings.model_id, messages=messages)
    if req.profile is not None:
        chat = PROFILES[req.profile].apply(chat)
    if req.sampling is not None:  # explicit sampling wins over the profile
        chat = dataclasses.replace(chat, **req.sampling.model_dump(exclude_none=True))
    prompt_record: dict[str, Any] = {
        "model": chat.model,
        "mode": mode,
        "requested_mode": req.mode,
        "messages": messages,
        "sampling": {
            "temperature": chat.temperature,
            "seed": chat.seed,
            "max_tokens": chat.max_tokens,
            "top_p": chat.top_p,
        },
        "result_schema": req.result_schema,
        "tools": req.tools,
    }
    return StreamPlan(
        stream_id=stream_id,
        chat=chat,
        mode=mode,
        on_disconnect=req.on_disconnect,
        prompt_record=prompt_record,
    )


def _limits(gw: Gateway) -> SessionLimits:
    s = gw.settings
    return SessionLimits(
        queue_max_frames=s.queue_max_frames,
        max_frame_bytes=s.max_frame_bytes,
        max_json_depth=s.max_json_depth,
        frame_timeout_s=s.frame_timeout_ms / 1000,
    )


@router.post("/v1/stream", summary="One request in, one SSE stream of typed frames out")
async def stream(
    request: Request,
    gw: GatewayDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    req = _parse(await _read_body(request, gw.settings.max_body_bytes))
    body_hash = hashlib.sha256(
        orjson.dumps(req.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()
    if idempotency_key is not None:
        stored = gw.registry.replay_for(idempotency_key, body_hash)
        if stored is not None:
            return FrameStreamResponse(
                stored,
                ping_interval_s=gw.settings.ping_interval_s,
                headers={"Idempotent-Replayed": "true"},
            )
    stream_id = "s_" + secrets.token_hex(10)
    session = StreamSession(
        _plan(gw, req, stream_id),
        upstream=gw.upstream,
        limits=_limits(gw),
        artifacts=RunArtifacts(gw.settings.artifacts_dir, stream_id),
        metrics=gw.metrics,
    )
    session.log.attach_primary()  # backpressure from the first frame on
    gw.registry.start(session, idempotency_key=idempotency_key, body_hash=body_hash)
    return FrameStreamResponse(session, primary=True, ping_interval_s=gw.settings.ping_interval_s)


@router.get("/v1/streams/{stream_id}", summary="Resume a stream after Last-Event-ID")
async def resume(
    stream_id: str,
    gw: GatewayDep,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[
        int | None, Query(ge=0, description="Last-Event-ID for clients that cannot set headers")
    ] = None,
) -> Response:
    session = gw.registry.get(stream_id)
    cursor = after or 0
    if last_event_id is not None:
        if not last_event_id.strip().isdigit():
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"Last-Event-ID must be a frame id (a whole number), got {last_event_id!r}",
                http_status=422,
            )
        cursor = int(last_event_id)
    return FrameStreamResponse(session, after=cursor, ping_interval_s=gw.settings.ping_interval_s)


@router.post("/v1/streams/{stream_id}/cancel", summary="Stop a running stream")
async def cancel(stream_id: str, gw: GatewayDep) -> dict[str, Any]:
    session = gw.registry.get(stream_id)
    cancelled = session.cancel("cancelled")
    if cancelled:
        await session.wait()
    return {"stream_id": session.id, "cancelled": cancelled, "reason": session.reason}


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the upstream answers")
async def readyz(gw: GatewayDep) -> Response:
    url = gw.settings.upstream_base_url.rstrip("/") + "/models"
    headers = {}
    if gw.settings.upstream_api_key:
        headers["Authorization"] = f"Bearer {gw.settings.upstream_api_key}"
    try:
        response = await gw.client.get(url, headers=headers, timeout=2.0)
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"status": "unavailable", "upstream": url, "reason": type(exc).__name__}, 503
        )
    if response.status_code >= 500:
        return JSONResponse(
            {"status": "unavailable", "upstream": url, "reason": f"HTTP {response.status_code}"},
            503,
        )
    return JSONResponse({"status": "ready", "upstream": url})


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(gw: GatewayDep) -> Response:
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)
