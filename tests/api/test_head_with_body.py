"""The response head leaves with the first body, in one write, over real sockets.

A small ASGI app is served by uvicorn with :class:`LimitedHttpToolsProtocol` (as
``GatewayServer`` serves the gateway); each connection's transport is wrapped to count
the server's writes. A head whose body is not ready must not wait for it, a ``100
Continue`` must not wait for the response, and a close must not lose a held head.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from tests.api.test_server_limits import connection
from toolforge.api.server_limits import LimitedHttpToolsProtocol

WRITES: list[list[bytes]] = []  # per connection, in order


class _Counted:
    """A transport that records each write before passing it on."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CountingProtocol(LimitedHttpToolsProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writes: list[bytes] = []
        WRITES.append(writes)
        assert isinstance(transport, asyncio.Transport)
        super().connection_made(_Counted(transport, writes))  # type: ignore[arg-type]


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-test", b"1")]}
    if path == "/echo":  # reads the body first (a 100 Continue when asked for)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send(start)
        await send({"type": "http.response.body", "body": b"got " + body})
        return
    await send(start)
    if path == "/late":
        await asyncio.sleep(0.5)
    elif path == "/fail":
        raise RuntimeError("the app fails after its head")
    await send({"type": "http.response.body", "body": b"first", "more_body": True})
    await send({"type": "http.response.body", "body": b"second"})


@pytest.fixture
async def served() -> AsyncIterator[int]:
    """The app's port; its socket listens before the server starts, so a connection made
    at once waits in the backlog until uvicorn accepts it."""
    WRITES.clear()
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=CountingProtocol, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await task
        sock.close()


def _connection(port: int) -> Any:
    return connection(f"http://127.0.0.1:{port}")


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()


async def _read_until(reader: asyncio.StreamReader, marker: bytes, timeout_s: float) -> bytes:
    got = b""
    async with asyncio.timeout(timeout_s):
        while marker not in got:
            chunk = await reader.read(65536)
            if not chunk:
                break
            got += chunk
    return got


async def test_the_head_and_the_first_body_leave_in_one_write(served: int) -> None:
    async with _connection(served) as (reader, writer):
        writer.write(_get("/"))
        response = await _read_until(reader, b"0\r\n\r\n", 5)
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"first" in response and b"second" in response
    first_write = WRITES[0][0]
    assert first_write.startswith(b"HTTP/1.1 200 OK\r\n")
    assert first_write.endswith(b"5\r\nfirst\r\n"), first_write  # the head and the first body
    assert len(WRITES[0]) == 2  # then "second" with the chunked body's end


async def test_a_head_whose_body_is_late_does_not_wait_for_it(served: int) -> None:
    async with _connection(served) as (reader, writer):
        started = time.monotonic()
        writer.write(_get("/late"))
        head = await _read_until(reader, b"\r\n\r\n", 5)
        head_s = time.monotonic() - started
        rest = await _read_until(reader, b"0\r\n\r\n", 5)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"first" not in head
    assert head_s < 0.4, f"the head waited {head_s:.3f} s for a body 0.5 s away"
    assert b"first" in rest and b"second" in rest
    assert WRITES[0][0].endswith(b"\r\n\r\n")  # the head alone, at the end of the turn


async def test_a_100_continue_is_not_held_for_the_response(served: int) -> None:
    async with _connection(served) as (reader, writer):
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        interim = await _read_until(reader, b"\r\n\r\n", 2)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
        writer.write(b"hello")
        response = await _read_until(reader, b"got hello", 5)
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_close_after_the_head_sends_the_head_first(served: int) -> None:
    """The app fails after its head: uvicorn closes the connection; the held head is
    written before the close, so the client sees the response start and then the end."""
    async with _connection(served) as (reader, writer):
        writer.write(_get("/fail"))
        async with asyncio.timeout(5):
            response = await reader.read()
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-test: 1\r\n" in response
