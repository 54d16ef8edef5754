"""Open Responses' compliance checks, each as a counterpart here: the same request to
``POST /v1/responses`` over raw HTTP on loopback (no SDK smoothing anything over), the
response object validated with the spec's published types (``openresponses-types``),
every streamed event validated with its own type, then each check's own assertions.

The checks: a basic text response, a streamed one, a system message, a function call
(whole and streamed: ``output_item.added``/``done`` with a ``function_call`` item, and
``function_call_arguments.delta``/``done``), an image in the user's content, and a
multi-turn conversation sent as items.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.api.conftest import Harness, HarnessFactory
from tests.api.test_proxy import native_call
from tests.api.test_responses import EVENT_TYPES, valid_resource
from toolforge.eval.scripted_upstream import Script

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state"},
        },
        "required": ["location"],
    },
}
HEART = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4"
    "z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def post(gw: Harness, body: dict[str, Any], *, stream: bool) -> Any:
    """The response object (validated); streamed: the events too (each validated)."""
    async with gw.client.stream(
        "POST", f"{gw.url}/v1/responses", json={**body, "model": "m", "stream": stream}
    ) as response:
        raw = await response.aread()
        assert response.status_code == 200, raw
    if not stream:
        assert response.headers["content-type"].startswith("application/json")
        return valid_resource(orjson.loads(raw)), []
    assert response.headers["content-type"].startswith("text/event-stream")
    events: list[dict[str, Any]] = []
    for block in raw.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next(line[7:] for line in lines if line.startswith("event: "))
        data = orjson.loads(next(line[6:] for line in lines if line.startswith("data: ")))
        assert name == data["type"]
        EVENT_TYPES[data["type"]].model_validate(data)
        events.append(data)
    assert events, "no streaming events"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return valid_resource(events[-1]["response"]), events


def text_of(resource: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in resource["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["basic-response", "streaming-response"])
async def test_a_text_response(make_gateway: HarnessFactory, stream: bool) -> None:
    gw = await make_gateway([Script.from_tokens(["Hello ", "there ", "friend."])])
    resource, events = await post(
        gw, {"input": [user("Say hello in exactly 3 words.")]}, stream=stream
    )
    assert resource["output"] and resource["status"] == "completed"
    assert text_of(resource) == "Hello there friend."
    if stream:
        assert events[-1]["type"] == "response.completed"


async def test_a_system_prompt(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Ahoy!"])])
    pirate = {"type": "message", "role": "system", "content": "You are a pirate."}
    resource, _ = await post(gw, {"input": [pirate, user("Say hello.")]}, stream=False)
    assert resource["output"] and resource["status"] == "completed"
    messages = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert messages == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Say hello."},
    ]


async def test_tool_calling(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([native_call("get_weather", {"location": "San Francisco, CA"})])
    body = {"input": [user("What's the weather like in San Francisco?")], "tools": [WEATHER]}
    resource, _ = await post(gw, body, stream=False)
    calls = [item for item in resource["output"] if item["type"] == "function_call"]
    assert len(calls) == 1
    assert orjson.loads(calls[0]["arguments"]) == {"location": "San Francisco, CA"}


async def test_tool_calling_streamed(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([native_call("get_weather", {"location": "San Francisco, CA"})])
    body = {"input": [user("What's the weather like in San Francisco?")], "tools": [WEATHER]}
    resource, events = await post(gw, body, stream=True)
    types = [e["type"] for e in events]
    assert any(
        e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
        for e in events
    )
    assert "response.function_call_arguments.delta" in types
    assert "response.function_call_arguments.done" in types
    assert any(
        e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
        for e in events
    )
    assert [item["type"] for item in resource["output"]] == ["function_call"]


async def test_an_image_input(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["A red heart."])])
    content = [
        {"type": "input_text", "text": "What do you see in this image?"},
        {"type": "input_image", "image_url": HEART},
    ]
    body = {"input": [{"type": "message", "role": "user", "content": content}]}
    resource, _ = await post(gw, body, stream=False)
    assert resource["status"] == "completed" and text_of(resource) == "A red heart."
    sent = orjson.loads(gw.upstream.requests[-1].body)["messages"][0]["content"]
    assert sent[1] == {"type": "image_url", "image_url": {"url": HEART}}


async def test_a_multi_turn_conversation(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Your name is Alice."])])
    said = {"type": "message", "role": "assistant", "content": "Hello Alice!"}
    body = {"input": [user("My name is Alice."), said, user("What is my name?")]}
    resource, _ = await post(gw, body, stream=False)
    assert resource["status"] == "completed" and text_of(resource) == "Your name is Alice."
    messages = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
