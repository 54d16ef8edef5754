"""POST /v1/stream end to end: frames, ids, done, pings, chunk boundaries, artifacts."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from tests.api.conftest import (
    HarnessFactory,
    assert_well_formed,
    frames,
    open_raw_stream,
    sentinel_reply,
)
from toolforge.api import sse
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import PING_BYTES
from toolforge.eval.scripted_upstream import Script, Step


def tokens(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


async def test_happy_path_text_object_and_result(make_gateway: HarnessFactory) -> None:
    action = '{"mode":"search","target":{"kind":"place","id":"p1"}}'
    obj = sentinels.frame(FrameKind.OBJECT, "o1", "Action", action)
    text = "Looking. " + obj + " " + sentinel_reply()
    gw = await make_gateway(
        [Script.from_tokens(tokens(text), usage={"prompt_tokens": 10, "completion_tokens": 42})]
    )
    events = await gw.stream({"input": "Find pizza near me", "model": "tiny"})
    assert_well_formed(events)
    by_event = {e.event: e.data for e in frames(events)}
    assert by_event["stream.begin"]["model"] == "tiny"
    assert by_event["stream.begin"]["mode"] == "sentinel"
    assert by_event["stream.begin"]["stream_id"].startswith("s_")
    assert by_event["json.begin"] == {"id": "o1", "schema": "Action"}
    assert by_event["json.end"]["value"] == {
        "mode": "search",
        "target": {"kind": "place", "id": "p1"},
    }
    assert by_event["json.end"]["repaired"] is False and by_event["json.end"]["degraded"] is False
    assert by_event["result.end"]["value"] == {"answer": "Two places are open."}
    assert by_event["done"]["reason"] == "stop"
    assert by_event["done"]["usage"] == {"prompt_tokens": 10, "completion_tokens": 42}
    text_out = "".join(e.data["chunk"] for e in frames(events) if e.event == "text.delta")
    assert text_out == "Looking.  Here you go. "
    deltas = "".join(e.data["chunk"] for e in frames(events) if e.event == "json.delta")
    assert json.loads(deltas) == by_event["json.end"]["value"]
    assert by_event["json.end"]["length"] == len(deltas.encode())
    # What the gateway sent upstream: our system prompt first, the user's input, streaming.
    sent = gw.upstream.requests[0].json
    assert sent["stream"] is True and sent["model"] == "tiny"
    assert (
        sent["messages"][0]["role"] == "system" and "BEGIN_RESULT" in sent["messages"][0]["content"]
    )
    assert sent["messages"][1] == {"role": "user", "content": "Find pizza near me"}
    await gw.settle()


async def test_text_only_stream(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Hello", ", ", "world", "!"])])
    events = await gw.stream()
    assert_well_formed(events)
    assert [e.event for e in frames(events)] == ["stream.begin"] + ["text.delta"] * 4 + ["done"]
    assert "".join(e.data["chunk"] for e in frames(events)[1:-1]) == "Hello, world!"


async def test_sentinels_split_across_upstream_chunks_and_inside_utf8(
    make_gateway: HarnessFactory,
) -> None:
    text = "Résumé 👩‍💻 " + sentinel_reply("Ça marche ⟦ok⟧ 👍")
    # One character per upstream event, and every event's bytes cut in two, which splits
    # each multi-byte character (⟦ is 3 bytes in UTF-8) across TCP writes.
    steps = [Step(text=ch, split=(7,)) for ch in text]
    gw = await make_gateway([Script(steps=(*steps, Step(finish="stop")))])
    events = await gw.stream()
    assert_well_formed(events)
    result = next(e.data for e in frames(events) if e.event == "result.end")
    assert result["value"] == {"answer": "Ça marche ⟦ok⟧ 👍"}
    text_out = "".join(e.data["chunk"] for e in frames(events) if e.event == "text.delta")
    assert text_out == "Résumé 👩‍💻 Here you go. "


async def test_finish_reason_length_is_reported(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["a", "b"], finish="length")])
    events = await gw.stream({"input": "x", "sampling": {"max_tokens": 2}})
    assert frames(events)[-1].data["reason"] == "length"
    assert gw.upstream.requests[0].json["max_tokens"] == 2


async def test_demo_profile_and_explicit_sampling(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["x"]), Script.from_tokens(["y"])])
    await gw.stream({"input": "x", "profile": "demo"})
    await gw.stream({"input": "x", "profile": "demo", "sampling": {"temperature": 0}})
    first, second = (r.json for r in gw.upstream.requests)
    assert (first["temperature"], first["seed"], first["max_tokens"]) == (0.2, 42, 384)
    assert (second["temperature"], second["seed"]) == (0, 42)


async def test_pings_flow_while_the_upstream_is_silent(make_gateway: HarnessFactory) -> None:
    script = Script(steps=(Step(text="a"), Step(text="b", delay_ms=400), Step(finish="stop")))
    gw = await make_gateway([script], ping_interval_s=0.05)
    _, body = await gw.raw("POST", "/v1/stream", json={"input": "x"})
    # A ping has no id line: it never moves the client's Last-Event-ID (SSE semantics).
    assert body.count(b"\n\n" + PING_BYTES) >= 4
    assert b"id: 2\nevent: text.delta" in body and b"id: 3\nevent: text.delta" in body


async def test_headers_for_proxies_and_resume(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["x"])])
    response, body = await gw.raw("POST", "/v1/stream", json={"input": "x"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-stream-id"].startswith("s_")
    assert body.startswith(b"id: 1\nevent: stream.begin\ndata: {")


async def _first_body_chunk(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The response head, and the first chunk of its chunked body (one ``send``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
    return head, await reader.readexactly(size)


async def test_a_first_frame_that_comes_quickly_goes_out_with_the_head(
    make_gateway: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hold far longer than this upstream takes, so the outcome does not depend on the
    # machine's speed: the head waits for the first frame, which then goes out in the
    # same write as stream.begin (before, stream.begin went out alone, first).
    monkeypatch.setattr(sse, "HEAD_HOLD_S", 10.0)
    gw = await make_gateway([Script.from_tokens(["Hel", "lo"])])
    reader, writer = await open_raw_stream(gw, {"input": "x"})
    try:
        head, chunk = await asyncio.wait_for(_first_body_chunk(reader), 5)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert chunk.startswith(b"id: 1\nevent: stream.begin\n")
    assert b"id: 2\nevent: text.delta\n" in chunk


async def test_a_slow_first_token_does_not_hold_the_head(make_gateway: HarnessFactory) -> None:
    # The first token is 2 s away; the head and stream.begin come after HEAD_HOLD_S.
    script = Script(steps=(Step(text="late", delay_ms=2000), Step(finish="stop")))
    gw = await make_gateway([script])
    reader, writer = await open_raw_stream(gw, {"input": "x"})
    try:
        head, chunk = await asyncio.wait_for(_first_body_chunk(reader), 1.5)
        (session,) = gw.gateway.registry._sessions.values()
        assert session.log.last_id == 1, "the head waited for the first token"
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert chunk.startswith(b"id: 1\nevent: stream.begin\n") and b"text.delta" not in chunk


async def test_protocol_violation_ends_with_error_then_done(make_gateway: HarnessFactory) -> None:
    text = f"hi {sentinels.end(FrameKind.OBJECT, 'x')} never shown" + " more" * 20
    # Paced, so the violation comes while the upstream is still sending.
    gw = await make_gateway([Script.from_tokens(tokens(text, 4), delay_ms=5)])
    events = await gw.stream()
    assert_well_formed(events)
    names = [e.event for e in frames(events)]
    assert names[-2:] == ["error", "done"]
    error = frames(events)[-2].data
    assert error["code"] == "END_WITHOUT_BEGIN" and error["frame_id"] == "x"
    assert error["retryable"] is True
    assert frames(events)[-1].data["reason"] == "error"
    assert "never shown" not in "".join(
        e.data.get("chunk", "") for e in frames(events) if e.event == "text.delta"
    )
    await gw.settle(upstream_closed=True)  # abandoned midway: the connection is closed


async def test_artifacts_are_complete_and_match_the_stream(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(tokens(sentinel_reply()))])
    events = await gw.stream({"input": "my key is sk-abcdef1234567890abcdef"})
    stream_id = frames(events)[0].data["stream_id"]
    await gw.settle()
    run = gw.artifacts / "runs" / stream_id
    assert sorted(p.name for p in run.iterdir()) == [
        "frames.ndjson", "metrics.json", "prompt.json", "result.json", "tool_logs.json",
    ]  # fmt: skip
    written = [orjson.loads(line) for line in (run / "frames.ndjson").read_bytes().splitlines()]
    received = [{"id": int(e.id), "event": e.event, "data": e.data} for e in frames(events)]
    assert written == received
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    assert metrics["reason"] == "stop"
    assert metrics["ttft_ms"] is not None and metrics["ttft_ms"] >= 0
    assert metrics["frames"] == len(received)
    assert metrics["queue_high_water"] <= metrics["queue_max_frames"]
    prompt = (run / "prompt.json").read_text()
    assert "sk-abcdef1234567890abcdef" not in prompt  # secrets redacted
    result = orjson.loads((run / "result.json").read_bytes())
    assert result["results"][0]["value"] == {"answer": "Two places are open."}


async def test_concurrent_streams_are_independent(make_gateway: HarnessFactory) -> None:
    scripts = [Script.from_tokens([f"s{i}-", "x", "y"], delay_ms=5) for i in range(20)]
    gw = await make_gateway(scripts)
    results = await asyncio.gather(*(gw.stream() for _ in range(20)))
    texts = sorted(
        "".join(e.data["chunk"] for e in frames(ev) if e.event == "text.delta") for ev in results
    )
    assert texts == sorted(f"s{i}-xy" for i in range(20))
    for events in results:
        assert_well_formed(events)
    await gw.settle()


async def test_artifacts_are_written_when_the_stream_fails(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script(steps=(Step(text="partial "),), end="rst")])
    events = await gw.stream()
    stream_id = frames(events)[0].data["stream_id"]
    await gw.settle()
    run = gw.artifacts / "runs" / stream_id
    written = [orjson.loads(line) for line in (run / "frames.ndjson").read_bytes().splitlines()]
    assert [f["event"] for f in written] == ["stream.begin", "text.delta", "error", "done"]
    result = orjson.loads((run / "result.json").read_bytes())
    assert result["reason"] == "error" and result["error"]["code"] == "UPSTREAM_PROTOCOL"
    assert orjson.loads((run / "metrics.json").read_bytes())["reason"] == "error"


async def test_system_prompts_are_rendered_once_per_schema_and_tool_set(
    make_gateway: HarnessFactory,
) -> None:
    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])] * 4)
    await gw.stream({"input": "a", "object_schemas": ["Action"]})
    await gw.stream({"input": "b", "object_schemas": ["Action"]})
    await gw.stream({"input": "c", "object_schemas": [{"name": "Point", "schema": point}]})
    await gw.stream({"input": "d"})
    systems = [r.json["messages"][0]["content"] for r in gw.upstream.requests]
    assert systems[0] == systems[1] and "Action" in systems[0]
    assert '"x"' in systems[2] and systems[3] != systems[0]
    # The two registered-schema combinations are cached; the inline schema is not.
    cached = [shape.system for shape in gw.gateway.planner.shapes.values()]
    assert len(cached) == 2
    assert systems[0] in cached
    assert not any("Point" in p for p in cached)


async def test_the_stream_route_is_still_documented(make_gateway: HarnessFactory) -> None:
    # POST /v1/stream is served past FastAPI's routing (app/api/fastpath.py); its docs stay.
    gw = await make_gateway()
    schema = (await gw.client.get(f"{gw.url}/openapi.json")).json()
    assert "post" in schema["paths"]["/v1/stream"]
    params = {p["name"] for p in schema["paths"]["/v1/stream"]["post"].get("parameters", [])}
    assert "idempotency-key" in params


async def test_an_overlong_idempotency_key_is_a_typed_422(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "x"}, headers={"Idempotency-Key": "k" * 256}
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and "Idempotency-Key" in error["message"]
    assert gw.gateway.registry._sessions == {}  # nothing started


async def test_each_stream_logs_its_start_and_end(
    make_gateway: HarnessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = await make_gateway([Script.from_tokens(["Hello", " there"])], log_level="INFO")
    events = await gw.stream()
    await gw.settle()
    stream_id = frames(events)[0].data["stream_id"]
    lines = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    ours = [e["event"] for e in lines if e.get("stream_id") == stream_id]
    assert ours[0] == "stream.started" and ours[-1] == "stream.finished"


async def test_a_receive_that_raises_counts_as_the_client_leaving() -> None:
    # Some ASGI servers raise from receive() once the client is gone instead of sending
    # http.disconnect; the writer's watcher must end quietly either way.
    from toolforge.api.sse import _until_disconnect

    messages = iter([{"type": "http.request", "body": b"", "more_body": False}])

    async def receive() -> dict[str, object]:
        for message in messages:
            return message
        raise OSError("connection reset")

    async with asyncio.timeout(1):
        await _until_disconnect(receive)  # type: ignore[arg-type]


def test_the_gateway_dependency_runs_on_the_event_loop() -> None:
    # FastAPI runs a plain ``def`` dependency in its thread pool: a thread hop before
    # every request's first byte. get_gateway must stay a coroutine function.
    import inspect

    from toolforge.api.deps import get_gateway

    assert inspect.iscoroutinefunction(get_gateway)
