"""The OpenAI-compatible proxy on the real SmolLM2-135M, through the official ``openai`` SDK
(docs/proxy.md): a gateway on loopback in front of the session's llama-server, treated as
one (``UPSTREAM_KIND=llama_server``: constrained mode). The assertions are on the protocol
and the shapes (chunks, finish reasons, schema-valid calls and JSON), not on the model's
wording. bench/proxy_quality.py measures the call rate over many cases."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openai import AsyncOpenAI, BadRequestError
from openai.types.chat import ChatCompletionFunctionToolParam

from toolforge.eval.loopback import start_gateway
from toolforge.runtime.local_backend import SMOLLM2_135M

pytestmark = pytest.mark.real

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": WEATHER_PARAMS,
    },
}
MODEL = SMOLLM2_135M.name
SEED = 7  # with temperature 0 (greedy), for the record


@pytest.fixture
async def client(local_llama_server: str, tmp_path: Path) -> AsyncIterator[AsyncOpenAI]:
    """The SDK's client, pointed at a gateway in front of the real llama-server."""
    async with contextlib.AsyncExitStack() as stack:
        gateway = await start_gateway(
            stack,
            tmp_path,
            upstream_base_url=f"{local_llama_server}/v1",
            upstream_kind="llama_server",
            model_id=SMOLLM2_135M.name,
            first_byte_s=60.0,  # a CPU shared with other tests: prompts can wait a while
            idle_s=60.0,
        )
        sdk = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        stack.push_async_callback(sdk.close)
        yield sdk


async def test_a_plain_answer_streams_as_content_chunks_and_stops(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        temperature=0,
        seed=SEED,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=64,
        stop=["\n"],  # ends the answer with "stop" whatever the model goes on to say
        stream=True,
    )
    pieces: list[str] = []
    finishes: list[str | None] = []
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finishes.append(choice.finish_reason)
            assert not choice.delta.tool_calls
    assert len(pieces) > 1 and "".join(pieces).strip()  # token by token, not one lump
    assert [f for f in finishes if f is not None] == ["stop"] and finishes[-1] == "stop"


async def test_a_tool_request_streams_back_a_schema_valid_call(client: AsyncOpenAI) -> None:
    # "required": whether to call at all is the model's choice under "auto" (it may answer
    # through respond instead; bench/proxy_quality.py measures that), the call's shape is not.
    stream = await client.chat.completions.create(
        model=MODEL,
        temperature=0,
        seed=SEED,
        messages=[{"role": "user", "content": "How hot is it in Phoenix, in fahrenheit?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=256,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finishes: list[str] = []
    modes: list[str] = []
    async for chunk in stream:
        if "toolforge" in (chunk.model_extra or {}):
            modes.append(chunk.model_extra["toolforge"]["mode"])  # type: ignore[index]
        for choice in chunk.choices:
            assert not choice.delta.content
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            if choice.finish_reason is not None:
                finishes.append(choice.finish_reason)
    assert finishes == ["tool_calls"] and modes == ["constrained"]  # the grammar ran
    (call,) = calls.values()
    assert call["id"] and call["name"] == "get_weather"
    args = json.loads(call["arguments"])
    assert list(Draft202012Validator(WEATHER_PARAMS).iter_errors(args)) == []


async def test_a_json_schema_answer_is_valid_json_for_the_schema(client: AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "country": {"type": "string"},
            "population_millions": {"type": "number"},
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": False,
    }
    reply = await client.chat.completions.create(
        model=MODEL,
        temperature=0,
        seed=SEED,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "City", "schema": schema, "strict": True},
        },
        max_tokens=128,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    value = json.loads(choice.message.content or "")
    assert list(Draft202012Validator(schema).iter_errors(value)) == []
    assert (reply.model_extra or {})["toolforge"].get("degraded") is False


async def test_a_prompt_over_the_models_context_is_a_bad_request(client: AsyncOpenAI) -> None:
    """llama-server refuses a prompt longer than a slot's context (4096 tokens here): the
    SDK raises ``BadRequestError`` with ``CONTEXT_LENGTH_EXCEEDED`` and the numbers, not
    a 502 that blames the upstream."""
    long = "Tell me about the weather in every city you know. " * 800  # ~9,600 tokens
    with pytest.raises(BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": long}], max_tokens=8
        )
    assert caught.value.status_code == 400
    assert caught.value.code == "CONTEXT_LENGTH_EXCEEDED"
    assert "the model's context 4096" in caught.value.message, caught.value.message
