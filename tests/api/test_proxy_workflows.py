"""Workflows through the OpenAI-compatible proxy (docs/proxy.md: ``"toolforge": {"workflow": …}``),
with the official ``openai`` SDK as the client: a real gateway on loopback in front of the
scripted upstream. The gateway runs the workflow — its tools, its rules, its nudges, its
narrowed grammar on llama-server — and the completion is its terminal tool's result."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.api.conftest import SDK, Harness, HarnessFactory
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script

SEARCH = '{"query": "italian"}'
BOOK = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
USER = [{"role": "user", "content": "Book a table for 2 at an italian place at 19:30."}]
BOOKING = {"toolforge": {"workflow": "book_a_table"}}
NOPE = {"name": "x", "tools": ["nope"], "terminal_tools": ["nope"]}


def call(frame_id: str, name: str, args: str, before: str = "") -> Script:
    return Script.from_tokens([before, sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])


def search_then_book() -> list[Script]:
    return [call("t1", "places.search", SEARCH), call("t2", "bookings.create", BOOK)]


def sent(gw: Harness, index: int = 0) -> dict[str, Any]:
    assert gw.upstream is not None
    return orjson.loads(gw.upstream.requests[index].body)  # type: ignore[no-any-return]


def extension(reply: Any) -> dict[str, Any]:
    return (reply.model_extra or {})["toolforge"]  # type: ignore[no-any-return]


async def test_the_booking_is_the_answer(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH, before="Let me look. "),
            call("t2", "bookings.create", BOOK, before="Booking it. "),
        ]
    )
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="m", messages=USER, temperature=0.2, extra_body=BOOKING
    )
    done = reply.parse()
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    booking = orjson.loads(choice.message.content or "")
    assert booking["place_id"] == "trattoria-roma" and booking["party_size"] == 2
    assert "Let me look" not in (choice.message.content or "")  # chatter is not the answer
    ext = extension(done)
    assert ext["workflow"]["completed_steps"] == ["places.search", "bookings.create"]
    assert ext["workflow"]["finished"] is True and ext["workflow"]["name"] == "book_a_table"
    assert [(c["name"], c["ok"]) for c in ext["server_tools"]] == [
        ("places.search", True),
        ("bookings.create", True),
    ]
    assert reply.headers["x-toolforge-mode"] == "sentinel"
    # The model was taught the workflow, shown its tools, and sent the client's sampling.
    first = sent(gw)
    system = first["messages"][0]["content"]
    assert 'workflow "book_a_table"' in system and "bookings.create" in system
    assert first["messages"][1:] == USER and first["temperature"] == 0.2
    # The run is on record like any stream's.
    metrics = await gw.metrics(ext["stream_id"])
    assert metrics["workflow"] == ext["workflow"]


async def test_streamed_the_answer_comes_once_at_the_end(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH, before="Let me look. "),
            call("t2", "bookings.create", BOOK),
        ]
    )
    stream = await sdk(gw).chat.completions.create(
        model="m",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=BOOKING,
    )
    contents: list[str] = []
    finishes: list[str] = []
    last: Any = None
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                contents.append(delta.content)
            if chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
                last = chunk
    assert len(contents) == 1  # no chatter, one answer
    assert orjson.loads(contents[0])["place_id"] == "trattoria-roma"
    assert finishes == ["stop"]
    assert extension(last)["workflow"]["completed_steps"] == ["places.search", "bookings.create"]


async def test_a_skipped_step_is_nudged_in_the_stream_and_counted(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [
            call("t1", "bookings.create", BOOK),
            call("t2", "places.search", SEARCH),
            call("t3", "bookings.create", BOOK),
        ]
    )
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_body=BOOKING
    )
    done = reply.parse()
    assert orjson.loads(done.choices[0].message.content or "")["place_id"] == "trattoria-roma"
    ext = extension(done)
    assert ext["guardrails"]["nudge"] == 1 and ext["workflow"]["nudges"] == 1
    assert reply.headers["x-toolforge-nudge"] == "1"
    refused = ext["server_tools"][0]
    assert refused["name"] == "bookings.create" and refused["ok"] is False
    assert refused["error"]["code"] == "STEP_REQUIRED"
    # The refusal reached the model in the call's result: nothing restarted.
    assert "places.search" in sent(gw, 1)["messages"][-1]["content"]


async def test_a_workflow_that_fails_is_a_422_with_its_context(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([call(f"t{i}", "bookings.create", BOOK) for i in range(1, 5)])
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await sdk(gw).chat.completions.create(model="m", messages=USER, extra_body=BOOKING)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["code"] == "STEP_ENFORCEMENT_EXHAUSTED"
    assert body["details"][0]["pending_steps"] == "places.search"
    assert body["details"][0]["iterations"] == "4"
    assert len(gw.upstream.requests) == 4  # type: ignore[union-attr]


async def test_a_failure_mid_stream_raises_with_its_code(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([call(f"t{i}", "bookings.create", BOOK) for i in range(1, 5)])
    stream = await sdk(gw).chat.completions.create(
        model="m", messages=USER, stream=True, extra_body=BOOKING
    )
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert (caught.value.body or {}).get("code") == "STEP_ENFORCEMENT_EXHAUSTED"  # type: ignore[union-attr]


async def test_respond_answers_in_words(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway(
        [
            call("t1", "places.search", SEARCH),
            call("t2", "respond", '{"content": "Trattoria Roma is the closest."}'),
        ]
    )
    done = await sdk(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Which italian place is closest?"}],
        extra_body={"toolforge": {"workflow": "find_and_answer"}},
    )
    assert done.choices[0].message.content == "Trattoria Roma is the closest."
    assert done.choices[0].finish_reason == "stop"


async def test_an_inline_workflow_runs(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway([call("t1", "places.search", SEARCH)])
    inline = {
        "name": "just_search",
        "tools": ["places.search"],
        "terminal_tools": ["places.search"],
    }
    done = await sdk(gw).chat.completions.create(
        model="m", messages=USER, extra_body={"toolforge": {"workflow": inline}}
    )
    found = orjson.loads(done.choices[0].message.content or "")
    assert "trattoria-roma" in {p["id"] for p in found["places"]}


async def test_on_llama_server_the_booking_grammar_holds_only_the_searched_ids(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        search_then_book(),
        upstream_kind="llama_server",
    )
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_body=BOOKING
    )
    done = reply.parse()
    assert reply.headers["x-toolforge-mode"] == "constrained"
    found = {p["id"] for p in extension(done)["server_tools"][0]["result"]["places"]}
    assert "trattoria-roma" in found
    first, second = sent(gw, 0)["grammar"], sent(gw, 1)["grammar"]
    assert "bookings.create" not in first  # the search is the only call the first turn allows
    for place in ("bella-napoli", "sakura-sushi", "taco-loco", "7"):
        if place not in found:
            assert f'\\"{place}\\"' not in second
    assert all(f'\\"{place}\\"' in second for place in found)


async def test_guardrail_switches_map_to_the_workflows_own(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    # grammar off: sentinel, no grammar, where llama-server would get constrained mode.
    gw = await make_gateway(
        search_then_book(),
        upstream_kind="llama_server",
    )
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="m",
        messages=USER,
        extra_body={"toolforge": {"workflow": "book_a_table", "guardrails": {"grammar": False}}},
    )
    assert reply.headers["x-toolforge-mode"] == "sentinel"
    assert "grammar" not in sent(gw)
    # nudge off: no retry is left, a turn without a call ends the run.
    gw = await make_gateway([Script.from_tokens(["I would search for pizza."])])
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await sdk(gw).chat.completions.create(
            model="m",
            messages=USER,
            extra_body={"toolforge": {"workflow": "book_a_table", "guardrails": {"nudge": False}}},
        )
    assert (caught.value.body or {}).get("code") == "RETRIES_EXHAUSTED"  # type: ignore[union-attr]
    # rescue off: a call written as text is not run.
    written = 'places.search({"query": "italian"})'
    gw = await make_gateway([Script.from_tokens([written])] * 4)
    with pytest.raises(openai.UnprocessableEntityError):
        await sdk(gw).chat.completions.create(
            model="m",
            messages=USER,
            extra_body={"toolforge": {"workflow": "book_a_table", "guardrails": {"rescue": False}}},
        )
    # ... which the same run with rescue on does run.
    gw = await make_gateway([Script.from_tokens([written]), call("t2", "bookings.create", BOOK)])
    done = await sdk(gw).chat.completions.create(model="m", messages=USER, extra_body=BOOKING)
    assert extension(done)["workflow"]["rescued"] == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "'tools'"),
        ({"toolforge": {"server_tools": ["places.search"]}}, "server_tools"),
        ({"tool_choice": "none"}, "'tool_choice'"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"stop": ["\n"]}, "'stop'"),
        ({"toolforge": {"guardrails": {"respond": False}}}, "guardrails"),
        ({"toolforge": {"guardrails": {"relevance": False}}}, "'relevance'"),
        ({"toolforge": {"workflow": {**NOPE}}}, "WORKFLOW_INVALID"),
        ({"toolforge": {"workflow": {**NOPE}}}, "tool 'nope' does not exist"),
    ],
)
async def test_what_a_workflow_cannot_honour_is_refused(
    make_gateway: HarnessFactory, sdk: SDK, extra: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway()
    ext = {**BOOKING["toolforge"], **extra.pop("toolforge", {})}
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).chat.completions.create(
            model="m", messages=USER, extra_body={**extra, "toolforge": ext}
        )
    assert needle in caught.value.message or needle == caught.value.code
    assert gw.upstream is not None and gw.upstream.requests == []


async def test_an_unknown_workflow_is_not_found(make_gateway: HarnessFactory, sdk: SDK) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk(gw).chat.completions.create(
            model="m", messages=USER, extra_body={"toolforge": {"workflow": "nope"}}
        )
    assert caught.value.code == "WORKFLOW_NOT_FOUND" and "book_a_table" in caught.value.message
