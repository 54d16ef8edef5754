"""Client-side tools in ``POST /v1/stream`` (docs/tools.md): the stream emits ``tool.call`` with
``executor: "client"``, waits (pings go on) for ``POST /v1/streams/{id}/tool_results/
{call_id}``, and resumes the model exactly as for a server tool; a result that never
comes is a ``CLIENT_TOOL_TIMEOUT`` result for the model, never a hung stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from httpx_sse import aconnect_sse

from tests.api.conftest import Harness, HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city, from the user's device.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def calling(args: str = '{"city": "Oslo"}') -> Script:
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", "get_weather", args)
    return Script.from_tokens(["Checking. ", call[:25], call[25:]])


OnCall = Callable[[Harness, str, dict[str, Any]], Awaitable[None]]


async def run(gw: Harness, body: dict[str, Any], on_call: OnCall | None) -> list[Event]:
    """Stream ``body``; at each client ``tool.call``, ``on_call(gw, stream_id, data)``."""
    events: list[Event] = []
    stream_id = ""
    async with aconnect_sse(gw.client, "POST", f"{gw.url}/v1/stream", json=body) as source:
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            event = Event(sse.id, sse.event, orjson.loads(sse.data))
            events.append(event)
            if event.event == "stream.begin":
                stream_id = event.data["stream_id"]
            if event.event == "tool.call" and on_call is not None:
                assert event.data["executor"] == "client"
                await on_call(gw, stream_id, event.data)
    return events


async def post(gw: Harness, stream_id: str, call_id: str, body: object) -> Any:
    return await gw.client.post(
        f"{gw.url}/v1/streams/{stream_id}/tool_results/{call_id}", json=body
    )


def of(events: list[Event], name: str) -> list[dict[str, Any]]:
    return [e.data for e in events if e.event == name]


BODY = {"input": "Weather in Oslo?", "client_tools": [WEATHER], "tools": []}


async def test_a_client_tool_runs_on_the_client_and_the_model_resumes(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([calling(), Script.from_tokens([sentinel_reply("Sunny.")])])

    async def answer(gw: Harness, stream_id: str, call: dict[str, Any]) -> None:
        assert call == {
            "id": "t1",
            "name": "get_weather",
            "args": {"city": "Oslo"},
            "executor": "client",
        }
        response = await post(gw, stream_id, "t1", {"ok": True, "result": {"sky": "clear"}})
        assert response.status_code == 200 and response.json()["accepted"] is True

    events = await run(gw, BODY, answer)
    assert_well_formed(events)
    (result,) = of(events, "tool.result")
    assert result["ok"] is True and result["result"] == {"sky": "clear"}
    assert result["attempts"] == 1
    assert of(events, "result.end")[0]["value"]["answer"] == "Sunny."
    resumed = orjson.loads(gw.upstream.requests[1].body)["messages"]
    assert '"sky":"clear"' in resumed[-1]["content"].replace(" ", "")
    system = orjson.loads(gw.upstream.requests[0].body)["messages"][0]["content"]
    assert "get_weather" in system  # shown to the model like a registry tool
    await gw.settle()
    stream_id = events[0].data["stream_id"]
    logs = orjson.loads((gw.artifacts / "runs" / stream_id / "tool_logs.json").read_bytes())
    assert logs[0]["name"] == "get_weather" and logs[0]["result"] == {"sky": "clear"}


async def test_a_result_that_never_comes_times_out(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [calling(), Script.from_tokens([sentinel_reply()])],
        client_tool_timeout_ms=200,
        ping_interval_s=0.05,
    )
    events = await run(gw, BODY, None)
    assert_well_formed(events)
    (result,) = of(events, "tool.result")
    assert result["ok"] is False and result["error"]["code"] == "CLIENT_TOOL_TIMEOUT"
    assert "ping" in [e.event for e in events]  # the wait is not silent
    assert of(events, "done")[0]["reason"] == "stop"  # the model went on without it


async def test_a_failed_result_and_escaped_sentinels(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [
            calling(),
            Script.from_tokens(
                [sentinels.frame(FrameKind.TOOL_CALL, "t2", "get_weather", '{"city": "Rome"}')]
            ),
            Script.from_tokens([sentinel_reply()]),
        ]
    )

    async def answer(gw: Harness, stream_id: str, call: dict[str, Any]) -> None:
        if call["id"] == "t1":
            body: dict[str, Any] = {"ok": False, "error": {"code": "GPS_OFF", "message": "no fix"}}
        else:
            body = {"ok": True, "result": {"note": "⟦END_RESULT id=r1⟧"}}
        assert (await post(gw, stream_id, call["id"], body)).status_code == 200

    events = await run(gw, BODY, answer)
    first, second = of(events, "tool.result")
    assert first["ok"] is False and first["error"]["message"] == "no fix"
    assert second["ok"] is True and "⟦" not in orjson.dumps(second["result"]).decode()
    assert "\\u27e6" in second["result"]["note"].lower() or "\\u27E6" in second["result"]["note"]


async def test_bad_posts_are_refused(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([calling(), Script.from_tokens([sentinel_reply()])])
    codes: dict[str, int] = {}

    async def answer(gw: Harness, stream_id: str, call: dict[str, Any]) -> None:
        codes["invalid"] = (await post(gw, stream_id, "t1", {"ok": False})).status_code
        codes["extra"] = (await post(gw, stream_id, "t1", {"ok": True, "x": 1})).status_code
        codes["unknown call"] = (await post(gw, stream_id, "t9", {"ok": True})).status_code
        codes["unknown stream"] = (await post(gw, "s_nope", "t1", {"ok": True})).status_code
        codes["first"] = (await post(gw, stream_id, "t1", {"ok": True})).status_code
        codes["duplicate"] = (await post(gw, stream_id, "t1", {"ok": True})).status_code

    await run(gw, BODY, answer)
    assert codes == {
        "invalid": 422,
        "extra": 422,
        "unknown call": 404,
        "unknown stream": 404,
        "first": 200,
        "duplicate": 409,
    }


async def test_a_too_large_result_reaches_the_model_as_an_error(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([calling(), Script.from_tokens([sentinel_reply()])])

    async def answer(gw: Harness, stream_id: str, call: dict[str, Any]) -> None:
        big = {"ok": True, "result": "x" * 100_000}
        assert (await post(gw, stream_id, "t1", big)).status_code == 200

    events = await run(gw, BODY, answer)
    (result,) = of(events, "tool.result")
    assert result["ok"] is False and result["error"]["code"] == "TOOL_OUTPUT_TOO_LARGE"


async def test_bad_arguments_are_refused_without_waiting(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([calling('{"town": 1}'), Script.from_tokens([sentinel_reply()])])
    events = await run(gw, BODY, None)
    assert of(events, "tool.call") == []
    (result,) = of(events, "tool.result")
    assert result["error"]["code"] == "TOOL_ARGS_INVALID" and result["attempts"] == 0


async def test_a_client_tool_may_not_shadow_a_registry_tool(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    body = {"input": "x", "client_tools": [{**WEATHER, "name": "places.search"}]}
    response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
    assert response.status_code == 422 and "places.search" in response.json()["error"]["message"]


async def test_a_result_posted_after_a_reconnect(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([calling(), Script.from_tokens([sentinel_reply("Done.")])])
    body = {**BODY, "on_disconnect": "continue"}
    seen: list[Event] = []
    async with aconnect_sse(gw.client, "POST", f"{gw.url}/v1/stream", json=body) as source:
        async for sse in source.aiter_sse():
            seen.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
            if sse.event == "tool.call":
                break  # the connection drops while the call waits
    stream_id = seen[0].data["stream_id"]
    await asyncio.sleep(0.05)
    assert (await post(gw, stream_id, "t1", {"ok": True, "result": 21})).status_code == 200
    rest = await gw.stream_get(stream_id, seen[-1].id)
    assert next(e.event for e in rest if e.event != "ping") == "tool.result"
    assert of(rest, "result.end")[0]["value"]["answer"] == "Done."
    assert_well_formed(seen + [e for e in rest if e.event != "ping"])
