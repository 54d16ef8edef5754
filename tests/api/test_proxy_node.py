"""The OpenAI-compatible proxy through the official ``openai`` npm package (docs/proxy.md): the
Node side of tests/api/test_proxy.py. ``tests/node/proxy.test.mjs`` holds the cases; this
test starts a real gateway on loopback in front of the scripted upstream and runs
``node --test`` against it. Node and ``tests/node/node_modules`` come from ``make test``
(the Makefile installs what is missing); without them this test fails, never skips, so a
run that did not exercise the npm client cannot pass for one that did."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import orjson
import pytest

from tests.api.conftest import HarnessFactory
from tests.api.test_proxy import USAGE, native_call
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TIMEOUT_S = 60.0  # node starts in well under a second; five loopback calls take milliseconds


async def test_the_openai_npm_package_against_the_proxy(make_gateway: HarnessFactory) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: run `make test`, which installs nodejs", pytrace=False)
    if not (NODE_DIR / "node_modules" / "openai" / "package.json").is_file():
        pytest.fail(
            f"{NODE_DIR / 'node_modules'} has no openai package: run `make test`, "
            "which installs it (npm ci --prefix tests/node)",
            pytrace=False,
        )
    # One script per upstream request, in proxy.test.mjs's order (the n=2 case sends none).
    booking = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
    gw = await make_gateway(
        [
            Script.from_tokens(["Hel", "lo ", "there"], usage=USAGE),
            native_call("get_weather", {"city": "Paris"}),
            sentinel_call("t1", "places.search", '{"query": "italian"}'),
            sentinel_call("t2", "bookings.create", booking),
            *(sentinel_call(f"t{i}", "bookings.create", booking) for i in range(1, 5)),
        ]
    )
    # A subprocess on the event loop (not subprocess.run): the gateway under test is
    # served by this same loop and must keep answering while node runs.
    proc = await asyncio.create_subprocess_exec(
        node,
        "--test",
        str(NODE_DIR / "proxy.test.mjs"),
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
    assert gw.upstream is not None and len(gw.upstream.requests) == 8
    offered = orjson.loads(gw.upstream.requests[1].body)["tools"]
    assert offered[0]["function"]["name"] == "get_weather"
    system = orjson.loads(gw.upstream.requests[2].body)["messages"][0]["content"]
    assert 'workflow "book_a_table"' in system


def sentinel_call(frame_id: str, name: str, args: str) -> Script:
    return Script.from_tokens([sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])
