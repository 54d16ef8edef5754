"""A real gateway on loopback in front of a real scripted upstream.

httpx's ASGITransport buffers whole bodies (encode/httpx#2186), so streaming is tested
against uvicorn on 127.0.0.1, with httpx-sse and raw sockets as clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from httpx_sse import aconnect_sse

from app.api.app import create_app
from app.api.deps import Gateway
from app.core.tools import ToolRegistry
from app.eval.scripted_upstream import ScriptedUpstream, ScriptLike
from app.settings import Settings

LB, RB = "\u27e6", "\u27e7"


@dataclass
class Event:
    id: str
    event: str
    data: Any


@dataclass
class Harness:
    url: str
    app: FastAPI
    upstream: ScriptedUpstream
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

    async def settle(self, *, upstream_closed: bool = False) -> None:
        """Wait until every stream has ended (done sent, artifacts written).

        ``upstream_closed``: also wait until the upstream has no connection open, which
        is what must happen when the gateway abandons a response midway (a clean end
        may keep the connection alive in the pool instead).
        """
        async with asyncio.timeout(5):
            for session in list(self.gateway.registry._sessions.values()):
                await session.wait()
            if upstream_closed:
                await self.upstream.wait_connections_closed()


@contextlib.asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
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


HarnessFactory = Callable[..., Awaitable[Harness]]


async def open_raw_stream(
    gw: Harness, body: dict[str, Any], *, rcvbuf: int | None = None, close: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST /v1/stream over a raw socket (a small receive buffer makes a slow client;
    ``close`` asks for ``Connection: close``, so the body ends at EOF)."""
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    payload = orjson.dumps(body)
    writer.write(
        b"POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s"
        % (len(payload), b"Connection: close\r\n" if close else b"", payload)
    )
    await writer.drain()
    return reader, writer


@pytest.fixture
async def make_gateway(tmp_path: Path) -> AsyncIterator[HarnessFactory]:
    stack = contextlib.AsyncExitStack()

    async def factory(
        scripts: Iterable[ScriptLike] = (),
        *,
        tools: ToolRegistry | None = None,
        routes: dict[str, ScriptLike] | None = None,
        **settings: Any,
    ) -> Harness:
        upstream = await stack.enter_async_context(ScriptedUpstream(scripts, routes=routes))
        artifacts = tmp_path / "artifacts"
        config = Settings(
            upstream_base_url=settings.pop("upstream_base_url", upstream.base_url),
            artifacts_dir=artifacts,
            upstream_first_byte_timeout_s=settings.pop("first_byte_s", 2.0),
            upstream_idle_timeout_s=settings.pop("idle_s", 2.0),
            log_level="WARNING",
            **settings,
        )
        app = create_app(config, tools=tools)
        url = await stack.enter_async_context(serve(app))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        return Harness(url, app, upstream, client, artifacts)

    async with stack:
        yield factory


def frames(events: list[Event]) -> list[Event]:
    """The numbered frames, pings left out."""
    return [e for e in events if e.event != "ping"]


def assert_well_formed(events: list[Event]) -> None:
    """The protocol invariants every stream keeps (SPEC §3)."""
    numbered = frames(events)
    assert numbered[0].event == "stream.begin"
    assert [int(e.id) for e in numbered] == list(range(1, len(numbered) + 1))
    assert [e.event for e in numbered].count("done") == 1
    assert numbered[-1].event == "done"


def sentinel_reply(answer: str = "Two places are open.") -> str:
    body = orjson.dumps({"answer": answer}).decode()
    begin = f"{LB}BEGIN_RESULT id=r1 schema=AssistantReply{RB}"
    return f"Here you go. {begin}{body}{LB}END_RESULT id=r1{RB}"
