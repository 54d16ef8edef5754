"""Stored responses shared through Redis (docs/responses.md): two gateways in front of one
real ``redis-server`` on loopback, each with its own scripted upstream. A response made on
one is read, listed and continued (``previous_response_id``) on the other, a running one
is cancelled from the other, and keys of other keys' responses are refused — through the
official ``openai`` SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.api.conftest import SDK, HarnessFactory
from tests.api.test_auth import KEY_A, KEY_B
from tests.api.test_proxy import native_call
from tests.api.test_responses import WEATHER, valid_resource
from tests.replicas.conftest import RedisServer, redis_binary
from toolforge.eval.scripted_upstream import Script, Step


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(redis_binary(), tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


async def test_a_conversation_goes_on_at_another_replica(
    make_gateway: HarnessFactory, sdk: SDK, redis_url: str
) -> None:
    one = await make_gateway([native_call("get_weather", {"city": "Paris"})], redis_url=redis_url)
    two = await make_gateway(
        [native_call("respond", {"content": "Sunny in Paris."})], redis_url=redis_url
    )
    first = await sdk(one).responses.create(
        model="m",
        input="Weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
    )
    call = first.output[0]
    got = await sdk(two).responses.retrieve(first.id)
    valid_resource(got)
    assert got.status == "completed" and got.output[0].call_id == call.call_id  # type: ignore[union-attr]
    items = await sdk(two).responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"]
    second = await sdk(two).responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],  # type: ignore[union-attr]
        tools=[WEATHER],  # type: ignore[list-item]
    )
    assert second.output_text == "Sunny in Paris."
    history: list[dict[str, Any]] = orjson.loads(two.upstream.requests[-1].body)["messages"]
    assert history[0] == {"role": "user", "content": "Weather in Paris?"}
    assert history[1]["tool_calls"][0]["id"] == call.call_id  # type: ignore[union-attr]
    assert history[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}  # type: ignore[union-attr]


async def test_a_running_response_is_cancelled_from_another_replica(
    make_gateway: HarnessFactory, sdk: SDK, redis_url: str
) -> None:
    slow = Script(steps=(Step(text="Once "), Step(text="upon", delay_ms=10_000)))
    one = await make_gateway([slow], redis_url=redis_url, idle_s=30)
    two = await make_gateway(redis_url=redis_url)
    stream = await sdk(one).responses.create(model="m", input="A story?", stream=True)
    seen: list[Any] = []
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    cancelled = await asyncio.wait_for(sdk(two).responses.cancel(seen[0].response.id), 10)
    assert cancelled.status == "cancelled" and cancelled.output_text == "Once "
    await stream.close()


async def test_another_keys_response_is_not_found(
    make_gateway: HarnessFactory, redis_url: str
) -> None:
    keys = f"{KEY_A},{KEY_B}"
    gw = await make_gateway([Script.from_tokens(["Hi."])], api_keys=keys, redis_url=redis_url)
    a = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0, timeout=10)
    b = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_B, max_retries=0, timeout=10)
    async with a, b:
        made = await a.responses.create(model="m", input="Hello?")
        assert (await a.responses.retrieve(made.id)).output_text == "Hi."
        with pytest.raises(openai.NotFoundError):
            await b.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await b.responses.create(model="m", input="On?", previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            await b.responses.delete(made.id)
        assert (await a.responses.retrieve(made.id)).id == made.id
