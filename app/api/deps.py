"""What routes depend on: the ``Gateway`` built by ``create_app``, as an ``Annotated`` alias."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
from fastapi import Depends, Request

from app.core.schemas import CompiledSchema, SchemaRegistry
from app.core.tools import ToolSpec
from app.runtime.artifacts import ArtifactStore
from app.runtime.backends import Backend
from app.runtime.executor import ToolExecutor
from app.runtime.metrics import GatewayMetrics
from app.runtime.servers import ServerManager
from app.runtime.session import SessionLimits
from app.runtime.streams import StreamRegistry
from app.settings import Settings
from app.upstream.base import Upstream
from app.upstream.probe import ModeDecision

__all__ = ["Gateway", "GatewayDep", "PlanShape", "get_gateway"]


@dataclass(frozen=True, slots=True)
class PlanShape:
    """What a request's schemas, tools and mode make of its plan, apart from its messages
    and sampling: the same for every request that names the same registered schemas and
    tools, so it is built once per combination (``Gateway.shapes``, app.api.routes._shape)."""

    schemas: Mapping[str, CompiledSchema]
    visible: Sequence[ToolSpec[Any]]
    system: str
    extra: Mapping[str, Any]  # native mode: the upstream's own tools
    registered: Mapping[str, CompiledSchema]  # every schema the request can name
    # For the prompt record (artifacts): the schema documents and the tools' descriptions.
    schema_docs: Mapping[str, Any]
    tool_dicts: Sequence[Mapping[str, Any]]


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
    system_template: str
    repair_template: str
    artifacts: ArtifactStore
    limits: SessionLimits  # from the settings, for every stream
    # SPEC §6: the managed servers (embedded llama-server, Ollama models) and the backend
    # started on them with its budget decision; None for a plain remote upstream.
    servers: ServerManager | None = None
    backend: Backend | None = None
    # mode=auto: one probe per model, shared by concurrent first requests, then cached.
    modes: dict[str, asyncio.Future[ModeDecision]] = field(default_factory=dict)
    # What each combination of schemas, tools and mode makes of a plan (the system prompt
    # among it), by (result schema, object schema names, tool names, mode): see
    # app.api.routes._shape.
    shapes: dict[tuple[object, ...], PlanShape] = field(default_factory=dict)


async def get_gateway(request: Request) -> Gateway:
    # async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (about 1 ms here) before every request's first byte.
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
