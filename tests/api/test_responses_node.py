"""The AI SDK's Open Responses provider (``@ai-sdk/open-responses`` on npm) against
``POST /v1/responses`` (docs/responses.md): ``streamText`` with a tool over two steps, and
``generateText`` (``tests/node/open-responses.test.mjs``). Without node or the package
this test fails, never skips (``make test`` installs both)."""

from __future__ import annotations

import orjson

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_proxy import native_call
from toolforge.eval.scripted_upstream import Script


async def test_the_open_responses_provider(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [  # one script per upstream request, in open-responses.test.mjs's order
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
            Script.from_tokens(["Hello ", "there"]),
        ]
    )
    await node_test("open-responses.test.mjs", gw.url, "@ai-sdk/open-responses")
    assert len(gw.upstream.requests) == 3
    second = orjson.loads(gw.upstream.requests[1].body)["messages"]
    assert second[-1]["role"] == "tool"
    assert orjson.loads(second[-1]["content"]) == {"city": "Paris", "sky": "sunny"}
