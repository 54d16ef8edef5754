"""The WebSocket transport: ``GET /v1/stream/ws`` carries a stream's frames, and the
client's side of it (tool results, approvals, cancel) on the same connection
(docs/websocket.md).

One JSON object per message. The client sends:

* ``{"type": "start", "request": {...}}``: a ``POST /v1/stream`` body, started by the one
  start sequence (:meth:`toolforge.runtime.stream_service.Streams.open`) as over HTTP;
* ``{"type": "resume", "stream_id": ..., "after": N}``: the frames after id ``N`` of a
  stream this key started (a dropped socket resumes as SSE does with Last-Event-ID);
* a stream command, as :func:`toolforge.runtime.commands.from_wire` reads it:
  ``{"type": "tool_result", "call_id", "ok", "result" | "error"}``,
  ``{"type": "approve", "call_id", "approved"}``, ``{"type": "cancel"}``,
  ``{"type": "pause"}``, ``{"type": "resume"}`` (no ``stream_id``: the model of the
  stream followed reads on); it goes to the stream the socket follows, on whichever
  replica runs it.

A stream another replica runs is followed from its resume buffer in Redis, as ``GET
/v1/streams/{id}`` does (its commands are forwarded to that replica): a socket that drops
may come back through any replica.

The gateway sends each frame as ``{"id": N, "event": NAME, "data": {...}}`` (the SSE
frame's three fields, the same bytes of ``data``), a command's answer as ``{"type":
"answer", "to": <command type>, "answer": {...}}``, and a refusal as ``{"type": "error",
"error": {code, message, ...}}`` (the HTTP error body's object). A socket follows one
stream at a time; after its ``done`` it may start or resume another.

A client that offers the subprotocol ``toolforge.frames.v1``
(:data:`toolforge.core.protocol.socket_messages.SUBPROTOCOL`) gets it echoed in the
handshake and reads each batch the frame log hands over as one message of JSON lines,
one frame object per line (what SSE writes with one ``send``); without it, one frame per
message. Answers and refusals are a message of their own (one line) either way.

The socket is admitted like an HTTP request (the ``Host`` allowlist, the API key in
``Authorization: Bearer`` or a ``token`` query parameter for browsers, which cannot set
headers), and a browser page only from its own origin or one of ``CORS_ORIGINS``: a
socket refused is refused before it opens (HTTP 403). Its messages are held to
``MAX_BODY_BYTES``. The socket is the stream's primary reader: a slow client throttles the
model as a slow SSE client does (the frame log's backpressure).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, cast

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from toolforge.api.auth import ApiKey, allowed_tools, check_workflow, own
from toolforge.api.body import parse_stream_request
from toolforge.api.deps import Gateway
from toolforge.api.stream_slot import StreamSlot
from toolforge.core.protocol.socket_messages import frame_lines, select_subprotocol
from toolforge.core.workflow import WorkflowDef
from toolforge.errors import ErrorCode, RequestError, ToolForgeError
from toolforge.runtime.commands import from_wire
from toolforge.runtime.planner import StreamPlan
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_service import Started

__all__ = ["router"]

router = APIRouter(tags=["stream"])

_POLICY_VIOLATION: Final = 1008  # RFC 6455: the socket is refused by policy (no key)
_TOO_BIG: Final = 1009


@router.websocket("/v1/stream/ws")
async def stream_socket(ws: WebSocket) -> None:
    gw: Gateway = ws.app.state.gateway
    key: ApiKey | None = None
    scope = dict(ws.scope)
    scope["method"] = "GET"  # the checks read an HTTP request's method
    refused = _foreign(scope, gw.settings.cors_origins)
    guard = getattr(ws.app, "guard", None)
    if refused is None and guard is not None:
        found = guard.refusal(scope)  # the Host allowlist, as for HTTP
        refused = None if found is None else found.message
    if refused is not None:
        await ws.close(code=_POLICY_VIOLATION, reason=refused[:120])
        return
    access = getattr(ws.app, "access", None)
    if access is not None:
        token = ws.query_params.get("token")
        if token is not None and not any(k == b"authorization" for k, _ in scope["headers"]):
            scope["headers"] = [*scope["headers"], (b"authorization", f"Bearer {token}".encode())]
        try:
            key = await access.admit(scope)
        except ToolForgeError as exc:
            await ws.close(code=_POLICY_VIOLATION, reason=exc.message[:120])
            return
    # RFC 6455: the subprotocol chosen from the client's offer is echoed in the handshake
    # answer; a client that offered none (or none known) gets one frame per message.
    subprotocol = select_subprotocol(ws.scope.get("subprotocols") or ())
    await ws.accept(subprotocol=subprotocol)
    await _Socket(gw, ws, key, batched=subprotocol is not None).serve()


def _foreign(scope: dict[str, Any], cors_origins: str | None) -> str | None:
    """Why a browser page of another origin may not open this socket, if it is one.
    Browsers send ``Origin`` on every WebSocket handshake and apply no CORS to it: without
    this check any page could drive a gateway on localhost (cross-site WebSocket
    hijacking). Same-origin pages and the ``CORS_ORIGINS`` are let in; clients that are no
    browser send no ``Origin``."""
    headers = dict(scope["headers"])
    origin = headers.get(b"origin")
    if origin is None:
        return None
    shown = origin.decode("latin-1")
    allowed = {o.strip() for o in (cors_origins or "").split(",") if o.strip()}
    host = headers.get(b"host", b"").decode("latin-1")
    if shown in allowed or shown.split("://", 1)[-1] == host:
        return None
    return f"origin {shown[:60]!r} may not open this socket (CORS_ORIGINS lists who may)"


class _Socket:
    """One connection: its messages in, the stream it follows out."""

    def __init__(self, gw: Gateway, ws: WebSocket, key: ApiKey | None, *, batched: bool) -> None:
        self._gw = gw
        self._batched = batched  # SUBPROTOCOL: a message per batch, its frames as lines
        self._ws = ws
        self._key = key
        self._caller = None if key is None else key.name
        self._stream_id: str | None = None  # the stream followed (here or elsewhere)
        self._session: StreamSession | None = None  # ... when this replica runs it
        self._writer: asyncio.Task[None] | None = None
        self._primary = False
        self._send_lock = asyncio.Lock()
        self._slot: StreamSlot | None = None

    async def serve(self) -> None:
        try:
            while True:
                text = await self._ws.receive_text()
                if len(text) > self._gw.settings.max_body_bytes:
                    await self._ws.close(code=_TOO_BIG, reason="message over MAX_BODY_BYTES")
                    return
                try:
                    await self._message(text)
                except ToolForgeError as exc:
                    await self._send({"type": "error", "error": exc.to_dict()})
        except WebSocketDisconnect:
            pass
        finally:
            await self._detach()

    async def _send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self._ws.send_text(orjson.dumps(message).decode())

    async def _message(self, text: str) -> None:
        try:
            message = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise _bad(f"a message is one JSON object: {exc}") from exc
        if not isinstance(message, dict):
            raise _bad("a message is one JSON object with a 'type'")
        kind = message.get("type")
        if kind == "start" or (kind == "resume" and "stream_id" in message):
            if self._following():
                raise RequestError(
                    ErrorCode.CONFLICT,
                    "this socket follows a stream until its done: send 'cancel', or open "
                    "another socket",
                    http_status=409,
                )
            await self._detach()
            if kind == "start":
                await self._start(message.get("request"))
            else:
                await self._resume(message)
            return
        stream_id = self._stream_id
        if stream_id is None:
            raise _bad(f"{kind!r} before 'start' or 'resume': this socket follows no stream")
        answer = await self._gw.streams.command(stream_id, from_wire(message), self._caller)
        await self._send({"type": "answer", "to": kind, "answer": answer})

    def _following(self) -> bool:
        return self._writer is not None and not self._writer.done()

    async def _start(self, request: Any) -> None:
        gw, key = self._gw, self._key
        if not isinstance(request, dict):
            raise _bad("'start' needs 'request': a POST /v1/stream body")
        req = parse_stream_request(orjson.dumps(request), gw.settings.max_request_depth)
        workflow: WorkflowDef | None = None
        if key is not None and key.tools is not None:
            visible = (spec.name for spec in gw.executor.registry.visible())
            req = req.model_copy(update={"tools": allowed_tools(key, req.tools, visible)})
            if req.workflow is not None:
                workflow = check_workflow(key, gw.planner.resolve_workflow(req.workflow))

        async def plan(stream_id: str) -> StreamPlan:
            built = await gw.planner.plan(req, stream_id, None, workflow=workflow)
            built = own(built, key)
            return built

        slot = await StreamSlot.take(self._ws.app, key)  # one of the key's streams
        try:
            with slot.starting():
                opened = await gw.streams.open(plan, owner=self._caller)
        except BaseException:
            await slot.release()
            raise
        assert isinstance(opened, Started)  # no Idempotency-Key: nothing to replay
        self._slot = slot  # given back when the socket stops following it
        self._follow(opened.session, after=0, primary=True)

    async def _resume(self, message: dict[str, Any]) -> None:
        stream_id, after = message.get("stream_id"), message.get("after", 0)
        if not isinstance(stream_id, str) or not isinstance(after, int) or after < 0:
            raise _bad("'resume' needs 'stream_id' and 'after' (the last frame id seen)")
        found = await self._gw.streams.find(stream_id, self._caller)
        if isinstance(found, StreamSession):
            self._follow(found, after=after, primary=found.reader_joined(after))
        else:  # run by another replica: its resume buffer, never the primary reader
            self._stream_id, self._session, self._primary = found.id, None, False
            self._writer = asyncio.ensure_future(self._write(found.follow(after)))

    def _follow(self, session: StreamSession, *, after: int, primary: bool) -> None:
        self._stream_id, self._session, self._primary = session.id, session, primary
        self._writer = asyncio.ensure_future(
            self._write(session.log.follow(after, primary=primary))
        )

    async def _write(self, frames: AsyncIterator[bytes]) -> None:
        """Each batch of ``frames`` (SSE blocks; ``b""``: nothing new yet) as one message
        of JSON lines (:data:`SUBPROTOCOL`), or as one message per frame."""
        follow = cast(AsyncGenerator[bytes, None], frames)
        # A message is an ASGI send and a socket write of its own: batched, a batch costs
        # one, as SSE's does (measured in bench.gateway --formats, B2). The lock is taken
        # once per batch, so a command's answer goes between batches.
        send, batched = self._ws.send, self._batched
        try:
            async with contextlib.aclosing(follow) as batches:
                async for batch in batches:
                    if not batch:
                        continue
                    text = frame_lines(batch).decode()
                    async with self._send_lock:
                        if batched:
                            await send({"type": "websocket.send", "text": text})
                            continue
                        for frame in text.split("\n"):
                            await send({"type": "websocket.send", "text": frame})
        except ToolForgeError as exc:  # another replica's buffer, and Redis went away
            await self._send({"type": "error", "error": exc.to_dict()})

    async def _detach(self) -> None:
        """Stop following the current stream: a primary reader's leaving is a disconnect
        (the plan's ``on_disconnect`` applies, as for SSE)."""
        writer, session, slot = self._writer, self._session, self._slot
        self._writer = None
        self._slot = None
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError):
                await writer
        if session is not None and writer is not None:
            if self._primary:
                session.client_left()
            else:
                session.reader_left()
        if slot is not None:  # now, or when the stream ends if it goes on
            await slot.release()


def _bad(message: str) -> RequestError:
    return RequestError(ErrorCode.BAD_REQUEST, message, http_status=400)
