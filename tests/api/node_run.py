"""Run one of tests/node's ``node --test`` files against a gateway on loopback: the URL in
``TOOLFORGE_URL``, more in ``env``. Without node or the packages the test fails, never
skips (``make test`` installs both)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TIMEOUT_S = 60.0  # node starts in well under a second; the runs take milliseconds


async def node_test(script: str, url: str, package: str, env: Mapping[str, str] = {}) -> None:
    """``node --test tests/node/<script>`` (its cases one after another, in the file's
    order), which needs ``package`` installed under tests/node; fails the test with node's
    output unless every case passed."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    if not (NODE_DIR / "node_modules" / package / "package.json").is_file():
        pytest.fail(
            f"{NODE_DIR / 'node_modules'} has no {package}: run `make test`, which installs "
            "it (npm ci --prefix tests/node)",
            pytrace=False,
        )
    # A subprocess on the event loop: the gateway under test is served by this same loop.
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-concurrency=1",
        str(NODE_DIR / script),
        cwd=NODE_DIR.parents[1],
        env={**os.environ, "TOOLFORGE_URL": url, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(TIMEOUT_S):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"node --test ran past {TIMEOUT_S:.0f} s:\n{out.decode(errors='replace')}")
    assert proc.returncode == 0, f"node --test failed:\n{out.decode(errors='replace')}"
