"""MCP tool sources, the side that awaits: one client session per configured server.

At start-up (:func:`start_mcp_sources`) each server is connected with the ``mcp``
package's ``Client`` (stdio: the command as a child process with an explicit
environment; streamable HTTP: the URL with its headers). The SDK negotiates the
protocol: it probes ``server/discover`` for the 2026-07-28 revision and falls back to the
``initialize`` handshake (2025-11-25 and older) when the server is older. The tools are
listed, page after page (``nextCursor``), and each becomes a :class:`ToolSpec`
``<server>.<tool>`` with the server's JSON Schema, run by the gateway's one executor
like any tool (validation, timeout, retries, concurrency, redaction, idempotency,
approvals).

Cache hints: the SDK's response cache honours ``ttlMs``/``cacheScope`` on the listing;
the gateway lists again before a call once the listing's ``ttlMs`` has run out (a tool
the server stopped offering is then unavailable), and after every restart. A server that
gives no ``ttlMs`` (or 0) keeps the listing it gave at start-up until it restarts.

Failures of a call:

* ``isError`` result → ``TOOL_FAILED`` with the server's text: the model reads it; not
  retried (the same call would fail the same way).
* A JSON-RPC error from the server (unknown tool, bad params) → ``TOOL_FAILED``, not
  retried.
* The transport failing (the process died, the connection closed, HTTP unreachable) →
  ``TOOL_UNAVAILABLE`` (transient: the executor retries it) and the server is
  **restarted** in the background, with backoff; meanwhile its tools answer
  ``TOOL_UNAVAILABLE`` at once, saying the server is restarting, and ``GET /v1/tools``
  shows them ``available: false`` with the reason.

Each session lives in a task of its own, because the SDK's transports are anyio
context managers that must be exited by the task that entered them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, Implementation

from toolforge import __version__
from toolforge.core.mcp import (
    MCP_SOURCE_PREFIX,
    McpListedTool,
    McpServerConfig,
    call_result_data,
    listed_tool,
    parse_mcp_servers,
    tool_name,
)
from toolforge.core.tool_rules import ToolConfigError, check_registry
from toolforge.core.tool_specs import (
    JsonArgs,
    PermanentToolError,
    ToolOutput,
    ToolRegistry,
    ToolSpec,
    TransientToolError,
)
from toolforge.errors import ErrorCode
from toolforge.log import SERVER_CRASHED, SERVER_READY, SERVER_RESTARTED, SERVER_STOPPED, get_logger

__all__ = ["McpServerSource", "McpSources", "load_mcp_config", "start_mcp_sources"]

log = get_logger(__name__)

_MAX_PAGES: Final = 100
_RESTART_DELAYS_S: Final = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_CLOSE_TIMEOUT_S: Final = 5.0


@asynccontextmanager
async def _http_transport(url: str, headers: Mapping[str, str]) -> AsyncIterator[Any]:
    async with (
        create_mcp_http_client(headers=dict(headers)) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


class McpServerSource:
    """One configured MCP server: its session, its tools, its restarts."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        restart_delays_s: tuple[float, ...] = _RESTART_DELAYS_S,
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._restart_delays = restart_delays_s
        self._client: Client | None = None
        self._session_task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._restarter: asyncio.Task[None] | None = None
        self._down: str | None = None
        self._up = asyncio.Event()  # set while the server is up (not _down)
        self._closed = False
        self._listing: dict[str, McpListedTool] = {}
        self._fresh_until: float | None = None
        self._relist_lock = asyncio.Lock()
        self.restarts = 0
        self.protocol_version: str | None = None

    # -- session ------------------------------------------------------------------------

    def _target(self) -> Any:
        cfg = self.config
        if cfg.command is not None:
            return StdioServerParameters(
                command=cfg.command, args=list(cfg.args), env=dict(cfg.env), cwd=cfg.cwd
            )
        assert cfg.url is not None
        return _http_transport(cfg.url, cfg.headers)

    async def _connect(self) -> None:
        """Open a session in its own task; return once it is ready (or raise why not)."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def own() -> None:
            client = Client(
                self._target(),
                client_info=Implementation(name="toolforge", version=__version__),
            )
            try:
                async with client:
                    ready.set_result(client)
                    await stop.wait()
            except BaseException as exc:  # the owner must end quietly; the caller learns why
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
                if isinstance(exc, asyncio.CancelledError):
                    raise

        task = asyncio.create_task(own(), name=f"mcp:{self.name}")
        try:
            client = await ready
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise
        self._client, self._stop, self._session_task = client, stop, task
        self.protocol_version = client.protocol_version

    async def _disconnect(self) -> None:
        task, stop = self._session_task, self._stop
        self._client = self._session_task = self._stop = None
        if task is None or stop is None:
            return
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def start(self, timeout_s: float) -> None:
        """Connect and list the tools; a failure is a :class:`ToolConfigError`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._connect()
                await self._relist()
        except ToolConfigError:
            await self._disconnect()
            raise
        except Exception as exc:
            await self._disconnect()
            raise ToolConfigError(
                f"MCP server {self.name!r} ({self._where()}) could not start: "
                f"{_describe(exc)}; check its command/url in the MCP configuration"
            ) from exc
        self._up.set()
        log.info(
            SERVER_READY,
            kind="mcp",
            server=self.name,
            transport=self.config.transport,
            protocol=self.protocol_version,
            tools=len(self._listing),
        )

    def _where(self) -> str:
        return self.config.command or self.config.url or "?"

    async def _relist(self, *, refresh: bool = False) -> None:
        """List every page of tools. ``refresh``: past our copy's ``ttlMs``, so past the
        SDK cache's too; ask the server rather than the cache."""
        client = self._client
        if client is None:
            raise ConnectionError("no session")
        tools: dict[str, McpListedTool] = {}
        cursor: str | None = None
        ttl_ms: int | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(
                cursor=cursor, cache_mode="refresh" if refresh else "use"
            )
            if ttl_ms is None:
                ttl_ms = page.ttl_ms
            for tool in page.tools:
                listed = listed_tool(tool.model_dump(by_alias=True, mode="json", exclude_none=True))
                tools[listed.name] = listed
            cursor = page.next_cursor
            if cursor is None:
                break
        else:
            raise ToolConfigError(
                f"MCP server {self.name!r} listed more than {_MAX_PAGES} pages of tools"
            )
        self._listing = tools
        self._fresh_until = self._clock() + ttl_ms / 1000 if ttl_ms else None

    # -- tools --------------------------------------------------------------------------

    def specs(self, *, default_timeout_s: float | None = None) -> list[ToolSpec[Any]]:
        """The registry entries for the listed tools (filtered by the ``tools`` key)."""
        cfg = self.config
        wanted = cfg.tools
        if wanted is not None:
            missing = sorted(set(wanted) - set(self._listing))
            if missing:
                raise ToolConfigError(
                    f"MCP server {self.name!r} does not offer {', '.join(missing)} "
                    f"(it offers: {', '.join(self._listing) or 'nothing'})"
                )
        out: list[ToolSpec[Any]] = []
        for tool in self._listing.values():
            if wanted is not None and tool.name not in wanted:
                continue
            out.append(
                ToolSpec(
                    name=tool_name(self.name, tool.name),
                    description=tool.description,
                    args_model=JsonArgs,
                    json_schema=tool.input_schema,
                    fn=self._tool_fn(tool.name),
                    timeout_s=cfg.timeout_s or default_timeout_s,
                    retries=cfg.retries,
                    retry_delay_s=cfg.retry_delay_s,
                    idempotent=tool.idempotent,
                    needs_approval=cfg.approval_needed(tool.name),
                    output_allowlist=frozenset(cfg.output_allowlist),
                    redact_keys=frozenset(cfg.redact_keys),
                    source=f"{MCP_SOURCE_PREFIX}{self.name}",
                    availability=self._availability(tool.name),
                )
            )
        return out

    def _availability(self, tool: str) -> Callable[[], str | None]:
        return lambda: self.unavailable(tool)

    def unavailable(self, tool: str) -> str | None:
        """Why ``tool`` cannot run now, or ``None``."""
        if self._closed:
            return f"MCP server {self.name!r} is stopped"
        if self._down is not None:
            return self._down
        if tool not in self._listing:
            return f"MCP server {self.name!r} no longer offers {tool!r}"
        return None

    def _tool_fn(self, tool: str) -> Callable[[JsonArgs], Any]:
        async def run(args: JsonArgs) -> ToolOutput:
            return await self.call(tool, args.root)

        return run

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call one tool; see the module docstring for what each failure becomes."""
        if self._fresh_until is not None and self._clock() >= self._fresh_until and not self._down:
            async with self._relist_lock:
                if self._fresh_until is not None and self._clock() >= self._fresh_until:
                    try:
                        await self._relist(refresh=True)
                    except Exception as exc:
                        raise self._crashed(exc) from exc
        reason = self.unavailable(tool)
        client = self._client
        if reason is not None and self._down is None and not self._closed:
            # No longer offered: calling again will not help until the server changes.
            raise PermanentToolError(reason, code=ErrorCode.TOOL_UNAVAILABLE)
        if reason is not None or client is None:
            raise TransientToolError(reason or f"MCP server {self.name!r} is not connected")
        try:
            result = await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise self._crashed(exc) from exc
            raise PermanentToolError(
                f"MCP server {self.name!r} refused the call to {tool}: {exc.message}"
            ) from exc
        except Exception as exc:  # the transport: a dead process, a refused connection
            raise self._crashed(exc) from exc
        wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        ok, data, message = call_result_data(wire)
        if not ok:
            raise PermanentToolError(
                f"{tool_name(self.name, tool)} returned an error: {message}",
                code=ErrorCode.TOOL_FAILED,
            )
        return ToolOutput(data, raw=wire)

    # -- crashes and restarts -----------------------------------------------------------

    def _crashed(self, exc: BaseException) -> TransientToolError:
        if self._down is None and not self._closed:
            self._down = (
                f"MCP server {self.name!r} stopped ({_describe(exc)}); it is being "
                "restarted and its tools are unavailable until it is back"
            )
            self._up.clear()
            log.warning(SERVER_CRASHED, kind="mcp", server=self.name, error=_describe(exc))
            self._restarter = asyncio.create_task(self._restart(), name=f"mcp-restart:{self.name}")
        return TransientToolError(self._down or f"MCP server {self.name!r} is stopped")

    async def _restart(self) -> None:
        await self._disconnect()
        attempt = 0
        while not self._closed:
            delay = self._restart_delays[min(attempt, len(self._restart_delays) - 1)]
            await asyncio.sleep(delay)
            attempt += 1
            try:
                async with asyncio.timeout(30.0):
                    await self._connect()
                    await self._relist()
            except Exception as exc:
                await self._disconnect()
                self._down = (
                    f"MCP server {self.name!r} is down and restarting (attempt {attempt} "
                    f"failed: {_describe(exc)}); its tools are unavailable until it is back"
                )
                continue
            self.restarts += 1
            self._down = None
            self._up.set()
            log.info(
                SERVER_RESTARTED,
                kind="mcp",
                server=self.name,
                attempts=attempt,
                tools=len(self._listing),
            )
            return

    async def wait_available(self, timeout_s: float) -> None:
        """Wait until the server is up (after a crash); for tests and tooling."""
        async with asyncio.timeout(timeout_s):
            await self._up.wait()

    async def aclose(self) -> None:
        self._closed = True
        if self._restarter is not None:
            self._restarter.cancel()
            with contextlib.suppress(BaseException):
                await self._restarter
        await self._disconnect()
        log.info(SERVER_STOPPED, kind="mcp", server=self.name)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def load_mcp_config(mcp_config: Path | None, mcp_servers: str | None) -> dict[str, McpServerConfig]:
    """The servers of ``MCP_CONFIG`` (a file) and ``MCP_SERVERS`` (inline JSON); a name in
    both is an error. Reads the file (hence here, not in core)."""
    servers: dict[str, McpServerConfig] = {}
    if mcp_config is not None:
        try:
            text = mcp_config.read_bytes()
        except OSError as exc:
            raise ToolConfigError(f"MCP_CONFIG {mcp_config}: {exc.strerror}") from None
        servers.update(parse_mcp_servers(text, where=f"MCP_CONFIG {mcp_config}"))
    if mcp_servers:
        for name, config in parse_mcp_servers(mcp_servers, where="MCP_SERVERS").items():
            if name in servers:
                raise ToolConfigError(f"MCP server {name!r} is in both MCP_CONFIG and MCP_SERVERS")
            servers[name] = config
    return servers


class McpSources:
    """The running MCP servers of one gateway."""

    def __init__(self, sources: list[McpServerSource]) -> None:
        self.sources = sources

    def get(self, name: str) -> McpServerSource | None:
        return next((s for s in self.sources if s.name == name), None)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.sources), return_exceptions=True)


async def start_mcp_sources(
    servers: Mapping[str, McpServerConfig],
    registry: ToolRegistry,
    *,
    start_timeout_s: float = 30.0,
    default_timeout_s: float | None = None,
    restart_delays_s: tuple[float, ...] = _RESTART_DELAYS_S,
) -> McpSources:
    """Start every server, register its tools in ``registry`` and check the tool rules
    (docs/tools.md) over the whole registry. Any failure stops everything started and raises
    :class:`ToolConfigError` (the gateway does not start half-configured)."""
    sources = [
        McpServerSource(name, cfg, restart_delays_s=restart_delays_s)
        for name, cfg in servers.items()
    ]
    running = McpSources(sources)
    results = await asyncio.gather(
        *(s.start(start_timeout_s) for s in sources), return_exceptions=True
    )
    try:
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        for source in sources:
            for spec in source.specs(default_timeout_s=default_timeout_s):
                if spec.name in registry:
                    raise ToolConfigError(
                        f"MCP server {source.name!r} offers {spec.name!r}, which is "
                        "already registered; rename the server in the configuration"
                    )
                registry.register(spec)
        check_registry(registry)
    except BaseException:
        await running.aclose()
        raise
    return running
