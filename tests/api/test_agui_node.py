"""AG-UI through ``@ag-ui/client``'s ``HttpAgent`` (docs/agui.md): the Node side of
tests/api/test_agui.py. ``tests/node/agui.test.mjs`` holds the cases; this test starts a
real gateway on loopback in front of the scripted upstream (with a tool that needs an
approval) and runs ``node --test`` against it. Without node or the package this test
fails, never skips (``make test`` installs both)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from tests.api.conftest import HarnessFactory
from tests.api.test_agui import approval_registry
from tests.api.test_proxy import native_call
from toolforge.eval.scripted_upstream import Script

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TIMEOUT_S = 60.0  # node starts in well under a second; the runs take milliseconds


async def test_the_ag_ui_client_against_the_gateway(make_gateway: HarnessFactory) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    if not (NODE_DIR / "node_modules" / "@ag-ui" / "client" / "package.json").is_file():
        pytest.fail(
            f"{NODE_DIR / 'node_modules'} has no @ag-ui/client: run `make test`, which "
            "installs it (npm ci --prefix tests/node)",
            pytrace=False,
        )
    ran: list[int] = []
    gw = await make_gateway(
        [  # one script per upstream request, in agui.test.mjs's order
            Script.from_tokens(["Sunny ", "and warm."]),
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
            native_call("book", {"table": 4}),
            native_call("respond", {"content": "Booked."}),
        ],
        tools=approval_registry(ran),
    )
    # A subprocess on the event loop: the gateway under test is served by this same loop.
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-concurrency=1",
        str(NODE_DIR / "agui.test.mjs"),
        cwd=NODE_DIR.parents[1],
        env={**os.environ, "TOOLFORGE_URL": gw.url},
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
    assert ran == [4]  # the approved call ran, once
    assert len(gw.upstream.requests) == 5
