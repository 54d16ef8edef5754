"""AG-UI over ``POST /v1/agui``: a real gateway on loopback in front of the scripted
upstream, every event the gateway sends parsed by the ``ag-ui-protocol`` package's own
event model. A run with text, a frontend tool, an approval as an interrupt and its
resume (granted and denied), an upstream error, and refusals."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from ag_ui.core import Event, EventType
from pydantic import BaseModel, Field, TypeAdapter

from tests.api.conftest import Harness, HarnessFactory
from tests.api.test_proxy import USAGE, native_call
from tests.api.test_proxy_workflows import call
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.eval.scripted_upstream import Script

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def run_input(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A RunAgentInput as @ag-ui/client's HttpAgent sends it (camelCase)."""
    return {
        "threadId": "t1",
        "runId": extra.pop("runId", "r1"),
        "state": {},
        "messages": messages,
        "tools": extra.pop("tools", []),
        "context": extra.pop("context", []),
        "forwardedProps": extra.pop("forwardedProps", {}),
        **extra,
    }


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "content": text}


async def run(gw: Harness, body: dict[str, Any]) -> list[Any]:
    """POST /v1/agui; every event, parsed by ag-ui-protocol's own model."""
    async with gw.client.stream("POST", f"{gw.url}/v1/agui", json=body) as response:
        raw = await response.aread()
        assert response.status_code == 200, raw
        assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            events.append(EVENT.validate_python(orjson.loads(block[6:])))
    return events


def types(events: list[Any]) -> list[str]:
    return [e.type.value if isinstance(e.type, EventType) else e.type for e in events]


async def test_a_text_run(make_gateway: HarnessFactory) -> None:
    tokens = ["<think>Warm in summer.</think>", "Sunny ", "and warm."]
    gw = await make_gateway([Script.from_tokens(tokens, usage=USAGE)])
    events = await run(
        gw,
        run_input([user("Weather in Paris?")], context=[{"description": "city", "value": "Paris"}]),
    )
    assert types(events) == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert (events[0].thread_id, events[0].run_id) == ("t1", "r1")
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "Sunny and warm."
    assert events[-1].outcome.type == "success"
    sent = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert sent == [
        {"role": "system", "content": "Context:\n- city: Paris"},
        {"role": "user", "content": "Weather in Paris?"},
    ]


async def test_a_frontend_tool_ends_the_run_with_its_call(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            native_call("get_weather", {"city": "Paris"}),
            native_call("respond", {"content": "Sunny in Paris."}),
        ]
    )
    events = await run(gw, run_input([user("Weather in Paris?")], tools=[WEATHER]))
    assert types(events) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    start, args = events[1], events[2]
    assert start.tool_call_name == "get_weather"
    assert orjson.loads(args.delta) == {"city": "Paris"}  # whole and valid, never a prefix
    assert events[-1].outcome.pending_tool_call_ids == [start.tool_call_id]
    # the front-end ran it: the next run carries the call and its result
    history = [
        user("Weather in Paris?"),
        {
            "id": "a1",
            "role": "assistant",
            "toolCalls": [
                {
                    "id": start.tool_call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": args.delta},
                }
            ],
        },
        {"id": "m3", "role": "tool", "toolCallId": start.tool_call_id, "content": "sunny"},
    ]
    second = await run(gw, run_input(history, tools=[WEATHER], runId="r2"))
    text = "".join(e.delta for e in second if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "Sunny in Paris."
    sent = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": start.tool_call_id, "content": "sunny"}
    assert sent[-2]["tool_calls"][0]["id"] == start.tool_call_id


class _BookArgs(BaseModel):
    table: int = Field(ge=1)


def approval_registry(ran: list[int]) -> ToolRegistry:
    async def book(args: _BookArgs) -> dict[str, Any]:
        ran.append(args.table)
        return {"booked": args.table}

    spec = ToolSpec(
        name="book",
        description="Books a table.",
        args_model=_BookArgs,
        fn=book,
        needs_approval=True,
    )
    return ToolRegistry([spec])


@pytest.mark.parametrize("approve", [True, False], ids=["granted", "denied"])
async def test_an_approval_is_an_interrupt_and_the_next_run_resumes(
    make_gateway: HarnessFactory, approve: bool
) -> None:
    ran: list[int] = []
    gw = await make_gateway(
        [
            native_call("book", {"table": 4}),
            native_call("respond", {"content": "Done." if approve else "Not booked."}),
        ],
        tools=approval_registry(ran),
    )
    props = {"toolforge": {"server_tools": ["book"]}}
    first = await run(gw, run_input([user("Book table 4.")], forwardedProps=props))
    assert types(first) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    outcome = first[-1].outcome
    assert outcome.type == "interrupt"
    (interrupt,) = outcome.interrupts
    assert interrupt.reason == "tool_approval"
    assert interrupt.tool_call_id == first[1].tool_call_id
    await asyncio.sleep(0.2)
    assert ran == []  # nothing runs before the decision, though the first run has ended
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approve": approve}}]
    second = await run(
        gw, run_input([user("Book table 4.")], forwardedProps=props, resume=resume, runId="r2")
    )
    assert types(second)[0] == "RUN_STARTED" and second[0].run_id == "r2"
    (result,) = [e for e in second if e.type == EventType.TOOL_CALL_RESULT]
    assert result.tool_call_id == interrupt.tool_call_id
    if approve:
        assert orjson.loads(result.content) == {"booked": 4}
    else:
        assert orjson.loads(result.content)["error"]["code"] == "TOOL_APPROVAL_DENIED"
    text = "".join(e.delta for e in second if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == ("Done." if approve else "Not booked.")
    assert second[-1].type == EventType.RUN_FINISHED and second[-1].outcome.type == "success"
    assert ran == ([4] if approve else [])


async def test_an_upstream_error_is_a_run_error(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"], finish=None, end="rst")])
    events = await run(gw, run_input([user("Hi")]))
    assert types(events)[-1] == "RUN_ERROR"
    assert "UPSTREAM" in events[-1].code
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "Hello"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"threadId": "t1"}, "runId"),
        (run_input([user("x")], forwardedProps={"toolforge": {"server_tools": ["nope"]}}), "nope"),
        (
            run_input(
                [user("x")],
                resume=[{"interruptId": "x.y", "status": "resolved", "payload": {}}],
            ),
            "not one of this gateway's",
        ),
        (
            run_input(
                [user("x")],
                tools=[WEATHER],
                forwardedProps={"toolforge": {"workflow": "book_a_table"}},
            ),
            "not with 'toolforge.workflow'",
        ),
        (
            run_input([user("x")], forwardedProps={"toolforge": {"max_tool_calls": "many"}}),
            "max_tool_calls",
        ),
    ],
)
async def test_bad_runs_are_refused(
    make_gateway: HarnessFactory, body: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    response = await gw.client.post(f"{gw.url}/v1/agui", json=body)
    assert response.status_code in (400, 404, 422), response.text
    assert needle in response.json()["error"]["message"]
    assert gw.upstream.requests == []


async def test_a_workflow_run_answers_with_its_result(make_gateway: HarnessFactory) -> None:
    search = '{"query": "italian"}'
    book = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
    gw = await make_gateway(
        [call("t1", "places.search", search, "Let me look. "), call("t2", "bookings.create", book)]
    )
    props = {"toolforge": {"workflow": "book_a_table"}}
    events = await run(
        gw, run_input([user("Book a table for 2, italian, 19:30.")], forwardedProps=props)
    )
    assert [e.tool_call_name for e in events if e.type == EventType.TOOL_CALL_START] == [
        "places.search",
        "bookings.create",
    ]
    assert len([e for e in events if e.type == EventType.TOOL_CALL_RESULT]) == 2
    texts = [e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT]
    assert len(texts) == 1 and orjson.loads(texts[0])["place_id"] == "trattoria-roma"  # no chatter
    assert types(events)[-1] == "RUN_FINISHED"
