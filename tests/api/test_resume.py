"""Resume with Last-Event-ID, idempotent replay, cancel, and bad requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from httpx_sse import aconnect_sse

from tests.api.conftest import (
    Event,
    Harness,
    HarnessFactory,
    assert_well_formed,
    frames,
)
from toolforge.eval.scripted_upstream import Script, Step

JSON = {"Content-Type": "application/json"}  # bodies sent as bytes say what they are


async def _read_some(gw: Harness, body: dict[str, object], n: int) -> tuple[str, list[Event]]:
    """Start a stream, read ``n`` frames, drop the connection."""
    got: list[Event] = []
    async with aconnect_sse(gw.client, "POST", f"{gw.url}/v1/stream", json=body) as source:
        stream_id = source.response.headers["x-stream-id"]
        async for sse in source.aiter_sse():
            if sse.event != "ping":
                got.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
            if len(got) == n:
                break
    return stream_id, got


async def _resume(gw: Harness, stream_id: str, last_id: str) -> list[Event]:
    return await gw.stream_get(stream_id, last_id)


async def test_resume_after_a_dropped_connection_gets_the_rest_exactly_once(
    make_gateway: HarnessFactory,
) -> None:
    script = Script.from_tokens([f"w{i} " for i in range(60)], delay_ms=3)
    gw = await make_gateway([script])
    stream_id, first = await _read_some(gw, {"input": "x", "on_disconnect": "continue"}, 10)
    rest = await _resume(gw, stream_id, first[-1].id)
    whole = first + frames(rest)
    assert_well_formed(whole)  # ids 1..n, each exactly once, one done, last
    text = "".join(e.data["chunk"] for e in whole if e.event == "text.delta")
    assert text == "".join(f"w{i} " for i in range(60))
    assert whole[-1].data["reason"] == "stop"
    await gw.settle()


async def test_resume_after_cancel_on_disconnect_replays_what_was_sent(
    make_gateway: HarnessFactory,
) -> None:
    script = Script.from_tokens([f"w{i} " for i in range(500)], delay_ms=5)
    gw = await make_gateway([script])
    stream_id, first = await _read_some(gw, {"input": "x", "on_disconnect": "cancel"}, 5)
    await gw.settle()
    rest = frames(await _resume(gw, stream_id, first[-1].id))
    whole = first + rest
    assert_well_formed(whole)
    assert whole[-1].data["reason"] == "client_disconnected"


async def test_resume_from_zero_and_from_the_end(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["a", "b"])])
    original = frames(await gw.stream())
    stream_id = original[0].data["stream_id"]
    assert frames(await _resume(gw, stream_id, "0")) == original
    assert frames(await _resume(gw, stream_id, original[-1].id)) == []


async def test_resume_errors(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["a"])])
    stream_id = frames(await gw.stream())[0].data["stream_id"]
    missing = await gw.client.get(f"{gw.url}/v1/streams/s_nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    bad = await gw.client.get(f"{gw.url}/v1/streams/{stream_id}", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422 and "Last-Event-ID" in bad.json()["error"]["message"]


async def test_resumed_stream_expires_after_the_ttl(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["a"])], resume_ttl_s=0.1)
    stream_id = frames(await gw.stream())[0].data["stream_id"]
    await gw.settle()
    await asyncio.sleep(0.2)
    assert (await gw.client.get(f"{gw.url}/v1/streams/{stream_id}")).status_code == 404


async def test_idempotent_replay_is_byte_identical(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["one ", "two"])])
    headers = {"Idempotency-Key": "k-1"}
    first, body1 = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=headers)
    second, body2 = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=headers)
    assert body1 == body2 and b"event: done" in body1
    assert second.headers["idempotent-replayed"] == "true"
    assert first.headers["x-stream-id"] == second.headers["x-stream-id"]
    assert len(gw.upstream.requests) == 1  # the model ran once


async def test_idempotency_key_in_flight_is_409_and_different_body_is_422(
    make_gateway: HarnessFactory,
) -> None:
    script = Script(steps=(Step(text="a"), Step(text="b", delay_ms=500), Step(finish="stop")))
    gw = await make_gateway([script])
    headers = {"Idempotency-Key": "k-2"}
    running = asyncio.create_task(gw.stream({"input": "x"}, headers=headers))
    async with asyncio.timeout(2):
        await gw.upstream.wait_for_requests(1)
    busy = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "x"}, headers=headers)
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "IDEMPOTENCY_IN_FLIGHT"
    other = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "y"}, headers=headers)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert_well_formed(await running)


async def test_cancel_endpoint_stops_the_stream(make_gateway: HarnessFactory) -> None:
    script = Script.from_tokens([f"t{i}" for i in range(1000)], delay_ms=5)
    gw = await make_gateway([script])
    reading = asyncio.create_task(gw.stream())
    async with asyncio.timeout(2):
        await gw.upstream.wait_for_requests(1)
    stream_id = next(iter(gw.gateway.registry._sessions))
    response = await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/cancel")
    assert response.json() == {"stream_id": stream_id, "cancelled": True, "reason": "cancelled"}
    events = await reading
    assert_well_formed(events)
    assert frames(events)[-1].data["reason"] == "cancelled"
    await gw.settle()
    again = await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/cancel")
    assert again.json()["cancelled"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "(body)"),
        ({"input": "x", "messages": [{"role": "user", "content": "y"}]}, "(body)"),
        ({"input": "x", "temperature": 1}, "temperature"),
        ({"input": "x", "sampling": {"temperature": 9}}, "sampling.temperature"),
        ({"input": "x", "mode": "magic"}, "mode"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"input": "x", "max_tool_calls": -1}, "max_tool_calls"),
        ({"input": "x", "result_schema": "has space"}, "result_schema"),
    ],
)
async def test_bad_bodies_are_422_naming_the_field(
    make_gateway: HarnessFactory, body: dict[str, object], field: str
) -> None:
    gw = await make_gateway()
    response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["retryable"] is False
    assert error["details"][0]["field"] == field
    assert field in error["message"]
    assert not gw.upstream.requests


async def test_a_misspelt_field_gets_a_suggestion(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "x", "temprature": 1})
    message = response.json()["error"]["message"]
    assert "unknown field" in message and "did you mean 'sampling.temperature'" in message


async def test_body_that_is_not_json_is_422(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(f"{gw.url}/v1/stream", content=b"{nope", headers=JSON)
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]["message"]


async def test_oversized_body_is_413(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(max_body_bytes=4096)
    big = {"input": "x" * 5000}
    response = await gw.client.post(f"{gw.url}/v1/stream", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "BODY_TOO_LARGE"

    async def chunks() -> object:  # no Content-Length: counted while reading
        for _ in range(10):
            yield b"x" * 1000

    response = await gw.client.post(f"{gw.url}/v1/stream", content=chunks(), headers=JSON)
    assert response.status_code == 413


async def test_unavailable_modes_are_refused_clearly(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "x", "mode": "constrained"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "MODE_UNAVAILABLE"


async def test_a_body_sent_in_pieces_is_read_whole(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"])])

    async def pieces() -> AsyncIterator[bytes]:  # chunked, no Content-Length: several receives
        for part in (b'{"inp', b'ut": "h', b'i", "mode": "sentinel"}'):
            yield part

    response = await gw.client.post(f"{gw.url}/v1/stream", content=pieces(), headers=JSON)
    assert response.status_code == 200
    assert "event: done" in response.text and "event: error" not in response.text
    data = [orjson.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    assert "".join(d.get("chunk", "") for d in data) == "Hello"


async def test_a_bug_before_the_stream_is_a_typed_500(
    make_gateway: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await make_gateway()

    async def broken(*args: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr("toolforge.api.fastpath.start_stream", broken)
    response = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "hi"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "INTERNAL"
    assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200  # still serving
