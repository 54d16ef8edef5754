"""AG-UI through ``@ag-ui/client``'s ``HttpAgent`` (docs/agui.md): the Node side of
tests/api/test_agui.py. ``tests/node/agui.test.mjs`` holds the cases; this test starts a
real gateway on loopback in front of the scripted upstream (with a tool that needs an
approval) and runs ``node --test`` against it. Without node or the package this test
fails, never skips (``make test`` installs both)."""

from __future__ import annotations

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_agui import approval_registry
from tests.api.test_proxy import native_call
from toolforge.eval.scripted_upstream import Script


async def test_the_ag_ui_client_against_the_gateway(make_gateway: HarnessFactory) -> None:
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
    await node_test("agui.test.mjs", gw.url, "@ag-ui/client")
    assert ran == [4]  # the approved call ran, once
    assert len(gw.upstream.requests) == 5
