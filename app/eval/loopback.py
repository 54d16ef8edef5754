"""A real gateway on loopback in front of a scripted upstream: what the API tests and the
conformance runner drive.

httpx's ASGITransport buffers whole bodies (encode/httpx#2186), so streaming is exercised
against uvicorn on 127.0.0.1, with httpx, httpx-sse and raw sockets as clients. Each
gateway gets its own app (``create_app``), its own artifacts directory and its own
scripted upstream, so nothing leaks from one test or conformance case to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from fastapi import FastAPI
from httpx_sse import aconnect_sse

from toolforge.api.app import create_app
from toolforge.api.deps import Gateway
from toolforge.api.serve import GatewayServer
from toolforge.core.tool_specs import ToolRegistry
from toolforge.eval.scripted_upstream import ScriptedUpstream, ScriptLike
from toolforge.settings import Settings

__all__ = ["Event", "Harness", "Served", "frames", "open_raw_stream", "serve", "start_gateway"]


@dataclass
class Event:
    """One SSE event as a client received it (``id`` is ``""`` for pings)."""

    id: str
    event: str
    data: Any


@dataclass
class Served:
    """A gateway served on loopback: its URL, app, an HTTP client and its artifacts."""

    url: str
    app: FastAPI
    client: httpx.AsyncClient
    artifacts: Path

    @property
    def gateway(self) -> Gateway:
        gw: Gateway = self.app.state.gateway
        return gw

    async def stream(self, body: dict[str, Any] | None = None, **kwargs: Any) -> list[Event]:
        """POST /v1/stream and read every event (pings included) to the end."""
        events: list[Event] = []
        async with aconnect_sse(
            self.client, "POST", f"{self.url}/v1/stream", json=body or {"input": "hi"}, **kwargs
        ) as source:
            source.response.raise_for_status()
            async for sse in source.aiter_sse():
                events.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
        return events

    async def stream_get(self, stream_id: str, last_event_id: str) -> list[Event]:
        """GET /v1/streams/{id} with Last-Event-ID and read to the end."""
        events: list[Event] = []
        async with aconnect_sse(
            self.client,
            "GET",
            f"{self.url}/v1/streams/{stream_id}",
            headers={"Last-Event-ID": last_event_id},
        ) as source:
            source.response.raise_for_status()
            async for sse in source.aiter_sse():
                events.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
        return events

    async def raw(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, bytes]:
        async with self.client.stream(method, f"{self.url}{path}", **kwargs) as response:
            body = b"".join([chunk async for chunk in response.aiter_raw()])
        return response, body

    async def metrics(self, stream_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """A stream's metrics.json, once the stream has ended (it is written just after
        the done frame)."""
        async with asyncio.timeout(timeout_s):
            await self.gateway.registry.get(stream_id).wait()
        path = self.artifacts / "runs" / stream_id / "metrics.json"
        data: dict[str, Any] = orjson.loads(await asyncio.to_thread(path.read_bytes))
        return data


@dataclass
class Harness(Served):
    """A served gateway in front of its own scripted upstream."""

    upstream: ScriptedUpstream

    async def settle(self, *, upstream_closed: bool = False, timeout_s: float = 5.0) -> None:
        """Wait until every stream has ended (done sent, artifacts written).

        ``upstream_closed``: also wait until the upstream has no connection open, which
        is what must happen when the gateway abandons a response midway (a clean end
        may keep the connection alive in the pool instead).
        """
        async with asyncio.timeout(timeout_s):
            # The registry has no public iteration: this harness is its test double's peer.
            for session in list(self.gateway.registry._sessions.values()):
                await session.wait()
            if upstream_closed:
                await self.upstream.wait_connections_closed()


class _EmbeddedServer(GatewayServer):
    """A gateway served inside another program (the eval, a test): the program owns its
    signals. uvicorn's own handlers would end the gateway on SIGTERM while the program
    went on using it (the eval would record every run in flight as a failure)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: FastAPI, *, start_timeout_s: float = 10.0) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on an ephemeral loopback port; yield its base URL.
    ``start_timeout_s``: how long its start-up may take (a managed model server's too)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = _EmbeddedServer(config, app)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(start_timeout_s):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def open_raw_stream(
    gw: Harness,
    body: dict[str, Any],
    *,
    rcvbuf: int | None = None,
    close: bool = False,
    headers: dict[str, str] | None = None,
    path: str = "/v1/stream",
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``path`` (``/v1/stream``) over a raw socket (a small receive buffer makes a slow
    client; ``close`` asks for ``Connection: close``, so the body ends at EOF)."""
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    payload = orjson.dumps(body)
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in (headers or {}).items())
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s%s\r\n%s"
        % (path.encode(), len(payload), extra, b"Connection: close\r\n" if close else b"", payload)
    )
    await writer.drain()
    return reader, writer


async def start_gateway(
    stack: contextlib.AsyncExitStack,
    artifacts: Path,
    scripts: Iterable[ScriptLike] = (),
    *,
    tools: ToolRegistry | None = None,
    routes: dict[str, ScriptLike] | None = None,
    client_timeout: httpx.Timeout | float = 10.0,
    **settings: Any,
) -> Harness:
    """Start a scripted upstream and a gateway in front of it, owned by ``stack``.

    ``settings`` are :class:`Settings` fields, plus two shorthands with test-friendly
    defaults: ``first_byte_s`` and ``idle_s`` (2 s each) for the upstream timeouts. An
    ``upstream_base_url`` points the gateway elsewhere (a dead port, a real model server);
    the scripted upstream is then simply unused. ``client_timeout`` is the harness
    client's (a real model may be silent for longer than 10 s).
    """
    upstream = await stack.enter_async_context(ScriptedUpstream(scripts, routes=routes))
    config = Settings(
        upstream_base_url=settings.pop("upstream_base_url", upstream.base_url),
        artifacts_dir=artifacts,
        upstream_first_byte_timeout_s=settings.pop("first_byte_s", 2.0),
        upstream_idle_timeout_s=settings.pop("idle_s", 2.0),
        log_level=settings.pop("log_level", "WARNING"),
        **settings,
    )
    app = create_app(config, tools=tools)
    url = await stack.enter_async_context(serve(app))
    client = await stack.enter_async_context(
        httpx.AsyncClient(timeout=client_timeout, verify=_tls_context())
    )
    return Harness(url, app, client, artifacts, upstream=upstream)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One default TLS context for every harness client: loading the CA bundle costs
    ~70 ms per client, and these clients only ever talk plain HTTP on loopback."""
    return ssl.create_default_context()


def frames(events: list[Event]) -> list[Event]:
    """The numbered frames, pings left out."""
    return [e for e in events if e.event != "ping"]
