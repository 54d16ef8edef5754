"""Constrained mode (docs/protocol.md): sentinel mode plus a GBNF grammar in every upstream
request; available only where the upstream takes grammars (llama-server)."""

from __future__ import annotations

from typing import Any

import orjson

from tests.api.conftest import HarnessFactory, assert_well_formed, frames, sentinel_reply
from tests.core.gbnf_matcher import parse
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script


def props(*, tool_calls: bool) -> Script:
    body = {"chat_template_caps": {"supports_tool_calls": tool_calls}, "total_slots": 1}
    return Script(end="status", status=200, body=orjson.dumps(body).decode())


def places_call(call_id: str = "t1", query: str = "pizza") -> str:
    body = orjson.dumps({"query": query}).decode()
    return "Looking. " + sentinels.frame(FrameKind.TOOL_CALL, call_id, "places.search", body)


def named(events: list[Any], event: str) -> list[dict[str, Any]]:
    return [e.data for e in frames(events) if e.event == event]


async def test_each_turn_carries_the_grammar_of_its_ids(make_gateway: HarnessFactory) -> None:
    turns = [places_call("t1"), places_call("t2", "sushi"), sentinel_reply()]
    gw = await make_gateway([Script.from_tokens([t]) for t in turns], upstream_kind="llama_server")
    events = await gw.stream({"input": "pizza?", "mode": "constrained"})
    assert_well_formed(events)
    assert frames(events)[0].data["mode"] == "constrained"
    assert [c["id"] for c in named(events, "tool.call")] == ["t1", "t2"]
    assert named(events, "result.end")[0]["value"] == {"answer": "Two places are open."}
    grammars = [r.json["grammar"] for r in gw.upstream.requests]
    assert len(grammars) == 3
    for grammar, turn, call_id in zip(grammars, turns, ("t1", "t2", "t3"), strict=True):
        assert f"id={call_id} name=places.search" in grammar  # ids advance with the calls
        assert parse(grammar).accepts(turn)  # what the model wrote is what it was allowed
    assert not parse(grammars[1]).accepts(places_call("t1"))  # a used id is not offered
    # everything else is sentinel mode: the same prompt, no native tools
    first = gw.upstream.requests[0].json
    assert "tools" not in first and "BEGIN_TOOL_CALL" in first["messages"][0]["content"]


async def test_usage_adds_up_over_turns_the_grammar_ended(make_gateway: HarnessFactory) -> None:
    # The grammar ends the generation at the call's END, so that turn's usage chunk
    # follows at once and is read (unlike sentinel mode, tests/api/test_tools.py).
    scripts = [
        Script.from_tokens(
            [places_call("t1")], usage={"prompt_tokens": 40, "completion_tokens": 30}
        ),
        Script.from_tokens(
            [sentinel_reply()], usage={"prompt_tokens": 90, "completion_tokens": 12}
        ),
    ]
    gw = await make_gateway(scripts, upstream_kind="llama_server")
    events = await gw.stream({"input": "pizza?", "mode": "constrained", "max_tool_calls": 1})
    assert_well_formed(events)
    (done,) = named(events, "done")
    assert done["usage"] == {"prompt_tokens": 130, "completion_tokens": 42}


async def test_no_tool_call_once_max_tool_calls_are_spent(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [Script.from_tokens([places_call("t1")]), Script.from_tokens([sentinel_reply()])],
        upstream_kind="llama_server",
    )
    events = await gw.stream({"input": "x", "mode": "constrained", "max_tool_calls": 1})
    assert named(events, "result.end")
    first, second = (r.json["grammar"] for r in gw.upstream.requests)
    assert "BEGIN_TOOL_CALL" in first and "BEGIN_TOOL_CALL" not in second


async def test_object_schemas_and_the_result_schema_shape_the_grammar(
    make_gateway: HarnessFactory,
) -> None:
    action = '{"mode":"search","target":{"kind":"place","id":"p1"}}'
    obj = sentinels.frame(FrameKind.OBJECT, "o1", "Action", action)
    text = obj + sentinels.frame(FrameKind.RESULT, "r1", "Action", action)
    gw = await make_gateway([Script.from_tokens([text])], upstream_kind="llama_server")
    body = {
        "input": "x",
        "mode": "constrained",
        "tools": [],
        "result_schema": "Action",
        "object_schemas": ["Action"],
    }
    events = await gw.stream(body)
    assert named(events, "json.end")[0]["value"]["mode"] == "search"
    (request,) = gw.upstream.requests
    grammar = parse(request.json["grammar"])
    assert grammar.accepts(text)
    assert not grammar.accepts(text.replace('"search"', '"fly"'))
    assert "TOOL_CALL" not in request.json["grammar"]  # no tools offered, none in the grammar


async def test_the_repair_call_carries_a_json_grammar(make_gateway: HarnessFactory) -> None:
    bad = sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", '{"answer": 5}')
    gw = await make_gateway(
        [Script.from_tokens([bad]), Script.from_tokens(['{"answer": "five"}'])],
        upstream_kind="llama_server",
    )
    events = await gw.stream({"input": "x", "mode": "constrained"})
    (end,) = named(events, "result.end")
    assert end["value"] == {"answer": "five"} and end["repaired"] is True
    turn, repair = (r.json for r in gw.upstream.requests)
    grammar = parse(repair["grammar"])
    assert "BEGIN" not in repair["grammar"]
    # The "{" the grammar forces goes as the start of the reply (the llama-server adapter's
    # prefill), the grammar holds the rest.
    assert repair["messages"][-1] == {"role": "assistant", "content": "{"}
    assert grammar.accepts('"answer": "five"}')
    assert not grammar.accepts('"answer": 5}')
    assert repair["grammar"] != turn["grammar"]


async def test_constrained_is_refused_where_the_upstream_takes_no_grammar(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens(["a"])])  # answers neither /props nor /api/show
    response = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "x", "mode": "constrained"}
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "MODE_UNAVAILABLE"
    assert "UPSTREAM_KIND=llama_server" in error["message"] and "sentinel" in error["message"]
    assert gw.upstream.requests == []  # nothing was generated


async def test_constrained_is_allowed_when_the_probe_finds_a_llama_server(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply()])], routes={"/props": props(tool_calls=True)}
    )
    events = await gw.stream({"input": "x", "mode": "constrained"})
    assert frames(events)[0].data["mode"] == "constrained"
    assert "grammar" in gw.upstream.requests[0].json


async def test_auto_picks_constrained_for_a_llama_server_without_tool_calls(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply()])], routes={"/props": props(tool_calls=False)}
    )
    events = await gw.stream({"input": "x"})
    assert frames(events)[0].data["mode"] == "constrained"
    request = gw.upstream.requests[0].json
    assert "grammar" in request and "tools" not in request
    await gw.settle()
    run = gw.artifacts / "runs" / frames(events)[0].data["stream_id"]
    prompt = orjson.loads((run / "prompt.json").read_bytes())
    assert prompt["mode"] == "constrained"
    assert "GBNF grammars" in prompt["mode_reason"]


async def test_auto_trusts_upstream_kind_when_props_is_silent(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], upstream_kind="llama_server")
    events = await gw.stream({"input": "x"})
    assert frames(events)[0].data["mode"] == "constrained"
    assert "grammar" in gw.upstream.requests[0].json


async def test_other_modes_send_no_grammar(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], upstream_kind="llama_server")
    await gw.stream({"input": "x", "mode": "sentinel"})
    assert "grammar" not in gw.upstream.requests[0].json


async def test_the_grammar_fits_the_turn_budget(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], upstream_kind="llama_server")
    await gw.stream({"input": "x", "mode": "constrained", "profile": "demo"})
    grammar = parse(gw.upstream.requests[0].json["grammar"])
    # demo: max_tokens 384, so a string the schema leaves open takes up to 96 characters
    assert grammar.accepts(sentinel_reply("0" * 96))
    assert not grammar.accepts(sentinel_reply("0" * 97))
