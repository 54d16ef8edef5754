"""The OpenAI-compatible proxy through the official ``openai`` npm package (docs/proxy.md): the
Node side of tests/api/test_proxy.py. ``tests/node/proxy.test.mjs`` holds the cases; this
test starts a real gateway on loopback in front of the scripted upstream and runs
``node --test`` against it. Node and ``tests/node/node_modules`` come from ``make test``
(the Makefile installs what is missing); without them this test fails, never skips, so a
run that did not exercise the npm client cannot pass for one that did."""

from __future__ import annotations

import orjson

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_proxy import USAGE, native_call
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script


async def test_the_openai_npm_package_against_the_proxy(make_gateway: HarnessFactory) -> None:
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
    await node_test("proxy.test.mjs", gw.url, "openai")
    assert gw.upstream is not None and len(gw.upstream.requests) == 8
    offered = orjson.loads(gw.upstream.requests[1].body)["tools"]
    assert offered[0]["function"]["name"] == "get_weather"
    system = orjson.loads(gw.upstream.requests[2].body)["messages"][0]["content"]
    assert 'workflow "book_a_table"' in system


def sentinel_call(frame_id: str, name: str, args: str) -> Script:
    return Script.from_tokens([sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])
