"""Native mode: the upstream's own tool_calls, assembled by index, executed, continued
with tool messages; the client sees the same frames as in sentinel mode."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.api.conftest import HarnessFactory, assert_well_formed, frames, sentinel_reply
from toolforge.eval.scripted_upstream import Script, Step


def chunk(delta: dict[str, Any], finish: str | None = None) -> Step:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return Step(raw="data: " + orjson.dumps(body).decode() + "\n\n")


def vllm_style_call(call_id: str, args: str) -> Script:
    """id and name first, then the arguments in fragments, under one index."""
    first = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": "places__search", "arguments": ""},
    }
    pieces = [args[i : i + 7] for i in range(0, len(args), 7)]
    steps = [chunk({"role": "assistant", "content": "Looking. "}), chunk({"tool_calls": [first]})]
    steps += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
    steps.append(chunk({}, finish="tool_calls"))
    return Script(steps=tuple(steps))


def named(events: list[Any], event: str) -> list[dict[str, Any]]:
    return [e.data for e in frames(events) if e.event == event]


async def test_native_tool_call_round_trip(make_gateway: HarnessFactory) -> None:
    args = '{"query": "pizza", "open_at": "19:00"}'
    gw = await make_gateway(
        [vllm_style_call("call_xyz", args), Script.from_tokens([sentinel_reply()])]
    )
    events = await gw.stream({"input": "pizza?", "mode": "native"})
    assert_well_formed(events)
    assert frames(events)[0].data["mode"] == "native"
    (call,) = named(events, "tool.call")
    assert call == {
        "id": "call_xyz",
        "name": "places.search",
        "args": {"query": "pizza", "open_at": "19:00"},
    }
    (result,) = named(events, "tool.result")
    assert result["ok"] is True and result["id"] == "call_xyz"
    assert named(events, "result.end")[0]["value"] == {"answer": "Two places are open."}
    first, second = (r.json for r in gw.upstream.requests)
    assert first["tools"][0]["function"]["name"] == "places__search"
    assert first["tool_choice"] == "auto"
    assistant, tool = second["messages"][-2:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Looking. "
    assert assistant["tool_calls"][0]["id"] == "call_xyz"
    assert assistant["tool_calls"][0]["function"] == {"name": "places__search", "arguments": args}
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_xyz"
    assert '"trattoria-roma"' in tool["content"]


async def test_native_calls_without_index_or_id(make_gateway: HarnessFactory) -> None:
    # Ollama's /v1 before 0.4.7: whole calls, no index, no id; two calls in one turn.
    calls = [
        {"function": {"name": "places__search", "arguments": '{"query": "sushi"}'}},
        {"function": {"name": "places__search", "arguments": '{"query": "tacos"}'}},
    ]
    turn = Script(steps=(chunk({"tool_calls": calls}), chunk({}, finish="tool_calls")))
    gw = await make_gateway([turn, Script.from_tokens([sentinel_reply()])])
    events = await gw.stream({"input": "x", "mode": "native"})
    assert_well_formed(events)
    tool_calls = named(events, "tool.call")
    assert [c["args"]["query"] for c in tool_calls] == ["sushi", "tacos"]
    assert len({c["id"] for c in tool_calls}) == 2  # ids given where the upstream had none
    assert [r["ok"] for r in named(events, "tool.result")] == [True, True]
    tools = [m for m in gw.upstream.requests[1].json["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == [c["id"] for c in tool_calls]


async def test_native_bad_arguments_go_back_as_invalid_json(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [vllm_style_call("c1", '{"query": "pizza",}'), Script.from_tokens([sentinel_reply()])]
    )
    events = await gw.stream({"input": "x", "mode": "native"})
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["error"]["code"] == "INVALID_JSON"
    assert named(events, "tool.call") == []


async def test_auto_picks_native_when_llama_server_says_so(make_gateway: HarnessFactory) -> None:
    props = {"chat_template_caps": {"supports_tools": True, "supports_tool_calls": True}}
    gw = await make_gateway(
        [Script.from_tokens(["a"]), Script.from_tokens(["b"])],
        routes={"/props": Script(end="status", status=200, body=orjson.dumps(props).decode())},
    )
    first = await gw.stream({"input": "x"})
    await gw.stream({"input": "y"})
    assert frames(first)[0].data["mode"] == "native"
    assert "tools" in gw.upstream.requests[-1].json  # the request carried native tools
    probes = [r for r in gw.upstream.all_requests if r.path == "/props"]
    assert len(probes) == 1  # probed once, then cached
    await gw.settle()
    run = gw.artifacts / "runs" / frames(first)[0].data["stream_id"]
    prompt = orjson.loads((run / "prompt.json").read_bytes())
    assert prompt["mode_reason"] == "llama-server /props: the chat template does tool calls"


async def test_auto_picks_sentinel_for_ollama_without_tools(make_gateway: HarnessFactory) -> None:
    show = {"capabilities": ["completion"]}
    gw = await make_gateway(
        [Script.from_tokens(["a"])],
        routes={"/api/show": Script(end="status", status=200, body=orjson.dumps(show).decode())},
    )
    events = await gw.stream({"input": "x", "model": "smollm2"})
    assert frames(events)[0].data["mode"] == "sentinel"
    (probe,) = [r for r in gw.upstream.all_requests if r.path == "/api/show"]
    assert probe.json == {"model": "smollm2"}
    assert "tools" not in gw.upstream.requests[-1].json


async def test_auto_falls_back_to_sentinel_when_nothing_answers(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens(["a"])])
    events = await gw.stream({"input": "x"})
    assert frames(events)[0].data["mode"] == "sentinel"


async def test_concurrent_first_requests_share_one_probe(make_gateway: HarnessFactory) -> None:
    props = {"chat_template_caps": {"supports_tool_calls": False}}
    gw = await make_gateway(
        [Script.from_tokens(["a"]) for _ in range(8)],
        routes={"/props": Script(end="status", status=200, body=orjson.dumps(props).decode())},
    )
    results = await asyncio.gather(*(gw.stream({"input": "x"}) for _ in range(8)))
    assert all(frames(r)[0].data["mode"] == "constrained" for r in results)
    assert len([r for r in gw.upstream.all_requests if r.path == "/props"]) == 1


async def test_native_is_refused_where_the_template_renders_no_tools(
    make_gateway: HarnessFactory,
) -> None:
    # SmolLM2's and Gemma 3's templates: llama-server drops the request's tools, so the model
    # would be asked for calls it is never shown, turn after turn.
    props = {"chat_template_caps": {"supports_tools": False, "supports_tool_calls": False}}
    gw = await make_gateway(
        [Script.from_tokens(["a"])],
        routes={"/props": Script(end="status", status=200, body=orjson.dumps(props).decode())},
    )
    response = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "x", "mode": "native"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "MODE_UNAVAILABLE"
    assert "renders tools" in error["message"] and "'constrained'" in error["message"]
    assert gw.upstream.requests == []  # nothing was generated
    # auto on the same upstream still runs, with the grammar
    events = await gw.stream({"input": "y"})
    assert frames(events)[0].data["mode"] == "constrained"


async def test_native_is_refused_for_an_ollama_model_without_tools(
    make_gateway: HarnessFactory,
) -> None:
    show = {"capabilities": ["completion"]}
    gw = await make_gateway(
        [Script.from_tokens(["a"])],
        routes={"/api/show": Script(end="status", status=200, body=orjson.dumps(show).decode())},
    )
    response = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "x", "mode": "native", "model": "smollm2"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "MODE_UNAVAILABLE"
    assert "'sentinel'" in response.json()["error"]["message"]


async def test_native_runs_where_the_template_does_tool_calls(
    make_gateway: HarnessFactory,
) -> None:
    props = {"chat_template_caps": {"supports_tools": True, "supports_tool_calls": True}}
    gw = await make_gateway(
        [Script.from_tokens(["a"])],
        routes={"/props": Script(end="status", status=200, body=orjson.dumps(props).decode())},
    )
    events = await gw.stream({"input": "x", "mode": "native"})
    assert_well_formed(events)
    assert frames(events)[0].data["mode"] == "native"
