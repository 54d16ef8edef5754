"""The gateway's ASGI entry: the access check, CORS, and the two hot routes ahead of FastAPI.

**Hot routes.** ``POST /v1/stream`` and ``POST /v1/chat/completions`` are the gateway's hot
paths. In front of an ordinary route, FastAPI runs five ASGI layers (its error, telemetry
and body-limit middleware, the exception middleware, the router matching the path against
every route) and solves the route's dependencies; the error middleware also wraps every
``send``, so each SSE write paid for it too. That cost about 0.3 ms of the time to first
event, cold (bench/RESULTS.md, B1 and B1p). :class:`GatewayApp` is the FastAPI app with
one check in front: these two go to the routes' own code
(:func:`toolforge.api.routes.start_stream`, :func:`toolforge.api.proxy.complete`) with the
same error responses (the proxy's in OpenAI's shape); everything else, and the lifespan,
goes to FastAPI as usual. The FastAPI routes stay registered, so ``/docs`` and
``/openapi.json`` still describe them.

**Access (docs/security.md).** With API keys configured, every HTTP request passes
:meth:`toolforge.api.auth.Access.admit` here, before the dispatch: the fast paths and
every FastAPI route share the one check, and a route added later is covered by default.
The key goes in the scope (``toolforge.api.auth.SCOPE_KEY``); requests that open a stream
also take one of the key's concurrent streams, held until that stream has ended (after the
response, for a stream that goes on without its client: ``Access.request_ended``).

**The request's shape** (:class:`toolforge.api.request_guard.RequestGuard`): before the
access check, the ``Host`` allowlist and the JSON-only rule for POSTs (a 403 or 415, in
the route's error shape); in the dispatch, the body of a POST that FastAPI serves is read
within ``MAX_BODY_BYTES`` and ``MAX_REQUEST_DEPTH`` first, as the hot routes read theirs.
The server underneath has its own limits (:mod:`toolforge.api.server_limits`).

**CORS.** With ``CORS_ORIGINS`` set, Starlette's ``CORSMiddleware`` wraps all of it:
preflights are answered before the access check (browsers send them without the key), and
every response, refusals included, carries the CORS headers for an allowed origin.
"""

from __future__ import annotations

from typing import Final

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from toolforge.api.auth import SCOPE_KEY, Access, ApiKey
from toolforge.api.body import ClientGone, read_body
from toolforge.api.proxy import complete, openai_error
from toolforge.api.request_guard import RequestGuard
from toolforge.api.retry_after import retry_headers
from toolforge.api.routes import start_stream
from toolforge.api.server_limits import ServerLimits
from toolforge.api.ui_stream import ui_chat_scope
from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.log import STREAM_INTERNAL_ERROR, get_logger

__all__ = ["CORS_ALLOW_HEADERS", "CORS_EXPOSE_HEADERS", "GatewayApp"]

log = get_logger(__name__)

CORS_ALLOW_HEADERS: Final = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")
CORS_EXPOSE_HEADERS: Final = (
    "X-Stream-Id",
    "X-ToolForge-Mode",
    "X-ToolForge-Guardrails",
    "Idempotent-Replayed",
    "Retry-After",
)
_PROXY: Final = "/v1/chat/completions"


def _is_openai(path: str) -> bool:
    return path.startswith(("/v1/chat/", "/v1/responses/")) or path in (
        "/v1/models",
        "/v1/responses",
    )


def _opens_stream(path: str, method: str) -> bool:
    """The requests that may start a stream, and so take one of a key's concurrent
    streams (a resume follows a stream that holds one already)."""
    return method == "POST" and path in ("/v1/stream", _PROXY)


def refusal(exc: ToolForgeError, path: str) -> Response:
    """An access refusal in the route's error shape (OpenAI's under ``/v1/chat``,
    ``/v1/responses`` and ``/v1/models``, so the SDKs raise AuthenticationError,
    RateLimitError, ...)."""
    response = (
        openai_error(exc)
        if _is_openai(path)
        else JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status)
    )
    if exc.http_status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    response.headers.update(retry_headers(exc) or {})
    return response


class GatewayApp(FastAPI):
    """The gateway's ASGI app: FastAPI, behind the access check and CORS, with the hot
    routes served first (see the module docstring)."""

    access: Access | None = None  # None: no keys configured, every request goes on
    guard: RequestGuard | None = None  # None: no Host, Content-Type or routed-body checks
    server_limits: ServerLimits = ServerLimits()  # what GatewayServer serves it with
    _cors: ASGIApp | None = None

    def allow_origins(self, origins: list[str]) -> None:
        """CORS for ``origins`` (none: off)."""
        self._cors = (
            CORSMiddleware(
                self._serve,
                allow_origins=origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=list(CORS_ALLOW_HEADERS),
                expose_headers=list(CORS_EXPOSE_HEADERS),
                max_age=600,
            )
            if origins
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan (the gateway has no websockets)
            await super().__call__(scope, receive, send)
        elif self._cors is not None:
            await self._cors(scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope = ui_chat_scope(scope)  # /v1/stream asking for the UI stream goes to /v1/ui/chat
        guard = self.guard
        if guard is not None:
            refused = guard.refusal(scope)
            if refused is not None:
                await refusal(refused, scope["path"])(scope, receive, send)
                return
        access = self.access
        if access is None:
            await self._dispatch(scope, receive, send)
            return
        path = scope["path"]
        try:
            key = await access.admit(scope)
        except ToolForgeError as exc:
            await refusal(exc, path)(scope, receive, send)
            return
        scope[SCOPE_KEY] = key
        if key is None or not _opens_stream(path, scope["method"]):
            await self._dispatch(scope, receive, send)
            return
        try:
            slot = await access.open_stream(key)
        except ToolForgeError as exc:
            await refusal(exc, path)(scope, receive, send)
            return
        try:
            with access.serving(slot):  # the stream started here takes the slot over
                await self._dispatch(scope, receive, send)
        finally:
            await access.request_ended(slot)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST":
            path = scope["path"]
            if path == "/v1/stream":
                await self._stream(scope, receive, send)
                return
            if path == _PROXY:
                await self._complete(scope, receive, send)
                return
            if self.guard is not None:
                try:
                    receive = await self.guard.buffered(scope, receive)
                except ToolForgeError as exc:
                    await refusal(exc, path)(scope, receive, send)
                    return
                except ClientGone:
                    await Response(status_code=499)(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        try:
            declared = idempotency = None
            for name, value in scope["headers"]:  # lower-cased by the server (ASGI)
                if name == b"content-length" and declared is None:
                    declared = value.decode("latin-1")
                elif name == b"idempotency-key" and idempotency is None:
                    idempotency = value.decode("latin-1")
            gateway = self.state.gateway
            body = await read_body(receive, declared, gateway.settings.max_body_bytes)
            key: ApiKey | None = scope.get(SCOPE_KEY)
            response = await start_stream(gateway, body, idempotency, key)
        except ToolForgeError as exc:  # as toolforge.api.app's exception handler answers
            response = JSONResponse(
                {"error": exc.to_dict()}, status_code=exc.http_status, headers=retry_headers(exc)
            )
        except ClientGone:
            response = Response(status_code=499)
        except Exception:  # a bug of ours: a typed 500, as FastAPI's error middleware would
            log.exception(STREAM_INTERNAL_ERROR, path=scope["path"])
            error = ToolForgeError(ErrorCode.INTERNAL, "internal error before the stream began")
            response = JSONResponse({"error": error.to_dict()}, status_code=500)
        await response(scope, receive, send)

    async def _complete(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        try:
            declared = None
            for name, value in scope["headers"]:
                if name == b"content-length":
                    declared = value.decode("latin-1")
                    break
            key: ApiKey | None = scope.get(SCOPE_KEY)
            response = await complete(self.state.gateway, receive, declared, key)
        except ToolForgeError as exc:
            response = openai_error(exc)
        except ClientGone:
            response = Response(status_code=499)
        except Exception:  # a bug of ours: a 500 in OpenAI's shape
            log.exception(STREAM_INTERNAL_ERROR, path=scope["path"])
            error = ToolForgeError(ErrorCode.INTERNAL, "internal error before the stream began")
            response = openai_error(error, 500)
        await response(scope, receive, send)
