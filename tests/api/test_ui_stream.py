"""The AI SDK's UI message stream over ``POST /v1/ui/chat``: a real gateway on loopback in
front of the scripted upstream. The chunks are read as the SDK reads them (``data:``
lines, ``[DONE]`` last); the node side (test_ui_stream_node.py) rebuilds the messages with
the ``ai`` package itself."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.api.conftest import Harness, HarnessFactory
from tests.api.test_agui import approval_registry
from tests.api.test_proxy import USAGE, native_call
from tests.api.test_proxy_workflows import call
from toolforge.eval.scripted_upstream import Script

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


async def chat(gw: Harness, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /v1/ui/chat as DefaultChatTransport does; every chunk, in order."""
    async with gw.client.stream("POST", f"{gw.url}/v1/ui/chat", json=body) as response:
        raw = await response.aread()
        assert response.status_code == 200, raw
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    blocks = [b for b in raw.decode().split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]"
    return [orjson.loads(b.removeprefix("data: ")) for b in blocks[:-1]]


def kinds(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


async def test_a_text_message(make_gateway: HarnessFactory) -> None:
    tokens = ["<think>Warm.</think>", "Sunny ", "and warm."]
    gw = await make_gateway([Script.from_tokens(tokens, usage=USAGE)])
    chunks = await chat(
        gw, {"id": "c1", "messages": [user("Weather?")], "trigger": "submit-message"}
    )
    assert kinds(chunks) == [
        "start",
        "start-step",
        "reasoning-start",
        "reasoning-delta",
        "reasoning-end",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    assert chunks[-1]["finishReason"] == "stop"
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "Sunny and warm."


async def test_a_client_tool_and_its_output_next_turn(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
        ]
    )
    chunks = await chat(gw, {"messages": [user("Weather in Paris?")], "tools": [WEATHER]})
    available = next(c for c in chunks if c["type"] == "tool-input-available")
    assert available["toolName"] == "get_weather" and available["input"] == {"city": "Paris"}
    assert "providerExecuted" not in available  # the browser runs it
    assert chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    call_id = available["toolCallId"]
    said = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-get_weather",
                "toolCallId": call_id,
                "state": "output-available",
                "input": {"city": "Paris"},
                "output": {"sky": "sunny"},
            },
        ],
    }
    second = await chat(gw, {"messages": [user("Weather in Paris?"), said], "tools": [WEATHER]})
    assert "".join(c["delta"] for c in second if c["type"] == "text-delta") == "Sunny in Paris."
    sent = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": call_id, "content": '{"sky":"sunny"}'}
    assert sent[-2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_an_approval_request_and_its_answer(
    make_gateway: HarnessFactory, approve: bool
) -> None:
    ran: list[int] = []
    gw = await make_gateway(
        [
            native_call("book", {"table": 4}),
            native_call("respond", {"content": "Booked." if approve else "Not booked."}),
        ],
        tools=approval_registry(ran),
    )
    extension = {"toolforge": {"server_tools": ["book"]}}
    first = await chat(gw, {"messages": [user("Book table 4.")], **extension})
    request = next(c for c in first if c["type"] == "tool-approval-request")
    available = next(c for c in first if c["type"] == "tool-input-available")
    assert available["providerExecuted"] is True  # the gateway runs it, once approved
    assert request["toolCallId"] == available["toolCallId"]
    assert kinds(first)[-2:] == ["finish-step", "finish"]
    assert ran == []
    message_id = first[0]["messageId"]
    answered = {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-book",
                "toolCallId": request["toolCallId"],
                "state": "approval-responded",
                "input": {"table": 4},
                "approval": {"id": request["approvalId"], "approved": approve},
            }
        ],
    }
    second = await chat(gw, {"messages": [user("Book table 4."), answered], **extension})
    assert second[0] == {"type": "start", "messageId": message_id}  # the same message goes on
    if approve:
        output = next(c for c in second if c["type"] == "tool-output-available")
        assert output["output"] == {"booked": 4}
    else:
        assert any(c["type"] == "tool-output-denied" for c in second)
    text = "".join(c["delta"] for c in second if c["type"] == "text-delta")
    assert text == ("Booked." if approve else "Not booked.")
    assert ran == ([4] if approve else [])


async def test_an_upstream_error_is_an_error_chunk(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"], finish=None, end="rst")])
    chunks = await chat(gw, {"messages": [user("Hi")]})
    assert chunks[-1]["type"] == "error" and "UPSTREAM" in chunks[-1]["errorText"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [user("x")], "frobnicate": 1}, "frobnicate"),
        ({"messages": [{"id": "x", "role": "robot", "parts": []}]}, "robot"),
        (
            {"messages": [{"id": "x", "role": "user", "parts": [{"type": "source-url"}]}]},
            "source-url",
        ),
    ],
)
async def test_bad_requests_are_refused(
    make_gateway: HarnessFactory, body: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    response = await gw.client.post(f"{gw.url}/v1/ui/chat", json=body)
    assert response.status_code in (400, 422), response.text
    assert needle in response.json()["error"]["message"]
    assert gw.upstream.requests == []


async def test_a_workflow_message_is_its_result(make_gateway: HarnessFactory) -> None:
    search = '{"query": "italian"}'
    book = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
    gw = await make_gateway(
        [call("t1", "places.search", search, "Let me look. "), call("t2", "bookings.create", book)]
    )
    body = {
        "messages": [user("Book a table for 2, italian, 19:30.")],
        "toolforge": {"workflow": "book_a_table"},
    }
    chunks = await chat(gw, body)
    outputs = [c for c in chunks if c["type"] == "tool-output-available"]
    assert len(outputs) == 2 and all(c["providerExecuted"] for c in outputs)
    texts = [c["delta"] for c in chunks if c["type"] == "text-delta"]
    assert len(texts) == 1 and orjson.loads(texts[0])["party_size"] == 2  # no chatter
    assert chunks[-1] == {"type": "finish", "finishReason": "stop"}
