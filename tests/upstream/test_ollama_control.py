"""OllamaControl: model management over Ollama's HTTP API, with the documented bodies in
``fixtures/ollama`` (see the README there), over MockTransport and a real loopback server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream
from toolforge.upstream.ollama import OllamaModelNotFound
from toolforge.upstream.ollama_control import (
    DEFAULT_KEEP_ALIVE,
    LoadedModel,
    ModelInfo,
    OllamaControl,
)

FIXTURES = Path(__file__).parent / "fixtures" / "ollama"
BASE = "http://ollama.test:11434"
T = 0.2

QWEN = LoadedModel(
    name="qwen3:8b",
    size=6591830464,
    size_vram=5333539264,
    context_length=32768,
    expires_at=datetime(2025, 10, 17, 16, 47, 7, 933550, tzinfo=timezone(timedelta(hours=-7))),
    digest="a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
    parameter_size="8.2B",
    quantization_level="Q4_K_M",
)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


class FakeOllama:
    """A MockTransport handler: ``routes`` maps ``"METHOD /path"`` to a status and a
    fixture (or bytes); every request is recorded with its JSON body."""

    def __init__(self, routes: dict[str, tuple[int, str | bytes]]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url.path}"
        self.seen.append((key, orjson.loads(request.content) if request.content else None))
        status, body = self.routes.get(key, (404, b"404 page not found"))
        content = fixture(body) if isinstance(body, str) else body
        return httpx.Response(status, content=content)


def control(handler: Callable[[httpx.Request], httpx.Response]) -> OllamaControl:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return OllamaControl(client, BASE, connect_s=T, timeout_s=T, load_timeout_s=T)


async def test_version() -> None:
    fake = FakeOllama({"GET /api/version": (200, "version.json")})
    assert await control(fake).version() == "0.12.6"


async def test_a_path_prefix_in_base_url_is_kept() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, content=fixture("version.json"))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
        await OllamaControl(c, "https://gpu.example/ollama/v1").version()
    assert seen == ["https://gpu.example/ollama/api/version"]


async def test_loaded_models_from_ps() -> None:
    fake = FakeOllama({"GET /api/ps": (200, "ps.json")})
    (model,) = await control(fake).loaded()
    assert model == QWEN
    assert model.gpu_fraction == pytest.approx(0.809, abs=0.001)


async def test_loaded_models_from_an_older_server_and_none_loaded() -> None:
    fake = FakeOllama({"GET /api/ps": (200, "ps_old.json")})
    (model,) = await control(fake).loaded()
    assert (model.name, model.context_length, model.gpu_fraction) == ("llama3.2:latest", None, 1)
    fake.routes["GET /api/ps"] = (200, "ps_empty.json")
    assert await control(fake).loaded() == ()


async def test_load_preloads_with_num_ctx_and_keep_alive_then_reports_ps() -> None:
    fake = FakeOllama(
        {"POST /api/generate": (200, "generate_load.json"), "GET /api/ps": (200, "ps.json")}
    )
    assert await control(fake).load("qwen3:8b", num_ctx=32768) == QWEN
    assert fake.seen == [
        (
            "POST /api/generate",
            {
                "model": "qwen3:8b",
                "prompt": "",
                "stream": False,
                "keep_alive": DEFAULT_KEEP_ALIVE,
                "options": {"num_ctx": 32768},
            },
        ),
        ("GET /api/ps", None),
    ]


async def test_load_matches_the_default_tag_and_passes_keep_alive() -> None:
    fake = FakeOllama(
        {"POST /api/generate": (200, "generate_load.json"), "GET /api/ps": (200, "ps_old.json")}
    )
    loaded = await control(fake).load("llama3.2", num_ctx=4096, keep_alive=-1)
    assert loaded is not None and loaded.name == "llama3.2:latest"
    assert fake.seen[0][1]["keep_alive"] == -1
    fake.routes["GET /api/ps"] = (200, "ps_empty.json")
    assert await control(fake).load("llama3.2", num_ctx=4096) is None


async def test_load_refuses_a_bad_num_ctx_before_any_request() -> None:
    fake = FakeOllama({})
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="num_ctx"):
            await control(fake).load("m", num_ctx=bad)  # type: ignore[arg-type]
    assert fake.seen == []


async def test_unload_sends_keep_alive_zero() -> None:
    fake = FakeOllama({"POST /api/generate": (200, "generate_unload.json")})
    await control(fake).unload("qwen3:8b")
    assert fake.seen == [
        (
            "POST /api/generate",
            {"model": "qwen3:8b", "prompt": "", "stream": False, "keep_alive": 0},
        )
    ]


async def test_show_context_length_and_capabilities() -> None:
    fake = FakeOllama({"POST /api/show": (200, "show.json")})
    ollama = control(fake)
    assert await ollama.show("qwen3:8b") == ModelInfo(
        model="qwen3:8b",
        architecture="qwen3",
        context_length=40960,
        capabilities=frozenset({"completion", "tools", "thinking"}),
        family="qwen3",
        parameter_size="8.2B",
        quantization_level="Q4_K_M",
    )
    assert await ollama.context_length("qwen3:8b") == 40960
    assert await ollama.capabilities("qwen3:8b") == {"completion", "tools", "thinking"}
    assert (await ollama.show("qwen3:8b")).supports_tools is True
    assert fake.seen[0] == ("POST /api/show", {"model": "qwen3:8b"})


async def test_show_on_an_older_server_without_capabilities() -> None:
    fake = FakeOllama({"POST /api/show": (200, "show_old.json")})
    info = await control(fake).show("llama3.2")
    assert (info.context_length, info.capabilities, info.supports_tools) == (131072, None, None)


@pytest.mark.parametrize(
    ("model_info", "expected"),
    [
        ({"llama.context_length": 8192}, 8192),  # no general.architecture: the one there is
        ({"a.context_length": 1, "b.context_length": 2}, None),  # ambiguous
        ({"general.architecture": "x", "x.context_length": "big"}, None),
        ({}, None),
    ],
)
async def test_context_length_when_model_info_is_unusual(
    model_info: dict[str, Any], expected: int | None
) -> None:
    fake = FakeOllama({"POST /api/show": (200, orjson.dumps({"model_info": model_info}))})
    assert await control(fake).context_length("m") == expected


async def test_a_model_ollama_does_not_have() -> None:
    fake = FakeOllama(
        {
            "POST /api/show": (404, "error_model_not_found.json"),
            "POST /api/generate": (404, "error_model_not_found.json"),
        }
    )
    for call in (control(fake).show("qwen3:8b"), control(fake).load("qwen3:8b", num_ctx=2048)):
        with pytest.raises(OllamaModelNotFound, match="ollama pull qwen3:8b") as info:
            await call
        assert (info.value.model, info.value.retryable) == ("qwen3:8b", False)


@pytest.mark.parametrize(
    ("route", "code", "message"),
    [
        ((500, b'{"error":"out of memory"}'), ErrorCode.UPSTREAM_HTTP_ERROR, "'out of memory'"),
        ((404, b"404 page not found"), ErrorCode.UPSTREAM_HTTP_ERROR, "an Ollama server?"),
        ((200, b"<html>"), ErrorCode.UPSTREAM_PROTOCOL, "not JSON: '<html>'"),
        ((200, b"[1, 2]"), ErrorCode.UPSTREAM_PROTOCOL, "unexpected shape: '[1,2]'"),
        ((200, b'{"models": "none"}'), ErrorCode.UPSTREAM_PROTOCOL, "unexpected shape"),
        ((200, b'{"models": [{"name": "m", "size": -1, "size_vram": 0}]}'), None, "shape"),
        ((200, b'{"models": [{"name": "m", "size": 1}]}'), None, "shape"),
        ((200, b'{"models": [7]}'), None, "shape"),
    ],
)
async def test_bad_answers_are_upstream_errors(
    route: tuple[int, bytes], code: ErrorCode | None, message: str
) -> None:
    fake = FakeOllama({"GET /api/ps": route})
    with pytest.raises(UpstreamError) as info:
        await control(fake).loaded()
    assert info.value.code is (code or ErrorCode.UPSTREAM_PROTOCOL)
    assert message in info.value.message


async def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with httpx.AsyncClient() as c:
        with pytest.raises(UpstreamError) as info:
            await OllamaControl(c, f"http://127.0.0.1:{port}").version()
    assert info.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert f"127.0.0.1:{port}" in info.value.message


async def test_connect_timeout_is_named() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out")

    with pytest.raises(UpstreamError, match="connect timeout") as info:
        await control(handler).loaded()
    assert info.value.code is ErrorCode.UPSTREAM_TIMEOUT


@pytest.fixture
async def served() -> AsyncIterator[tuple[ScriptedUpstream, httpx.AsyncClient]]:
    routes = {
        "/api/version": Script(end="status", body=fixture("version.json").decode()),
        "/api/ps": Script(end="status", body=fixture("ps.json").decode()),
        "/api/show": Script(end="hang_before_headers"),
    }
    async with ScriptedUpstream(routes=routes) as up:
        async with httpx.AsyncClient() as c:
            yield up, c
        async with asyncio.timeout(0.5):
            await up.wait_connections_closed()


async def test_over_a_real_socket(served: tuple[ScriptedUpstream, httpx.AsyncClient]) -> None:
    up, c = served
    ollama = OllamaControl(c, up.base_url, connect_s=T, timeout_s=T)
    assert await ollama.version() == "0.12.6"
    assert await ollama.loaded() == (QWEN,)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(UpstreamError, match="first-byte timeout") as info:
        await ollama.show("qwen3:8b")
    assert info.value.code is ErrorCode.UPSTREAM_TIMEOUT
    assert T <= loop.time() - start < T + 0.15
    assert [(r.method, r.path) for r in up.all_requests] == [
        ("GET", "/api/version"),
        ("GET", "/api/ps"),
        ("POST", "/api/show"),
    ]
    assert repr(ollama) == f"OllamaControl({up.base_url.removesuffix('/v1')!r})"
