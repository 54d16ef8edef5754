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
from toolforge.runtime.planner import StreamPlan, StreamPlanner
from toolforge.runtime.server_manager import ServerManager
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_service import Streams
from toolforge.runtime.streams import StreamRegistry
from toolforge.settings import Settings
from toolforge.upstream.base import Upstream

__all__ = ["Gateway", "GatewayDep", "get_gateway"]


@dataclass(slots=True)
class Gateway:
    """What the routes reach for, built in the lifespan and closed there: the settings,
    the streams (started, found and commanded through :class:`Streams`), the planner, the
    schemas, the metrics, and the proxy's prompts."""

    settings: Settings
    client: httpx.AsyncClient  # the upstream HTTP client (the managed servers use it too)
    streams: Streams
    planner: StreamPlanner  # a request -> a StreamPlan (mode, shape, prompt, grammar)
    schemas: SchemaRegistry
    metrics: GatewayMetrics
    # The OpenAI-compatible proxy's prompts (prompts/proxy_*.txt, docs/proxy.md).
    proxy_tools_template: str = ""
    proxy_nudges: Nudges = field(default_factory=Nudges)
    # docs/servers.md: the managed servers (embedded llama-server, Ollama models) and the
    # backend started on them with its budget decision; None for a plain remote upstream.
    servers: ServerManager | None = None
    backend: Backend | None = None

    @property
    def registry(self) -> StreamRegistry:
        return self.streams.registry

    @property
    def cluster(self) -> RedisCluster | None:
        """The state shared with other replicas, when REDIS_URL is set (docs/deployment.md)."""
        return self.streams.cluster

    @property
    def executor(self) -> ToolExecutor:
        return self.streams.parts.executor

    @property
    def upstream(self) -> Upstream:
        return self.streams.parts.upstream

    @property
    def artifacts(self) -> ArtifactStore:
        return self.streams.parts.artifacts

    def session(self, plan: StreamPlan) -> StreamSession:
        """A new stream for ``plan``, with everything the app owns (not started)."""
        return self.streams.parts.session(plan)


async def get_gateway(request: Request) -> Gateway:
    # async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a
    # thread hop (about 1 ms here) before every request's first byte.
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
