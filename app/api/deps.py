"""What routes depend on: the ``Gateway`` built by ``create_app``, as an ``Annotated`` alias."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import httpx
from fastapi import Depends, Request

from toolforge.core.engine.completion import Nudges
from toolforge.core.schemas import SchemaRegistry
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.backends import Backend
from toolforge.runtime.cluster import RedisCluster
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.metrics import GatewayMetrics
from toolforge.runtime.planner import SessionLimits, StreamPlan, StreamPlanner
from toolforge.runtime.servers import ServerManager
from toolforge.runtime.session import StreamSession
from toolforge.runtime.streams import StreamRegistry
from toolforge.runtime.tracing import Tracing
from toolforge.settings import Settings
from toolforge.upstream.base import Upstream

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
    # docs/servers.md: the managed servers (embedded llama-server, Ollama models) and the backend
    # started on them with its budget decision; None for a plain remote upstream.
    servers: ServerManager | None = None
    backend: Backend | None = None
    # The OpenAI-compatible proxy's prompts (prompts/proxy_*.txt, docs/proxy.md).
    proxy_tools_template: str = ""
    proxy_nudges: Nudges = field(default_factory=Nudges)
    # docs/deployment.md: the state shared with other replicas, when REDIS_URL is set; None (the
    # default) keeps everything in this process.
    cluster: RedisCluster | None = None
    # OpenTelemetry traces (toolforge.runtime.tracing): None unless OTEL_* ask for them.
    tracing: Tracing | None = None

    def session(self, plan: StreamPlan) -> StreamSession:
        """A new stream for ``plan``, with everything the app owns (not started)."""
        return StreamSession(
            plan,
            upstream=self.upstream,
            limits=self.limits,
            artifacts=self.artifacts.run(plan.stream_id),
            metrics=self.metrics,
            executor=self.executor,
            repair_template=self.repair_template,
            tracing=self.tracing,
        )


async def get_gateway(request: Request) -> Gateway:
    # async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (about 1 ms here) before every request's first byte.
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
