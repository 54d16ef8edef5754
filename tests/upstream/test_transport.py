"""LeanTransport against real loopback servers that answer with scripted raw bytes.

Each test starts a small ``asyncio.start_server`` whose handler writes exactly the bytes
under test (framing, faults, stalls), so what is checked is what a socket delivers. A few
checks look at the transport's private state (open-connection count, the read buffer) on
purpose: "no connection leaked" and "reading paused" have no public face.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import struct
import subprocess
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step
from toolforge.upstream import transport as transport_module
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.http11 import request_head
from toolforge.upstream.openai_compat import OpenAICompatUpstream
from toolforge.upstream.transport import (
    HIGH_WATER,
    LeanTransport,
    PostTemplate,
    ResponseHead,
    UpstreamClient,
)

T = 0.1  # every timeout in these tests
Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
Handler = Callable[["Server", Reader, Writer], Awaitable[None]]


def ok(body: bytes = b"hello", *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return b"HTTP/1.1 200 OK\r\n" + head.encode() + b"\r\n" + body


def chunked(*pieces: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    return head + b"\r\n" + body + (b"0\r\n\r\n" if end else b"")


class Server:
    """A loopback server: ``handler(server, reader, writer)`` runs once per connection."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.accepts = 0
        self.open = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body as received)
        self.got_request = asyncio.Event()
        self.all_closed = asyncio.Event()
        self.all_closed.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[Writer] = set()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/"

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await self._server.wait_closed()

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.accepts += 1
        self.open += 1
        self.all_closed.clear()
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()
            self._writers.discard(writer)
            self.open -= 1
            if not self.open:
                self.all_closed.set()
            self._tasks.discard(task)

    async def request(self, reader: Reader) -> bool:
        """Read one request (Content-Length or chunked body); False when the client left."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lower = head.lower()
        body = b""
        if b"transfer-encoding: chunked" in lower:
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readexactly(2)
        elif b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        self.requests.append((head, body))
        self.got_request.set()
        return True


def answer(*responses: bytes) -> Handler:
    """A keep-alive server: each request, on whichever connection, gets the next response."""
    queue = list(responses)

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        while queue and await server.request(reader):
            writer.write(queue.pop(0))
            await writer.drain()
        await reader.read()  # then wait for the client to leave

    return handler


def rst(writer: Writer) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def serving(
    handler: Handler, **kw: Any
) -> AsyncIterator[tuple[Server, httpx.AsyncClient, LeanTransport]]:
    """A server and a client over a LeanTransport; on exit every connection must be closed
    on both sides and the pool's slot count back to zero."""
    transport = LeanTransport(**kw)
    async with Server(handler) as server:
        async with httpx.AsyncClient(transport=transport, timeout=T) as client:
            yield server, client, transport
        assert (transport._open, transport._idle_count, transport._conns) == (0, 0, set())
        async with asyncio.timeout(1):
            await server.all_closed.wait()


def in_use(transport: LeanTransport) -> int:
    return transport._open - transport._idle_count


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds: for the transport's private state, which has no event."""
    async with asyncio.timeout(2):
        while not condition():  # noqa: ASYNC110 (no event to wait on; see above)
            await asyncio.sleep(0.002)


# -- bodies and framing ----------------------------------------------------------------------


async def test_many_small_chunks_arrive_coalesced() -> None:
    pieces = [b'data: {"t": %d}\n\n' % i for i in range(500)]
    async with serving(answer(chunked(*pieces))) as (server, client, _):
        async with client.stream("GET", server.url + "sse") as response:
            items = [item async for item in response.aiter_raw()]
    assert response.headers["content-type"] == "text/event-stream"
    assert b"".join(items) == b"".join(pieces)
    assert len(items) < len(pieces) / 10  # one item per socket read, not per chunk


async def test_content_length_body_and_keep_alive_reuse() -> None:
    async with serving(answer(ok(b"one"), ok(b"two", "X-A: b"))) as (server, client, transport):
        first = await client.get(server.url)
        second = await client.get(server.url + "p?q=1")
        assert transport._idle_count == 1
    assert (first.status_code, first.text, second.text) == (200, "one", "two")
    assert second.headers.raw == [(b"Content-Length", b"3"), (b"X-A", b"b")]
    assert (second.http_version, second.reason_phrase) == ("HTTP/1.1", "OK")
    assert server.accepts == 1
    assert server.requests[1][0].startswith(b"GET /p?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_close_delimited_body_ends_at_eof_and_is_not_reused() -> None:
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"the end")

    async with serving(handler) as (server, client, _):
        assert (await client.get(server.url)).text == "until the end"
        assert (await client.get(server.url)).text == "until the end"
    assert server.accepts == 2


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(ok(b"x", "Connection: close"), id="connection-close"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", id="http-1.0"),
    ],
)
async def test_no_reuse_when_the_server_does_not_keep_alive(response: bytes) -> None:
    async with serving(answer(response, response)) as (server, client, _):
        assert [(await client.get(server.url)).text for _ in range(2)] == ["x", "x"]
    assert server.accepts == 2


async def test_no_reuse_after_a_stream_closed_early() -> None:
    async with serving(answer(chunked(b"a", end=False), ok())) as (server, client, transport):
        async with client.stream("GET", server.url) as response:
            assert await anext(response.aiter_raw()) == b"a"
        assert transport._open == 0  # closed at once, not drained
        assert (await client.get(server.url)).text == "hello"
    assert server.accepts == 2


async def test_interim_responses_are_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    async with serving(answer(interim + ok(b"final"))) as (server, client, _):
        response = await client.post(server.url, content=b"{}")
    assert (response.status_code, response.text, response.headers.get("link")) == (
        200,
        "final",
        None,
    )


async def test_no_content_and_not_modified_have_no_body() -> None:
    empty = b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\n\r\n"
    async with serving(answer(*empty, ok())) as (server, client, _):
        statuses = [(await client.get(server.url)).status_code for _ in range(2)]
        assert (await client.get(server.url)).text == "hello"  # framing stayed in step
    assert (statuses, server.accepts) == ([204, 304], 1)


async def test_a_response_sent_byte_by_byte() -> None:
    response = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 Fine By Me\r\nX: y\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    )

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        while await server.request(reader):
            for i in range(len(response)):
                writer.write(response[i : i + 1])
                await writer.drain()

    async with serving(handler) as (server, client, _):
        for _ in range(2):
            got = await client.get(server.url)
            assert (got.reason_phrase, got.headers["x"], got.text) == (
                "Fine By Me",
                "y",
                "data: 1\n\ndata: 2\n\n",
            )
    assert server.accepts == 1


@pytest.mark.parametrize("when", ["with-the-response", "while-idle"])
async def test_bytes_after_a_complete_response_end_the_connection(when: str) -> None:
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    idle, sent = asyncio.Event(), asyncio.Event()

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(ok(b"one") + (stray if when == "with-the-response" else b""))
        if server.accepts == 1 and when == "while-idle":
            await idle.wait()
            writer.write(stray)
            await writer.drain()
            sent.set()
        await reader.read()

    async with serving(handler) as (server, client, transport):
        assert (await client.get(server.url)).text == "one"
        if when == "while-idle":
            idle.set()
            await sent.wait()
            await until(lambda: transport._idle_count == 0)  # dropped as soon as it spoke
        assert (await client.get(server.url)).text == "one"
    assert server.accepts == 2


# -- the pool --------------------------------------------------------------------------------


async def test_server_closing_idle_connections_never_breaks_a_request() -> None:
    # The server closes each connection right after its response, without a
    # "Connection: close": the client finds out either from connection_lost or, when the
    # loop has not run yet, from the socket being readable while idle.
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(ok())

    async with serving(handler) as (server, client, _):
        for _ in range(20):
            assert (await client.get(server.url)).text == "hello"
    assert server.accepts == 20


async def test_server_closing_an_idle_connection_later() -> None:
    close = asyncio.Event()

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        first = server.accepts == 1
        await server.request(reader)
        writer.write(ok() if first else ok(b"again"))
        await (close.wait() if first else reader.read())

    async with serving(handler) as (server, client, transport):
        await client.get(server.url)
        close.set()
        async with asyncio.timeout(1):
            await server.all_closed.wait()
        assert (await client.get(server.url)).text == "again"
        assert transport._open == 1
    assert server.accepts == 2


async def test_expired_idle_connections_are_not_reused() -> None:
    limits = httpx.Limits(max_keepalive_connections=10, keepalive_expiry=0)
    async with serving(answer(ok(), ok()), limits=limits) as (server, client, _):
        await client.get(server.url)
        await client.get(server.url)
    assert server.accepts == 2


async def test_pool_exhausted_is_a_pool_timeout_and_a_freed_slot_is_reused() -> None:
    limits = httpx.Limits(max_connections=1)
    async with serving(answer(ok(), ok()), limits=limits) as (server, client, transport):
        held = await client.send(client.build_request("GET", server.url), stream=True)
        with pytest.raises(httpx.PoolTimeout) as caught:
            await client.get(server.url)
        assert caught.value.request.url == server.url
        waiting = asyncio.create_task(client.get(server.url))
        await until(lambda: len(transport._waiters) == 1)
        await held.aread()  # read to the end: the connection goes back and the waiter takes it
        assert (await waiting).text == "hello"
    assert server.accepts == 1


async def test_a_full_pool_closes_an_idle_connection_to_another_origin() -> None:
    limits = httpx.Limits(max_connections=1)
    async with serving(answer(ok(), ok()), limits=limits) as (server, client, transport):
        await client.get(server.url)
        await client.get(server.url.replace("127.0.0.1", "localhost"))
        assert (transport._open, server.accepts) == (1, 2)


@pytest.mark.parametrize("order", ["cancel-then-free", "free-then-cancel"])
async def test_a_cancelled_pool_waiter_leaves_the_pool_consistent(order: str) -> None:
    limits = httpx.Limits(max_connections=1)
    async with serving(answer(ok(), ok()), limits=limits) as (server, client, transport):
        held = await client.send(client.build_request("GET", server.url), stream=True)
        waiters = [asyncio.create_task(client.get(server.url, timeout=5)) for _ in range(2)]
        await until(lambda: len(transport._waiters) == 2)
        if order == "cancel-then-free":
            waiters[0].cancel()
            await held.aclose()  # not read: closed, the slot freed
        else:  # the first waiter is woken, then cancelled before it runs: it passes the turn on
            await held.aclose()
            waiters[0].cancel()
        assert (await waiters[1]).text == "hello"
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        assert (transport._open, list(transport._waiters)) == (1, [])


async def test_aclose_closes_pooled_and_busy_connections() -> None:
    transport = LeanTransport()
    async with Server(answer(ok(), ok(), ok())) as server:
        client = httpx.AsyncClient(transport=transport)
        await client.get(server.url)
        await client.get(server.url.replace("127.0.0.1", "localhost"))
        busy = await client.send(client.build_request("GET", server.url), stream=True)
        assert (server.open, transport._idle_count) == (2, 1)
        await client.aclose()
        async with asyncio.timeout(1):
            await server.all_closed.wait()
        await busy.aclose()  # received in full, but the transport is closed: not pooled
    assert (transport._open, transport._idle_count) == (0, 0)


# -- preconnect ------------------------------------------------------------------------------


def one_per_connection(*, says_close: bool = False) -> Handler:
    """llama-server's way: one response per connection, then the server closes it (without
    a word, or with ``Connection: close``). Each request's connection is recorded."""

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        accepted = server.accepts
        if await server.request(reader):
            server.served_by.append(accepted)  # type: ignore[attr-defined]
            writer.write(ok(b"x", "Connection: close") if says_close else ok(b"x"))
            await writer.drain()

    return handler


def spare_ready(transport: LeanTransport) -> bool:
    return any(conn.spare for stack in transport._idle.values() for conn in stack)


@pytest.mark.parametrize("says_close", [False, True], ids=["silent-close", "connection-close"])
async def test_preconnect_has_a_connection_ready_when_the_server_closed_the_last(
    says_close: bool,
) -> None:
    async with serving(one_per_connection(says_close=says_close), preconnect=True) as (
        server,
        client,
        transport,
    ):
        server.served_by = []  # type: ignore[attr-defined]
        for n in range(1, 6):
            assert (await client.get(server.url)).text == "x"
            await until(lambda n=n: spare_ready(transport) and server.accepts == n + 1)
        assert transport._open == 1
    # Every request after the first went out on the spare opened after the one before.
    assert server.served_by == [1, 2, 3, 4, 5]  # type: ignore[attr-defined]


async def test_without_preconnect_a_closed_connection_is_not_replaced() -> None:
    async with serving(one_per_connection()) as (server, client, transport):
        server.served_by = []  # type: ignore[attr-defined]
        await client.get(server.url)
        await until(lambda: transport._open == 0)
        await asyncio.sleep(0.05)
        assert (server.accepts, transport._open) == (1, 0)


async def test_preconnect_leaves_an_origin_alone_once_nobody_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport_module, "PRECONNECT_WINDOW_S", 0.05)
    close = asyncio.Event()

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(ok())
        await close.wait()  # then the server times the idle connection out

    async with serving(handler, preconnect=True) as (server, client, transport):
        await client.get(server.url)
        await asyncio.sleep(0.06)
        close.set()
        await until(lambda: transport._open == 0)
        await asyncio.sleep(0.05)
        assert (server.accepts, transport._spares) == (1, {})


async def test_a_spare_the_server_times_out_is_replaced_within_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # llama-server closes an idle connection after 5 s; the gateway keeps a spare ready
    # for the next request as long as the origin was used within the window.
    monkeypatch.setattr(transport_module, "_SPARE_MIN_LIFE_S", 0.02)

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        accepted = server.accepts
        if accepted == 2:  # the first spare: timed out while idle
            await asyncio.sleep(0.05)
            return
        if await server.request(reader):
            server.served_by.append(accepted)  # type: ignore[attr-defined]
            writer.write(ok(b"x"))
            await writer.drain()

    async with serving(handler, preconnect=True) as (server, client, transport):
        server.served_by = []  # type: ignore[attr-defined]
        await client.get(server.url)
        await until(lambda: server.accepts == 3 and spare_ready(transport))
        assert (await client.get(server.url)).text == "x"
    assert server.served_by == [1, 3]  # type: ignore[attr-defined]


async def test_a_spare_the_server_drops_unused_is_not_replaced() -> None:
    # A server that closes every new connection at once must not get a reconnect loop.
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        if server.accepts == 1:
            await server.request(reader)
            writer.write(ok(b"x"))
            await writer.drain()

    async with serving(handler, preconnect=True) as (server, client, transport):
        await client.get(server.url)
        await until(lambda: server.accepts == 2)  # the spare
        await until(lambda: transport._open == 0)  # dropped by the server, unused
        await asyncio.sleep(0.05)
        assert (server.accepts, transport._spares) == (2, {})


async def test_a_spare_that_cannot_connect_gives_its_slot_back() -> None:
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        server._server.close()  # nothing listens any more: the spare is refused
        writer.write(ok(b"x"))
        await writer.drain()

    async with serving(handler, preconnect=True) as (server, client, transport):
        assert (await client.get(server.url)).text == "x"
        await until(lambda: transport._open == 0 and not transport._spares)
        with pytest.raises(httpx.ConnectError):
            await client.get(server.url)
    assert server.accepts == 1


def slow_connects(monkeypatch: pytest.MonkeyPatch, delay_s: float) -> list[int]:
    """Make connects on this event loop take ``delay_s`` longer; returns a list that
    counts them."""
    calls: list[int] = []
    loop = asyncio.get_running_loop()
    connect = loop.create_connection

    async def slow(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        await asyncio.sleep(delay_s)
        return await connect(*args, **kw)

    monkeypatch.setattr(loop, "create_connection", slow)
    return calls


async def test_a_request_takes_the_spare_that_is_still_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(one_per_connection(), preconnect=True) as (server, client, transport):
        server.served_by = []  # type: ignore[attr-defined]
        await client.get(server.url)
        calls = slow_connects(monkeypatch, 0.05)
        await until(lambda: bool(transport._spares))
        assert (await client.get(server.url)).text == "x"  # waited for the spare
        assert len(calls) == 1
    assert server.served_by == [1, 2]  # type: ignore[attr-defined]


async def test_aclose_stops_a_spare_still_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(one_per_connection(), preconnect=True) as (server, client, transport):
        server.served_by = []  # type: ignore[attr-defined]
        await client.get(server.url)
        slow_connects(monkeypatch, 10)
        await until(lambda: bool(transport._spares))
        spare = next(iter(transport._spares.values()))
    # serving() checked that nothing is left open or counted
    assert spare.cancelled()


# -- requests --------------------------------------------------------------------------------


async def test_request_bodies_arrive_intact() -> None:
    payload = {"model": "m", "messages": [{"role": "user", "content": "é" * 10_000}]}

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one,", b"", b"two,", b"three"):
            yield part

    big = bytes(range(256)) * 20_000  # 5 MB: the write side pauses and resumes

    async def big_parts() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 1_000_000):
            yield big[i : i + 1_000_000]

    async with serving(answer(ok(), ok(), ok(), ok())) as (server, client, _):
        await client.post(server.url, json=payload)
        await client.post(server.url, content=parts())
        await client.post(server.url, content=big, timeout=5)
        await client.post(server.url, content=big_parts(), timeout=5)
    (head, body), (chunked_head, chunked_body), (_, big_body), (_, big_chunked_body) = (
        server.requests
    )
    assert head.startswith(b"POST / HTTP/1.1\r\n")
    assert orjson.loads(body) == payload
    assert b"Transfer-Encoding: chunked" in chunked_head
    assert chunked_body == b"one,two,three"
    assert big_body == big_chunked_body == big


BODIES = (b'{"a": 1}', "é".encode() * 5000)


async def test_post_sends_what_httpx_would_and_reuses_the_connection() -> None:
    headers = {"Accept": "text/event-stream", "Authorization": "Bearer k"}
    sent: list[int] = []
    async with serving(answer(ok(b"one"), ok(b"two"))) as (server, _, transport):
        template = PostTemplate(httpx.URL(server.url + "v1/chat?x=1"), headers)
        bodies = []
        for body in BODIES:
            response = await transport.post(template, body, {"read": T}, lambda: sent.append(1))
            assert response.status_code == 200
            bodies.append(b"".join([part async for part in response.stream]))  # type: ignore[union-attr]
            await response.aclose()
    assert bodies == [b"one", b"two"]
    assert sent == [1, 1]
    assert isinstance(response, ResponseHead)  # not an httpx.Response: status, headers, body
    assert response.header("CONTENT-length") == "3" and response.header("x-none") is None
    assert server.accepts == 1  # the second POST went over the pooled connection
    for (head, body), sent_body in zip(server.requests, BODIES, strict=True):
        expected = request_head(
            httpx.Request("POST", template.url, headers=headers, content=sent_body)
        )
        assert sorted(head.split(b"\r\n")) == sorted(expected.split(b"\r\n"))
        assert head.startswith(b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
        assert body == sent_body


async def test_post_errors_are_httpx_errors_without_a_request() -> None:
    with pytest.raises(ValueError, match="http"):
        PostTemplate(httpx.URL("ftp://127.0.0.1/"), {})
    async with serving(then_close(b"HTTP/1.1 200 OK\r\nContent-")) as (server, _, transport):
        bad = PostTemplate(httpx.URL(server.url), {"X-A": "a\r\nX-B: b"})
        with pytest.raises(httpx.LocalProtocolError):
            await transport.post(bad, b"{}", {"read": T})
        template = PostTemplate(httpx.URL(server.url), {})
        with pytest.raises(httpx.RemoteProtocolError, match="Server disconnected") as caught:
            await transport.post(template, b"{}", {"read": T})
        with pytest.raises(RuntimeError):
            caught.value.request  # noqa: B018 (httpx raises: no request was built)
        assert transport._open == 0


async def test_header_injection_is_refused() -> None:
    async with serving(answer()) as (server, client, _):
        with pytest.raises(httpx.LocalProtocolError):
            await client.get(server.url, headers={"X-A": "a\r\nX-B: b"})


async def test_write_timeout() -> None:
    timed_out = asyncio.Event()

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await timed_out.wait()  # no reading till then: the kernel's buffers fill up
        await reader.read()

    async with serving(handler) as (server, client, _):
        with pytest.raises(httpx.WriteTimeout):
            await client.post(server.url, content=b"x" * 64_000_000)
        timed_out.set()


# -- faults ----------------------------------------------------------------------------------


def hang_after(data: bytes) -> Handler:
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(data)
        await reader.read()

    return handler


def then_close(data: bytes, *, reset: bool = False) -> Handler:
    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        writer.write(data)
        await writer.drain()
        if reset:
            await asyncio.sleep(0.02)  # let the client read the data before the RST drops it
            rst(writer)

    return handler


@pytest.mark.parametrize(
    ("handler", "error", "message"),
    [
        pytest.param(hang_after(b""), httpx.ReadTimeout, None, id="no-response"),
        pytest.param(hang_after(chunked(b"a", end=False)), httpx.ReadTimeout, None, id="mid-body"),
        pytest.param(
            then_close(chunked(b"a", end=False), reset=True),
            httpx.ReadError,
            "reset",
            id="rst-mid-body",
        ),
        pytest.param(
            then_close(b"", reset=True), httpx.ReadError, "reset", id="rst-before-response"
        ),
        pytest.param(
            then_close(chunked(b"a", end=False)),
            httpx.RemoteProtocolError,
            "without sending complete message body",
            id="truncated-chunked-body",
        ),
        pytest.param(
            then_close(ok(b"abc")[:-2]),
            httpx.RemoteProtocolError,
            "without sending complete message body",
            id="truncated-content-length-body",
        ),
        pytest.param(
            then_close(b""),
            httpx.RemoteProtocolError,
            "Server disconnected without sending a response.",
            id="fin-before-response",
        ),
        pytest.param(
            then_close(b"HTTP/1.1 200 OK\r\nContent-"),
            httpx.RemoteProtocolError,
            "Server disconnected",
            id="fin-inside-head",
        ),
        pytest.param(
            then_close(b"HTTP/1.1 OK 200\r\n\r\n"),
            httpx.RemoteProtocolError,
            "malformed response",
            id="malformed-status-line",
        ),
        pytest.param(
            then_close(chunked(b"a", end=False) + b"zz\r\n"),
            httpx.RemoteProtocolError,
            "malformed response",
            id="malformed-chunk-size",
        ),
        pytest.param(
            then_close(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"),
            httpx.RemoteProtocolError,
            "101",
            id="unasked-upgrade",
        ),
    ],
)
async def test_faults(handler: Handler, error: type[httpx.HTTPError], message: str | None) -> None:
    async with serving(handler) as (server, client, transport):
        request = client.build_request("GET", server.url)
        received = b""
        with pytest.raises(error, match=message) as caught:
            async with client.stream("GET", server.url) as response:
                async for part in response.aiter_raw():
                    received += part
        assert caught.value.request.url == request.url
        assert received in (b"", b"a")
        assert transport._open == 0


async def test_connection_refused_is_a_connect_error() -> None:
    with socket.socket() as sock:  # bind, note the port, close: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    transport = LeanTransport()
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.ConnectError) as caught:
            await client.get(f"http://127.0.0.1:{port}/")
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert transport._open == 0


async def test_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(*args: Any, **kwargs: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", never)
    transport = LeanTransport()
    async with httpx.AsyncClient(transport=transport, timeout=T) as client:
        with pytest.raises(httpx.ConnectTimeout):
            await client.get("http://127.0.0.1:9/")
        assert transport._open == 0
        task = asyncio.create_task(client.get("http://127.0.0.1:9/", timeout=5))
        await until(lambda: transport._open == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert transport._open == 0


# -- backpressure and cancellation -----------------------------------------------------------


async def test_a_slow_reader_pauses_the_socket_and_tcp_throttles_the_server() -> None:
    size = 10 * 1024 * 1024
    sent = 0

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        nonlocal sent
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        piece = b"x" * 65536
        while sent < size:
            writer.write(piece)
            await writer.drain()
            sent += len(piece)
        await reader.read()

    async with serving(handler) as (server, client, transport):
        async with client.stream("GET", server.url) as response:
            (conn,) = transport._conns
            await until(lambda: conn.read_paused)
            buffered = conn.buffered
            assert buffered <= HIGH_WATER + 256 * 1024  # at most one read past the mark
            await asyncio.sleep(0.05)  # not synchronisation: time in which nothing may move
            assert (conn.buffered, sent < size) == (buffered, True)
            total = 0
            async for part in response.aiter_raw():
                total += len(part)
                assert len(part) <= HIGH_WATER + 256 * 1024
    assert (total, sent) == (size, size)


@pytest.mark.parametrize("where", ["head", "body"])
async def test_cancelling_a_reader_closes_its_connection_and_the_pool_stays_usable(
    where: str,
) -> None:
    first = asyncio.Event()

    async def handler(server: Server, reader: Reader, writer: Writer) -> None:
        await server.request(reader)
        if server.accepts == 1:
            if where == "body":
                writer.write(chunked(b"a", end=False))
            await reader.read()
        else:
            writer.write(ok())
            await reader.read()

    async def read(client: httpx.AsyncClient, url: str) -> None:
        async with client.stream("GET", url, timeout=10) as response:
            async for _ in response.aiter_raw():
                first.set()

    async with serving(handler) as (server, client, transport):
        task = asyncio.create_task(read(client, server.url))
        await (first.wait() if where == "body" else server.got_request.wait())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert transport._open == 0
        async with asyncio.timeout(1):
            await server.all_closed.wait()
        assert (await client.get(server.url)).text == "hello"


# -- extensions and fallback -----------------------------------------------------------------

TRACED = [
    "connection.connect_tcp.started",
    "connection.connect_tcp.complete",
    "http11.send_request_headers.started",
    "http11.send_request_headers.complete",
    "http11.send_request_body.started",
    "http11.send_request_body.complete",
    "http11.receive_response_headers.started",
    "http11.receive_response_headers.complete",
]


async def test_trace_names_follow_httpcore() -> None:
    async def run(client: httpx.AsyncClient, url: str) -> list[str]:
        names: list[str] = []

        async def trace(name: str, info: dict[str, Any]) -> None:
            names.append(name)

        for _ in range(2):
            await client.post(url, content=b"{}", extensions={"trace": trace})
        return names

    async with serving(answer(ok(), ok())) as (server, client, _):
        ours = await run(client, server.url)
    assert ours == TRACED + TRACED[2:]  # the second request reuses the connection
    async with Server(answer(ok(), ok())) as server, httpx.AsyncClient() as client:
        theirs = iter(await run(client, server.url))
    assert all(name in theirs for name in ours)  # in httpcore's order, a subsequence


async def test_what_it_does_not_handle_goes_to_the_fallback() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.scheme}")
        return httpx.Response(200)

    transport = LeanTransport(fallback=httpx.MockTransport(handler))
    async with Server(answer(ok())) as server, httpx.AsyncClient(transport=transport) as client:
        await client.head(server.url)
        await client.get(server.url, extensions={"sni_hostname": "x"})
        await client.get(server.url, headers={"Upgrade": "websocket", "Connection": "upgrade"})
        assert (await client.get(server.url)).text == "hello"
    assert seen == ["HEAD http", "GET http", "GET http"]


async def test_the_default_fallback_is_httpx_own_transport() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"  # no body: a HEAD response
    async with serving(answer(head, ok())) as (server, client, transport):
        response = await client.head(server.url)
        assert (response.headers["content-length"], response.content) == ("5", b"")
        assert isinstance(transport._fallback, httpx.AsyncHTTPTransport)
        assert (await client.get(server.url)).text == "hello"
    assert server.accepts == 2  # one connection in each transport's pool


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl CLI; skipped without it)."""
    path = tmp_path_factory.mktemp("tls")
    cert, key = path / "cert.pem", path / "key.pem"
    try:
        subprocess.run(
            [
                *(
                    "openssl",
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                ),
                *("-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"),
                *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no openssl to make a test certificate: {exc}")
    return cert, key


async def test_https(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with Server(answer(chunked(b"a" * 10, b"b"), ok()), tls=server_ctx) as server:
        url = server.url
        trusting = LeanTransport(verify=ssl.create_default_context(cafile=cert))
        async with httpx.AsyncClient(transport=trusting) as client:
            assert (await client.get(url)).text == "a" * 10 + "b"
            assert (await client.get(url)).text == "hello"
        assert server.accepts == 1
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(url)


# -- the gateway's adapter over it -----------------------------------------------------------

REQUEST = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])


async def collect(client: httpx.AsyncClient, base_url: str) -> tuple[list[UpstreamDelta], Any]:
    upstream = OpenAICompatUpstream(client, base_url, connect_s=T, first_byte_s=T, idle_s=T)
    out: list[UpstreamDelta] = []
    try:
        async for delta in upstream.stream(REQUEST):
            out.append(delta)
    except UpstreamError as exc:
        # The text inside the parentheses quotes the httpx exception, worded per transport.
        return out, (exc.code, exc.message.split(" (")[0])
    return out, None


ADAPTER_SCRIPTS = [
    Script.from_tokens(["Hel", "lo", " wor", "ld"], usage={"total_tokens": 4}),
    Script(steps=(Step(text="a"),), end="rst", end_delay_ms=20),
    Script(steps=(Step(text="a"),), end="fin"),
    Script(steps=(Step(text="a"),), end="fin", chunked=False),
    Script(steps=(Step(text="a"), Step(finish="stop")), end="fin", end_delay_ms=10),
    Script(end="hang_before_headers"),
    Script(end="hang_after_headers"),
    Script(steps=(Step(text="a"),), end="hang"),
    Script(end="status", status=500, body='{"error": {"message": "model crashed"}}'),
]


@pytest.mark.parametrize("script", ADAPTER_SCRIPTS, ids=lambda s: f"{s.end}-{len(s.steps)}")
async def test_the_adapter_sees_the_same_over_either_transport(script: Script) -> None:
    results = []
    clients: list[Callable[[], httpx.AsyncClient]] = [
        lambda: UpstreamClient(transport=LeanTransport()),  # LeanTransport.post
        lambda: httpx.AsyncClient(transport=LeanTransport()),  # handle_async_request
        lambda: httpx.AsyncClient(transport=httpx.AsyncHTTPTransport()),
    ]
    for make in clients:
        async with ScriptedUpstream([script, Script.from_tokens(["next"])]) as up:
            async with make() as client:
                results.append(await collect(client, up.base_url))
                results.append(await collect(client, up.base_url))
            async with asyncio.timeout(1):
                await up.wait_connections_closed()
    posted, posted_next, ours, ours_next, theirs, theirs_next = results
    assert posted[1] == ours[1] == theirs[1]
    if script.end != "rst":  # an RST may drop the data before it
        assert posted[0] == ours[0] == theirs[0]
    expected = ([UpstreamDelta("next"), UpstreamDelta("", "stop")], None)
    assert posted_next == ours_next == theirs_next == expected
    if script.end == "hang_before_headers":
        assert ours[1] == (
            ErrorCode.UPSTREAM_TIMEOUT,
            "upstream first-byte timeout: no response in 0.1 s",
        )


async def test_the_adapter_keeps_only_the_body_of_an_open_stream() -> None:
    # An httpx.Response is about 1.2 KB; every open stream would hold one (bench B4).
    responses: list[weakref.ref[httpx.Response]] = []
    transport = LeanTransport()
    post = transport.post

    async def spy(*args: Any, **kwargs: Any) -> httpx.Response:
        response = await post(*args, **kwargs)
        responses.append(weakref.ref(response))
        return response

    script = Script(steps=(Step(text="a"), Step(text="b", delay_ms=200)))
    async with ScriptedUpstream([script]) as up:
        async with UpstreamClient(transport=transport) as client:
            transport.post = spy  # type: ignore[method-assign]
            upstream = OpenAICompatUpstream(client, up.base_url, connect_s=5, idle_s=5)
            stream = upstream.stream(REQUEST)
            assert await anext(stream) == UpstreamDelta("a")
            gc.collect()
            assert [ref() for ref in responses] == [None]  # mid-stream, the response is gone
            rest = [d async for d in stream]
            assert rest[0] == UpstreamDelta("b")
