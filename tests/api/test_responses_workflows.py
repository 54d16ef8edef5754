"""Workflows through the Responses API (``"toolforge": {"workflow": …}``), with the official
``openai`` SDK: the gateway runs the workflow — its tools, its rules, its nudges — and the
response's message is its terminal tool's result, streamed and not; a workflow the model
does not finish is a 422 with its code; what a workflow cannot honour is refused by name."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.api.conftest import SDK, HarnessFactory
from tests.api.test_proxy_workflows import BOOK, BOOKING, SEARCH, call
from tests.api.test_responses import valid_events, valid_resource

ASK = "Book a table for 2 at an italian place at 19:30."


async def test_the_booking_is_the_message(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH, before="Let me look. "),
            call("t2", "bookings.create", BOOK, before="Booking it. "),
        ]
    )
    done = await sdk(gw).responses.create(model="m", input=ASK, extra_body=BOOKING)
    valid_resource(done)
    booking = orjson.loads(done.output_text)
    assert booking["place_id"] == "trattoria-roma" and booking["party_size"] == 2
    assert "Let me look" not in done.output_text  # chatter is not the answer
    # each step's call and result as items, the answer last
    assert [item.type for item in done.output] == [
        *("function_call", "function_call_output") * 2,
        "message",
    ]
    assert [item.name for item in done.output[::2][:2]] == ["places.search", "bookings.create"]  # type: ignore[union-attr]
    ext: dict[str, Any] = (done.model_extra or {})["toolforge"]
    assert ext["workflow"]["completed_steps"] == ["places.search", "bookings.create"]
    assert [(c["name"], c["ok"]) for c in ext["server_tools"]] == [
        ("places.search", True),
        ("bookings.create", True),
    ]


async def test_streamed_the_answer_comes_once_at_the_end(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH, before="Let me look. "),
            call("t2", "bookings.create", BOOK),
        ]
    )
    stream = await sdk(gw).responses.create(model="m", input=ASK, stream=True, extra_body=BOOKING)
    events = valid_events([e async for e in stream])
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 1 and orjson.loads(deltas[0])["place_id"] == "trattoria-roma"
    assert events[-1]["type"] == "response.completed"


async def test_respond_answers_in_words(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            call("t2", "respond", '{"content": "Trattoria Roma is the closest."}'),
        ]
    )
    done = await sdk(gw).responses.create(
        model="m",
        input="Which italian place is closest?",
        extra_body={"toolforge": {"workflow": "find_and_answer"}},
    )
    assert done.output_text == "Trattoria Roma is the closest."


async def test_a_workflow_that_fails_is_a_422(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([call(f"t{i}", "bookings.create", BOOK) for i in range(1, 5)])
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await sdk(gw).responses.create(model="m", input=ASK, extra_body=BOOKING)
    assert caught.value.code == "STEP_ENFORCEMENT_EXHAUSTED"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "'tools'"),
        (
            {"tool_choice": "required", "toolforge": {"server_tools": ["places.search"]}},
            "server_tools",
        ),
        ({"text": {"format": {"type": "json_object"}}}, "'text.format'"),
        ({"parallel_tool_calls": True}, "'parallel_tool_calls'"),
    ],
)
async def test_what_a_workflow_cannot_honour_is_refused(
    make_gateway: HarnessFactory, sdk: SDK, extra: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    body = {"input": ASK, **extra}
    body["toolforge"] = {**BOOKING["toolforge"], **extra.get("toolforge", {})}
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).responses.create(model="m", extra_body=body)
    assert (
        "not with 'toolforge.workflow'" in caught.value.message and needle in caught.value.message
    )
    assert gw.upstream.requests == []


async def test_an_unknown_workflow_is_not_found(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.NotFoundError):
        await sdk(gw).responses.create(
            model="m", input=ASK, extra_body={"toolforge": {"workflow": "no_such_flow"}}
        )
