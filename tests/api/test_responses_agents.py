"""The OpenAI Agents SDK (``openai-agents``) with its default model, the Responses API,
pointed at the gateway: an agent with a function tool and a typed ``output_type`` runs
to its end, streamed and not, over loopback in front of the scripted upstream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from pydantic import BaseModel

from tests.api.conftest import SDK, Harness, HarnessFactory
from tests.api.test_proxy import native_call


class Forecast(BaseModel):
    city: str
    celsius: int


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return orjson.dumps({"city": city, "celsius": 21}).decode()


@pytest.fixture(autouse=True)
def no_tracing() -> None:
    set_tracing_disabled(True)  # its exporter would call OpenAI's servers


def agent(gw: Harness, sdk: SDK) -> Agent[Any]:
    return Agent(
        name="forecaster",
        instructions="Answer with the forecast.",
        tools=[get_weather],
        output_type=Forecast,
        model=OpenAIResponsesModel(model="m", openai_client=sdk(gw)),
        model_settings=ModelSettings(temperature=0.2),
    )


def scripts() -> list[Any]:
    return [
        native_call("get_weather", {"city": "Paris"}),
        native_call("respond", {"city": "Paris", "celsius": 21}),
    ]


def check_upstream(gw: Harness) -> None:
    assert gw.upstream is not None and len(gw.upstream.requests) == 2
    second = orjson.loads(gw.upstream.requests[1].body)
    messages = second["messages"]
    assert messages[0] == {"role": "system", "content": "Answer with the forecast."}
    call = messages[-2]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == call["id"]
    assert orjson.loads(messages[-1]["content"]) == {"city": "Paris", "celsius": 21}
    assert second["temperature"] == 0.2
    # the typed output is the answer's schema (respond's arguments, the forecast itself)
    respond = next(t for t in second["tools"] if t["function"]["name"] == "respond")
    assert set(respond["function"]["parameters"]["properties"]) == {"city", "celsius"}


async def test_an_agent_with_a_tool_and_a_typed_output(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(scripts())
    result = await Runner.run(agent(gw, sdk), "Weather in Paris?")
    assert result.final_output == Forecast(city="Paris", celsius=21)
    check_upstream(gw)


async def test_the_same_agent_streamed(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(scripts())
    run = Runner.run_streamed(agent(gw, sdk), "Weather in Paris?")
    kinds = [event.type async for event in run.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert run.final_output == Forecast(city="Paris", celsius=21)
    check_upstream(gw)
