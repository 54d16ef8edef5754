"""ServerManager: local llama-server processes, started, health-checked, reused, stopped.

docs/servers.md. A server is identified by everything that changes what it serves: binary, model,
context size, slots, KV-cache types and extra flags (:meth:`LlamaServerSpec.key`). Asking
for a spec that is already running and healthy returns that server (reuse); anything else
starts a new process on a free loopback port and polls ``GET /health`` until the model is
loaded (llama-server answers 503 while loading), then reads ``GET /props`` for the context
each slot really got.

Every server has a watcher task that awaits its process. An exit nobody asked for is a
crash: it is logged with the exit status and the tail of the server's log, the state turns
``crashed`` (what ``/v1/servers`` shows), and the manager restarts it on the same port, so
the upstream URL the gateway holds stays valid. Streams that were reading from the dead
process end with an ``UPSTREAM_*`` error frame then ``done`` (the adapter sees the
connection drop); the next stream reaches the restarted server. Restarts are bounded
(``max_restarts``), so a server that crashes at start-up does not loop forever.

Nothing is left running: the gateway's lifespan calls :meth:`ServerManager.aclose`, which
terminates (then kills) every process, and on Linux each child also gets
``PR_SET_PDEATHSIG`` so it dies with the gateway even on ``kill -9``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import httpx

from toolforge.errors import ErrorCode, ServerError, UpstreamError
from toolforge.log import SERVER_CRASHED, SERVER_READY, SERVER_RESTARTED, SERVER_STOPPED, get_logger
from toolforge.upstream.ollama_control import LoadedModel, OllamaControl, same_model

__all__ = ["LlamaServerSpec", "ManagedServer", "OllamaModel", "ServerManager", "ServerState"]

log = get_logger(__name__)

_POLL_S: Final = 0.05
_STOP_GRACE_S: Final = 5.0
_LOG_TAIL_LINES: Final = 15
_PR_SET_PDEATHSIG: Final = 1


class ServerState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    CRASHED = "crashed"  # died on its own; a restart follows unless the budget is spent
    FAILED = "failed"  # could not start, or crashed more than max_restarts times
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class LlamaServerSpec:
    """How to run one llama-server; equal specs are the same server (reuse).

    ``args`` are the flags of the budget decision (context size, ``--parallel`` slots,
    KV-cache types: :meth:`toolforge.core.budget.BudgetDecision.server_args`) and any others.
    """

    binary: Path
    model_path: Path
    model_name: str  # the alias clients send as "model"
    args: tuple[str, ...] = ()
    threads: int | None = None

    def argv(self, port: int) -> list[str]:
        argv = [
            str(self.binary),
            "--model", str(self.model_path),
            "--alias", self.model_name,
            "--host", "127.0.0.1",
            "--port", str(port),
            *self.args,
        ]  # fmt: skip
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv


@dataclass(slots=True)
class ManagedServer:
    """One llama-server process and what we know of it."""

    spec: LlamaServerSpec
    port: int
    log_path: Path
    state: ServerState = ServerState.STARTING
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    started_at: float | None = None  # wall clock, for /v1/servers
    ready_s: float | None = None  # seconds from spawn to healthy
    restarts: int = 0
    last_exit: int | None = None
    last_error: str | None = None
    props: dict[str, Any] = field(default_factory=dict)
    budget: Mapping[str, Any] | None = None  # the context-budget decision it was started with
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    stopping: bool = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def slot_n_ctx(self) -> int | None:
        """Context per slot, as the server reports it in ``/props``."""
        settings = self.props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return n_ctx if isinstance(n_ctx, int) else None

    def describe(self) -> dict[str, Any]:
        """The ``/v1/servers`` entry: backend, model, state, context budget, process."""
        return {
            "backend": "llama-server",
            "model": self.spec.model_name,
            "model_path": str(self.spec.model_path),
            "state": str(self.state),
            "base_url": self.base_url,
            "pid": self.process.pid if self.process is not None else None,
            "args": list(self.spec.args),
            "slot_n_ctx": self.slot_n_ctx,
            "total_slots": self.props.get("total_slots"),
            "budget": dict(self.budget) if self.budget is not None else None,
            "started_at": self.started_at,
            "ready_s": self.ready_s,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "last_error": self.last_error,
            "log": str(self.log_path),
        }


@dataclass(slots=True)
class OllamaModel:
    """A model the gateway loaded on an Ollama server, and what Ollama said of it."""

    control: OllamaControl = field(repr=False)
    model: str
    num_ctx: int
    keep_alive: str | float
    budget: Mapping[str, Any] | None = None
    loaded: LoadedModel | None = None
    last_error: str | None = None

    def describe(self) -> dict[str, Any]:
        loaded = self.loaded
        return {
            "backend": "ollama",
            "model": self.model,
            "base_url": self.control.base_url,
            "state": "loaded" if loaded is not None else "unloaded",
            "num_ctx": self.num_ctx,
            "context_length": loaded.context_length if loaded else None,
            "size_bytes": loaded.size if loaded else None,
            "size_vram_bytes": loaded.size_vram if loaded else None,
            "gpu_fraction": round(loaded.gpu_fraction, 3) if loaded else None,
            "expires_at": loaded.expires_at.isoformat() if loaded and loaded.expires_at else None,
            "keep_alive": self.keep_alive,
            "budget": dict(self.budget) if self.budget is not None else None,
            "last_error": self.last_error,
        }


def free_port() -> int:
    """A loopback port nobody listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_setup(nice: int) -> Callable[[], None]:
    """What runs in the child between fork and exec: die with the gateway (Linux), and
    lower the server's CPU priority by ``nice`` (threads it starts inherit it)."""

    def setup() -> None:
        if sys.platform == "linux":
            _die_with_parent()
        if nice:
            with contextlib.suppress(OSError):  # best effort: the server runs either way
                os.nice(nice)

    return setup


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


class ServerManager:
    """Starts, reuses, watches, restarts and stops llama-server processes (docs/servers.md).

    ``client`` is used for health and ``/props`` requests; ``log_dir`` receives one log
    file per server. ``on_change`` is called after every state change (metrics).

    ``nice``: how much lower than the gateway's the servers' CPU priority is (Linux
    ``nice``; 0 leaves it equal; the gateway's ``LLAMA_NICE`` defaults to 10). On a
    machine without a GPU, llama-server's threads keep every core busy while it
    generates; at equal priority, the gateway (and the client) woken by a token then
    wait for a scheduler tick (4 ms here) about every other time before they get a core:
    measured with bench/llama.py's set-up, the first token reached the client 3-5 ms
    late in 9 of 20 streams at nice 0 and in 3 of 20 at nice 10. The server loses
    nothing while nobody else wants the CPU.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        log_dir: Path,
        *,
        start_timeout_s: float = 120.0,
        max_restarts: int = 3,
        on_change: Callable[[ManagedServer], None] | None = None,
        nice: int = 0,
    ) -> None:
        self._client = client
        self._nice = nice
        self._log_dir = log_dir
        self._start_timeout_s = start_timeout_s
        self._max_restarts = max_restarts
        self._on_change = on_change or (lambda server: None)
        self._servers: dict[LlamaServerSpec, ManagedServer] = {}
        self._ollama: dict[str, OllamaModel] = {}
        self._lock = asyncio.Lock()

    def servers(self) -> list[ManagedServer]:
        return list(self._servers.values())

    async def describe(self) -> list[dict[str, Any]]:
        """Every managed server and Ollama model, as ``/v1/servers`` lists them; Ollama's
        state is asked afresh (a model may have expired since it was loaded)."""
        for entry in self._ollama.values():
            try:
                listed = await entry.control.loaded()
            except UpstreamError as exc:
                entry.last_error = exc.message
                continue
            entry.loaded = next((m for m in listed if same_model(m.name, entry.model)), None)
        return [s.describe() for s in self._servers.values()] + [
            m.describe() for m in self._ollama.values()
        ]

    async def load_ollama(
        self,
        control: OllamaControl,
        model: str,
        *,
        num_ctx: int,
        keep_alive: str | float,
        budget: Mapping[str, Any] | None = None,
    ) -> OllamaModel:
        """Load ``model`` on Ollama with ``num_ctx`` (the budget) and ``keep_alive``."""
        entry = OllamaModel(control, model, num_ctx, keep_alive, budget)
        entry.loaded = await control.load(model, num_ctx=num_ctx, keep_alive=keep_alive)
        self._ollama[model] = entry
        log.info(
            SERVER_READY,
            model=model,
            backend="ollama",
            num_ctx=num_ctx,
            context_length=entry.loaded.context_length if entry.loaded else None,
        )
        return entry

    async def ensure(
        self, spec: LlamaServerSpec, *, budget: Mapping[str, Any] | None = None
    ) -> ManagedServer:
        """A ready server for ``spec``: the running one when there is one, else a new one."""
        async with self._lock:
            server = self._servers.get(spec)
            if server is not None and server.state is ServerState.READY:
                return server
            if server is not None:  # crashed/failed/stopped: start afresh on its port
                await self._terminate(server)
                server.stopping = False
            else:
                server = ManagedServer(
                    spec=spec,
                    port=free_port(),
                    log_path=self._log_dir / f"llama-server-{len(self._servers) + 1}.log",
                    budget=budget,
                )
                self._servers[spec] = server
            await self._spawn(server)
            return server

    async def stop(self, server: ManagedServer) -> None:
        """Stop ``server`` for good (no restart)."""
        server.stopping = True
        await self._terminate(server)
        if server.watcher is not None:
            server.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server.watcher
        server.state = ServerState.STOPPED
        self._on_change(server)
        log.info(SERVER_STOPPED, model=server.spec.model_name, port=server.port)

    async def aclose(self) -> None:
        """Stop every server; nothing managed is left running."""
        for server in list(self._servers.values()):
            await self.stop(server)

    async def _spawn(self, server: ManagedServer) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        server.state = ServerState.STARTING
        self._on_change(server)
        spawned = time.monotonic()
        with server.log_path.open("ab") as out:
            out.write(f"--- start {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
            out.flush()
            server.process = await asyncio.create_subprocess_exec(
                *server.spec.argv(server.port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                preexec_fn=_child_setup(self._nice),
            )
        server.started_at = time.time()
        try:
            await self._wait_healthy(server)
        except BaseException:
            server.state = ServerState.FAILED
            self._on_change(server)
            await self._terminate(server)
            raise
        server.ready_s = round(time.monotonic() - spawned, 3)
        server.state = ServerState.READY
        self._on_change(server)
        log.info(
            SERVER_READY,
            model=server.spec.model_name,
            port=server.port,
            pid=server.process.pid,
            ready_s=server.ready_s,
            slot_n_ctx=server.slot_n_ctx,
        )
        server.watcher = asyncio.create_task(self._watch(server), name=f"watch:{server.port}")

    async def _wait_healthy(self, server: ManagedServer) -> None:
        assert server.process is not None
        deadline = time.monotonic() + self._start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            if server.process.returncode is not None:
                server.last_exit = server.process.returncode
                server.last_error = f"exited with status {server.last_exit} while starting"
                raise ServerError(
                    ErrorCode.SERVER_START_FAILED,
                    f"llama-server {server.last_error}; the end of {server.log_path}:\n"
                    + _tail(server.log_path),
                )
            try:
                health = await self._client.get(f"{server.base_url}/health", timeout=2.0)
                if health.status_code == 200:
                    props = await self._client.get(f"{server.base_url}/props", timeout=5.0)
                    server.props = props.json() if props.status_code == 200 else {}
                    return
                last = f"HTTP {health.status_code}"  # 503 while the model loads
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            await asyncio.sleep(_POLL_S)
        server.last_error = f"not healthy after {self._start_timeout_s:.0f} s ({last})"
        raise ServerError(
            ErrorCode.SERVER_START_FAILED,
            f"llama-server was {server.last_error}; the end of {server.log_path}:\n"
            + _tail(server.log_path),
        )

    async def _watch(self, server: ManagedServer) -> None:
        """Await the process; an exit nobody asked for is a crash, then a restart."""
        assert server.process is not None
        code = await server.process.wait()
        if server.stopping:
            return
        server.last_exit = code
        server.last_error = f"exited with status {code}"
        server.state = ServerState.CRASHED
        self._on_change(server)
        log.error(
            SERVER_CRASHED,
            model=server.spec.model_name,
            port=server.port,
            exit_status=code,
            log_tail=_tail(server.log_path),
        )
        if server.restarts >= self._max_restarts:
            server.state = ServerState.FAILED
            server.last_error += f"; not restarted after {server.restarts} restarts"
            self._on_change(server)
            return
        server.restarts += 1
        try:
            await self._spawn(server)
        except ServerError as exc:
            log.error(SERVER_CRASHED, model=server.spec.model_name, restart_failed=exc.message)
            return
        log.info(SERVER_RESTARTED, model=server.spec.model_name, restarts=server.restarts)

    async def _terminate(self, server: ManagedServer) -> None:
        process = server.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
