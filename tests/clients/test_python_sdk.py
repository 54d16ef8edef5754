"""The Python SDK (clients/python, ``toolforge_client``) against a real gateway on loopback
in front of a scripted upstream: the demo, client tools, backpressure, resume, cancel,
timeouts, approvals and errors, with the sync and the async client.

The sync client runs in a worker thread (``asyncio.to_thread``) so that the gateway, on
this test's event loop, goes on serving it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from pydantic import BaseModel, Field

from tests.api.conftest import HarnessFactory, sentinel_reply
from tests.clients.conftest import DEMO_INPUT, DropProxy, call, demo_scripts, tokens
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.eval.scripted_upstream import Script
from toolforge_client import (
    APIConnectionError,
    APITimeoutError,
    AsyncToolForge,
    BadRequestError,
    ConflictError,
    Event,
    NotFoundError,
    RequestTimeoutError,
    StreamResult,
    ToolForge,
    UpstreamError,
    client_tool,
)
from toolforge_client.frames import (
    Done,
    JsonEnd,
    ResultEnd,
    StreamBegin,
    TextDelta,
    ToolCall,
    ToolResult,
)

MODES = ["sync", "async"]
T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


async def run(mode: str, url: str, input: str, **options: Any) -> StreamResult:
    """``client.run(...)`` with the sync client (in a thread) or the async one."""
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(url) as client:
                return client.run(input, **options)

        return await in_thread(go)
    async with AsyncToolForge(url) as client:
        return await client.run(input, **options)


def assert_complete(result: StreamResult) -> None:
    """Every frame exactly once, in order, ending with done."""
    ids = [e.id for e in result.events]
    assert ids == list(range(1, len(ids) + 1))
    assert isinstance(result.events[0].data, StreamBegin)
    assert isinstance(result.events[-1].data, Done)


# -- the demo ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_demo_with_typed_frames_and_callbacks(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(demo_scripts())
    seen: dict[str, list[Any]] = {"text": [], "json": [], "result": [], "call": [], "event": []}
    result = await run(
        mode,
        gw.url,
        DEMO_INPUT,
        profile="demo",
        max_tool_calls=2,
        object_schemas=["Action"],
        on_text=seen["text"].append,
        on_json=seen["json"].append,
        on_result=seen["result"].append,
        on_tool_call=seen["call"].append,
        on_event=seen["event"].append,
    )
    assert_complete(result)
    assert result.stream_id is not None and result.stream_id.startswith("s_")
    assert [c.name for c in result.tool_calls] == ["places.search", "bookings.create"]
    assert all(r.ok for r in result.tool_results)
    assert result.tool_calls[0].args == {"query": "pizza", "radius_km": 2, "open_at": "19:00"}
    assert result.value == {"answer": "Booked Trattoria Roma at 19:00."}
    assert result.objects[0].value["mode"] == "book"
    assert result.done is not None and result.done.reason == "stop"
    assert result.done.metrics.duration_ms > 0
    # The callbacks saw what the result holds, as typed frames.
    assert "".join(seen["text"]) == result.text and "Let me look." in result.text
    assert seen["json"] == result.objects and isinstance(seen["json"][0], JsonEnd)
    assert seen["result"] == [result.result] and isinstance(seen["result"][0], ResultEnd)
    assert [c.id for c in seen["call"]] == ["t1", "t2"]
    assert seen["event"] == result.events
    assert result.resumes == 0


@pytest.mark.parametrize("mode", MODES)
async def test_iterating_yields_typed_events_without_pings(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(
        [tokens("Hello there, " * 5 + sentinel_reply(), delay_ms=20)], ping_interval_s=0.05
    )
    if mode == "sync":

        def go() -> list[Event]:
            with ToolForge(gw.url) as client, client.stream("hi") as stream:
                return list(stream)

        events = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url) as client, await client.stream("hi") as stream:
            events = [e async for e in stream]
    assert "ping" not in {e.event for e in events}
    assert all(type(e.data).EVENT == e.event for e in events)
    assert any(isinstance(e.data, TextDelta) for e in events)
    session = gw.gateway.registry.get(events[0].data.stream_id)  # type: ignore[attr-defined]
    assert [f.event for f in session.log.frames] == [e.event for e in events]


# -- client-side tools ---------------------------------------------------------------------


class Weather(BaseModel):
    city: str = Field(min_length=1)


@client_tool
def get_weather(args: Weather) -> dict[str, Any]:
    """The weather in a city, from the user's device."""
    return {"city": args.city, "sky": "clear"}


@client_tool(name="device.time")
async def device_time(zone: str, hour24: bool = True) -> dict[str, Any]:
    """The device's local time."""
    await asyncio.sleep(0.01)
    return {"zone": zone, "time": "19:00" if hour24 else "7pm"}


def test_client_tool_schemas_come_from_models_and_signatures() -> None:
    assert get_weather.name == "get_weather"
    assert get_weather.description == "The weather in a city, from the user's device."
    assert get_weather.parameters["properties"]["city"]["minLength"] == 1
    assert get_weather.parameters["required"] == ["city"]
    assert device_time.name == "device.time"
    schema = device_time.parameters
    assert schema["required"] == ["zone"] and schema["additionalProperties"] is False
    assert schema["properties"]["hour24"]["type"] == "boolean"

    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(TypeError, match="no type annotation"):
        client_tool(untyped)
    explicit = client_tool(untyped, parameters={"type": "object"}, description="Echo.")
    assert explicit.to_wire() == {
        "name": "untyped", "description": "Echo.", "parameters": {"type": "object"},
    }  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
async def test_client_tools_sync_and_async_run_and_the_model_resumes(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(
        [
            tokens("Checking. " + call("t1", "get_weather", {"city": "Oslo"})),
            tokens(call("t2", "device.time", {"zone": "CET"})),
            tokens(sentinel_reply("Sunny at 19:00.")),
        ]
    )
    result = await run(mode, gw.url, "Weather?", tools=[], client_tools=[get_weather, device_time])
    assert_complete(result)
    assert [(c.name, c.executor) for c in result.tool_calls] == [
        ("get_weather", "client"),
        ("device.time", "client"),
    ]
    first, second = result.tool_results
    assert first.ok and first.result == {"city": "Oslo", "sky": "clear"}
    assert second.ok and second.result == {"zone": "CET", "time": "19:00"}
    assert result.value == {"answer": "Sunny at 19:00."}
    resumed = orjson.loads(gw.upstream.requests[2].body)["messages"]
    assert "19:00" in resumed[-1]["content"]
    system = orjson.loads(gw.upstream.requests[0].body)["messages"][0]["content"]
    assert "get_weather" in system and "device.time" in system


@pytest.mark.parametrize("mode", MODES)
async def test_a_failing_or_non_json_client_tool_is_reported_to_the_model(
    make_gateway: HarnessFactory, mode: str
) -> None:
    class GpsOff(Exception):
        code = "GPS_OFF"

    @client_tool(name="gps")
    def gps() -> dict[str, Any]:
        """Where the device is."""
        raise GpsOff("no fix")

    @client_tool(name="odd")
    def odd() -> Any:
        """Returns something that is not JSON."""
        return {1, 2}

    gw = await make_gateway(
        [tokens(call("t1", "gps", {})), tokens(call("t2", "odd", {})), tokens(sentinel_reply())]
    )
    result = await run(mode, gw.url, "Where?", tools=[], client_tools=[gps, odd])
    failed, not_json = result.tool_results
    assert not failed.ok and failed.error is not None and failed.error.message == "no fix"
    assert failed.error.details == [{"client_code": "GPS_OFF"}]
    assert not not_json.ok and not_json.error is not None
    assert not_json.error.details == [{"client_code": "RESULT_NOT_JSON"}]
    assert result.done is not None and result.done.reason == "stop"


# -- bad posts, HTTP errors and error frames ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_bad_results_posted_by_hand_raise_typed_errors(
    make_gateway: HarnessFactory, mode: str
) -> None:
    declared = {"name": "ask_user", "description": "Ask.", "parameters": {"type": "object"}}
    gw = await make_gateway([tokens(call("t1", "ask_user", {})), tokens(sentinel_reply())])
    errors: dict[str, Exception] = {}
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(gw.url) as client, client.stream("x", client_tools=[declared]) as s:
                for event in s:
                    if isinstance(event.data, ToolCall):
                        try:
                            s.submit_tool_result("t1", error="")  # a failure says why
                        except BadRequestError as exc:
                            errors["empty error"] = exc
                        for name, cid in (("unknown", "t9"), ("first", "t1"), ("dup", "t1")):
                            try:
                                s.submit_tool_result(cid, {"answer": "yes"})
                            except (NotFoundError, ConflictError) as exc:
                                errors[name] = exc
                return s.result

        result = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url) as client:
            async with await client.stream("x", client_tools=[declared]) as s:
                async for event in s:
                    if isinstance(event.data, ToolCall):
                        try:
                            await s.submit_tool_result("t1", error="")
                        except BadRequestError as exc:
                            errors["empty error"] = exc
                        for name, cid in (("unknown", "t9"), ("first", "t1"), ("dup", "t1")):
                            try:
                                await s.submit_tool_result(cid, {"answer": "yes"})
                            except (NotFoundError, ConflictError) as exc:
                                errors[name] = exc
                result = s.result
    assert set(errors) == {"empty error", "unknown", "dup"}
    assert isinstance(errors["empty error"], BadRequestError)
    assert errors["empty error"].status_code == 422
    assert isinstance(errors["unknown"], NotFoundError) and errors["unknown"].status_code == 404
    assert errors["unknown"].code == "NOT_FOUND" and "t1" in errors["unknown"].message
    assert isinstance(errors["dup"], ConflictError) and errors["dup"].status_code == 409
    assert result.tool_results[0].result == {"answer": "yes"}


@pytest.mark.parametrize("mode", MODES)
async def test_http_and_frame_errors_are_typed(make_gateway: HarnessFactory, mode: str) -> None:
    gw = await make_gateway()
    with pytest.raises(BadRequestError) as bad:
        await run(mode, gw.url, "x", extra_body={"temprature": 1})
    assert bad.value.status_code == 422 and bad.value.code == "BAD_REQUEST"
    assert bad.value.details and "temperature" in bad.value.details[0]["message"]
    with pytest.raises(NotFoundError):
        if mode == "sync":
            await in_thread(lambda: ToolForge(gw.url).resume("s_nope").until_done())
        else:
            await (await AsyncToolForge(gw.url).resume("s_nope")).until_done()
    # An upstream that refuses connections: an error frame, then done; run() raises it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    down = await make_gateway(upstream_base_url=f"http://127.0.0.1:{dead}/v1")
    with pytest.raises(UpstreamError) as err:
        await run(mode, down.url, "x")
    assert err.value.code == "UPSTREAM_UNAVAILABLE" and err.value.retryable
    assert err.value.result.done is not None and err.value.result.done.reason == "error"
    with pytest.raises(APIConnectionError):
        await run(mode, f"http://127.0.0.1:{dead}", "x")


# -- backpressure --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_pausing_two_seconds_pauses_the_upstream_and_loses_nothing(
    make_gateway: HarnessFactory, mode: str
) -> None:
    # A fast upstream: 2,000 frames of 10 KB at full speed. The client stops reading for
    # 2 s after the first one; its 64 KB receive buffer (httpx socket options) and the
    # gateway's 8-frame queue fill, and the gateway must stop reading the upstream.
    n = 2000
    gw = await make_gateway([Script.from_tokens(["x" * 10_000] * n)], queue_max_frames=8)
    small = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)]
    pausing = threading.Event()

    def on_text(chunk: str) -> None:
        if not pausing.is_set():
            pausing.set()
            time.sleep(2)  # a sync callback: not reading, whichever the client

    if mode == "sync":

        def go() -> StreamResult:
            http = httpx.Client(transport=httpx.HTTPTransport(socket_options=small), timeout=30)
            with http, ToolForge(gw.url, http_client=http) as client:
                return client.run("x", on_text=on_text)

        task = asyncio.create_task(in_thread(go))
    else:
        http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(socket_options=small), timeout=30
        )

        async def go_async() -> StreamResult:
            async with http, AsyncToolForge(gw.url, http_client=http) as client:
                # A blocking callback would stall the gateway too (one event loop): the
                # async client's pause is an awaiting one.
                async def on_text_async(chunk: str) -> None:
                    if not pausing.is_set():
                        pausing.set()
                        await asyncio.sleep(2)

                return await client.run("x", on_text=on_text_async)

        task = asyncio.create_task(go_async())
    assert await asyncio.to_thread(pausing.wait, 10), "no text arrived"
    await asyncio.sleep(1.0)
    session = next(iter(gw.gateway.registry._sessions.values()))
    assert session.running, "the stream finished although the client read nothing"
    assert session.log.pending() <= 8 and session.log.paused_s > 0
    stalled_at = session.log.last_id
    await asyncio.sleep(0.3)
    assert session.log.last_id == stalled_at, "the producer kept going while the queue was full"
    result = await task
    assert_complete(result)
    assert sum(isinstance(e.data, TextDelta) for e in result.events) == n
    assert len(result.text) == n * 10_000
    assert result.done is not None and result.done.reason == "stop"


# -- drop and resume -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_dropped_connection_resumes_with_last_event_id(
    make_gateway: HarnessFactory, mode: str
) -> None:
    words = [f"w{i} " for i in range(60)]
    gw = await make_gateway([Script.from_tokens([*words, sentinel_reply()], delay_ms=10)])
    async with DropProxy(gw.url, lambda seen: seen.count(b"event: text.delta") >= 5) as proxy:
        result = await run(mode, proxy.url, "x")
    assert proxy.dropped == 1 and proxy.connections >= 2
    assert result.resumes == 1
    assert_complete(result)  # every frame once: nothing lost, nothing twice
    assert result.text.startswith("".join(words))
    assert result.value == {"answer": "Two places are open."}
    assert len(gw.upstream.requests) == 1  # the model was not asked again


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_tool_answered_across_a_drop(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(
        [tokens(call("t1", "get_weather", {"city": "Rome"})), tokens(sentinel_reply("Warm."))]
    )
    async with DropProxy(gw.url, lambda seen: b"event: tool.call" in seen) as proxy:
        result = await run(mode, proxy.url, "x", tools=[], client_tools=[get_weather])
    assert proxy.dropped == 1 and result.resumes == 1
    assert_complete(result)
    assert result.tool_results[0].result == {"city": "Rome", "sky": "clear"}
    assert result.value == {"answer": "Warm."}


class _LosesFirstResultPost(httpx.HTTPTransport):
    """A real transport whose first ``tool_results`` POST fails to connect."""

    failed = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "/tool_results/" in request.url.path and not self.failed:
            self.failed += 1
            raise httpx.ConnectError("network down", request=request)
        return super().handle_request(request)


class _LosesFirstResultPostAsync(httpx.AsyncHTTPTransport):
    failed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "/tool_results/" in request.url.path and not self.failed:
            self.failed += 1
            raise httpx.ConnectError("network down", request=request)
        return await super().handle_async_request(request)


@pytest.mark.parametrize("mode", MODES)
async def test_a_result_post_that_fails_to_connect_is_sent_again(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(
        [tokens(call("t1", "get_weather", {"city": "Bergen"})), tokens(sentinel_reply())]
    )
    if mode == "sync":
        transport: Any = _LosesFirstResultPost()

        def go() -> StreamResult:
            with httpx.Client(transport=transport) as http:
                client = ToolForge(gw.url, http_client=http)
                return client.run("x", tools=[], client_tools=[get_weather])

        result = await in_thread(go)
    else:
        transport = _LosesFirstResultPostAsync()
        async with httpx.AsyncClient(transport=transport) as http:
            client = AsyncToolForge(gw.url, http_client=http)
            result = await client.run("x", tools=[], client_tools=[get_weather])
    assert transport.failed == 1
    assert result.tool_results[0].result == {"city": "Bergen", "sky": "clear"}


async def test_no_resume_when_disabled(make_gateway: HarnessFactory) -> None:
    words = [f"w{i} " for i in range(60)]
    gw = await make_gateway(
        [Script.from_tokens([*words, sentinel_reply()], delay_ms=10)], disconnect_grace_ms=300
    )
    async with DropProxy(gw.url, lambda seen: b"event: text.delta" in seen) as proxy:
        async with AsyncToolForge(proxy.url, max_resumes=0) as client:
            with pytest.raises(APIConnectionError) as err:
                await client.run("x")
    assert err.value.stream_id is not None and err.value.last_event_id >= 2
    await gw.settle()
    # With no resume, the SDK leaves on_disconnect at the gateway's default: a grace for a
    # resume that never comes, then cancelled.
    assert gw.gateway.registry.get(err.value.stream_id).reason == "client_disconnected"


@pytest.mark.parametrize("mode", MODES)
async def test_resume_by_hand_after_giving_up(make_gateway: HarnessFactory, mode: str) -> None:
    words = [f"w{i} " for i in range(40)]
    gw = await make_gateway([Script.from_tokens([*words, sentinel_reply()], delay_ms=10)])
    async with DropProxy(gw.url, lambda seen: b"event: text.delta" in seen) as proxy:
        if mode == "sync":

            def go() -> tuple[APIConnectionError, StreamResult]:
                with ToolForge(proxy.url, max_resumes=0) as client:
                    with pytest.raises(APIConnectionError) as err:
                        client.run("x", on_disconnect="continue")
                    e = err.value
                    assert e.stream_id is not None
                    with client.resume(e.stream_id, e.last_event_id) as rest:
                        return e, rest.until_done()

            dropped, rest = await in_thread(go)
        else:
            async with AsyncToolForge(proxy.url, max_resumes=0) as client:
                with pytest.raises(APIConnectionError) as err:
                    await client.run("x", on_disconnect="continue")
                dropped = err.value
                assert dropped.stream_id is not None
                resumed = await client.resume(dropped.stream_id, dropped.last_event_id)
                async with resumed:
                    rest = await resumed.until_done()
    assert rest.events[0].id == dropped.last_event_id + 1
    assert rest.value == {"answer": "Two places are open."}
    assert rest.done is not None and rest.done.reason == "stop"


@pytest.mark.parametrize("mode", MODES)
async def test_an_idempotency_key_replays_the_stored_stream(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway([tokens(sentinel_reply("Once."))])
    first = await run(mode, gw.url, "x", idempotency_key="k-1")
    again = await run(mode, gw.url, "x", idempotency_key="k-1")
    assert len(gw.upstream.requests) == 1  # the model answered once
    assert [(e.id, e.event) for e in again.events] == [(e.id, e.event) for e in first.events]
    assert again.value == first.value == {"answer": "Once."}


# -- cancel --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_stops_the_stream_and_the_upstream(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway([Script.from_tokens([f"t{i} " for i in range(500)], delay_ms=20)])
    answers: list[dict[str, Any]] = []
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(gw.url) as client, client.stream("x") as stream:
                for event in stream:
                    if isinstance(event.data, TextDelta) and not answers:
                        answers.append(stream.cancel())
                return stream.result

        result = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url) as client, await client.stream("x") as stream:
            async for event in stream:
                if isinstance(event.data, TextDelta) and not answers:
                    answers.append(await stream.cancel())
            result = stream.result
    assert answers[0]["cancelled"] is True and answers[0]["reason"] == "cancelled"
    assert_complete(result)
    assert result.done is not None and result.done.reason == "cancelled"
    await gw.settle(upstream_closed=True)


@pytest.mark.parametrize("mode", MODES)
async def test_leaving_a_stream_early_cancels_it(make_gateway: HarnessFactory, mode: str) -> None:
    gw = await make_gateway([Script.from_tokens([f"t{i} " for i in range(500)], delay_ms=20)])
    if mode == "sync":

        def go() -> str | None:
            with ToolForge(gw.url) as client, client.stream("x") as stream:
                for event in stream:
                    if isinstance(event.data, TextDelta):
                        break
                return stream.stream_id

        stream_id = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url) as client, await client.stream("x") as stream:
            async for event in stream:
                if isinstance(event.data, TextDelta):
                    break
            stream_id = stream.stream_id
    assert stream_id is not None
    await gw.settle(upstream_closed=True)
    assert gw.gateway.registry.get(stream_id).reason == "cancelled"


# -- timeouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_request_deadline_cancels_the_stream(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway([Script.from_tokens(["slow "] * 100, delay_ms=50)])
    started = time.perf_counter()
    with pytest.raises(RequestTimeoutError) as err:
        await run(mode, gw.url, "x", timeout=1.0)
    assert 0.9 < time.perf_counter() - started < 6  # 6: a loaded machine
    assert err.value.stream_id is not None and err.value.result.text.startswith("slow")
    await gw.settle(upstream_closed=True)
    assert gw.gateway.registry.get(err.value.stream_id).reason == "cancelled"


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_tool_over_its_timeout_is_a_timeout_result(
    make_gateway: HarnessFactory, mode: str
) -> None:
    @client_tool(name="slow_sync", timeout=0.2)
    def slow_sync() -> str:
        """Sleeps."""
        time.sleep(1)
        return "late"

    @client_tool(name="slow_async")
    async def slow_async() -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "late"

    gw = await make_gateway(
        [
            tokens(call("t1", "slow_sync", {})),
            tokens(call("t2", "slow_async", {})),
            tokens(sentinel_reply()),
        ]
    )
    started = time.perf_counter()
    result = await run(
        mode, gw.url, "x", tools=[], client_tools=[slow_sync, slow_async], tool_timeout=0.3
    )
    assert time.perf_counter() - started < 4  # the tools alone would take 1 s + 5 s
    for r in result.tool_results:
        assert not r.ok and r.error is not None
        assert r.error.details == [{"client_code": "CLIENT_TOOL_TIMEOUT"}]
        assert "did not finish" in r.error.message
    assert result.done is not None and result.done.reason == "stop"


@pytest.mark.parametrize("mode", MODES)
async def test_pings_keep_a_slow_stream_within_the_read_timeout(
    make_gateway: HarnessFactory, mode: str
) -> None:
    # The model is silent for 1.5 s between tokens; the client's read timeout is 0.8 s.
    # The gateway's pings (every 0.1 s here, 15 s by default) keep the line alive.
    gw = await make_gateway(
        [Script.from_tokens(["a b ", sentinel_reply()], delay_ms=1500)],
        ping_interval_s=0.1,
        idle_s=5.0,
    )
    timeout = httpx.Timeout(0.8, connect=2.0)
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(gw.url, timeout=timeout) as client:
                return client.run("x")

        result = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url, timeout=timeout) as client:
            result = await client.run("x")
    assert result.resumes == 0 and result.text.startswith("a b ")


@pytest.mark.parametrize("mode", MODES)
async def test_a_silent_gateway_is_a_timeout_after_the_resumes(
    make_gateway: HarnessFactory, mode: str
) -> None:
    # An upstream that hangs, no pings within the read timeout: each read times out, the
    # SDK resumes (max_resumes times), then raises APITimeoutError with where it was.
    gw = await make_gateway(
        [Script.from_tokens(["a "], finish=None, end="hang")], ping_interval_s=30, idle_s=10
    )
    timeout = httpx.Timeout(0.2, connect=2.0)
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(gw.url, timeout=timeout, max_resumes=2) as client:
                return client.run("x")

        with pytest.raises(APITimeoutError) as err:
            await in_thread(go)
    else:
        async with AsyncToolForge(gw.url, timeout=timeout, max_resumes=2) as client:
            with pytest.raises(APITimeoutError) as err:
                await client.run("x")
    assert "after 2 attempt(s)" in str(err.value) and err.value.last_event_id >= 2
    stream_id = err.value.stream_id
    assert stream_id is not None
    session = gw.gateway.registry.get(stream_id)
    assert session.running  # left resumable, not cancelled: the caller decides
    async with AsyncToolForge(gw.url) as client:
        assert (await client.cancel(stream_id))["cancelled"] is True
    await gw.settle(upstream_closed=True)
    assert session.reason == "cancelled"


# -- approvals -----------------------------------------------------------------------------


class _Args(BaseModel):
    seconds: float = Field(ge=0, le=10)


def _approval_registry(ran: list[float]) -> ToolRegistry:
    async def slow(args: _Args) -> dict[str, Any]:
        ran.append(args.seconds)
        return {"slept": args.seconds}

    spec = ToolSpec(
        name="slow", description="Sleeps.", args_model=_Args, fn=slow, needs_approval=True
    )
    return ToolRegistry([spec])


@pytest.mark.parametrize("mode", MODES)
async def test_approvals_by_callback(make_gateway: HarnessFactory, mode: str) -> None:
    ran: list[float] = []
    script = [tokens(call("t1", "slow", {"seconds": 0})), tokens(sentinel_reply())]
    gw = await make_gateway(script * 2, tools=_approval_registry(ran))
    asked: list[ToolCall] = []
    for approve in (True, False):

        def decide(call: ToolCall, approve: bool = approve) -> bool:
            asked.append(call)
            return approve

        result = await run(mode, gw.url, "x", on_approval=decide)
        (tool_result,) = result.tool_results
        assert tool_result.ok is approve
        if not approve:
            assert tool_result.error is not None
            assert tool_result.error.code == "TOOL_APPROVAL_DENIED"
    assert [c.needs_approval for c in asked] == [True, True]
    assert ran == [0]  # only the approved call ran


@pytest.mark.parametrize("mode", MODES)
async def test_approvals_by_hand(make_gateway: HarnessFactory, mode: str) -> None:
    ran: list[float] = []
    gw = await make_gateway(
        [tokens(call("t1", "slow", {"seconds": 0})), tokens(sentinel_reply())],
        tools=_approval_registry(ran),
    )
    if mode == "sync":

        def go() -> StreamResult:
            with ToolForge(gw.url) as client, client.stream("x") as stream:
                for event in stream:
                    if isinstance(event.data, ToolCall) and event.data.needs_approval:
                        assert stream.approve(event.data.id)["approved"] is True
                return stream.result

        result = await in_thread(go)
    else:
        async with AsyncToolForge(gw.url) as client, await client.stream("x") as stream:
            async for event in stream:
                if isinstance(event.data, ToolCall) and event.data.needs_approval:
                    assert (await stream.approve(event.data.id))["approved"] is True
            result = stream.result
    assert ran == [0] and result.tool_results[0].ok
    assert isinstance(result.tool_results[0], ToolResult)
