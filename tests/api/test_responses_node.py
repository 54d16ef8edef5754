"""The AI SDK's Open Responses provider (``@ai-sdk/open-responses`` on npm) against
``POST /v1/responses`` (docs/responses.md): ``streamText`` with a tool over two steps, and
``generateText`` (``tests/node/open-responses.test.mjs``). Without node or the package
this test fails, never skips (``make test`` installs both)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import orjson
import pytest

from tests.api.conftest import HarnessFactory
from tests.api.test_proxy import native_call
from toolforge.eval.scripted_upstream import Script

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TIMEOUT_S = 60.0  # node starts in well under a second; the calls take milliseconds


async def test_the_open_responses_provider(make_gateway: HarnessFactory) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    package = NODE_DIR / "node_modules" / "@ai-sdk" / "open-responses" / "package.json"
    if not package.is_file():
        pytest.fail(
            f"{NODE_DIR / 'node_modules'} has no @ai-sdk/open-responses: run `make test`, "
            "which installs it (npm ci --prefix tests/node)",
            pytrace=False,
        )
    gw = await make_gateway(
        [  # one script per upstream request, in open-responses.test.mjs's order
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
            Script.from_tokens(["Hello ", "there"]),
        ]
    )
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        "--test-concurrency=1",
        str(NODE_DIR / "open-responses.test.mjs"),
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
    assert len(gw.upstream.requests) == 3
    second = orjson.loads(gw.upstream.requests[1].body)["messages"]
    assert second[-1]["role"] == "tool"
    assert orjson.loads(second[-1]["content"]) == {"city": "Paris", "sky": "sunny"}
