"""The OpenAI-compatible proxy through the official ``openai`` SDK (docs/proxy.md): a real gateway
on loopback in front of the scripted upstream. The SDK is the client a user has, so every
case asserts what the SDK returns or raises, and what the upstream was sent."""

from __future__ import annotations

from typing import Any, Final

import openai
import orjson
import pytest

from tests.api.conftest import SDK, Harness, HarnessFactory
from tests.core.gbnf_matcher import parse
from toolforge.eval.scripted_upstream import Script, Step

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


def call_chunk(calls: list[dict[str, Any]], *, finish: str | None = None) -> Step:
    """A native tool-call chunk as an OpenAI-compatible server writes one."""
    choice: dict[str, Any] = {"index": 0, "delta": {"tool_calls": calls}, "finish_reason": finish}
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return Step(raw="data: " + orjson.dumps({**chunk, "choices": [choice]}).decode() + "\n\n")


def native_call(name: str, args: dict[str, Any], call_id: str = "call_up_1") -> Script:
    text = orjson.dumps(args).decode()
    return Script(
        steps=(
            call_chunk(
                [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": text[:5]},
                    }
                ]
            ),
            call_chunk([{"index": 0, "function": {"arguments": text[5:]}}]),
            Step(finish="tool_calls", usage=USAGE),
        )
    )


def sent(gw: Harness, index: int = -1) -> dict[str, Any]:
    assert gw.upstream is not None
    body: dict[str, Any] = orjson.loads(gw.upstream.requests[index].body)
    return body


# -- text ---------------------------------------------------------------------------------


async def test_a_streamed_text_answer_with_usage(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo ", "there"], usage=USAGE)])
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes.count("stop") == 1
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 14 and chunks[-1].usage.prompt_tokens == 11
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    body = sent(gw)
    assert body["messages"] == USER and "tools" not in body and "grammar" not in body


async def test_a_text_answer_not_streamed(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny ", "and warm."], usage=USAGE)])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, temperature=0.3, seed=7, max_tokens=50, stop=["\n\n"]
    )
    assert done.choices[0].message.content == "Sunny and warm."
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens == 3
    extension = (done.model_extra or {})["toolforge"]
    assert extension["stream_id"] and extension["guardrails"] == {}
    body = sent(gw)
    assert (body["temperature"], body["seed"], body["max_tokens"]) == (0.3, 7, 50)
    assert body["stop"] == ["\n\n"]


async def test_models_are_listed(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(model_id="smol")
    models = await sdk(gw).models.list()
    assert [m.id for m in models.data] == ["smol"]


async def test_reasoning_is_returned_apart(make_gateway: HarnessFactory, sdk: SDK) -> None:
    tokens = ["<thi", "nk>Paris is in Fra", "nce.</th", "ink>\n", "Sunny."]
    gw = await make_gateway([Script.from_tokens(tokens), Script.from_tokens(tokens)])
    stream = await sdk(gw).chat.completions.create(model="m", messages=USER, stream=True)
    chunks = [c async for c in stream]
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (reasoning, content) == ("Paris is in France.", "Sunny.")
    done = await sdk(gw).chat.completions.create(model="m", messages=USER)
    message = done.choices[0].message
    assert message.content == "Sunny."
    assert (message.model_extra or {})["reasoning_content"] == "Paris is in France."


async def test_the_upstreams_reasoning_content_passes_through(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    thought = {"index": 0, "delta": {"reasoning_content": "Hmm."}, "finish_reason": None}
    step = Step(raw="data: " + orjson.dumps({**chunk, "choices": [thought]}).decode() + "\n\n")
    gw = await make_gateway([Script(steps=(step, Step(text="Yes."), Step(finish="stop")))])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, user="ann", metadata={"k": "v"}
    )
    message = done.choices[0].message
    assert (message.content, (message.model_extra or {})["reasoning_content"]) == ("Yes.", "Hmm.")
    extension = (done.model_extra or {})["toolforge"]
    prompt = orjson.loads(
        (gw.artifacts / "runs" / extension["stream_id"] / "prompt.json").read_bytes()
    )
    assert (prompt["user"], prompt["metadata"]) == ("ann", {"k": "v"})


async def test_reasoning_split_can_be_switched_off(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["<think>x</think>y"])])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, extra_body={"toolforge": {"guardrails": {"reasoning": False}}}
    )
    assert done.choices[0].message.content == "<think>x</think>y"


# -- tools (the client's) -------------------------------------------------------------------


async def test_a_native_tool_call_streams_as_tool_call_deltas(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([native_call("get_weather", {"city": "Paris"})])
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], stream=True
    )
    chunks = [c async for c in stream]
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert len(calls) == 1
    call = calls[0]
    assert (call.index, call.type, call.function.name) == (0, "function", "get_weather")
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    body = sent(gw)
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == ["get_weather", "respond"]  # respond offered beside the client's tools
    assert body["tool_choice"] == "required"  # the answer is a call too (docs/proxy.md)


async def test_the_tool_call_round_trip(make_gateway: HarnessFactory, sdk: SDK) -> None:
    """The client runs the tool and sends the result back, as the OpenAI docs show."""
    gw = await make_gateway(
        [
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "It is sunny in Paris."}),
        ]
    )
    client = sdk(gw)
    first = await client.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    history = [
        *USER,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
    ]
    second = await client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None
    assert (second.model_extra or {})["toolforge"]["guardrails"] == {"respond": 1}
    upstream_history = sent(gw)["messages"]
    assert upstream_history[-1] == {
        "role": "tool",
        "tool_call_id": call.id,
        "content": '{"sky": "sunny"}',
    }


async def test_parallel_tool_calls(make_gateway: HarnessFactory, sdk: SDK) -> None:
    calls = [
        {
            "index": 0,
            "id": "a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
        },
        {
            "index": 1,
            "id": "b",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"city":"Oslo"}'},
        },
    ]
    gw = await make_gateway([Script(steps=(call_chunk(calls), Step(finish="tool_calls")))])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER, TIME], parallel_tool_calls=True
    )
    got = done.choices[0].message.tool_calls or []
    assert [c.function.name for c in got] == ["get_weather", "get_time"]
    assert sent(gw)["parallel_tool_calls"] is True


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        'Sure. {"name": "get_weather", "arguments": {"city": "Paris"}}',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        'get_weather({"city": "Paris"})',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ],
    ids=["fenced", "bare", "tags", "call-syntax", "mistral"],
)
async def test_a_call_written_as_text_is_rescued(
    make_gateway: HarnessFactory, sdk: SDK, text: str
) -> None:
    gw = await make_gateway([Script.from_tokens([text[:7], text[7:]])])
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], stream=True
    )
    chunks = [c async for c in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert content == ""  # held, then recognised as a call: no prose leaks out
    assert [(c.function.name, orjson.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert (chunks[-1].model_extra or {})["toolforge"]["guardrails"] == {"rescued": 1}


async def test_rescue_switched_off_returns_the_text(make_gateway: HarnessFactory, sdk: SDK) -> None:
    text = 'get_weather({"city": "Paris"})'
    gw = await make_gateway([Script.from_tokens([text])])
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        extra_body={"toolforge": {"guardrails": {"rescue": False, "respond": False}}},
    )
    assert done.choices[0].message.content == text
    assert done.choices[0].message.tool_calls is None


async def test_prose_where_a_call_is_required_is_nudged_once(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [
            Script.from_tokens(["I think it is sunny."]),
            native_call("get_weather", {"city": "Paris"}),
        ]
    )
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], tool_choice="required"
    )
    assert done.choices[0].message.tool_calls is not None
    assert (done.model_extra or {})["toolforge"]["guardrails"] == {"nudge": 1}
    retry = sent(gw, 1)["messages"]
    assert retry[-2] == {"role": "assistant", "content": "I think it is sunny."}
    assert retry[-1]["role"] == "user" and "get_weather" in retry[-1]["content"]
    assert [t["function"]["name"] for t in sent(gw, 0)["tools"]] == ["get_weather"]


async def test_the_nudge_switched_off_returns_the_prose(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["I think it is sunny."])])
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        tool_choice="required",
        extra_body={"toolforge": {"guardrails": {"nudge": False}}},
    )
    assert done.choices[0].message.content == "I think it is sunny."
    assert gw.upstream is not None and len(gw.upstream.requests) == 1


async def test_only_one_nudge_then_the_reply_as_it_is(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["No."]), Script.from_tokens(["Still no."])])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], tool_choice="required"
    )
    assert done.choices[0].message.content == "Still no."
    assert gw.upstream is not None and len(gw.upstream.requests) == 2


async def test_an_unknown_tool_is_nudged(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            native_call("get_forecast", {"city": "Paris"}),
            native_call("get_weather", {"city": "Paris"}),
        ]
    )
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    calls = done.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    assert (done.model_extra or {})["toolforge"]["guardrails"] == {"unknown_tool": 1, "nudge": 1}
    nudge = sent(gw, 1)["messages"][-1]["content"]
    assert "get_forecast" in nudge and "get_weather" in nudge


async def test_bad_arguments_are_nudged(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            native_call("get_weather", {"town": "Paris"}),
            native_call("get_weather", {"city": "Paris"}),
        ]
    )
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    calls = done.choices[0].message.tool_calls or []
    assert orjson.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert (done.model_extra or {})["toolforge"]["guardrails"]["invalid_arguments"] == 1


async def test_respond_switched_off_lets_prose_through(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny."])])
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        extra_body={"toolforge": {"guardrails": {"respond": False}}},
    )
    assert done.choices[0].message.content == "Sunny."
    body = sent(gw)
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    assert body["tool_choice"] == "auto"


async def test_tool_choice_none_offers_nothing(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny."])])
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], tool_choice="none", stream=False
    )
    assert done.choices[0].message.content == "Sunny."
    assert "tools" not in sent(gw) or sent(gw)["tool_choice"] == "none"


async def test_a_named_tool_choice_is_forced(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([native_call("get_time", {"city": "Oslo"})])
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert [c.function.name for c in done.choices[0].message.tool_calls or []] == ["get_time"]
    assert sent(gw)["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}


# -- constrained (llama-server) -------------------------------------------------------------


async def test_on_llama_server_a_grammar_makes_the_call(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    reply = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    gw = await make_gateway(
        [Script.from_tokens([reply[:10], reply[10:]])], upstream_kind="llama_server"
    )
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    calls = done.choices[0].message.tool_calls or []
    assert [(c.function.name, orjson.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert (done.model_extra or {})["toolforge"] == {
        "stream_id": (done.model_extra or {})["toolforge"]["stream_id"],
        "mode": "constrained",
        "guardrails": {},
    }
    body = sent(gw)
    assert "tools" not in body  # the grammar and the system prompt are the contract
    # "Weather in Paris?" names get_weather: a call is due, respond is not in the grammar.
    assert '\\"get_weather\\"' in body["grammar"]
    assert '\\"respond\\"' not in body["grammar"]
    system = body["messages"][0]
    assert system["role"] == "system" and "get_weather" in system["content"]


async def test_a_message_that_names_no_function_keeps_respond(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    reply = '{"name": "respond", "arguments": {"content": "Hello!"}}'
    gw = await make_gateway([Script.from_tokens([reply])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi, who are you?"}], tools=[WEATHER]
    )
    assert done.choices[0].message.content == "Hello!"
    grammar = parse(sent(gw)["grammar"])
    assert grammar.accepts(reply)
    assert grammar.accepts('{"name": "get_weather", "arguments": {"city": "Hi"}}')


async def test_a_message_that_names_a_function_is_answered_by_a_call(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    gw = await make_gateway([Script.from_tokens([call])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Wie ist das Wetter in Paris? The weather, please."}],
        tools=[WEATHER, TIME],
    )
    assert [c.function.name for c in done.choices[0].message.tool_calls or []] == ["get_weather"]
    grammar = parse(sent(gw)["grammar"])
    assert grammar.accepts(call)
    assert not grammar.accepts('{"name": "respond", "arguments": {"content": "Sunny."}}')
    # get_time is offered still: the guard takes respond away, not the other functions.
    assert grammar.accepts('{"name": "get_time", "arguments": {"city": "Paris"}}')


async def test_a_retry_of_a_named_function_is_still_a_call(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    # The nudge after a bad call is the user's message too: the retry's grammar has no
    # respond either (one grammar serves every turn of a request without server tools).
    bad = '{"name": "get_weather", "arguments": {"city": 7}}'
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    gw = await make_gateway(
        [Script.from_tokens([bad]), Script.from_tokens([call])], upstream_kind="llama_server"
    )
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    assert [c.function.name for c in done.choices[0].message.tool_calls or []] == ["get_weather"]
    answer = '{"name": "respond", "arguments": {"content": "Sunny."}}'
    for turn in (0, 1):
        assert not parse(sent(gw, turn)["grammar"]).accepts(answer)
    assert sent(gw, 1)["messages"][-1]["role"] == "user"  # the nudge


async def test_the_relevance_guard_can_be_switched_off(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    reply = '{"name": "respond", "arguments": {"content": "Sunny."}}'
    gw = await make_gateway([Script.from_tokens([reply])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        extra_body={"toolforge": {"guardrails": {"relevance": False}}},
    )
    assert done.choices[0].message.content == "Sunny."
    assert parse(sent(gw)["grammar"]).accepts(reply)


async def test_after_a_server_tool_the_answer_is_possible_again(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    search = '{"name": "places.search", "arguments": {"query": "pizza"}}'
    answer = '{"name": "respond", "arguments": {"content": "Two pizzerias are open."}}'
    gw = await make_gateway(
        [Script.from_tokens([search]), Script.from_tokens([answer])], upstream_kind="llama_server"
    )
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Search pizza restaurants near me"}],
        extra_body={"toolforge": {"server_tools": ["places.search"]}},
    )
    assert done.choices[0].message.content == "Two pizzerias are open."
    first, second = parse(sent(gw, 0)["grammar"]), parse(sent(gw, 1)["grammar"])
    assert first.accepts(search) and not first.accepts(answer)  # the user named the search
    assert second.accepts(answer)  # the last message is the tool's result: respond is back
    assert sent(gw, 1)["messages"][-1]["role"] == "tool"


async def test_a_call_the_grammar_let_the_model_repeat_is_made_once(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    paris = {"name": "get_weather", "arguments": {"city": "Paris"}}
    rome = {"name": "get_weather", "arguments": {"city": "Rome"}}
    reply = orjson.dumps([paris, rome, paris, {**paris, "arguments": {"city": "Paris"}}])
    gw = await make_gateway([Script.from_tokens([reply.decode()])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
        tools=[WEATHER],
    )
    calls = done.choices[0].message.tool_calls or []
    assert [orjson.loads(c.function.arguments) for c in calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    assert len({c.id for c in calls}) == 2
    assert (done.model_extra or {})["toolforge"]["guardrails"] == {"repeated_call": 2}


async def test_a_repeated_call_cut_by_max_tokens_is_rescued_once(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    paris = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    cut = f"[{paris}, {paris}, {paris}, " + '{"name": "get_wea'  # the list never closes
    gw = await make_gateway([Script.from_tokens([cut])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER]
    )
    calls = done.choices[0].message.tool_calls or []
    assert [orjson.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}]
    assert (done.model_extra or {})["toolforge"]["guardrails"] == {
        "rescued": 1,
        "repeated_call": 2,
    }


async def test_an_answer_written_beside_a_call_is_set_aside_and_reported_so(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    answer = {"name": "respond", "arguments": {"content": "It is sunny."}}
    paris = {"name": "get_weather", "arguments": {"city": "Paris"}}
    reply = orjson.dumps([answer, paris]).decode()
    gw = await make_gateway([Script.from_tokens([reply])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    message = done.choices[0].message
    assert [orjson.loads(c.function.arguments) for c in message.tool_calls or []] == [
        {"city": "Paris"}
    ]
    assert not message.content  # the calls are the turn
    assert (done.model_extra or {})["toolforge"]["guardrails"] == {"respond_set_aside": 1}


async def test_on_llama_server_respond_is_the_answer(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    reply = '{"name": "respond", "arguments": {"content": "Sunny in Paris."}}'
    gw = await make_gateway([Script.from_tokens([reply])], upstream_kind="llama_server")
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], stream=True
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Sunny in Paris."
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_the_grammar_can_be_switched_off(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny."])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        extra_body={"toolforge": {"guardrails": {"grammar": False, "respond": False}}},
    )
    assert done.choices[0].message.content == "Sunny."
    body = sent(gw)
    assert "grammar" not in body and body["tools"][0]["function"]["name"] == "get_weather"


async def test_on_llama_server_respond_off_leaves_prose_possible(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["Paris."])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER],
        extra_body={"toolforge": {"guardrails": {"respond": False}}},
    )
    assert done.choices[0].message.content == "Paris."
    body = sent(gw)
    assert "grammar" not in body  # no grammar forces a call under tool_choice auto
    assert "get_weather" in body["messages"][0]["content"]


# -- JSON answers ---------------------------------------------------------------------------

ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "weather",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}


async def test_a_json_schema_answer_is_valid(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(['{"city": "Paris", ', '"celsius": 21}'])])
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, response_format=ANSWER, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert orjson.loads(text) == {"city": "Paris", "celsius": 21}
    assert sent(gw)["response_format"]["json_schema"]["name"] == "weather"


async def test_a_broken_json_answer_is_repaired(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            Script.from_tokens(['{"city": "Paris", "celsius": "warm"}']),
            Script.from_tokens(['{"city": "Paris", "celsius": 20}']),
        ]
    )
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, response_format=ANSWER)
    assert orjson.loads(done.choices[0].message.content or "") == {"city": "Paris", "celsius": 20}
    extension = (done.model_extra or {})["toolforge"]
    assert extension["repaired"] is True and extension["degraded"] is False


async def test_an_unrepairable_answer_is_degraded_but_valid(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["no idea"]), Script.from_tokens(["still none"])])
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, response_format=ANSWER)
    value = orjson.loads(done.choices[0].message.content or "")
    assert set(value) == {"city", "celsius"}
    assert isinstance(value["city"], str) and isinstance(value["celsius"], int)
    extension = (done.model_extra or {})["toolforge"]
    assert extension["degraded"] is True and extension["diagnostics"]


async def test_the_json_guarantee_switched_off(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script.from_tokens(["no idea"])])
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        response_format=ANSWER,
        extra_body={"toolforge": {"guardrails": {"json": False}}},
    )
    assert done.choices[0].message.content == "no idea"


async def test_json_object_on_llama_server_is_a_grammar(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(['{"a": 1}'])], upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, response_format={"type": "json_object"}
    )
    assert orjson.loads(done.choices[0].message.content or "") == {"a": 1}
    assert sent(gw)["grammar"]


# -- server tools (the extension) -----------------------------------------------------------


async def test_server_tools_run_in_the_loop(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            native_call("places__search", {"query": "pizza", "radius_km": 2}),
            native_call("respond", {"content": "Two pizzerias are open."}),
        ]
    )
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Pizza near me?"}],
        extra_body={"toolforge": {"server_tools": ["places.search"]}},
    )
    assert done.choices[0].message.content == "Two pizzerias are open."
    trace = (done.model_extra or {})["toolforge"]["server_tools"]
    assert trace[0]["name"] == "places.search" and trace[0]["ok"] is True
    second = sent(gw, 1)["messages"]
    assert second[-1]["role"] == "tool" and second[-2]["tool_calls"][0]["function"]["name"] == (
        "places__search"
    )


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"n": 2}, "n=2"),
        ({"logprobs": True}, "logprobs"),
        ({"frobnicate": 1}, "unknown parameter 'frobnicate'"),
        ({"tool_choice": "required"}, "needs 'tools'"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"extra_body": {"toolforge": {"server_tools": ["nope"]}}}, "nope"),
        (
            {"extra_body": {"toolforge": {"workflow": "book_a_table", "server_tools": ["x"]}}},
            "not with 'toolforge.workflow'",
        ),
    ],
)
async def test_bad_requests_raise_bad_request(
    make_gateway: HarnessFactory, sdk: SDK, extra: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    body = dict(extra)
    extra_body = body.pop("extra_body", None)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).chat.completions.create(
            model="m", messages=USER, extra_body={**body, **(extra_body or {})}
        )
    assert needle in caught.value.message
    assert caught.value.status_code == 400
    assert gw.upstream is not None and gw.upstream.requests == []


async def test_a_dead_upstream_raises_an_api_error(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([Script(end="status", status=500, body='{"error": "boom"}')])
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk(gw).chat.completions.create(model="m", messages=USER)
    assert caught.value.status_code == 502
    assert "UPSTREAM" in str(caught.value.code)


LLAMA_OVER_CONTEXT: Final = (
    '{"error": {"code": 400, "message": "the request exceeds the available context size, '
    'try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 9137, '
    '"n_ctx": 4096}}'
)


async def test_a_prompt_over_the_context_raises_bad_request_with_the_numbers(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    """llama-server's 400 for a prompt over the model's context is the request's to
    shorten: a 400 with OpenAI's type, not a 502 that blames the upstream; never retried.
    Streamed, the stream has started: the same code comes as the stream's error."""
    over = Script(end="status", status=400, body=LLAMA_OVER_CONTEXT)
    gw = await make_gateway([over] * 4)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).chat.completions.create(model="m", messages=USER)
    assert caught.value.status_code == 400
    assert caught.value.code == "CONTEXT_LENGTH_EXCEEDED"
    assert "9137 tokens" in caught.value.message and "4096" in caught.value.message
    assert gw.upstream is not None and len(gw.upstream.requests) == 1  # not retried
    with pytest.raises(openai.APIError) as streamed:
        async for _ in await sdk(gw).chat.completions.create(model="m", messages=USER, stream=True):
            pass
    assert (streamed.value.body or {}).get("code") == "CONTEXT_LENGTH_EXCEEDED"
    assert "9137 tokens" in streamed.value.message
    assert len(gw.upstream.requests) == 2


async def test_an_error_after_the_headers_raises_in_the_stream(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"], finish=None, end="rst")])
    stream = await sdk(gw).chat.completions.create(model="m", messages=USER, stream=True)
    seen: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            if chunk.choices:
                seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "Hello"
    assert "UPSTREAM" in str((caught.value.body or {}).get("code"))


async def test_the_fast_path_answers_in_openai_shape(
    make_gateway: HarnessFactory, sdk: SDK, monkeypatch: pytest.MonkeyPatch
) -> None:
    """POST /v1/chat/completions is served past FastAPI (app/api/fastpath.py): a body over
    MAX_BODY_BYTES, and a bug of ours before the stream, still come back as OpenAI errors."""
    gw = await make_gateway(max_body_bytes=2048)
    client = sdk(gw)
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 4096}]
        )
    assert raised.value.status_code == 413 and raised.value.code == "BODY_TOO_LARGE"

    async def broken(*args: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr("toolforge.api.fastpath.complete", broken)
    with pytest.raises(openai.InternalServerError) as failed:
        await client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert failed.value.code == "INTERNAL"
    assert failed.value.body == {  # type: ignore[comparison-overlap]
        "message": "internal error before the stream began",
        "type": "server_error",
        "param": None,
        "code": "INTERNAL",
    }
    assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200  # still serving


AREA = {
    "type": "function",
    "function": {
        "name": "triangle_area",
        "description": "The area of a triangle.",
        "parameters": {
            "type": "object",
            "properties": {
                "base": {"type": "integer"},
                "height": {"type": "integer"},
                "unit": {"type": "string"},
                "precision": {"type": "integer"},
            },
            "required": ["base", "height"],
        },
    },
}


async def test_provenance_holds_the_numbers_to_what_the_user_wrote(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    ask = [{"role": "user", "content": "Area of a triangle with base 10 and height 5?"}]
    reply = '{"name": "triangle_area", "arguments": {"base": 10, "height": 5}}'
    gw = await make_gateway([Script.from_tokens([reply])] * 2, upstream_kind="llama_server")
    done = await sdk(gw).chat.completions.create(model="m", messages=ask, tools=[AREA])
    assert (done.choices[0].message.tool_calls or [])[0].function.name == "triangle_area"
    grammar = parse(sent(gw)["grammar"])

    def call(args: str) -> str:
        return f'{{"name": "triangle_area", "arguments": {args}}}'

    assert grammar.accepts(call('{"base": 10, "height": 5}'))
    assert grammar.accepts(call('{"base": 5, "height": 10, "unit": "triangle"}'))
    assert not grammar.accepts(call('{"base": 10, "height": 5, "unit": "cm"}'))  # made up
    assert not grammar.accepts(call('{"base": 12, "height": 5}'))  # nobody wrote 12
    assert not grammar.accepts(call('{"base": 10, "height": 5, "precision": 3}'))
    assert not grammar.accepts(call('{"base": 10, "height": 5, "precision": 10}'))  # optional
    # Switched off, the function's own schema: any integer.
    await sdk(gw).chat.completions.create(
        model="m",
        messages=ask,
        tools=[AREA],
        extra_body={"toolforge": {"guardrails": {"provenance": False}}},
    )
    assert parse(sent(gw)["grammar"]).accepts(call('{"base": 12, "height": 5}'))
