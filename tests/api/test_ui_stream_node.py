"""The AI SDK's UI message stream read by the ``ai`` package itself (docs/ui-stream.md):
``DefaultChatTransport`` sends each turn and ``readUIMessageStream`` rebuilds the message
(``tests/node/ui-stream.test.mjs``): a text answer, a server tool's call and result, and an
approval answered in the next request. Without node or the package this test fails, never
skips (``make test`` installs both)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_agui import approval_registry
from tests.api.test_proxy import native_call
from toolforge.core.tool_specs import ToolSpec
from toolforge.eval.scripted_upstream import Script


class _CityArgs(BaseModel):
    city: str


async def _lookup(args: _CityArgs) -> dict[str, Any]:
    return {"sky": "sunny"}


async def test_the_ai_package_reads_the_ui_stream(make_gateway: HarnessFactory) -> None:
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
    await node_test("ui-stream.test.mjs", gw.url, "ai")
    assert ran == [4]
    assert len(gw.upstream.requests) == 5
