"""What routes depend on: the ``Gateway`` built by ``create_app``, as an ``Annotated`` alias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from app.core.schemas import SchemaRegistry
from app.runtime.artifacts import ArtifactStore
from app.runtime.backends import Backend
from app.runtime.executor import ToolExecutor
from app.runtime.metrics import GatewayMetrics
from app.runtime.planner import SessionLimits, StreamPlanner
from app.runtime.servers import ServerManager
from app.runtime.streams import StreamRegistry
from app.settings import Settings
from app.upstream.base import Upstream

__all__ = ["Gateway", "GatewayDep", "get_gateway"]


@dataclass(slots=True)
class Gateway:
    """Everything the app owns for its lifetime (built in the lifespan, closed there)."""

    settings: Settings
    upstream: Upstream
    client: httpx.AsyncClient
    registry: StreamRegistry
    metrics: GatewayMetrics
    executor: ToolExecutor
    schemas: SchemaRegistry
    planner: StreamPlanner  # the body of POST /v1/stream -> a StreamPlan (mode, shape, ...)
    repair_template: str
    artifacts: ArtifactStore
    limits: SessionLimits  # from the settings, for every stream
    # SPEC §6: the managed servers (embedded llama-server, Ollama models) and the backend
    # started on them with its budget decision; None for a plain remote upstream.
    servers: ServerManager | None = None
    backend: Backend | None = None


async def get_gateway(request: Request) -> Gateway:
    # async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (about 1 ms here) before every request's first byte.
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
