"""The proxy's mode (``CompletionMode``) in the turn engine, with no event loop: scripted
model turns in, the actions and frames out. One table per guardrail, each on and off."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.core.test_engine import Script, deltas, drive
from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.engine import CallModel, Conversation, ConversationConfig
from toolforge.core.engine.completion import CompletionMode, Guards
from toolforge.core.native_tools import ToolCallDelta
from toolforge.core.schemas import compile_schema

WEATHER = compile_schema(
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    name="get_weather",
)
ANSWER = compile_schema(
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, name="answer"
)


def mode(**fields: Any) -> CompletionMode:
    fields.setdefault("name", "native")
    fields.setdefault("tools", {"get_weather": WEATHER})
    return CompletionMode(**fields)


def run_of(
    m: CompletionMode, *turns: list[UpstreamDelta], client: bool = True, **config: Any
) -> Any:
    answer = {"answer": m.answer} if m.answer is not None else {}
    conversation = Conversation(
        ConversationConfig(
            stream_id="s_1",
            request=ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}]),
            mode=m,
            schemas=answer,
            result_schema="answer" if answer else None,
            registered=answer,
            client_tools=frozenset(m.tools) if client else frozenset(),
            repair_template="fix: $text ($errors)",
            **config,
        )
    )
    return drive(conversation, Script(list(turns), repairs=[None, None]))


def native(name: str, args: str) -> list[UpstreamDelta]:
    piece = ToolCallDelta(index=0, id="up1", name=name, arguments=args)
    return [UpstreamDelta("", tool_calls=(piece,)), UpstreamDelta("", finish_reason="tool_calls")]


def calls(run: Any) -> list[tuple[str, Any, str | None]]:
    return [
        (f.data["name"], f.data["args"], f.data.get("executor"))
        for f in run.frames
        if f.event == "tool.call"
    ]


def test_text_without_tools_streams_as_it_comes() -> None:
    run = run_of(mode(tools={}), deltas("Hel", "lo"))
    assert run.events == ["stream.begin", "text.delta", "text.delta"]
    assert run.finish.reason == "stop"


def test_with_tools_the_text_is_held_until_the_turn_ends() -> None:
    run = run_of(mode(guards=Guards(respond=False)), deltas("Sun", "ny"))
    assert run.events == ["stream.begin", "text.delta"]
    assert run.text() == "Sunny"


def test_a_native_call_to_a_client_tool_ends_the_conversation() -> None:
    run = run_of(mode(), native("get_weather", '{"city": "Oslo"}'))
    assert calls(run) == [("get_weather", {"city": "Oslo"}, "client")]
    assert run.finish.reason == "tool_calls"
    assert len(run.kinds(CallModel)) == 1


@pytest.mark.parametrize("rescue", [True, False])
def test_rescue_on_and_off(rescue: bool) -> None:
    text = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
    m = mode(guards=Guards(rescue=rescue, respond=False))
    run = run_of(m, deltas(text[:9], text[9:]))
    if rescue:
        assert calls(run) == [("get_weather", {"city": "Oslo"}, "client")]
        assert [f.data.get("rescued") for f in run.frames if f.event == "tool.call"] == [True]
        assert run.text() == ""
    else:
        assert calls(run) == [] and run.text() == text


@pytest.mark.parametrize("nudge", [True, False])
def test_the_required_nudge_on_and_off(nudge: bool) -> None:
    m = mode(choice="required", guards=Guards(nudge=nudge))
    run = run_of(m, deltas("prose"), native("get_weather", '{"city": "Oslo"}'))
    if nudge:
        asks = run.kinds(CallModel)
        assert len(asks) == 2
        assert asks[1].request.messages[-1]["role"] == "user"
        assert "get_weather" in asks[1].request.messages[-1]["content"]
        assert calls(run) == [("get_weather", {"city": "Oslo"}, "client")]
    else:
        assert len(run.kinds(CallModel)) == 1 and run.text() == "prose"


def test_an_unknown_tool_is_nudged_and_the_nudge_is_spent_once() -> None:
    m = mode(guards=Guards(respond=False))
    run = run_of(m, native("get_time", "{}"), native("get_time", "{}"))
    assert len(run.kinds(CallModel)) == 2
    assert calls(run) == []  # no nudge left: the reply stands, with no call in it
    done_notes = run_of(m, native("get_time", "{}"), native("get_weather", '{"city":"x"}'))
    assert calls(done_notes) == [("get_weather", {"city": "x"}, "client")]


def test_invalid_arguments_are_nudged() -> None:
    run = run_of(
        mode(), native("get_weather", '{"town": 1}'), native("get_weather", '{"city":"x"}')
    )
    assert len(run.kinds(CallModel)) == 2
    assert "city" in run.kinds(CallModel)[1].request.messages[-1]["content"]


@pytest.mark.parametrize("respond", [True, False])
def test_respond_on_and_off(respond: bool) -> None:
    m = mode(guards=Guards(respond=respond))
    run = run_of(m, native("respond", '{"content": "Hi there"}'), deltas("plain"))
    if respond:
        assert run.text() == "Hi there" and calls(run) == [] and run.finish.reason == "stop"
    else:  # respond is no known tool then: nudged, then the plain answer
        assert run.text() == "plain"


def test_the_json_answer_is_decided_by_the_guarantee() -> None:
    good = run_of(mode(tools={}, answer=ANSWER), deltas('{"n": ', "3}"))
    ends = [f.data for f in good.frames if f.event == "result.end"]
    assert ends and ends[0]["value"] == {"n": 3} and ends[0]["repaired"] is False
    bad = run_of(mode(tools={}, answer=ANSWER), deltas("no"))
    ends = [f.data for f in bad.frames if f.event == "result.end"]
    assert ends[0]["degraded"] is True and isinstance(ends[0]["value"]["n"], int)


def test_the_grammar_call_is_read_in_constrained_mode() -> None:
    a, b = ({"name": "get_weather", "arguments": {"city": c}} for c in "AB")
    reply = orjson.dumps([a, b]).decode()
    run = run_of(mode(name="constrained", extra={"grammar": "root ::= x"}), deltas(reply))
    assert [c[0] for c in calls(run)] == ["get_weather", "get_weather"]
    assert run.kinds(CallModel)[0].request.extra["grammar"] == "root ::= x"
    # the same call repeated in the list is made once
    reply = orjson.dumps([a, a, b, a]).decode()
    run = run_of(mode(name="constrained", extra={"grammar": "root ::= x"}), deltas(reply))
    assert len(calls(run)) == 2


def test_reasoning_goes_to_its_own_frames() -> None:
    run = run_of(mode(tools={}), deltas("<think>hm", "m</think>", "Yes"))
    assert run.text("reasoning.delta") == "hmm" and run.text() == "Yes"
    off = run_of(mode(tools={}, guards=Guards(reasoning=False)), deltas("<think>a</think>b"))
    assert off.text() == "<think>a</think>b"


def test_server_tools_run_and_the_conversation_goes_on() -> None:
    m = mode(tools={"places.search": WEATHER})
    run = run_of(
        m,
        native("places__search", '{"city": "Oslo"}'),
        native("respond", '{"content": "done"}'),
        client=False,
    )
    assert calls(run) == [("places.search", {"city": "Oslo"}, None)]
    second = run.kinds(CallModel)[1].request.messages
    assert second[-2]["tool_calls"][0]["function"]["name"] == "places__search"
    assert second[-1]["role"] == "tool"
    assert run.text() == "done"
