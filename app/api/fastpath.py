"""``POST /v1/stream`` straight to its handler, ahead of FastAPI's whole stack.

The route is the gateway's hot path. In front of an ordinary route, FastAPI runs five
ASGI layers (its error, telemetry and body-limit middleware, the exception middleware,
the router matching the path against every route) and solves the route's dependencies;
the error middleware also wraps every ``send``, so each SSE write paid for it too. That
cost about 0.3 ms of the time to first event, cold (bench/RESULTS.md, B1).
:class:`GatewayApp` is the FastAPI app with one check in front: ``POST /v1/stream``
goes to the route's own code (:func:`toolforge.api.routes.read_body`, then
:func:`~toolforge.api.routes.start_stream`) with the same error responses; everything else,
and the lifespan, goes to FastAPI as usual. The FastAPI route stays registered, so
``/docs`` and ``/openapi.json`` still describe it.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from toolforge.api.routes import ClientGone, read_body, start_stream
from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.log import STREAM_INTERNAL_ERROR, get_logger

__all__ = ["GatewayApp"]

log = get_logger(__name__)


class GatewayApp(FastAPI):
    """The gateway's ASGI app: FastAPI, with ``POST /v1/stream`` served first."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/stream" and scope["method"] == "POST":
            await self._stream(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        try:
            declared = key = None
            for name, value in scope["headers"]:  # lower-cased by the server (ASGI)
                if name == b"content-length" and declared is None:
                    declared = value.decode("latin-1")
                elif name == b"idempotency-key" and key is None:
                    key = value.decode("latin-1")
            gateway = self.state.gateway
            body = await read_body(receive, declared, gateway.settings.max_body_bytes)
            response = await start_stream(gateway, body, key)
        except ToolForgeError as exc:  # as toolforge.api.app's exception handler answers
            response = JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status)
        except ClientGone:
            response = Response(status_code=499)
        except Exception:  # a bug of ours: a typed 500, as FastAPI's error middleware would
            log.exception(STREAM_INTERNAL_ERROR, path=scope["path"])
            error = ToolForgeError(ErrorCode.INTERNAL, "internal error before the stream began")
            response = JSONResponse({"error": error.to_dict()}, status_code=500)
        await response(scope, receive, send)
