"""The proxy streams with the same care as ``/v1/stream`` (docs/protocol.md, docs/proxy.md): a
client that leaves closes the upstream within 50 ms (streaming or not), a slow client pauses the
upstream with nothing lost, every request has its artifacts, and the guardrails' actions
reach the headers and ``/metrics``."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.api.conftest import HarnessFactory, upstream_closed_within
from toolforge.eval.loopback import open_raw_stream
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.artifacts import ARTIFACT_FILES

USER = [{"role": "user", "content": "hi"}]
PROXY = "/v1/chat/completions"


async def test_a_streaming_client_that_leaves_closes_the_upstream(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([f"t{i} " for i in range(1000)], delay_ms=5)])
    body = {"model": "m", "messages": USER, "stream": True}
    reader, writer = await open_raw_stream(gw, body, path=PROXY)
    await reader.readuntil(b'"content":"t1 "')
    writer.transport.abort()
    elapsed = await upstream_closed_within(gw, 1.0)
    assert elapsed < 0.05, f"upstream still open {elapsed * 1000:.1f} ms after the client left"
    await gw.settle()
    (session,) = gw.gateway.registry._sessions.values()
    assert session.reason == "client_disconnected"


async def test_a_waiting_client_that_leaves_closes_the_upstream(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([f"t{i} " for i in range(1000)], delay_ms=5)])
    _, writer = await open_raw_stream(gw, {"model": "m", "messages": USER}, path=PROXY)
    async with asyncio.timeout(2):
        await gw.upstream.wait_for_requests(1)
    await asyncio.sleep(0.05)
    writer.transport.abort()
    assert await upstream_closed_within(gw, 1.0) < 0.05
    await gw.settle()


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "queued"])
async def test_a_slow_client_pauses_the_upstream_and_loses_nothing(
    make_gateway: HarnessFactory, relay: bool
) -> None:
    token = "x" * 10_000
    script = Script.from_tokens([token] * 1000)
    gw = await make_gateway([script], queue_max_frames=8, stream_relay=relay)
    body = {"model": "m", "messages": USER, "stream": True}
    reader, writer = await open_raw_stream(gw, body, path=PROXY, rcvbuf=4096)
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(0.5)  # the client stalls
    (session,) = gw.gateway.registry._sessions.values()
    assert session.running and session.log.paused_s > 0
    stalled_at = session.log.last_id
    await asyncio.sleep(0.2)
    assert session.log.last_id == stalled_at, "the producer kept going while the queue was full"
    data = b""
    while b"data: [DONE]" not in data[-64:]:
        chunk = await reader.read(1 << 16)
        assert chunk, "the stream ended without [DONE]"
        data += chunk
    writer.close()
    assert data.count(b'"content":"' + token.encode() + b'"') == 1000
    await gw.settle()


async def test_artifacts_headers_and_metrics(make_gateway: HarnessFactory) -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    gw = await make_gateway([Script.from_tokens([text])])
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    body = {"model": "m", "messages": USER, "tools": [tool]}
    response = await gw.client.post(f"{gw.url}{PROXY}", json=body)
    assert response.status_code == 200
    assert response.headers["x-toolforge-mode"] == "native"
    assert response.headers["x-toolforge-rescued"] == "1"
    assert "rescue" in response.headers["x-toolforge-guardrails"].split(",")
    stream_id = response.headers["x-stream-id"]
    metrics = await gw.metrics(stream_id)
    assert metrics["guardrails"] == {"rescued": 1}
    run = gw.artifacts / "runs" / stream_id
    prompt = orjson.loads((run / "prompt.json").read_bytes())
    assert prompt["api"] == "chat.completions" and prompt["guardrails"]["rescue"] is True
    assert set(ARTIFACT_FILES) <= {p.name for p in run.iterdir()}
    exposition = (await gw.client.get(f"{gw.url}/metrics")).text
    assert 'toolforge_guardrail_actions_total{action="rescued"} 1.0' in exposition
