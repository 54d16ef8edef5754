"""Fixtures for the conformance suite (``toolforge.eval.conformance``, the product runner).

The cases that need a real model server are marked ``real``. They run when the
``real_upstream`` fixture gives one: by default it reads ``TOOLFORGE_REAL_UPSTREAM`` (an
OpenAI-compatible base URL ending in ``/v1``) and ``TOOLFORGE_REAL_MODEL``; a fixture that
starts a local llama-server can override it. Without the variable they run against the
local llama-server (the session's ``local_llama_server``), as the embedded default does.
"""

from __future__ import annotations

import os

import pytest

from toolforge.eval.conformance import RealUpstream
from toolforge.runtime.local_backend import SMOLLM2_135M


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real: needs a real model server (a local llama-server)")


@pytest.fixture
def real_upstream(request: pytest.FixtureRequest) -> RealUpstream | None:
    """``TOOLFORGE_REAL_UPSTREAM`` when set; otherwise the local llama-server (docs/servers.md)."""
    url = os.environ.get("TOOLFORGE_REAL_UPSTREAM")
    if url:
        return RealUpstream(url, os.environ.get("TOOLFORGE_REAL_MODEL"))
    root: str = request.getfixturevalue("local_llama_server")
    return RealUpstream(f"{root}/v1", SMOLLM2_135M.name, kind="llama_server")
