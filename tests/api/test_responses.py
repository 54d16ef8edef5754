"""The Responses API through the official ``openai`` SDK's ``client.responses``: a real
gateway on loopback in front of the scripted upstream. Every response object and every
streamed event is also validated with Open Responses' published types
(``openresponses-types``), as its compliance suite validates them."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import openresponses_types as spec
import orjson
import pytest
from pydantic import BaseModel, TypeAdapter

from tests.api.conftest import SDK, Harness, HarnessFactory
from tests.api.test_proxy import USAGE, native_call
from toolforge.eval.scripted_upstream import Script, Step

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

EVENT_TYPES: dict[str, type[BaseModel]] = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.reasoning.delta": spec.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning.done": spec.ResponseReasoningDoneStreamingEvent,
    "response.function_call_arguments.delta": (
        spec.ResponseFunctionCallArgumentsDeltaStreamingEvent
    ),
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
}
_RESOURCE = TypeAdapter(spec.ResponseResource)


def valid_resource(resource: Any) -> dict[str, Any]:
    """``resource`` (an SDK object or a dict), validated against the published type."""
    data = resource if isinstance(resource, dict) else resource.model_dump(mode="json")
    _RESOURCE.validate_python(data)
    return data


def valid_events(events: list[Any]) -> list[dict[str, Any]]:
    """The streamed events as dicts: each valid against its published type, numbered
    from 0 with no gap, one terminal event last."""
    dumped = [e.model_dump(mode="json", exclude_unset=True) for e in events]
    for event in dumped:
        EVENT_TYPES[event["type"]].model_validate(event)
    assert [e["sequence_number"] for e in dumped] == list(range(len(dumped)))
    terminal = {"response.completed", "response.failed", "response.incomplete"}
    assert [e["type"] in terminal for e in dumped].count(True) == 1
    assert dumped[-1]["type"] in terminal
    assert [e["type"] for e in dumped[:2]] == ["response.created", "response.in_progress"]
    return dumped


def sent(gw: Harness, index: int = -1) -> dict[str, Any]:
    assert gw.upstream is not None
    body: dict[str, Any] = orjson.loads(gw.upstream.requests[index].body)
    return body


# -- text -------------------------------------------------------------------------------------


async def test_a_streamed_text_answer(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo ", "there"], usage=USAGE)])
    stream = await sdk(gw).responses.create(
        model="m", input="Say hello.", instructions="Be brief.", stream=True
    )
    events = valid_events([event async for event in stream])
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Hel", "lo ", "there"]
    final = valid_resource(events[-1]["response"])
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == (
        "Hello there"
    )
    assert final["usage"]["input_tokens"] == 11 and final["usage"]["total_tokens"] == 14
    assert events[0]["response"]["status"] == "in_progress"
    assert sent(gw)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]


async def test_a_text_answer_not_streamed(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny ", "and warm."], usage=USAGE)])
    done = await sdk(gw).responses.create(
        model="m",
        input=[
            {"type": "message", "role": "system", "content": "You are a pirate."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        ],
        temperature=0.3,
        top_p=0.9,
        max_output_tokens=50,
        metadata={"k": "v"},
    )
    valid_resource(done)
    assert done.output_text == "Sunny and warm."
    assert done.status == "completed" and done.id.startswith("resp_")
    assert (done.temperature, done.top_p, done.max_output_tokens) == (0.3, 0.9, 50)
    body = sent(gw)
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.3, 0.9, 50)
    assert body["messages"] == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Weather?"},
    ]


async def test_reasoning_is_its_own_item(make_gateway: HarnessFactory, sdk: SDK) -> None:
    tokens = ["<thi", "nk>Paris is in Fra", "nce.</th", "ink>\n", "Sunny."]
    gw = await make_gateway([Script.from_tokens(tokens), Script.from_tokens(tokens)])
    stream = await sdk(gw).responses.create(model="m", input="Weather in Paris?", stream=True)
    events = valid_events([e async for e in stream])
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning.delta")
    assert reasoning == "Paris is in France."
    done = [e for e in events if e["type"] == "response.reasoning.done"]
    assert [e["text"] for e in done] == ["Paris is in France."]
    whole = await sdk(gw).responses.create(model="m", input="Weather in Paris?")
    valid_resource(whole)
    kinds = [item.type for item in whole.output]
    assert kinds == ["reasoning", "message"]
    assert whole.output_text == "Sunny."


# -- tools ------------------------------------------------------------------------------------


async def test_a_streamed_function_call(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([native_call("get_weather", {"city": "Paris"})])
    stream = await sdk(gw).responses.create(
        model="m",
        input="Weather in Paris?",
        tools=[WEATHER],
        stream=True,  # type: ignore[list-item]
    )
    events = valid_events([e async for e in stream])
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["type"] for e in added] == ["function_call"]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    # the whole arguments at once: validated JSON, never a prefix that does not parse
    assert [orjson.loads(e["delta"]) for e in deltas] == [{"city": "Paris"}]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert orjson.loads(done[0]["arguments"]) == {"city": "Paris"}
    item = events[-2]["item"]
    assert events[-2]["type"] == "response.output_item.done"
    assert (item["type"], item["name"], item["status"]) == (
        "function_call",
        "get_weather",
        "completed",
    )
    assert item["call_id"] and item["id"] != item["call_id"]
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["function_call"]
    body = sent(gw)
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "respond"]


async def test_a_client_call_answered_with_previous_response_id(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "It is sunny in Paris."}),
        ]
    )
    client = sdk(gw)
    first = await client.responses.create(
        model="m",
        input="Weather in Paris?",
        instructions="Use the tools.",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    valid_resource(first)
    call = first.output[0]
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"city": "Paris"}
    second = await client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
        ],
        tools=[WEATHER],  # type: ignore[list-item]
    )
    valid_resource(second)
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first.id
    history = sent(gw)["messages"]
    assert history[0] == {
        "role": "user",
        "content": "Weather in Paris?",
    }  # instructions not carried
    assert history[1]["role"] == "assistant"
    assert history[1]["tool_calls"][0]["id"] == call.call_id
    assert history[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert history[2] == {
        "role": "tool",
        "tool_call_id": call.call_id,
        "content": '{"sky": "sunny"}',
    }


PIZZA = [
    native_call("places__search", {"query": "pizza", "radius_km": 2}),
    native_call("respond", {"content": "Trattoria Roma has pizza."}),
]
SERVER_TOOLS = {"toolforge": {"server_tools": ["places.search"]}}


def assert_server_call_items(output: list[dict[str, Any]]) -> None:
    """The server tool's call and its result as items, then the answer."""
    assert [i["type"] for i in output] == ["function_call", "function_call_output", "message"]
    call, result, message = output
    assert call["name"] == "places.search" and call["status"] == "completed"
    assert orjson.loads(call["arguments"]) == {"query": "pizza", "radius_km": 2}
    assert result["call_id"] == call["call_id"] and result["status"] == "completed"
    assert orjson.loads(result["output"])["places"][0]["name"] == "Trattoria Roma"
    assert message["content"][0]["text"] == "Trattoria Roma has pizza."


async def test_a_server_tool_runs_mid_response(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(PIZZA)
    stream = await sdk(gw).responses.create(
        model="m", input="Pizza near me?", stream=True, extra_body=SERVER_TOOLS
    )
    events = valid_events([e async for e in stream])
    final = events[-1]["response"]
    assert_server_call_items(final["output"])
    # streamed as it happened: the call (its arguments whole), then its output, then the text
    items = [
        (e["type"], e.get("item", {}).get("type"))
        for e in events
        if e["type"].startswith(("response.output_item", "response.function_call"))
    ]
    assert items[:6] == [
        ("response.output_item.added", "function_call"),
        ("response.function_call_arguments.delta", None),
        ("response.function_call_arguments.done", None),
        ("response.output_item.done", "function_call"),
        ("response.output_item.added", "function_call_output"),
        ("response.output_item.done", "function_call_output"),
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    trace = final["toolforge"]["server_tools"]
    assert trace[0]["name"] == "places.search" and trace[0]["ok"] is True
    second = sent(gw, 1)["messages"]
    assert second[-1]["role"] == "tool"


async def test_server_tool_items_are_stored_and_continued(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([*PIZZA, Script.from_tokens(["It opens at 11:30."])])
    client = sdk(gw)
    first = await client.responses.create(
        model="m", input="Pizza near me?", extra_body=SERVER_TOOLS
    )
    assert_server_call_items(valid_resource(first)["output"])
    assert first.output_text == "Trattoria Roma has pizza."
    got = valid_resource(await client.responses.retrieve(first.id))
    assert got["output"] == valid_resource(first)["output"]
    second = await client.responses.create(
        model="m", input="When does it open?", previous_response_id=first.id
    )
    assert second.output_text == "It opens at 11:30."
    history = sent(gw)["messages"]
    call_id = first.output[0].call_id  # type: ignore[union-attr]
    # the model sees the call and its result as it did mid-response: its wire name, the id
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[1]["tool_calls"][0]["function"]["name"] == "places__search"
    assert history[1]["tool_calls"][0]["id"] == call_id
    assert history[2]["tool_call_id"] == call_id
    assert orjson.loads(history[2]["content"])["places"][0]["id"] == "trattoria-roma"
    listed = await client.responses.input_items.list(second.id, order="asc")
    ids = [item.id for item in listed.data]
    assert ids[1:4] == [item.id for item in first.output]
    assert [item.type for item in listed.data] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]


class Forecast(BaseModel):
    city: str
    celsius: int


async def test_a_json_schema_answer_is_parsed(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [Script.from_tokens(['{"city": "Paris", ', '"celsius": 21}'], usage=USAGE)]
    )
    parsed = await sdk(gw).responses.parse(model="m", input="Forecast?", text_format=Forecast)
    assert parsed.output_parsed == Forecast(city="Paris", celsius=21)
    body = sent(gw)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["city", "celsius"]


async def test_an_image_goes_on_as_an_image_url_part(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["A red heart."])])
    url = "data:image/png;base64,iVBORw0KGgo="
    done = await sdk(gw).responses.create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": url, "detail": "auto"},
                ],
            }
        ],
    )
    assert done.output_text == "A red heart."
    assert sent(gw)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url, "detail": "auto"}},
            ],
        }
    ]


# -- stored responses ------------------------------------------------------------------------


async def test_a_stored_response_is_read_listed_and_deleted(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["Hi."]), Script.from_tokens(["Yes."])])
    client = sdk(gw)
    stream = await client.responses.create(model="m", input="Hello?", stream=True)
    events = [e async for e in stream]
    response_id = events[-1].response.id  # type: ignore[union-attr]
    got = await client.responses.retrieve(response_id)
    valid_resource(got)
    assert got.status == "completed" and got.output_text == "Hi."
    items = await client.responses.input_items.list(response_id)
    assert [item.type for item in items.data] == ["message"]
    await client.responses.delete(response_id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response_id)
    unstored = await client.responses.create(model="m", input="Again?", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="m", input="On?", previous_response_id=unstored.id)


async def test_a_running_response_is_cancelled(make_gateway: HarnessFactory, sdk: SDK) -> None:
    slow = Script(steps=(Step(text="Once "), Step(text="upon", delay_ms=10_000)), end="done")
    gw = await make_gateway([slow])
    client = sdk(gw)
    stream = await client.responses.create(model="m", input="A story?", stream=True)
    seen: list[Any] = []
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    cancelled = await asyncio.wait_for(client.responses.cancel(seen[0].response.id), 5)
    assert cancelled.status == "cancelled"
    assert cancelled.output_text == "Once "
    await stream.close()


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"background": True}, "'background' is not supported"),
        ({"include": ["reasoning.encrypted_content"]}, "'include' is not supported"),
        ({"frobnicate": 1}, "unknown parameter 'frobnicate'"),
        ({"tools": [{"type": "web_search"}]}, "tool type 'web_search' is not supported"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "'nope', which is not in"),
        ({"tool_choice": "required"}, "needs 'tools'"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference' items"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"toolforge": {"workflow": "book_a_table"}, "parallel_tool_calls": True},
            "not with 'toolforge.workflow'",
        ),
        ({"toolforge": {"server_tools": ["nope"]}}, "nope"),
    ],
)
async def test_bad_requests_are_refused_by_name(
    make_gateway: HarnessFactory, sdk: SDK, extra: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    body: dict[str, Any] = {"input": "Hi"}
    body.update(extra)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).responses.create(model="m", extra_body=body)
    assert needle in caught.value.message
    assert caught.value.status_code == 400
    assert gw.upstream is not None and gw.upstream.requests == []


async def test_an_unknown_previous_response_is_not_found(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.NotFoundError):
        await sdk(gw).responses.create(model="m", input="Hi", previous_response_id="resp_nope")
    assert gw.upstream is not None and gw.upstream.requests == []


async def test_an_error_mid_stream_fails_the_response(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"], finish=None, end="rst")])
    stream = await sdk(gw).responses.create(model="m", input="Hi", stream=True)
    events = valid_events([e async for e in stream])
    last = events[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["status"] == "failed"
    assert "UPSTREAM" in last["response"]["error"]["code"]
    assert last["response"]["output"][0]["content"][0]["text"] == "Hello"


async def test_a_dead_upstream_raises_an_api_error(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script(end="status", status=500, body='{"error": "boom"}')])
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk(gw).responses.create(model="m", input="Hi")
    assert caught.value.status_code == 502
