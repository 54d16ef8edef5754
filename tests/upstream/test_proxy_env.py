"""HTTP_PROXY / HTTPS_PROXY / NO_PROXY for the upstream requests, against a small
forward/CONNECT proxy on loopback.

The upstream's host name (``upstream.invalid``) resolves nowhere: only the proxy, which
sends every request to the scripted upstream on 127.0.0.1, can reach it. A stream that
arrives therefore went through the proxy, and the proxy's log says how (an absolute-form
request line for http, CONNECT for https)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.tcp import LoopbackTcpServer
from toolforge.api.app import create_app
from toolforge.eval.loopback import serve
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream
from toolforge.settings import Settings
from toolforge.upstream.transport import LeanTransport, PostTemplate, _no_proxy


class LoopbackProxy(LoopbackTcpServer):
    """A forward proxy (absolute-form requests) and CONNECT tunnel; every host it is asked
    for is 127.0.0.1. ``seen`` holds the request lines it got."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = head.partition(b"\r\n")
            method, target, version = line.decode().split(" ")
            self.seen.append(f"{method} {target}")
            if method == "CONNECT":
                port = int(target.rsplit(":", 1)[1])
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                url = httpx.URL(target)
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", url.port)
                origin = url.raw_path.decode()
                up_writer.write(f"{method} {origin} {version}\r\n".encode() + rest)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await w.wait_closed()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.write_eof()


@contextlib.asynccontextmanager
async def gateway(base_url: str, tmp_path: Path) -> AsyncIterator[str]:
    settings = Settings(upstream_base_url=base_url, artifacts_dir=tmp_path, log_level="ERROR")
    async with serve(create_app(settings)) as url:
        yield url


async def _stream(url: str) -> str:
    # trust_env=False: this client talks to the gateway on loopback, not through the proxy.
    async with (
        httpx.AsyncClient(trust_env=False, timeout=20) as client,
        client.stream("POST", f"{url}/v1/stream", json={"input": "hi"}) as response,
    ):
        return (await response.aread()).decode()


async def test_http_proxy_carries_the_upstream_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        ScriptedUpstream([Script.from_tokens(["Bonjour", " !"])]) as up,
        LoopbackProxy() as proxy,
    ):
        port = up.base_url.rsplit(":", 1)[1].split("/")[0]
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with gateway(f"http://upstream.invalid:{port}/v1", tmp_path) as url:
            body = await _stream(url)
    assert "Bonjour" in body and "event: error" not in body, body
    # Absolute-form request lines: a forward proxy's (httpx keeps the proxied connection
    # open, so the proxy sees the first request line of each connection).
    assert proxy.seen and all(
        line.split(" ")[1].startswith(f"http://upstream.invalid:{port}/") for line in proxy.seen
    )
    assert len(up.requests) == 1  # the chat completion reached the upstream, via the proxy


async def test_https_proxy_tunnels_with_connect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tunnel reaches a server that hangs up at once, so TLS then fails: the stream
    # ends with a typed error, and the proxy's log shows the CONNECT that httpx sent.
    async def hang_up(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    closer = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = closer.sockets[0].getsockname()[1]
    try:
        async with LoopbackProxy() as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            monkeypatch.delenv("HTTP_PROXY", raising=False)
            async with gateway(f"https://secure.invalid:{port}/v1", tmp_path) as url:
                body = await _stream(url)
    finally:
        closer.close()
        await closer.wait_closed()
    assert f"CONNECT secure.invalid:{port}" in proxy.seen
    events = [line.split(": ", 1)[1] for line in body.splitlines() if line.startswith("event:")]
    assert events[-2:] == ["error", "done"], body
    assert "UPSTREAM_" in body


async def test_without_proxy_variables_nothing_is_proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    transport = LeanTransport()
    assert not transport.proxied(("http", "api.example.com", 80))
    await transport.aclose()


async def test_no_proxy_and_loopback_bypass_the_proxy() -> None:
    transport = LeanTransport(
        proxies={
            "http": "http://127.0.0.1:9",
            "https": "http://127.0.0.1:9",
            "no": "internal.example, 10.0.0.0/8, .corp:8443",
        }
    )
    assert transport.proxied(("https", "api.groq.com", 443))
    assert transport.proxied(("http", "corp", 80))  # .corp:8443 is for port 8443 only
    for key in [
        ("http", "internal.example", 80),
        ("http", "gpu.internal.example", 8080),  # subdomains too
        ("http", "10.1.2.3", 8080),
        ("https", "llm.corp", 8443),
        ("http", "127.0.0.1", 8080),  # loopback (the managed llama-server): never
        ("http", "localhost", 8080),
        ("http", "[::1]", 8080),
    ]:
        assert not transport.proxied(key), key
    with pytest.raises(ValueError, match="proxy"):
        await transport.post(
            PostTemplate(httpx.URL("https://api.groq.com/v1/chat/completions"), {}), b"{}", {}
        )
    await transport.aclose()


def test_no_proxy_star_and_ports() -> None:
    assert _no_proxy("anything.example", 443, "*")
    assert not _no_proxy("example.com", 443, "example.com:80")
    assert _no_proxy("example.com", 80, "example.com:80")
    assert not _no_proxy("notexample.com", 80, "example.com")
    assert not _no_proxy("example.com", 80, "")
