"""The app factory: ``create_app(settings)`` builds everything; nothing happens at import.

The lifespan owns the long-lived objects (the upstream HTTP client, the stream registry)
and closes them in reverse: running streams are cancelled and end with ``done`` and their
artifacts before the upstream client goes away.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from toolforge import __version__
from toolforge.api.agui import router as agui_router
from toolforge.api.auth import Access, KeyRing, key_secrets, load_keys
from toolforge.api.body import ClientGone
from toolforge.api.deps import Gateway
from toolforge.api.fastpath import GatewayApp
from toolforge.api.openapi import install_openapi
from toolforge.api.proxy import router as proxy_router
from toolforge.api.request_guard import RequestGuard
from toolforge.api.responses import router as responses_router
from toolforge.api.retry_after import retry_headers
from toolforge.api.routes import router
from toolforge.api.runs import router as runs_router
from toolforge.api.server_limits import ServerLimits
from toolforge.api.servers import router as servers_router
from toolforge.api.stream_socket import router as stream_socket_router
from toolforge.api.ui_stream import router as ui_stream_router
from toolforge.api.web import install_web
from toolforge.core.context import ContextPolicy
from toolforge.core.engine.completion import Nudges
from toolforge.core.redact import redact, remember_secrets, url_credentials
from toolforge.core.schemas import SchemaRegistry, builtin_registry
from toolforge.core.steps import WorkflowNudges
from toolforge.core.tool_specs import ModelQuery, ToolRegistry
from toolforge.core.workflow import WorkflowCaps
from toolforge.errors import ErrorCode, RequestError, ServerError, ToolForgeError
from toolforge.log import BACKEND_SETUP, configure_logging, get_logger
from toolforge.runtime.admission import Admission
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.backends import Backend, BackendConfig, start_embedded, start_ollama
from toolforge.runtime.cluster import RedisCluster, RedisRateLimiter
from toolforge.runtime.context import context_policy, reported_n_ctx
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.local_backend import LOCAL_MODELS
from toolforge.runtime.mcp import McpSources, load_mcp_config, start_mcp_sources
from toolforge.runtime.metrics import GatewayMetrics
from toolforge.runtime.model_json import ask_json
from toolforge.runtime.planner import PlannerConfig, SessionLimits, StreamPlanner
from toolforge.runtime.ratelimit import FailureThrottle, MemoryRateLimiter, RateLimiter
from toolforge.runtime.readiness import ReadinessCheck, readiness_request
from toolforge.runtime.server_manager import ServerManager
from toolforge.runtime.stream_service import SessionParts, Streams
from toolforge.runtime.streams import StreamRegistry
from toolforge.runtime.tracing import tracing_from_env
from toolforge.runtime.workflows import bundled_workflows_dir, load_workflows
from toolforge.settings import Settings
from toolforge.tools import load_packs
from toolforge.upstream.anthropic import AnthropicUpstream
from toolforge.upstream.base import Upstream
from toolforge.upstream.llama_server import LlamaServerUpstream
from toolforge.upstream.openai_compat import OpenAICompatUpstream
from toolforge.upstream.transport import LeanTransport, UpstreamClient, pool_limits

__all__ = ["PROMPTS_DIR", "create_app", "log_json"]

# prompts/ is package data (toolforge.prompts): the same files from the repo, an editable
# install or a wheel.
PROMPTS_DIR = files("toolforge.prompts")

log = get_logger(__name__)


def _error_response(exc: ToolForgeError) -> JSONResponse:
    # Redacted: a message may quote what an upstream or a tool said (docs/security.md).
    return JSONResponse(
        {"error": redact(exc.to_dict())}, status_code=exc.http_status, headers=retry_headers(exc)
    )


async def _start_backend(
    settings: Settings, client: httpx.AsyncClient, manager: ServerManager
) -> Backend:
    """The embedded llama-server, or the model on the configured Ollama (docs/servers.md)."""
    config = _backend_config(settings)
    if settings.upstream_base_url is None:
        return await start_embedded(
            config, client, manager, progress=lambda line: log.info(BACKEND_SETUP, step=line)
        )
    if settings.model_id == "default":
        raise ServerError(
            ErrorCode.BACKEND_SETUP_FAILED,
            "UPSTREAM_KIND=ollama needs MODEL_ID: the Ollama model to load (e.g. llama3.2)",
        )
    return await start_ollama(
        config, client, manager, settings.upstream_base_url, settings.model_id
    )


def session_limits(settings: Settings) -> SessionLimits:
    """The per-stream limits the settings give (built once per app: see ``Gateway``)."""
    return SessionLimits(
        queue_max_frames=settings.queue_max_frames,
        stream_relay=settings.stream_relay,
        max_frame_bytes=settings.max_frame_bytes,
        max_json_depth=settings.max_json_depth,
        frame_timeout_s=settings.frame_timeout_ms / 1000,
        repair_retries=settings.repair_retries,
        client_tool_timeout_s=settings.client_tool_timeout_ms / 1000,
        disconnect_grace_s=settings.disconnect_grace_ms / 1000,
        pause_max_s=settings.pause_max_s,
    )


def _pointed_at(settings: Settings, backend: Backend) -> dict[str, object]:
    """The settings' upstream fields as they really are once the backend runs."""
    update: dict[str, object] = {"model_id": backend.model_name}
    if backend.server is not None:
        update["upstream_base_url"] = f"{backend.server.base_url}/v1"
        update["upstream_kind"] = "llama_server"
    return update


def _backend_config(settings: Settings) -> BackendConfig:
    return BackendConfig(
        budget_mode=settings.budget_mode,
        budget_tokens=settings.budget_tokens,
        parallel=settings.llama_parallel,
        threads=settings.llama_threads,
        cache_prompt=settings.llama_cache_prompt,
        prefill_forced=settings.llama_prefill_forced,
        server_bin=settings.llama_server_bin,
        model_path=settings.local_model_path,
        local_model=LOCAL_MODELS[settings.local_model],
        model_name=None if settings.model_id == "default" else settings.model_id,
        connect_s=settings.upstream_connect_timeout_s,
        first_byte_s=settings.upstream_first_byte_timeout_s,
        idle_s=settings.upstream_idle_timeout_s,
    )


def remote_upstream(settings: Settings, client: httpx.AsyncClient) -> Upstream:
    """The adapter for ``UPSTREAM_BASE_URL`` in the dialect ``UPSTREAM_KIND`` names.

    ``openai`` (default): any OpenAI-compatible server (Groq, vLLM, Ollama's ``/v1``).
    ``llama_server``: the same stream plus ``cache_prompt`` and grammars; the URL may be
    given with or without ``/v1``.
    """
    url = settings.upstream_base_url
    assert url is not None, "the embedded default has no remote upstream"
    connect_s = settings.upstream_connect_timeout_s
    first_byte_s = settings.upstream_first_byte_timeout_s
    idle_s = settings.upstream_idle_timeout_s
    if settings.upstream_kind == "anthropic":
        return AnthropicUpstream(
            client,
            url,
            api_key=settings.upstream_api_key,
            version=settings.anthropic_version,
            default_max_tokens=settings.anthropic_max_tokens,
            connect_s=connect_s,
            first_byte_s=first_byte_s,
            idle_s=idle_s,
        )
    if settings.upstream_kind == "llama_server":
        root = url.rstrip("/").removesuffix("/v1")
        return LlamaServerUpstream(
            client,
            root,
            cache_prompt=settings.llama_cache_prompt,
            prefill_forced=settings.llama_prefill_forced,
            connect_s=connect_s,
            first_byte_s=first_byte_s,
            idle_s=idle_s,
        )
    return OpenAICompatUpstream(
        client,
        url,
        api_key=settings.upstream_api_key,
        connect_s=connect_s,
        first_byte_s=first_byte_s,
        idle_s=idle_s,
    )


async def _tool_sources(
    settings: Settings, tools: ToolRegistry | None, model: ModelQuery
) -> tuple[ToolRegistry, McpSources | None]:
    """The registry: ``tools`` or the packs of ``TOOL_PACKS``, plus the MCP servers'
    tools (which are started here). ``model`` is the gateway's own model, for packs whose
    tools ask it (task_analysis)."""
    registry = tools if tools is not None else load_packs(settings, model=model)
    servers = load_mcp_config(settings.mcp_config, settings.mcp_servers)
    if not servers:
        return registry, None
    sources = await start_mcp_sources(
        servers,
        registry,
        start_timeout_s=settings.mcp_start_timeout_s,
        default_timeout_s=None,
    )
    return registry, sources


def _cluster(settings: Settings) -> RedisCluster | None:
    if settings.redis_url is None:
        return None
    return RedisCluster(
        settings.redis_url,
        timeout_s=settings.redis_timeout_ms / 1000,
        flush_s=settings.redis_flush_ms / 1000,
        replica_ttl_s=settings.replica_ttl_s,
        resume_ttl_s=settings.resume_ttl_s,
        mirror_caps=(settings.redis_mirror_max_entries, settings.redis_mirror_max_bytes),
        max_connections=settings.redis_max_connections,
    )


async def _context_policy(
    settings: Settings, adapter: Upstream, backend: Backend | None
) -> ContextPolicy | None:
    """The context budget and compaction of every stream (docs/context.md, runtime.context): the
    managed server's decision, else CTX_BUDGET_TOKENS, else the remote llama-server's own
    n_ctx (read once here)."""
    reported: int | None = None
    if (
        backend is None
        and settings.budget_tokens is None
        and isinstance(adapter, LlamaServerUpstream)
    ):
        try:
            reported = reported_n_ctx(await adapter.props())
        except ToolForgeError as exc:
            log.warning("context.props_unavailable", code=str(exc.code), error=exc.message)
    return context_policy(
        settings.context_compaction,
        keep_recent=settings.context_keep_recent,
        threshold=settings.context_threshold,
        server_budget=backend.decision.to_dict() if backend is not None else None,
        manual_tokens=settings.budget_tokens if backend is None else None,
        reported_tokens=reported,
    )


def load_workflow_nudges() -> WorkflowNudges:
    """The workflow runner's corrections (docs/workflows.md): the step tiers and prerequisites from
    ``prompts/workflow_nudge_*.txt``, the retry and unknown-tool ones shared with the
    proxy (``prompts/proxy_nudge_required.txt``, ``proxy_nudge_unknown.txt``)."""

    def text(name: str) -> str:
        return (PROMPTS_DIR / f"{name}.txt").read_text(encoding="utf-8").strip()

    return WorkflowNudges(
        step=(
            text("workflow_nudge_step_1"),
            text("workflow_nudge_step_2"),
            text("workflow_nudge_step_3"),
        ),
        prerequisite=text("workflow_nudge_prerequisite"),
        matched=text("workflow_nudge_matched"),
        retry=text("proxy_nudge_required"),
        unknown=text("proxy_nudge_unknown"),
    )


def log_json(settings: Settings) -> bool | None:
    """JSON logs (True), console lines (False), or by where stderr goes (None): ``LOG_JSON``
    when set, else ``LOG_FORMAT``."""
    if settings.log_json is not None or settings.log_format == "auto":
        return settings.log_json
    return settings.log_format == "json"


@dataclass(frozen=True, slots=True)
class _Prompts:
    """The prompt files every stream's planning reads (prompts/, package data)."""

    system: str
    repair: str
    proxy_tools: str
    workflow: str
    workflow_nudges: WorkflowNudges
    proxy_nudges: Nudges

    @classmethod
    def load(cls) -> _Prompts:
        def text(name: str) -> str:
            return (PROMPTS_DIR / f"{name}.txt").read_text(encoding="utf-8")

        return cls(
            system=text("system"),
            repair=text("repair"),
            proxy_tools=text("proxy_tools"),
            workflow=text("workflow"),
            workflow_nudges=load_workflow_nudges(),
            proxy_nudges=Nudges(
                **{
                    kind: text(f"proxy_nudge_{kind}").strip()
                    for kind in ("required", "unknown", "invalid")
                }
            ),
        )


def _upstream_timeout(settings: Settings) -> httpx.Timeout:
    return httpx.Timeout(
        connect=settings.upstream_connect_timeout_s,
        read=None,  # first-byte and idle timeouts are enforced per read by the adapter
        write=settings.upstream_connect_timeout_s,
        pool=settings.upstream_connect_timeout_s,
    )


@dataclass(frozen=True, slots=True)
class _Upstream:
    """The upstream as it runs: the adapter, and the managed server behind it, if any."""

    settings: Settings  # as they really are once it runs (a managed server's URL, model)
    adapter: Upstream
    servers: ServerManager | None = None
    backend: Backend | None = None


async def _upstream(
    settings: Settings, client: httpx.AsyncClient, upstream: Upstream | None
) -> _Upstream:
    """The upstream adapter: the one handed in, a managed server's (the embedded
    llama-server, or a model on Ollama) or the remote one; with the settings as they
    really are once it runs, and the server manager and backend when there are some."""
    if upstream is not None:
        return _Upstream(settings, upstream)
    if settings.upstream_base_url is not None and settings.upstream_kind != "ollama":
        return _Upstream(settings, remote_upstream(settings, client))
    manager = ServerManager(
        client,
        settings.artifacts_dir / "servers",
        start_timeout_s=settings.server_start_timeout_s,
        nice=settings.llama_nice,
    )
    try:
        backend = await _start_backend(settings, client, manager)
    except BaseException:
        await manager.aclose()
        raise
    effective = settings.model_copy(update=_pointed_at(settings, backend))
    return _Upstream(effective, backend.upstream, manager, backend)


def _gateway_model(model_id: str, upstream: Upstream, repair_template: str) -> ModelQuery:
    """The gateway's own model, for tools that ask it a question (task_analysis)."""

    async def ask(prompt: str, schema: type[BaseModel]) -> tuple[BaseModel, bool]:
        answer = await ask_json(
            upstream, model=model_id, prompt=prompt, schema=schema, repair_template=repair_template
        )
        return answer.value, answer.degraded

    return ask


async def _gateway(
    settings: Settings,
    up: _Upstream,
    client: httpx.AsyncClient,
    tool_registry: ToolRegistry,
    cluster: RedisCluster | None,
    metrics: GatewayMetrics,
    prompts: _Prompts,
) -> Gateway:
    """The gateway: its streams (tools, artifacts, the other replicas), its planner, its
    schemas and metrics."""
    effective, backend = up.settings, up.backend
    executor = ToolExecutor(
        tool_registry,
        concurrency=settings.tool_concurrency,
        default_timeout_s=settings.tool_timeout_ms / 1000,
        gate=None if cluster is None else cluster.gate(settings.tool_concurrency),
    )
    tracing = tracing_from_env()  # OTEL_* variables; None: off
    if tracing is not None:
        tracing.server_url = effective.upstream_base_url
    metrics.know_models([effective.model_id])  # the managed model's own name
    metrics.know_tools(executor.registry.names())
    registry = StreamRegistry(resume_ttl_s=settings.resume_ttl_s)
    metrics.watch_queues(frames=registry.frames_buffered, tools=lambda: executor.queue_depth)
    parts = SessionParts(
        upstream=up.adapter,
        limits=session_limits(effective),
        # docs/protocol.md: each tool's own redaction list too.
        artifacts=ArtifactStore(
            settings.artifacts_dir,
            tool_redact_keys={t.name: t.redact_keys for t in executor.registry},
            max_age_s=settings.artifacts_max_age_s,
            max_bytes=settings.artifacts_max_bytes,
        ),
        metrics=metrics,
        executor=executor,
        repair_template=prompts.repair,
        tracing=tracing,
    )
    schemas = builtin_registry()
    context = await _context_policy(settings, up.adapter, backend)
    budget = backend.decision.to_dict() if backend is not None else None
    return Gateway(
        settings=effective,
        client=client,
        streams=Streams(parts, registry, cluster, _admission(settings, metrics)),
        planner=_planner(settings, effective, client, schemas, executor, prompts, context, budget),
        schemas=schemas,
        metrics=metrics,
        proxy_tools_template=prompts.proxy_tools,
        proxy_nudges=prompts.proxy_nudges,
        servers=up.servers,
        backend=backend,
    )


def _admission(settings: Settings, metrics: GatewayMetrics) -> Admission:
    """One upstream slot per stream, as many as the pool's connections (docs/deployment.md)."""
    return Admission(
        settings.upstream_max_connections,
        settings.admission_timeout_ms / 1000,
        metrics=metrics,
    )


def _planner(
    settings: Settings,
    effective: Settings,
    client: httpx.AsyncClient,
    schemas: SchemaRegistry,
    executor: ToolExecutor,
    prompts: _Prompts,
    context: ContextPolicy | None,
    budget: dict[str, Any] | None = None,
) -> StreamPlanner:
    """The planner of every stream: a request -> a StreamPlan."""
    return StreamPlanner(
        PlannerConfig(
            model_id=effective.model_id,
            upstream_kind=effective.upstream_kind,
            upstream_base_url=effective.upstream_base_url,
            upstream_api_key=effective.upstream_api_key,
            max_json_depth=effective.max_json_depth,
            mode_cache_models=effective.mode_cache_models,
        ),
        client=client,
        schemas=schemas,
        tools=executor.registry,
        system_template=prompts.system,
        budget=budget,
        context=context,
        workflows=load_workflows(
            settings.workflows_dir or bundled_workflows_dir(),
            known_tools=executor.registry.names(),
            skip_unavailable=settings.workflows_dir is None,
        ),
        workflow_nudges=prompts.workflow_nudges,
        workflow_template=prompts.workflow,
        inline_caps=WorkflowCaps(
            max_iterations=settings.inline_workflow_max_iterations,
            max_tool_calls=settings.inline_workflow_max_tool_calls,
            max_budget_tokens=settings.inline_workflow_max_budget_tokens,
        ),
    )


def _readiness(
    settings: Settings, up: _Upstream, client: httpx.AsyncClient, replica: str | None
) -> ReadinessCheck:
    """``/readyz``'s check of the upstream the settings name (its dialect's request);
    ``replica``: this replica's id, named in the details (with Redis)."""
    return ReadinessCheck(
        client,
        readiness_request(
            up.settings.upstream_kind,
            up.settings.upstream_base_url,
            api_key=up.settings.upstream_api_key,
            anthropic_version=up.settings.anthropic_version,
        ),
        ttl_s=settings.readyz_cache_s,
        shown=repr(up.adapter),
        replica=replica,
    )


def create_app(
    settings: Settings | None = None,
    *,
    upstream: Upstream | None = None,
    tools: ToolRegistry | None = None,
    on_ready: Callable[[Settings], None] | None = None,
    limiter: RateLimiter | None = None,
) -> FastAPI:
    """Build the gateway. ``upstream`` replaces the OpenAI-compatible adapter and
    ``tools`` the demo tool pack (tests, embedding applications). ``on_ready`` is called
    with the effective settings (the managed server's URL, for the embedded default) once
    the gateway can serve. ``limiter`` holds the per-key rate limits' state (default: in
    this process, :class:`~toolforge.runtime.ratelimit.MemoryRateLimiter`)."""
    settings = settings if settings is not None else Settings()
    configure_logging(level=settings.log_level, json=log_json(settings))
    # The configured secrets, replaced by value wherever text leaves the gateway (logs,
    # artifacts, error messages and frames): docs/security.md.
    remember_secrets(
        [
            settings.upstream_api_key,
            *url_credentials(settings.upstream_base_url),
            *url_credentials(settings.redis_url),
            *key_secrets(settings),
        ]
    )
    # Model labels: the configured model and METRICS_MODELS; any other name is "other".
    extra_models = (m.strip() for m in (settings.metrics_models or "").split(","))
    metrics = GatewayMetrics(models=[settings.model_id, *(m for m in extra_models if m)])
    prompts = _Prompts.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The lean transport (httptools under httpx's API): one Python step per socket
        # read instead of one per HTTP chunk, and a fraction of httpcore's cost per
        # request (app/upstream/transport.py, bench/RESULTS.md). With preconnect, a spare
        # connection replaces one the upstream closed, ahead of the next request.
        # Its pool holds UPSTREAM_MAX_CONNECTIONS connections, the streams admitted at once.
        limits = pool_limits(settings.upstream_max_connections, settings.upstream_max_keepalive)
        transport = LeanTransport(limits=limits, preconnect=settings.upstream_preconnect)
        async with UpstreamClient(
            timeout=_upstream_timeout(settings), transport=transport
        ) as client:
            up = await _upstream(settings, client, upstream)
            try:
                # Tool sources (docs/tools.md): the packs of TOOL_PACKS, then the MCP
                # servers' tools, all checked against the rules; a broken one stops it.
                ask = _gateway_model(up.settings.model_id, up.adapter, prompts.repair)
                tool_registry, mcp_sources = await _tool_sources(settings, tools, ask)
                cluster = _cluster(settings)  # None unless REDIS_URL is set
                gateway = await _gateway(
                    settings, up, client, tool_registry, cluster, metrics, prompts
                )
            except BaseException:
                if up.servers is not None:
                    await up.servers.aclose()
                raise
            app.state.mcp_sources = mcp_sources
            access = getattr(app, "access", None)
            if access is not None:
                access.sessions = gateway.registry  # where a stream slot's stream is found
                if cluster is not None and limiter is None:
                    # Per-key limits shared by every replica (a limiter handed in is kept).
                    access.limiter = RedisRateLimiter(cluster)
            replica = None if cluster is None else cluster.conn.replica_id
            app.state.readiness = _readiness(settings, up, client, replica)
            app.state.gateway = gateway
            await gateway.streams.start()  # joins the other replicas, with Redis
            # Everything built so far lives as long as the app: out of the collector's
            # sight, so that the collections that run while streams are served (some in
            # the middle of a request) walk only what requests allocate.
            gc.freeze()
            # Full collections only when cheap or long due (runtime.streams.Collector).
            gateway.streams.registry.collector.take_over()
            if on_ready is not None:
                on_ready(up.settings)
            # Artifact retention and the runs index's reconciliation, off the request path.
            retention = asyncio.create_task(gateway.artifacts.maintain())
            try:
                yield
            finally:
                retention.cancel()
                gateway.streams.registry.collector.give_back()
                await gateway.streams.aclose()  # streams end (done, artifacts), then Redis
                if mcp_sources is not None:
                    await mcp_sources.aclose()
                if up.servers is not None:
                    await up.servers.aclose()
                if gateway.streams.parts.tracing is not None:  # flush the last spans
                    await anyio.to_thread.run_sync(gateway.streams.parts.tracing.shutdown)

    app = GatewayApp(
        title="ToolForge",
        version=__version__,
        summary="A streaming tool-calling gateway: typed SSE frames, tools mid-stream, valid JSON.",
        lifespan=lifespan,
    )
    keys = load_keys(settings)  # a KEYS_INVALID error here stops the start-up
    if keys:
        app.access = Access(
            KeyRing(keys),
            limiter if limiter is not None else MemoryRateLimiter(),
            metrics_public=settings.metrics_public,
            throttle=FailureThrottle(settings.auth_failure_limit, settings.auth_failure_window_s),
            metrics=metrics,
        )
    app.allow_origins([o.strip() for o in (settings.cors_origins or "").split(",") if o.strip()])
    # Host allowlist, JSON-only POSTs, every POST's body limits; the server's own limits.
    app.guard = RequestGuard.from_settings(settings, keys=bool(keys))
    app.server_limits = ServerLimits.from_settings(settings)
    app.include_router(router)
    app.include_router(servers_router)
    app.include_router(proxy_router)
    app.include_router(responses_router)
    app.include_router(agui_router)
    app.include_router(ui_stream_router)
    app.include_router(stream_socket_router)
    app.include_router(runs_router)
    install_web(app)
    install_openapi(app)

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
