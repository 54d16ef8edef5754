"""Tools mid-stream: pause the model at a tool call's END, run the tool, resume it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from pydantic import BaseModel, Field

from tests.api.conftest import (
    Harness,
    HarnessFactory,
    assert_well_formed,
    frames,
    sentinel_reply,
)
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.eval.scripted_upstream import Script, Step


def call(fid: str, name: str, args: object | str) -> str:
    body = args if isinstance(args, str) else orjson.dumps(args).decode()
    return sentinels.frame(FrameKind.TOOL_CALL, fid, name, body)


def tokens(text: str, size: int = 5) -> Script:
    return Script.from_tokens([text[i : i + size] for i in range(0, len(text), size)])


def named(events: list[Any], event: str) -> list[dict[str, Any]]:
    return [e.data for e in frames(events) if e.event == event]


SEARCH = {"query": "pizza", "radius_km": 5, "open_at": "19:00"}


async def test_pause_execute_resume_in_one_stream(make_gateway: HarnessFactory) -> None:
    first = "Let me look. " + call("t1", "places.search", SEARCH) + " IGNORED AFTER END"
    gw = await make_gateway([tokens(first), tokens(sentinel_reply("Trattoria Roma is open."))])
    events = await gw.stream({"input": "Find pizza near me", "profile": "demo"})
    assert_well_formed(events)
    names = [e.event for e in frames(events)]
    assert names.index("tool.call") < names.index("tool.result") < names.index("result.end")
    (tool_call,) = named(events, "tool.call")
    assert tool_call == {"id": "t1", "name": "places.search", "args": SEARCH}
    (result,) = named(events, "tool.result")
    assert result["ok"] is True and result["attempts"] == 1 and result["cached"] is False
    assert {p["id"] for p in result["result"]["places"]} >= {"trattoria-roma"}
    text = "".join(d["chunk"] for d in named(events, "text.delta"))
    assert "IGNORED" not in text  # the model is paused at the END: what follows is dropped
    # The second request resumes the conversation: the model's own text up to the END,
    # then the tool's result.
    resumed = gw.upstream.requests[1].json["messages"]
    assert resumed[-2] == {
        "role": "assistant",
        "content": "Let me look. " + call("t1", "places.search", SEARCH),
    }
    assert (
        resumed[-1]["role"] == "user"
        and "Result of tool call t1 (places.search)" in resumed[-1]["content"]
    )
    assert '"trattoria-roma"' in resumed[-1]["content"]
    assert named(events, "done")[0]["reason"] == "stop"
    await gw.settle()


async def test_usage_counts_the_turns_the_upstream_reported(make_gateway: HarnessFactory) -> None:
    # The first turn ends at the call's END: the gateway closes its request, so the usage
    # chunk at the end of that generation never arrives (docs/protocol.md, done.usage).
    first = Script.from_tokens(
        ["Let me look. ", call("t1", "places.search", SEARCH), " more"],
        usage={"prompt_tokens": 40, "completion_tokens": 30},
    )
    last = Script.from_tokens(
        [sentinel_reply()], usage={"prompt_tokens": 90, "completion_tokens": 12}
    )
    gw = await make_gateway([first, last])
    events = await gw.stream({"input": "Find pizza near me", "profile": "demo"})
    assert_well_formed(events)
    (done,) = named(events, "done")
    assert done["usage"] == {"prompt_tokens": 90, "completion_tokens": 12}
    await gw.settle()


async def test_a_long_turn_is_resumed_with_all_of_its_text(make_gateway: HarnessFactory) -> None:
    # Hundreds of deltas before the call: the turn's text is kept in joined blocks.
    said = "".join(f"w{i} " for i in range(150)) + call("t1", "places.search", SEARCH)
    gw = await make_gateway([tokens(said + " IGNORED", size=3), tokens(sentinel_reply())])
    events = await gw.stream({"input": "Find pizza near me"})
    assert_well_formed(events)
    assert gw.upstream.requests[1].json["messages"][-2] == {"role": "assistant", "content": said}


async def test_tools_are_taught_in_the_system_prompt(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([tokens(sentinel_reply())])
    await gw.stream({"input": "x", "tools": ["places.search"]})
    system = gw.upstream.requests[0].json["messages"][0]["content"]
    assert "- places.search:" in system and "- bookings.create" not in system
    assert '"radius_km"' in system  # the input schema, generated from the pydantic model


async def test_tool_error_goes_back_and_the_model_corrects_itself(
    make_gateway: HarnessFactory,
) -> None:
    full = {"place_id": "trattoria-roma", "time": "19:30", "party_size": 2}
    free = {"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}
    gw = await make_gateway(
        [
            tokens(call("b1", "bookings.create", full)),
            tokens(call("b2", "bookings.create", free)),
            tokens(sentinel_reply("Booked for 19:00.")),
        ]
    )
    events = await gw.stream({"input": "book at 7:30pm"})
    assert_well_formed(events)
    failed, booked = named(events, "tool.result")
    assert failed["ok"] is False and failed["error"]["code"] == "BOOKING_FULL"
    assert booked["ok"] is True
    assert "BOOKING_FULL" in gw.upstream.requests[1].json["messages"][-1]["content"]
    assert len(gw.upstream.requests) == 3


async def test_invalid_args_name_the_path_and_the_tool_does_not_run(
    make_gateway: HarnessFactory,
) -> None:
    bad = {"place_id": "trattoria-roma", "time": "19:00", "party_size": 0}
    gw = await make_gateway([tokens(call("b1", "bookings.create", bad)), tokens(sentinel_reply())])
    events = await gw.stream()
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["attempts"] == 0
    assert "$.party_size" in orjson.dumps(result["error"]).decode()


async def test_bad_json_args_are_fed_back_as_invalid_json(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            tokens(call("t1", "places.search", '{"query": "pizza",}')),
            tokens(call("t2", "places.search", SEARCH)),
            tokens(sentinel_reply()),
        ]
    )
    events = await gw.stream()
    assert_well_formed(events)
    first, second = named(events, "tool.result")
    assert first["ok"] is False and first["error"]["code"] == "INVALID_JSON"
    assert [c["id"] for c in named(events, "tool.call")] == ["t2"]  # t1 was never announced
    assert second["ok"] is True


async def test_max_tool_calls_is_enforced(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [tokens(call(f"t{i}", "places.search", SEARCH)) for i in range(3)]
        + [tokens(sentinel_reply())]
    )
    events = await gw.stream({"input": "x", "max_tool_calls": 2})
    results = named(events, "tool.result")
    assert [r["ok"] for r in results] == [True, True, False]
    assert results[2]["error"]["code"] == "TOOL_CALL_LIMIT"


async def test_a_tool_never_runs_on_a_prefix_that_parses(make_gateway: HarnessFactory) -> None:
    # The arguments are complete JSON, but the END never comes: nothing may run.
    body = (
        sentinels.begin(FrameKind.TOOL_CALL, "t1", "places.search") + orjson.dumps(SEARCH).decode()
    )
    gw = await make_gateway([Script(steps=(Step(text=body),), end="hang")], idle_s=0.3)
    events = await gw.stream()
    assert named(events, "tool.call") == [] and named(events, "tool.result") == []
    assert named(events, "error")[0]["code"] == "UPSTREAM_TIMEOUT"


class _SlowArgs(BaseModel):
    seconds: float = Field(ge=0, le=10)


def _registry(*, needs_approval: bool = False, ran: list[float] | None = None) -> ToolRegistry:
    async def slow(args: _SlowArgs) -> dict[str, Any]:
        if ran is not None:
            ran.append(args.seconds)
        await asyncio.sleep(args.seconds)
        return {"slept": args.seconds}

    spec = ToolSpec(
        name="slow",
        description="Sleeps.",
        args_model=_SlowArgs,
        fn=slow,
        needs_approval=needs_approval,
    )
    return ToolRegistry([spec])


async def _wait_for_event(gw: Harness, stream_id: str, event: str) -> None:
    session = gw.gateway.registry.get(stream_id)
    marker = f"event: {event}\n".encode()
    async with asyncio.timeout(3), contextlib.aclosing(session.log.follow(0)) as batches:
        async for batch in batches:
            if marker in batch:
                return


async def test_approval_granted_denied_and_timed_out(make_gateway: HarnessFactory) -> None:
    ran: list[float] = []
    script = [tokens(call("t1", "slow", {"seconds": 0})), tokens(sentinel_reply())]
    gw = await make_gateway(script * 2, tools=_registry(needs_approval=True, ran=ran))
    for approve in (True, False):
        reading = asyncio.create_task(gw.stream())
        await gw.upstream.wait_for_requests(len(gw.upstream.requests) + 1)
        stream_id = next(s for s, sess in gw.gateway.registry._sessions.items() if sess.running)
        await _wait_for_event(gw, stream_id, "tool.call")
        missing = await gw.client.post(
            f"{gw.url}/v1/streams/{stream_id}/approvals/nope", json={"approve": True}
        )
        assert missing.status_code == 404 and "t1" in missing.json()["error"]["message"]
        answer = await gw.client.post(
            f"{gw.url}/v1/streams/{stream_id}/approvals/t1", json={"approve": approve}
        )
        assert answer.json() == {"stream_id": stream_id, "call_id": "t1", "approved": approve}
        events = await reading
        (tool_call,) = named(events, "tool.call")
        assert tool_call["needs_approval"] is True
        (result,) = named(events, "tool.result")
        assert result["ok"] is approve
        if not approve:
            assert result["error"]["code"] == "TOOL_APPROVAL_DENIED"
    assert ran == [0]  # only the approved call ran


async def test_disconnect_during_a_tool_cancels_it(make_gateway: HarnessFactory) -> None:
    ran: list[float] = []
    gw = await make_gateway([tokens(call("t1", "slow", {"seconds": 5}))], tools=_registry(ran=ran))
    body = {"input": "x", "on_disconnect": "cancel"}
    async with gw.client.stream("POST", f"{gw.url}/v1/stream", json=body) as response:
        async for line in response.aiter_lines():
            if line == "event: tool.call":
                break
    await gw.settle()
    (session,) = gw.gateway.registry._sessions.values()
    assert session.reason == "client_disconnected"
    assert ran == [5] and gw.gateway.executor.running == 0
    assert session.stats["duration_ms"] < 2000  # not the tool's 5 s


async def test_idempotency_key_replays_and_tool_runs_once(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([tokens(call("t1", "places.search", SEARCH)), tokens(sentinel_reply())])
    headers = {"Idempotency-Key": "trip-1"}
    _, first = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=headers)
    _, second = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=headers)
    assert first == second and b"event: tool.result" in first
    assert len(gw.upstream.requests) == 2


async def test_tools_and_schemas_endpoints(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    tools = (await gw.client.get(f"{gw.url}/v1/tools")).json()["tools"]
    assert [t["name"] for t in tools] == ["places.search", "bookings.create"]
    schema = (await gw.client.get(f"{gw.url}/v1/schemas/bookings.create")).json()
    assert schema["properties"]["party_size"]["maximum"] == 20
    reply = (await gw.client.get(f"{gw.url}/v1/schemas/AssistantReply")).json()
    assert "answer" in reply["required"]
    missing = await gw.client.get(f"{gw.url}/v1/schemas/Nope")
    assert missing.status_code == 404 and "AssistantReply" in missing.json()["error"]["message"]
    unknown = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "x", "tools": ["nope"]})
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "TOOL_NOT_FOUND"
