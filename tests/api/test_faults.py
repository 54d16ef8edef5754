"""Upstream faults and client disconnects: every case ends with a defined terminal frame,
releases the upstream connection and leaves nothing running."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.api.conftest import (
    Harness,
    HarnessFactory,
    assert_well_formed,
    frames,
    open_raw_stream,
    upstream_closed_within,
)
from toolforge.api import sse
from toolforge.eval.scripted_upstream import Script, Step
from toolforge.upstream.transport import UpstreamClient


async def _error_of(gw: Harness) -> tuple[dict[str, object], str]:
    events = await gw.stream()
    assert_well_formed(events)
    numbered = frames(events)
    assert numbered[-2].event == "error"
    return numbered[-2].data, numbered[-1].data["reason"]


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        (
            Script(steps=(Step(text="partial"),), end="rst"),
            "UPSTREAM_PROTOCOL",
            "closed the stream early",
        ),
        (
            Script(steps=(Step(text="partial"),), end="fin"),
            "UPSTREAM_PROTOCOL",
            "closed the stream early",
        ),
        (Script(steps=(Step(text="partial"),), end="eof"), "UPSTREAM_PROTOCOL", "early"),
        (Script(steps=(Step(raw="data: {not json\n\n"),)), "UPSTREAM_PROTOCOL", "non-JSON"),
        (Script(end="hang_before_headers"), "UPSTREAM_TIMEOUT", "first-byte"),
        (Script(steps=(Step(text="a"),), end="hang"), "UPSTREAM_TIMEOUT", "idle"),
        (
            Script(end="status", status=500, body='{"error":{"message":"boom"}}'),
            "UPSTREAM_HTTP_ERROR",
            "500",
        ),
        (
            Script(end="status", status=401, body='{"error":{"message":"bad key"}}'),
            "UPSTREAM_HTTP_ERROR",
            "401",
        ),
    ],
    ids=[
        "rst",
        "fin",
        "eof-without-done",
        "malformed-sse",
        "hang-before-headers",
        "hang-mid-stream",
        "http-500",
        "http-401",
    ],
)
async def test_upstream_faults_become_typed_errors(
    make_gateway: HarnessFactory, script: Script, code: str, words: str
) -> None:
    gw = await make_gateway([script], first_byte_s=0.3, idle_s=0.3)
    error, reason = await _error_of(gw)
    assert error["code"] == code
    assert words in str(error["message"])
    assert reason == "error"
    # A response that arrived whole (a status, EOF, a bad event then [DONE]) may go back
    # to the pool; one abandoned midway must be closed.
    await gw.settle(upstream_closed=script.end not in ("status", "eof", "done"))


def _dead_url() -> str:
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/v1"


async def test_dead_upstream_is_unavailable(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(upstream_base_url=_dead_url())
    error, _ = await _error_of(gw)
    assert error["code"] == "UPSTREAM_UNAVAILABLE" and error["retryable"] is True


async def test_readyz_reports_the_upstream(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(routes={"/v1/models": Script(end="status", status=200, body="{}")})
    assert (await gw.client.get(f"{gw.url}/readyz")).json()["status"] == "ready"
    assert (await gw.client.get(f"{gw.url}/healthz")).json() == {"status": "ok"}
    dead = await make_gateway(upstream_base_url=_dead_url())
    response = await dead.client.get(f"{dead.url}/readyz")
    assert response.status_code == 503 and response.json()["status"] == "unavailable"


async def test_client_disconnect_mid_token_cancels_the_upstream_fast(
    make_gateway: HarnessFactory,
) -> None:
    # The upstream keeps streaming slowly; the client reads a little, then hangs up.
    script = Script.from_tokens([f"t{i} " for i in range(1000)], delay_ms=5)
    gw = await make_gateway([script])
    reader, writer = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    await reader.readuntil(b"event: text.delta")
    assert gw.upstream.open_connections == 1
    writer.transport.abort()
    elapsed = await upstream_closed_within(gw, 1.0)
    assert elapsed < 0.05, f"upstream still open {elapsed * 1000:.1f} ms after the client left"
    await gw.settle()
    session = next(iter(gw.gateway.registry._sessions.values()))
    assert session.reason == "client_disconnected"
    assert session.log.frames[-1].event == "done"


async def test_client_disconnect_during_an_upstream_stall(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script(steps=(Step(text="a"),), end="hang")], idle_s=30)
    reader, writer = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    await reader.readuntil(b"event: text.delta")
    writer.close()
    assert await upstream_closed_within(gw, 1.0) < 0.05
    await gw.settle()


async def test_client_gone_right_after_sending(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script(end="hang_before_headers")] * 2, first_byte_s=30)
    _, writer = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    writer.transport.abort()  # gone before reading a single byte of the answer
    await asyncio.sleep(0.1)
    await upstream_closed_within(gw, 1.0)
    await gw.settle()
    assert all(s.reason == "client_disconnected" for s in gw.gateway.registry._sessions.values())


@pytest.mark.parametrize("head_held", [False, True], ids=["head-written", "head-held"])
async def test_client_gone_before_the_upstream_answered(
    make_gateway: HarnessFactory, monkeypatch: pytest.MonkeyPatch, head_held: bool
) -> None:
    if head_held:  # the head still waits for the first frame when the client goes
        monkeypatch.setattr(sse, "HEAD_HOLD_S", 30.0)
    gw = await make_gateway([Script(end="hang_before_headers")], first_byte_s=30)
    _, writer = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    async with asyncio.timeout(2):
        await gw.upstream.wait_for_requests(1)
    writer.transport.abort()
    assert await upstream_closed_within(gw, 1.0) < 0.05
    await gw.settle()
    (session,) = gw.gateway.registry._sessions.values()
    assert session.reason == "client_disconnected"
    assert [f.event for f in session.log.frames] == ["stream.begin", "done"]
    assert (gw.artifacts / "runs" / session.id / "metrics.json").exists()
    if head_held:
        assert session.log.bytes_written == 0  # nothing went out, not even the head


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "queued"])
async def test_slow_client_pauses_the_upstream_and_loses_nothing(
    make_gateway: HarnessFactory, relay: bool
) -> None:
    # 2,000 frames of 10 KB: far more than the kernel's socket buffers hold (up to 4 MB
    # each way on loopback), so a client that stops reading must stop the gateway, and
    # the gateway must stop reading the upstream.
    token = "x" * 10_000
    script = Script.from_tokens([token] * 2000)
    gw = await make_gateway([script], queue_max_frames=8, stream_relay=relay)
    reader, writer = await open_raw_stream(gw, {"input": "x"}, rcvbuf=4096)
    await reader.readuntil(b"event: stream.begin")
    await asyncio.sleep(0.5)  # the client stalls
    session = next(iter(gw.gateway.registry._sessions.values()))
    assert session.running, "the stream finished although the client read nothing"
    assert session.log.pending() <= 8
    assert session.log.paused_s > 0
    stalled_at = session.log.last_id
    await asyncio.sleep(0.2)
    assert session.log.last_id == stalled_at, "the producer kept going while the queue was full"
    # Now read everything: all 2,000 tokens arrive, in order, exactly once.
    body = b""
    while b"event: done" not in body[-4096:]:
        chunk = await reader.read(1 << 16)
        assert chunk, "the stream ended without done"
        body += chunk
    writer.close()
    assert body.count(b"event: text.delta") == 2000
    await gw.settle()
    assert session.log.high_water <= 8
    assert session.reason == "stop"


def upstream_connections(gw: Harness) -> int:
    """Connections the gateway's upstream pool holds open (its lean transport's count)."""
    client = gw.gateway.client
    assert isinstance(client, UpstreamClient)  # what create_app builds
    return client.lean.connections


async def test_many_hang_ups_leave_no_upstream_connection_open(
    make_gateway: HarnessFactory,
) -> None:
    # Under load, a cancelled upstream read must still release its connection (with
    # httpcore, a native task.cancel() landing inside its cleanup once left the pool
    # entry ACTIVE and the socket open, the model server still generating into it).
    n = 40
    scripts = [Script.from_tokens([f"t{i} " for i in range(2000)], delay_ms=1) for _ in range(n)]
    gw = await make_gateway(scripts)
    clients = [
        await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"}) for _ in range(n)
    ]
    for reader, _ in clients:
        await reader.readuntil(b"event: text.delta")
    for _, writer in clients:
        writer.transport.abort()
    await gw.settle()
    async with asyncio.timeout(3):
        await gw.upstream.wait_connections_closed()
    assert upstream_connections(gw) == 0, f"{upstream_connections(gw)} upstream connections kept"


async def test_a_body_that_lingers_after_done_is_released(make_gateway: HarnessFactory) -> None:
    # [DONE] arrives but the server keeps the body open: the adapter stops waiting for the
    # end of the body, and the connection must be closed, not kept ACTIVE in the pool.
    lingering = Script(steps=(Step(text="hi"), Step(raw="data: [DONE]\n\n")), end="hang")
    gw = await make_gateway([lingering] * 20)
    results = await asyncio.gather(*(gw.stream() for _ in range(20)))
    assert all(frames(r)[-1].data["reason"] == "stop" for r in results)
    await gw.settle()
    async with asyncio.timeout(3):
        await gw.upstream.wait_connections_closed()
    assert upstream_connections(gw) == 0, f"{upstream_connections(gw)} upstream connections kept"


@pytest.mark.parametrize("preconnect", [True, False], ids=["preconnect", "off"])
async def test_a_spare_connection_replaces_the_one_the_upstream_closed(
    make_gateway: HarnessFactory, preconnect: bool
) -> None:
    # Like llama-server, the upstream closes the connection after each streamed response;
    # with UPSTREAM_PRECONNECT (the default) the next stream's request finds a connection
    # already open.
    script = {"steps": [{"text": "hi"}], "chunked": False}
    gw = await make_gateway([script] * 3, upstream_preconnect=preconnect)
    up = gw.upstream
    for n in range(1, 4):
        assert frames(await gw.stream())[-1].data["reason"] == "stop"
        if preconnect:  # wait for the spare that replaces this stream's connection
            async with asyncio.timeout(2):
                while (up.connections_total, up.open_connections) != (n + 1, 1):  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
    # With a spare, each stream after the first went out on the connection opened after
    # the stream before it ended.
    assert [r.connection for r in up.requests] == [1, 2, 3]
    if not preconnect:
        await asyncio.sleep(0.05)
        assert (up.connections_total, up.open_connections) == (3, 0)
