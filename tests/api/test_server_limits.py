"""The server's own limits, attacked over real sockets on loopback: slowloris heads and
bodies, oversized heads, header floods, connection floods, kept-alive connections held
for ever. Every gateway here is served the way ``toolforge serve`` serves it
(``GatewayServer``); the last test runs ``toolforge serve`` itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import uvicorn

from tests.api.conftest import HarnessFactory, sentinel_reply
from toolforge.api.app import create_app
from toolforge.api.serve import GatewayServer
from toolforge.api.server_limits import LimitedHttpToolsProtocol, ServerLimits
from toolforge.eval.scripted_upstream import Script
from toolforge.settings import Settings

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(autouse=True)
def enough_files() -> None:
    """Hundreds of connections, both ends in this process: room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def exchange(url: str, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``data`` on a new connection; everything the server writes before it closes."""
    async with connection(url) as (reader, writer):
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        async with asyncio.timeout(timeout_s):
            return await _read_to_eof(reader)


async def _read_to_eof(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_and_error(response: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(body)["error"]


async def healthz_ms(url: str) -> float:
    started = time.perf_counter()
    response = await exchange(url, HEALTHZ.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert response.startswith(b"HTTP/1.1 200 "), response[:200]
    return (time.perf_counter() - started) * 1000


async def test_slowloris_connections_are_closed_and_healthz_keeps_answering(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(header_timeout_s=1.5)
    host, port = gw.url.removeprefix("http://").split(":")
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for i in range(500):
            reader, writer = await asyncio.open_connection(host, int(port))
            if i % 10:  # most start a head and never finish it; some never send a byte
                writer.write(b"GET /v1/tools HTTP/1.1\r\nHost: localhost\r\nX-Wait: ")
            opened.append((reader, writer))
        started = time.monotonic()
        # /healthz answers quickly all along: the half-open connections cost nothing.
        slowest = 0.0
        while time.monotonic() - started < 1.0:
            slowest = max(slowest, await healthz_ms(gw.url))
            await asyncio.sleep(0.05)
        assert slowest < 500, f"/healthz took {slowest:.0f} ms beside 500 slowloris connections"
        # Every one of them is closed by the header timeout, without an answer.
        async with asyncio.timeout(10):
            leftovers = await asyncio.gather(*(_read_to_eof(r) for r, _ in opened))
        elapsed = time.monotonic() - started
        assert all(b"200" not in data for data in leftovers)
        assert elapsed < 1.5 + 5
    finally:
        for _, writer in opened:
            writer.close()
    assert await healthz_ms(gw.url) < 500


async def test_a_head_dripped_byte_by_byte_is_cut_at_the_header_timeout(
    make_gateway: HarnessFactory,
) -> None:
    """The deadline is for the whole head: sending a byte now and then does not extend it."""
    gw = await make_gateway(header_timeout_s=1.0)
    async with connection(gw.url) as (reader, writer):

        async def drip() -> None:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)

        started = time.monotonic()
        dripping = asyncio.create_task(drip())
        try:
            async with asyncio.timeout(5):
                assert await _read_to_eof(reader) == b""
            closed_after = time.monotonic() - started
        finally:
            dripping.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await dripping
        assert 0.9 <= closed_after < 3.0  # the drip had 12 s of bytes left


@pytest.mark.parametrize("chunks", [1, 64], ids=["whole", "in-64-pieces"])
async def test_a_100_kb_head_is_431(make_gateway: HarnessFactory, chunks: int) -> None:
    gw = await make_gateway()
    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    async with connection(gw.url) as (reader, writer):
        size = -(-len(head) // chunks)
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(head), size):
                writer.write(head[start : start + size])
                await writer.drain()
        async with asyncio.timeout(5):
            response = await _read_to_eof(reader)
    status, error = status_and_error(response)
    assert status == 431
    assert error["code"] == "BAD_REQUEST" and "32768 bytes" in str(error["message"])
    assert b"connection: close" in response.lower()


async def test_a_32_mb_header_is_refused_at_the_limit_not_read_whole(
    make_gateway: HarnessFactory,
) -> None:
    """The review's probe: a 32 MB header block was answered 200. Now the 431 comes once
    MAX_HEADER_BYTES have arrived, while the client is still sending."""
    gw = await make_gateway()
    async with connection(gw.url) as (reader, writer):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Huge: ")
        sent = 0
        head = b""
        with contextlib.suppress(ConnectionError):
            while sent < 32 * 1024 * 1024 and not head:
                writer.write(b"a" * 65536)
                sent += 65536
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.005):
                        head = await reader.readuntil(b"\r\n\r\n")
        if not head:  # the client was still writing when the connection ended
            async with asyncio.timeout(5):
                head = await _read_to_eof(reader)
    assert head.startswith(b"HTTP/1.1 431 "), head[:100]
    assert sent < 16 * 1024 * 1024


async def test_too_many_headers_is_431(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(max_headers=50)
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(60))
    response = await exchange(
        gw.url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + lines + b"\r\n"
    )
    status, error = status_and_error(response)
    assert status == 431 and "more than 50 request headers" in str(error["message"])


async def test_heads_within_the_limits_are_served(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(max_headers=50)
    cookie = b"Cookie: " + b"; ".join(b"c%d=%s" % (i, b"v" * 200) for i in range(80)) + b"\r\n"
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(45))
    head = b"GET /v1/tools HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + cookie + lines
    assert len(head) > 16_000
    response = await exchange(gw.url, head + b"\r\n")
    assert response.startswith(b"HTTP/1.1 200 ")


async def test_a_body_that_stalls_is_cut_and_the_stream_never_starts(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], body_timeout_s=0.5)
    async with connection(gw.url) as (reader, writer):
        writer.write(
            b"POST /v1/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"input": "'
        )
        await writer.drain()
        started = time.monotonic()
        async with asyncio.timeout(5):
            await _read_to_eof(reader)
        assert time.monotonic() - started < 3
    assert gw.upstream.requests == []  # nothing reached the model
    events = await gw.stream({"input": "hi"})  # and the gateway serves the next client
    assert events[-1].event == "done"


async def test_connections_over_the_cap_are_refused_at_once(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(max_connections=20)
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(20):
            await stack.enter_async_context(connection(gw.url))
        await asyncio.sleep(0.1)  # every one accepted
        over = await exchange(gw.url, HEALTHZ)
        status, error = status_and_error(over)
        assert status == 503 and "MAX_CONNECTIONS" in str(error["message"])
    await asyncio.sleep(0.1)  # the 20 closed: room again
    assert await healthz_ms(gw.url) < 1000


async def test_a_kept_alive_connection_ends_after_its_last_request(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(keepalive_max_requests=3)
    async with connection(gw.url) as (reader, writer):
        heads = []
        for _ in range(3):
            writer.write(HEALTHZ)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            heads.append(head.lower())
        assert [b"connection: close" in h for h in heads] == [False, False, True]
        async with asyncio.timeout(5):
            assert await reader.read() == b""


async def test_an_idle_kept_alive_connection_is_closed(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(keepalive_timeout_s=0.3)
    async with connection(gw.url) as (reader, writer):
        writer.write(HEALTHZ)
        await writer.drain()
        await reader.readuntil(b'{"status":"ok"}')
        started = time.monotonic()
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        assert time.monotonic() - started < 2


def test_the_gateway_server_serves_with_the_settings_limits(tmp_path: Path) -> None:
    settings = Settings(
        upstream_base_url="http://127.0.0.1:9/v1",
        artifacts_dir=tmp_path,
        header_timeout_s=3,
        max_header_bytes=8192,
        max_headers=20,
        max_connections=7,
        keepalive_timeout_s=2,
    )
    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=0)
    GatewayServer(config, app)
    assert isinstance(config.http, type) and issubclass(config.http, LimitedHttpToolsProtocol)
    assert config.http.limits == ServerLimits.from_settings(settings)
    assert (config.http.limits.max_headers, config.http.limits.max_connections) == (20, 7)
    assert config.timeout_keep_alive == 2


async def test_toolforge_serve_has_the_limits(tmp_path: Path) -> None:
    """``toolforge serve`` (the Docker image's command) serves with them: a head with
    too many headers is 431, a connection that never finishes its head is closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "ARTIFACTS_DIR": str(tmp_path),
        "MAX_HEADERS": "16",
        "HEADER_TIMEOUT_S": "1",
        "LOG_FORMAT": "json",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolforge.cli", "serve", "--port", str(port),
        "--upstream", "http://127.0.0.1:9/v1",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                await healthz_ms(url)
                break
            except OSError:
                assert proc.returncode is None
                await asyncio.sleep(0.1)
        lines = b"".join(b"X-H%d: v\r\n" % i for i in range(20))
        status, _ = status_and_error(
            await exchange(url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + lines + b"\r\n")
        )
        assert status == 431
        started = time.monotonic()
        assert await exchange(url, b"GET /healthz HTTP/1.1\r\n", timeout_s=5) == b""
        assert time.monotonic() - started < 4
    finally:
        proc.terminate()
        async with asyncio.timeout(20):
            await proc.wait()


async def test_a_body_answered_early_is_not_drained_for_ever(make_gateway: HarnessFactory) -> None:
    """A 413 on the declared length comes at once; a client that goes on sending the
    10 GB it declared is cut off soon after, not read until the body timeout."""
    gw = await make_gateway(body_timeout_s=60)
    async with connection(gw.url) as (reader, writer):
        writer.write(
            b"POST /v1/streams/s_x/cancel HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 ")
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while time.monotonic() - started < 30:
                writer.write(b"a" * 4096)
                await writer.drain()
                await asyncio.sleep(0.01)
                if reader.at_eof():
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.001):
                        await reader.read(65536)
        assert time.monotonic() - started < 5 + 3
