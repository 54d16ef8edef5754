"""Workflows over HTTP (docs/workflows.md): a scripted model drives each path of the runner through
a real gateway on loopback. The runner's rules live outside the message history: a refused
call is answered in-stream with a ``tool.result`` error and a ``step.nudge``; every
failure ends with ``error`` (its code) then ``done`` carrying ``workflow``."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from httpx_sse import aconnect_sse

from tests.api.conftest import HarnessFactory, assert_well_formed
from toolforge.core.context import MESSAGE_OVERHEAD_TOKENS, chars_per_token, count_text
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script, Step

SEARCH = '{"query": "italian"}'
BOOK = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
BOOK_MADE_UP = '{"place_id": "7", "time": "20:00", "party_size": 2}'


def chunk(delta: dict[str, Any], finish: str | None = None) -> Step:
    data = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return Step(raw="data: " + orjson.dumps(data).decode() + "\n\n")


def call(frame_id: str, name: str, args: str, before: str = "") -> Script:
    return Script.from_tokens([before, sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])


def text(reply: str) -> Script:
    return Script.from_tokens([reply])


def of(events: list[Event], name: str) -> list[dict[str, Any]]:
    return [e.data for e in events if e.event == name]


def kinds(events: list[Event]) -> list[str]:
    return [e.event for e in events if e.event not in ("ping", "text.delta")]


BODY: dict[str, Any] = {"input": "Book a table for 2 at an italian place at 19:30."}


def body(workflow: object = "book_a_table", **extra: Any) -> dict[str, Any]:
    return {**BODY, "workflow": workflow, "mode": "sentinel", **extra}


async def test_the_booking_workflow_completes_and_its_result_is_the_booking(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [call("t1", "places.search", SEARCH), call("t2", "bookings.create", BOOK)]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    assert kinds(events) == [
        "stream.begin",
        "tool.call",
        "tool.result",
        "tool.call",
        "tool.result",
        "result.begin",
        "result.delta",
        "result.end",
        "done",
    ]
    end = of(events, "result.end")[0]
    assert end["value"]["place_id"] == "trattoria-roma"
    assert of(events, "result.begin")[0]["schema"] == "bookings.create"
    done = of(events, "done")[0]
    assert done["reason"] == "stop"
    assert done["workflow"] == {
        "name": "book_a_table",
        "completed_steps": ["places.search", "bookings.create"],
        "pending_steps": [],
        "iterations": 2,
        "nudges": 0,
        "rescued": 0,
        "finished": True,
    }
    metrics = await gw.metrics(of(events, "stream.begin")[0]["stream_id"])
    assert metrics["workflow"] == done["workflow"]
    # The model was told the workflow and shown only its tools.
    system = orjson.loads(gw.upstream.requests[0].body)["messages"][0]["content"]
    assert 'workflow "book_a_table"' in system and "bookings.create" in system


async def test_a_premature_terminal_call_escalates_tiers_1_2_3_then_exhausts(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([call(f"t{i}", "bookings.create", BOOK) for i in range(1, 5)])
    events = await gw.stream(body())
    assert_well_formed(events)
    nudges = of(events, "step.nudge")
    assert [(n["kind"], n["tier"], n["call_id"]) for n in nudges] == [
        ("step", 1, "t1"),
        ("step", 2, "t2"),
        ("step", 3, "t3"),
        ("step", 3, "t4"),
    ]
    assert len({n["message"] for n in nudges[:3]}) == 3  # each tier its own, firmer text
    assert "places.search" in nudges[0]["message"]
    results = of(events, "tool.result")
    assert [r["error"]["code"] for r in results] == ["STEP_REQUIRED"] * 4
    assert not of(events, "tool.call")  # a refused call never runs
    (error,) = of(events, "error")
    assert error["code"] == "STEP_ENFORCEMENT_EXHAUSTED"
    assert error["details"][0]["pending_steps"] == "places.search"
    assert error["details"][0]["iterations"] == "4"
    done = of(events, "done")[0]
    assert done["reason"] == "error"
    assert done["workflow"]["pending_steps"] == ["places.search"]
    assert done["workflow"]["iterations"] == 4
    # The nudge reached the model in the refused call's result (nothing restarted).
    second = orjson.loads(gw.upstream.requests[1].body)["messages"]
    assert nudges[0]["message"] in second[-1]["content"]
    assert len(gw.upstream.requests) == 4


async def test_an_argument_matched_prerequisite_is_refused_then_met(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            call("t2", "bookings.create", BOOK_MADE_UP),  # "7": not an id the search returned
            call("t3", "bookings.create", BOOK),
        ]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    (nudge,) = of(events, "step.nudge")
    assert nudge["kind"] == "prerequisite" and nudge["call_id"] == "t2"
    assert "trattoria-roma" in nudge["message"]  # the values it may use
    results = of(events, "tool.result")
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["error"]["code"] == "PREREQUISITE_MISSING"
    assert of(events, "done")[0]["reason"] == "stop"
    assert of(events, "result.end")[0]["value"]["place_id"] == "trattoria-roma"


async def test_prerequisite_violations_exhaust_after_two(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [call("t1", "places.search", SEARCH)]
        + [call(f"t{i}", "bookings.create", BOOK_MADE_UP) for i in range(2, 5)]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    assert [n["tier"] for n in of(events, "step.nudge")] == [1, 2, 3]
    (error,) = of(events, "error")
    assert error["code"] == "PREREQUISITE_EXHAUSTED"
    assert error["details"][0]["completed_steps"] == "places.search"


async def test_a_call_written_as_text_is_rescued(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            text('```json\n{"name": "places.search", "arguments": {"query": "italian"}}\n```'),
            text(
                'I will book it: bookings_create({"place_id": "trattoria-roma", '
                '"time": "20:00", "party_size": 2})'
            ),
        ]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    calls = of(events, "tool.call")
    assert [(c["name"], c["rescued"]) for c in calls] == [
        ("places.search", True),
        ("bookings.create", True),
    ]
    assert len({c["id"] for c in calls}) == 2
    done = of(events, "done")[0]
    assert done["reason"] == "stop"
    assert done["workflow"]["rescued"] == 2
    assert done["guardrails"]["rescued"] == 2


async def test_two_calls_in_one_text_rescue_the_first(make_gateway: HarnessFactory) -> None:
    both = (
        '[{"name": "places.search", "arguments": {"query": "italian"}}, '
        '{"name": "bookings.create", "arguments": {"place_id": "trattoria-roma", '
        '"time": "20:00", "party_size": 2}}]'
    )
    gw = await make_gateway([text(both), call("t2", "bookings.create", BOOK)])
    events = await gw.stream(body())
    assert_well_formed(events)
    assert [c["name"] for c in of(events, "tool.call")] == ["places.search", "bookings.create"]
    assert of(events, "done")[0]["reason"] == "stop"


async def test_a_rescued_call_in_native_mode(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            text('<tool_call>{"name": "places.search", "arguments": {"query": "x"}}</tool_call>'),
            text('places.search(query="italian")'),
            text('bookings.create(place_id="trattoria-roma", time="20:00", party_size=2)'),
        ]
    )
    events = await gw.stream(body(mode="native"))
    assert_well_formed(events)
    assert [c["rescued"] for c in of(events, "tool.call")] == [True, True, True]
    assert of(events, "done")[0]["reason"] == "stop"


async def test_a_turn_without_a_call_gets_a_retry_nudge_then_succeeds(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [
            text("Sure, I can help you with that."),
            call("t1", "places.search", SEARCH),
            call("t2", "bookings.create", BOOK),
        ]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    (nudge,) = of(events, "step.nudge")
    assert nudge == {
        "kind": "retry",
        "tier": 1,
        "message": nudge["message"],
        "call_id": None,
    }
    assert "places.search" in nudge["message"]
    second = orjson.loads(gw.upstream.requests[1].body)["messages"]
    assert second[-2] == {"role": "assistant", "content": "Sure, I can help you with that."}
    assert second[-1] == {"role": "user", "content": nudge["message"]}
    assert of(events, "done")[0]["reason"] == "stop"


async def test_retries_exhausted_names_the_last_text(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([text(f"I think about it ({i}).") for i in range(5)])
    events = await gw.stream(body())
    assert_well_formed(events)
    assert [n["tier"] for n in of(events, "step.nudge")] == [1, 2, 3]
    (error,) = of(events, "error")
    assert error["code"] == "RETRIES_EXHAUSTED"
    assert error["details"][0]["last_text"] == "I think about it (3)."
    assert len(gw.upstream.requests) == 4


async def test_an_unknown_tool_gets_a_nudge_naming_the_known_ones(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [
            call("t1", "weather.get", '{"city": "Rome"}'),
            call("t2", "places.search", SEARCH),
            call("t3", "bookings.create", BOOK),
        ]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    (nudge,) = of(events, "step.nudge")
    assert nudge["kind"] == "unknown_tool" and nudge["call_id"] == "t1"
    assert "weather.get" in nudge["message"]
    assert "places.search" in nudge["message"] and "bookings.create" in nudge["message"]
    assert of(events, "tool.result")[0]["error"]["code"] == "TOOL_NOT_FOUND"
    assert of(events, "done")[0]["reason"] == "stop"


async def test_a_tool_error_then_self_correction(make_gateway: HarnessFactory) -> None:
    closed = '{"place_id": "trattoria-roma", "time": "04:00", "party_size": 2}'
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            call("t2", "bookings.create", closed),  # the place is closed at 04:00
            call("t3", "bookings.create", BOOK),
        ]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    results = of(events, "tool.result")
    assert [r["ok"] for r in results] == [True, False, True]
    assert not of(events, "step.nudge")  # a tool error is the tool's answer, not a nudge
    assert of(events, "done")[0]["reason"] == "stop"


async def test_tool_errors_exhausted(make_gateway: HarnessFactory) -> None:
    closed = '{"place_id": "trattoria-roma", "time": "04:00", "party_size": 2}'
    gw = await make_gateway(
        [call("t1", "places.search", SEARCH)]
        + [call(f"t{i}", "bookings.create", closed) for i in range(2, 5)]
    )
    events = await gw.stream(body())
    assert_well_formed(events)
    assert [r["ok"] for r in of(events, "tool.result")] == [True, False, False, False]
    (error,) = of(events, "error")
    assert error["code"] == "TOOL_ERRORS_EXHAUSTED"
    assert of(events, "done")[0]["workflow"]["completed_steps"] == ["places.search"]


async def test_max_iterations(make_gateway: HarnessFactory) -> None:
    inline = {
        "name": "search_forever",
        "tools": ["places.search", "bookings.create"],
        "terminal_tools": ["bookings.create"],
        "max_iterations": 3,
    }
    gw = await make_gateway([call(f"t{i}", "places.search", SEARCH) for i in range(1, 5)])
    events = await gw.stream(body(inline))
    assert_well_formed(events)
    (error,) = of(events, "error")
    assert error["code"] == "MAX_ITERATIONS"
    assert of(events, "done")[0]["workflow"]["iterations"] == 3
    assert len(gw.upstream.requests) == 3


async def test_a_cancel_mid_workflow(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            Script.from_tokens(["Let me think", " about it"] * 50, delay_ms=50),
        ]
    )
    events: list[Event] = []
    async with aconnect_sse(gw.client, "POST", f"{gw.url}/v1/stream", json=body()) as source:
        stream_id = ""
        async for sse in source.aiter_sse():
            event = Event(sse.id, sse.event, orjson.loads(sse.data))
            events.append(event)
            if event.event == "stream.begin":
                stream_id = event.data["stream_id"]
            if event.event == "tool.result":
                await gw.upstream.wait_for_requests(2)
                await asyncio.sleep(0.1)
                response = await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/cancel")
                assert response.status_code == 200
    assert_well_formed(events)
    done = of(events, "done")[0]
    assert done["reason"] == "cancelled"
    assert done["workflow"]["completed_steps"] == ["places.search"]
    assert done["workflow"]["iterations"] == 2
    await gw.settle(upstream_closed=True)


async def test_multi_turn_messages_keep_the_workflow_rules(make_gateway: HarnessFactory) -> None:
    earlier = [
        {"role": "user", "content": "Find me an italian place."},
        {"role": "assistant", "content": "Trattoria Roma is open tonight."},
        {"role": "user", "content": "Book it for 2 at 19:30."},
    ]
    # Steps live outside the history: an earlier conversation does not complete them.
    gw = await make_gateway(
        [
            call("t1", "bookings.create", BOOK),
            call("t2", "places.search", SEARCH),
            call("t3", "bookings.create", BOOK),
        ]
    )
    events = await gw.stream({"messages": earlier, "workflow": "book_a_table", "mode": "sentinel"})
    assert_well_formed(events)
    assert [n["kind"] for n in of(events, "step.nudge")] == ["step"]
    sent = orjson.loads(gw.upstream.requests[0].body)["messages"]
    assert sent[1:] == earlier
    assert of(events, "done")[0]["reason"] == "stop"


async def test_respond_ends_a_conversational_workflow(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            call("t2", "respond", '{"content": "Trattoria Roma is the closest."}'),
        ]
    )
    events = await gw.stream(body("find_and_answer"))
    assert_well_formed(events)
    assert of(events, "result.end")[0]["value"] == {"content": "Trattoria Roma is the closest."}
    assert of(events, "done")[0]["reason"] == "stop"


async def test_native_mode_offers_respond_and_runs_the_workflow(
    make_gateway: HarnessFactory,
) -> None:
    def native(name: str, args: str, call_id: str) -> Script:
        piece = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": args},
        }
        return Script(steps=(chunk({"tool_calls": [piece]}), chunk({}, finish="tool_calls")))

    gw = await make_gateway(
        [
            native("places__search", SEARCH, "a"),
            native("respond", '{"content": "Trattoria Roma."}', "b"),
        ]
    )
    events = await gw.stream(body("find_and_answer", mode="native"))
    assert_well_formed(events)
    # Each turn offers what is legal then: the search first, the answer once it is done.
    first, second = (orjson.loads(r.body) for r in gw.upstream.requests[:2])
    assert [t["function"]["name"] for t in first["tools"]] == ["places__search"]
    assert [t["function"]["name"] for t in second["tools"]] == ["respond"]
    assert second["tool_choice"] == {"type": "function", "function": {"name": "respond"}}
    assert [c["name"] for c in of(events, "tool.call")] == ["places.search", "respond"]
    assert of(events, "result.end")[0]["value"] == {"content": "Trattoria Roma."}


async def test_workflows_are_listed_and_bad_ones_refused(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([])
    listed = (await gw.client.get(f"{gw.url}/v1/workflows")).json()["workflows"]
    names = {w["name"] for w in listed}
    assert {"book_a_table", "search_then_book", "find_and_answer"} <= names
    book = next(w for w in listed if w["name"] == "book_a_table")
    assert book["prerequisites"]["bookings.create"][0]["match_arg"] == "place_id"
    cases = [
        ("nope", 404, "WORKFLOW_NOT_FOUND"),
        (
            {"name": "x", "tools": ["nothing.here"], "terminal_tools": ["nothing.here"]},
            422,
            "WORKFLOW_INVALID",
        ),
        (
            {
                "name": "x",
                "tools": ["places.search"],
                "required_steps": ["places.search"],
                "terminal_tools": ["places.search"],
            },
            422,
            "WORKFLOW_INVALID",
        ),
        (
            {
                "name": "x",
                "tools": ["places.search"],
                "terminal_tools": ["places.search"],
                "prerequisites": {"places.search": ["bookings.create"]},
            },
            422,
            "WORKFLOW_INVALID",
        ),
        (
            {
                "name": "x",
                "tools": ["places.search"],
                "terminal_tools": ["places.search"],
                "surprise": 1,
            },
            422,
            "WORKFLOW_INVALID",
        ),
    ]
    for workflow, status, code in cases:
        response = await gw.client.post(f"{gw.url}/v1/stream", json=body(workflow))
        assert response.status_code == status, (workflow, response.text)
        assert response.json()["error"]["code"] == code


# -- the workflow's own context settings (compaction, keep_recent, budget_tokens) ------------

SEARCHES = ['{"query": "italian"}', '{"query": "pizza"}', '{"query": "cafe"}']


def _searching(name: str = "searching", **settings: Any) -> dict[str, Any]:
    """An inline workflow that searches three times before it books: enough history to
    cross a small budget."""
    return {
        "name": name,
        "tools": ["places.search", "bookings.create"],
        "required_steps": ["places.search"],
        "terminal_tools": ["bookings.create"],
        **settings,
    }


def _searching_script() -> list[Script]:
    searches = [call(f"t{i}", "places.search", q) for i, q in enumerate(SEARCHES, 1)]
    return [*searches, call("t9", "bookings.create", BOOK)]


def _sent(gw: Any) -> list[list[dict[str, Any]]]:
    return [orjson.loads(r.body)["messages"] for r in gw.upstream.requests]


def _size(messages: list[dict[str, Any]]) -> int:
    return len(orjson.dumps(messages))


def _tokens(messages: list[dict[str, Any]]) -> int:
    """The engine's own measure (characters / 4 on an OpenAI-compatible upstream)."""
    return chars_per_token(count_text(messages)) + MESSAGE_OVERHEAD_TOKENS * len(messages)


async def test_the_workflows_budget_and_strategy_compact_its_history(
    make_gateway: HarnessFactory,
) -> None:
    # Dry: the same run with no budget anywhere; nothing is measured.
    dry = await make_gateway(_searching_script())
    events = await dry.stream(body(_searching()))
    assert of(events, "done")[0]["reason"] == "stop"
    assert "budget_source" not in of(events, "stream.begin")[0]
    grown = _sent(dry)
    # A budget whose trigger (75 %) the third turn's prompt crosses, the second's not.
    trigger = (_tokens(grown[1]) + _tokens(grown[2])) // 2
    budget = trigger * 4 // 3 + 1
    gw = await make_gateway(_searching_script())
    workflow = _searching(compaction="sliding", keep_recent=1, budget_tokens=budget)
    events = await gw.stream(body(workflow))
    assert_well_formed(events)
    begin = of(events, "stream.begin")[0]
    assert begin["budget_tokens"] == budget and begin["budget_source"] == "workflow"
    compacted = of(events, "context.compacted")
    assert compacted and compacted[0]["budget_tokens"] == budget
    assert compacted[0]["phase"] == 1  # sliding has one phase
    assert of(events, "done")[0]["reason"] == "stop"
    sent = _sent(gw)
    assert sent[:2] == grown[:2]  # under the threshold nothing changed
    assert _size(sent[2]) < _size(grown[2])
    # Sliding with keep_recent 1: the first search's call and result are gone, the step
    # hint stands in for them, and the last iteration is whole.
    assert not any("t1" in str(m.get("content")) for m in sent[2][2:])
    assert "[Steps completed: places.search]" in sent[2][1]["content"]
    assert sent[2][-2:] == grown[2][-2:]
    metrics = await gw.metrics(begin["stream_id"])
    assert metrics["context"]["strategy"] == "sliding"
    assert metrics["context"]["budget_source"] == "workflow"


async def test_a_workflow_that_never_compacts_ends_over_its_budget(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(_searching_script())
    events = await gw.stream(body(_searching(compaction="none", budget_tokens=256)))
    assert_well_formed(events)
    assert not of(events, "context.compacted")
    (error,) = of(events, "error")
    assert error["code"] == "CONTEXT_BUDGET_EXCEEDED"
    done = of(events, "done")[0]
    assert done["reason"] == "error"
    assert done["workflow"]["completed_steps"] == ["places.search"]
    assert len(gw.upstream.requests) == 1  # the second turn was never sent


async def test_a_workflow_cannot_ask_for_more_than_the_models_context(
    make_gateway: HarnessFactory,
) -> None:
    # Under the inline cap (raised here), a budget past the model's context is cut to it.
    gw = await make_gateway(
        _searching_script(), budget_tokens=50_000, inline_workflow_max_budget_tokens=10**6
    )
    events = await gw.stream(body(_searching(budget_tokens=1_000_000)))
    begin = of(events, "stream.begin")[0]
    assert begin["budget_tokens"] == 50_000 and begin["budget_source"] == "manual"
    smaller = await make_gateway(_searching_script(), budget_tokens=50_000)
    events = await smaller.stream(body(_searching(budget_tokens=40_000)))
    begin = of(events, "stream.begin")[0]
    assert begin["budget_tokens"] == 40_000 and begin["budget_source"] == "workflow"
    metrics = await smaller.metrics(begin["stream_id"])
    assert metrics["context"]["strategy"] == "tiered"  # the workflow's default
