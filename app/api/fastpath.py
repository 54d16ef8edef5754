"""``POST /v1/stream`` straight to its handler, past FastAPI's routing.

The route is the gateway's hot path, and FastAPI's per-request machinery in front of it
(its middleware layers, matching the path against every route, solving dependencies)
cost about 0.3 ms of the time to first event (bench/RESULTS.md, B1). This ASGI middleware
sends ``POST /v1/stream`` to the same handler, :func:`app.api.routes.stream`, with the
same arguments and the same error responses, and everything else on to FastAPI. The
FastAPI route stays registered, so ``/docs`` and ``/openapi.json`` still describe it.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.routes import ClientGone, stream
from app.errors import ToolForgeError

__all__ = ["StreamFastPath"]


class StreamFastPath:
    """ASGI middleware: ``create_app`` wraps the app in it (inside the error middleware)."""

    def __init__(self, app: ASGIApp, *, gateway_app: FastAPI) -> None:
        self.app = app
        self._gateway_app = gateway_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/stream" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response: Response
        try:
            response = await stream(
                request,
                self._gateway_app.state.gateway,
                request.headers.get("idempotency-key"),
            )
        except ToolForgeError as exc:  # as app.api.app's exception handler answers
            response = JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status)
        except ClientGone:
            response = Response(status_code=499)
        await response(scope, receive, send)
