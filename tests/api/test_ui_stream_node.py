"""The AI SDK's UI message stream read by the ``ai`` package itself (docs/ui-stream.md):
``DefaultChatTransport`` sends each turn and ``readUIMessageStream`` rebuilds the message
(``tests/node/ui-stream.test.mjs``): a text answer, a server tool's call and result, and an
approval answered in the next request. Without node or the package this test fails, never
skips (``make test`` installs both)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.api.conftest import HarnessFactory
from tests.api.test_agui import approval_registry
from tests.api.test_proxy import native_call
from toolforge.core.tool_specs import ToolSpec
from toolforge.eval.scripted_upstream import Script

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TIMEOUT_S = 60.0  # node starts in well under a second; the turns take milliseconds


class _CityArgs(BaseModel):
    city: str


async def _lookup(args: _CityArgs) -> dict[str, Any]:
    return {"sky": "sunny"}


async def test_the_ai_package_reads_the_ui_stream(make_gateway: HarnessFactory) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    if not (NODE_DIR / "node_modules" / "ai" / "package.json").is_file():
        pytest.fail(
            f"{NODE_DIR / 'node_modules'} has no ai package: run `make test`, which "
            "installs it (npm ci --prefix tests/node)",
            pytrace=False,
        )
    ran: list[int] = []
    tools = approval_registry(ran)
    tools.register(
        ToolSpec(name="lookup", description="Looks up.", args_model=_CityArgs, fn=_lookup)
    )
    gw = await make_gateway(
        [  # one script per upstream request, in ui-stream.test.mjs's order
            Script.from_tokens(["Sunny ", "and warm."]),
            native_call("lookup", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
            native_call("book", {"table": 4}),
            native_call("respond", {"content": "Booked."}),
        ],
        tools=tools,
    )
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-concurrency=1",
        str(NODE_DIR / "ui-stream.test.mjs"),
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
    assert ran == [4]
    assert len(gw.upstream.requests) == 5
