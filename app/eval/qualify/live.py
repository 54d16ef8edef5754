"""How one eval run happens: the scenario's workflow through ``POST /v1/stream`` of a real
gateway on loopback, the frames read back into a :class:`RunResult`.

The eval drives the product users get, over its public protocol: the gateway is
:func:`toolforge.api.app.create_app` with the scenario's tools as its registry (fresh tools,
so fresh state, every run), served by uvicorn on an ephemeral port; the workflow goes
inline in the request with the ablation applied. Everything a metric needs is in the
frames: ``tool.call``/``tool.result`` (calls, errors, rescues), ``step.nudge`` (tiers),
``context.compacted`` (phases), ``json.end``/``result.end`` (repaired, degraded), ``error``
and ``done`` (usage, the workflow's iterations).

Backends: ``embedded`` starts the managed llama-server once for the batch (``--model``
smollm2-135m or gemma3-270m) and points every run's gateway at it; a URL is any
OpenAI-compatible server (``llama:URL`` for a llama-server, with grammars); ``ollama[:URL]``;
``anthropic[:URL]`` is Anthropic's Messages API (``ANTHROPIC_API_KEY``; native mode is its
tool use); ``scripted:MODEL`` plays a scripted model in process (offline, deterministic).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Final

import httpx
import orjson
from httpx_sse import aconnect_sse

from toolforge.api.app import create_app
from toolforge.core.tool_specs import ToolRegistry
from toolforge.eval.loopback import serve
from toolforge.eval.qualify.batch import Job, RunFn
from toolforge.eval.qualify.metrics import RunResult
from toolforge.eval.qualify.scenario import Call
from toolforge.eval.qualify.scripted import MODELS, scripted
from toolforge.runtime.local_backend import LOCAL_MODELS
from toolforge.settings import Settings
from toolforge.upstream.base import Upstream

__all__ = ["Backend", "EvalSetupError", "make_run", "model_label", "read_run", "run_once"]

RUN_TIMEOUT_S = 600.0
MAX_TOKENS_PER_TURN = 192  # a call or a short answer fits; a small model's rambling is cut


class EvalSetupError(Exception):
    """The gateway refused the run's request (a 4xx): the batch's setup is wrong, not the
    model, so the batch stops instead of recording the same failure N times."""

    fatal = True


def model_label(backend: str, model: str | None) -> str:
    """The model's name in results: the scripted model's, the embedded one's, or as given."""
    if backend.startswith("scripted:"):
        return backend
    if backend == "embedded":
        return LOCAL_MODELS[model or "smollm2-135m"].name
    return model or "default"


class Backend:
    """Where runs send the model's turns: settings for each run's gateway, and for the
    scripted backend the model to put in front of it."""

    def __init__(self, settings: dict[str, Any], scripted_model: str | None = None) -> None:
        self.settings = settings
        self.scripted_model = scripted_model


def _parse_backend(backend: str, model: str | None) -> dict[str, Any]:
    if backend.startswith("llama:"):
        return {
            "upstream_base_url": backend.removeprefix("llama:"),
            "upstream_kind": "llama_server",
        }
    if backend == "ollama" or backend.startswith("ollama:"):
        url = backend.partition(":")[2] or "http://127.0.0.1:11434"
        return {"upstream_base_url": url, "upstream_kind": "ollama", "model_id": model or "default"}
    if backend.startswith(("http://", "https://")):
        return {"upstream_base_url": backend, "model_id": model or "default"}
    if backend == "anthropic" or backend.startswith("anthropic:"):
        # A frontier baseline (docs/eval.md): Anthropic's Messages API, the key from the
        # environment; ``anthropic:URL`` for another endpoint of the same API.
        key = os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("UPSTREAM_API_KEY")
        if not key:
            raise ValueError("--backend anthropic needs ANTHROPIC_API_KEY in the environment")
        url = backend.partition(":")[2] or os.environ.get(
            "ANTHROPIC_BASE_URL", "https://api.anthropic.com"
        )
        return {
            "upstream_base_url": url,
            "upstream_kind": "anthropic",
            "upstream_api_key": key,
            "model_id": model or "claude-haiku-4-5",
        }
    raise ValueError(
        f"unknown backend {backend!r}: embedded, a URL, llama:URL, ollama[:URL], anthropic[:URL] "
        f"or scripted:MODEL ({', '.join(MODELS)})"
    )


@contextlib.asynccontextmanager
async def _embedded(model: str | None) -> AsyncIterator[dict[str, Any]]:
    """The managed llama-server for the whole batch: one gateway's lifespan starts it (and
    stops it after); each run's gateway talks to it directly."""
    key = model or "smollm2-135m"
    if key not in LOCAL_MODELS:
        raise ValueError(f"no embedded model {key!r}; known: {', '.join(LOCAL_MODELS)}")
    with tempfile.TemporaryDirectory(prefix="toolforge-eval-") as tmp:
        host = create_app(
            Settings(artifacts_dir=Path(tmp), local_model=key, log_level="WARNING"),
        )
        # Its lifespan only (no HTTP): starting llama-server can take a minute.
        async with host.router.lifespan_context(host):
            effective: Settings = host.state.gateway.settings
            yield {
                "upstream_base_url": effective.upstream_base_url,
                "upstream_kind": "llama_server",
                "model_id": effective.model_id,
            }


@contextlib.asynccontextmanager
async def make_run(backend: str, model: str | None) -> AsyncIterator[RunFn]:
    """A run function for ``backend`` (set up once for the batch, torn down after)."""
    async with contextlib.AsyncExitStack() as stack:
        if backend.startswith("scripted:"):
            name = backend.removeprefix("scripted:")
            if name not in MODELS:
                raise ValueError(f"no scripted model {name!r}; known: {', '.join(MODELS)}")
            chosen = Backend({"upstream_base_url": "http://127.0.0.1:9/v1"}, name)
        elif backend == "embedded":
            chosen = Backend(await stack.enter_async_context(_embedded(model)))
        else:
            chosen = Backend(_parse_backend(backend, model))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolforge-eval-")))

        async def run(job: Job) -> RunResult:
            return await run_once(job, chosen, tmp)

        yield run


async def run_once(job: Job, backend: Backend, artifacts: Path) -> RunResult:
    """One run: a gateway with the scenario's fresh tools, one stream, its frames read."""
    scenario = job.scenario
    tools = ToolRegistry(scenario.build_tools())
    upstream: Upstream | None = None
    mode = job.ablation.mode(job.mode)
    if backend.scripted_model is not None:
        upstream = scripted(backend.scripted_model, scenario, native=mode == "native")
        mode = "sentinel" if mode in ("auto", "constrained") else mode
    # The scenario's workflow comes inline: no bundled workflow (they name demo tools).
    no_workflows = artifacts / "no-workflows"
    no_workflows.mkdir(exist_ok=True)
    settings = Settings(
        artifacts_dir=artifacts,
        log_level="WARNING",
        workflows_dir=no_workflows,
        **backend.settings,
    )
    app = create_app(settings, upstream=upstream, tools=tools)
    body: dict[str, Any] = {
        "input": scenario.prompt,
        "mode": mode,
        "workflow": job.ablation.apply(scenario.workflow()),
        # Low temperature, a seed, and a bound per turn: a small model that never stops
        # would otherwise write to the end of its context on every turn.
        "sampling": {"seed": job.seed, "temperature": 0.2, "max_tokens": MAX_TOKENS_PER_TURN},
    }
    if scenario.system:
        body["system"] = scenario.system
    started = time.monotonic()
    async with serve(app) as url, httpx.AsyncClient(timeout=RUN_TIMEOUT_S) as client:
        try:
            async with asyncio.timeout(RUN_TIMEOUT_S):
                events, refused = await _stream(client, f"{url}/v1/stream", body)
        except TimeoutError:  # a run, not the batch: recorded as a failure with its code
            events, refused = (
                [
                    (
                        "error",
                        {
                            "code": "RUN_TIMEOUT",
                            "message": f"no done frame within {RUN_TIMEOUT_S:g} s",
                        },
                    )
                ],
                None,
            )
    if refused is None:
        refused = _credentials_refused(events)
    if refused is not None:  # raised once the gateway is down, not through its shutdown
        raise EvalSetupError(refused)
    return read_run(job, events, time.monotonic() - started, config=_config(job, mode))


_REFUSED_CREDENTIALS: Final = re.compile(r"\bHTTP (401|403)\b")


def _credentials_refused(events: list[tuple[str, Any]]) -> str | None:
    """The upstream's 401/403 (a wrong or missing API key): every run would fail the same
    way, so it stops the batch like a refused request rather than scoring the model."""
    for name, data in events:
        if name == "error" and data.get("code") == "UPSTREAM_HTTP_ERROR":
            message = str(data.get("message", ""))
            if _REFUSED_CREDENTIALS.search(message):
                return f"the upstream refused the credentials ({message}); check the API key"
    return None


def _config(job: Job, mode: str) -> dict[str, Any]:
    return {"seed": job.seed, "mode_sent": mode, "budget_tokens": job.scenario.budget_tokens}


async def _stream(
    client: httpx.AsyncClient, url: str, body: Mapping[str, Any]
) -> tuple[list[tuple[str, Any]], str | None]:
    """The run's frames, or the refusal's text when the gateway answered a 4xx."""
    events: list[tuple[str, Any]] = []
    async with aconnect_sse(client, "POST", url, json=body) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            return [], f"POST /v1/stream answered {source.response.status_code}: " + (
                source.response.text[:500]
            )
        async for sse in source.aiter_sse():
            if sse.event != "ping":
                events.append((sse.event, orjson.loads(sse.data)))
    return events, None


def read_run(
    job: Job, events: list[tuple[str, Any]], latency_s: float, *, config: Mapping[str, Any]
) -> RunResult:
    """A :class:`RunResult` from a run's frames (pure: the offline tests feed it frames)."""
    scenario = job.scenario
    terminal = set(scenario.terminal_tools)
    calls: dict[str, tuple[str, Any]] = {}
    graded: list[Call] = []
    trace: list[list[Any]] = []
    nudges: dict[str, int] = {}
    compactions: dict[str, int] = {}
    rescues = repaired = degraded = tool_errors = 0
    terminal_args: Mapping[str, Any] | None = None
    terminal_name: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    usage: Mapping[str, Any] = {}
    workflow: Mapping[str, Any] = {}
    for event, data in events:
        if event == "tool.call":
            calls[data["id"]] = (data["name"], data.get("args"))
            rescues += bool(data.get("rescued"))
        elif event == "tool.result":
            name, args = calls.get(data["id"], (data["name"], None))
            ok = bool(data["ok"])
            tool_errors += not ok
            graded.append(Call(name, args if isinstance(args, dict) else {}, ok))
            trace.append([name, args, None if ok else _failure(data)])
            if ok and name in terminal and terminal_args is None:
                terminal_args = args if isinstance(args, dict) else {}
                terminal_name = name
        elif event == "step.nudge":
            key = f"{data.get('kind', 'step')}:{data.get('tier', 1)}"
            nudges[key] = nudges.get(key, 0) + 1
        elif event == "context.compacted":
            phase = str(data.get("phase", 1))
            compactions[phase] = compactions.get(phase, 0) + 1
        elif event in ("json.end", "result.end"):
            repaired += bool(data.get("repaired"))
            degraded += bool(data.get("degraded"))
        elif event == "error" and error_code is None:
            error_code = data.get("code")
            error_message = str(data.get("message", ""))[:300]
        elif event == "done":
            usage = data.get("usage") or {}
            workflow = data.get("workflow") or {}
    completed = terminal_args is not None
    correct = completed and bool(scenario.grade(terminal_args or {}, graded))
    iterations = int(workflow.get("iterations") or len(calls) or 1)
    return RunResult(
        scenario=scenario.name,
        model=job.model,
        mode=job.mode,
        ablation=job.ablation.name,
        run=job.run,
        completed=completed,
        correct=correct,
        iterations=iterations,
        ideal_iterations=scenario.ideal_iterations,
        tool_calls=len(calls),
        latency_s=round(latency_s, 4),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        nudges=dict(sorted(nudges.items())),
        rescues=rescues,
        retries=sum(v for k, v in nudges.items() if k.startswith("retry")),
        compactions=dict(sorted(compactions.items())),
        repaired=repaired,
        degraded=degraded,
        tool_errors=tool_errors,
        error_code=error_code,
        error_message=error_message,
        terminal=terminal_name,
        config=dict(config),
        trace=trace,
    )


def _failure(result: Mapping[str, Any]) -> str:
    """A failed tool result's message, short enough for a line of the JSONL."""
    error = result.get("error")
    text = error.get("message") if isinstance(error, Mapping) else error
    return str(text if text is not None else result.get("result", ""))[:160]
