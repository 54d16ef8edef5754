"""The app factory: ``create_app(settings)`` builds everything; nothing happens at import.

The lifespan owns the long-lived objects (the upstream HTTP client, the stream registry)
and closes them in reverse: running streams are cancelled and end with ``done`` and their
artifacts before the upstream client goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from app import __version__
from app.api.deps import Gateway
from app.api.routes import ClientGone, router
from app.core.schemas import builtin_registry
from app.core.tools import ToolRegistry
from app.errors import ErrorCode, RequestError, ToolForgeError
from app.log import configure_logging
from app.runtime.executor import ToolExecutor
from app.runtime.metrics import GatewayMetrics
from app.runtime.streams import StreamRegistry
from app.settings import Settings
from app.upstream.base import Upstream
from app.upstream.openai_compat import OpenAICompatUpstream
from tools import default_registry

__all__ = ["PROMPTS_DIR", "create_app"]

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "prompts"


def _error_response(exc: ToolForgeError) -> JSONResponse:
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status)


def create_app(
    settings: Settings | None = None,
    *,
    upstream: Upstream | None = None,
    tools: ToolRegistry | None = None,
) -> FastAPI:
    """Build the gateway. ``upstream`` replaces the OpenAI-compatible adapter and
    ``tools`` the demo tool pack (tests, embedding applications)."""
    settings = settings if settings is not None else Settings()
    configure_logging(level=settings.log_level, json=settings.log_json)
    system_template = (PROMPTS_DIR / "system.txt").read_text(encoding="utf-8")
    repair_template = (PROMPTS_DIR / "repair.txt").read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(
            connect=settings.upstream_connect_timeout_s,
            read=None,  # first-byte and idle timeouts are enforced per read by the adapter
            write=settings.upstream_connect_timeout_s,
            pool=settings.upstream_connect_timeout_s,
        )
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            adapter = upstream or OpenAICompatUpstream(
                client,
                settings.upstream_base_url,
                api_key=settings.upstream_api_key,
                connect_s=settings.upstream_connect_timeout_s,
                first_byte_s=settings.upstream_first_byte_timeout_s,
                idle_s=settings.upstream_idle_timeout_s,
            )
            registry = StreamRegistry(resume_ttl_s=settings.resume_ttl_s)
            app.state.gateway = Gateway(
                settings=settings,
                upstream=adapter,
                client=client,
                registry=registry,
                metrics=GatewayMetrics(),
                executor=ToolExecutor(
                    tools if tools is not None else default_registry(),
                    concurrency=settings.tool_concurrency,
                    default_timeout_s=settings.tool_timeout_ms / 1000,
                ),
                schemas=builtin_registry(),
                system_template=system_template,
                repair_template=repair_template,
            )
            try:
                yield
            finally:
                await registry.aclose()

    app = FastAPI(
        title="ToolForge",
        version=__version__,
        summary="A streaming tool-calling gateway: typed SSE frames, tools mid-stream, valid JSON.",
        lifespan=lifespan,
    )
    app.include_router(router)

    @app.exception_handler(ToolForgeError)
    async def _ours(request: Request, exc: ToolForgeError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        # 499 (nginx's "client closed request"): logged as what it is, not a traceback.
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": str(e["msg"])}
            for e in exc.errors()
        ]
        return _error_response(
            RequestError(
                ErrorCode.BAD_REQUEST,
                f"invalid {details[0]['field']}: {details[0]['message']}"
                if details
                else "invalid request",
                http_status=422,
                details=details,
            )
        )

    return app
