"""Every wire format holds an API key to its concurrent streams, as ``POST /v1/stream`` does
(``RATE_LIMIT_STREAMS``): a key at its limit gets a 429 on ``/v1/responses``,
``/v1/agui`` and ``/v1/ui/chat`` and a ``RATE_LIMITED`` refusal on the WebSocket, before
any model call; another key is not held back; the slot comes back when the stream ends;
and the next run after an approval follows its stream without taking another slot."""

from __future__ import annotations

from typing import Any

import orjson
from httpx_sse import aconnect_sse
from websockets.asyncio.client import connect

from tests.api.conftest import HarnessFactory, sentinel_reply
from tests.api.test_agui import approval_registry, run, run_input, user
from tests.api.test_auth import CLIENT_TOOL_BODY, KEY_A, KEY_B, bearer, calling_client_tool
from tests.api.test_proxy import native_call
from toolforge.eval.scripted_upstream import Script

ASKS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"model": "m", "input": "Hi", "stream": True}),
    ("/v1/responses", {"model": "m", "input": "Hi"}),
    ("/v1/agui", run_input([user("Hi")])),
    (
        "/v1/ui/chat",
        {"messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}]},
    ),
]


async def test_a_key_at_its_limit_is_refused_at_every_door(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [calling_client_tool(), Script.from_tokens([sentinel_reply("Sunny.")])]
        + [Script.from_tokens(["ok"])] * 8,
        api_keys=f"{KEY_A},{KEY_B}",
        rate_limit_streams=1,
    )
    async with aconnect_sse(
        gw.client, "POST", f"{gw.url}/v1/stream", json=CLIENT_TOOL_BODY, headers=bearer(KEY_A)
    ) as source:
        stream_id = ""
        async for sse in source.aiter_sse():
            if sse.event == "stream.begin":
                stream_id = orjson.loads(sse.data)["stream_id"]
            if sse.event != "tool.call":
                continue
            # KEY_A holds its one stream, waiting for its client
            before = len(gw.upstream.requests)
            for path, body in ASKS:
                refused = await gw.client.post(f"{gw.url}{path}", json=body, headers=bearer(KEY_A))
                assert refused.status_code == 429, (path, refused.text)
            ws_url = gw.url.replace("http://", "ws://") + "/v1/stream/ws"
            async with connect(ws_url, additional_headers=bearer(KEY_A), open_timeout=5) as ws:
                await ws.send(orjson.dumps({"type": "start", "request": {"input": "Hi"}}).decode())
                refusal = orjson.loads(await ws.recv())
                assert refusal["type"] == "error" and refusal["error"]["code"] == "RATE_LIMITED"
            assert len(gw.upstream.requests) == before  # no model call for any of them
            other = await gw.client.post(
                f"{gw.url}/v1/responses", json=ASKS[1][1], headers=bearer(KEY_B)
            )
            assert other.status_code == 200  # another key has its own streams
            answer = await gw.client.post(
                f"{gw.url}/v1/streams/{stream_id}/tool_results/t1",
                json={"ok": True, "result": {"sky": "clear"}},
                headers=bearer(KEY_A),
            )
            assert answer.status_code == 200
    await gw.settle()
    again = await gw.client.post(f"{gw.url}/v1/responses", json=ASKS[1][1], headers=bearer(KEY_A))
    assert again.status_code == 200  # the stream ended: its slot is back


async def test_the_run_after_an_approval_takes_no_second_slot(
    make_gateway: HarnessFactory,
) -> None:
    ran: list[int] = []
    gw = await make_gateway(
        [native_call("book", {"table": 4}), native_call("respond", {"content": "Booked."})],
        tools=approval_registry(ran),
        api_keys=KEY_A,
        rate_limit_streams=1,
    )
    gw.client.headers.update(bearer(KEY_A))
    props = {"toolforge": {"server_tools": ["book"]}}
    first = await run(gw, run_input([user("Book table 4.")], forwardedProps=props))
    (interrupt,) = first[-1].outcome.interrupts
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approve": True}}]
    second = await run(
        gw, run_input([user("Book table 4.")], forwardedProps=props, resume=resume, runId="r2")
    )
    assert second[-1].outcome.type == "success" and ran == [4]
