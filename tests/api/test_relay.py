"""The relay (``STREAM_RELAY``): a paced token is parsed and turned into frames in the
upstream read's callback, a caught-up client's frames are written from there too, and the
queued path takes over whenever it is needed (docs/performance.md).

The byte-for-byte comparison of the two paths over every conformance case is
``tests/conformance/test_relay_identity.py``; the slow-client tests of ``test_faults.py``
and ``test_proxy_streaming.py`` run on both paths.
"""

from __future__ import annotations

import asyncio
import dataclasses

import orjson
import pytest

from tests.api.conftest import HarnessFactory, assert_well_formed, frames
from toolforge.eval.loopback import open_raw_stream
from toolforge.eval.scripted_upstream import End, Script, Step
from toolforge.upstream.base import UpstreamDelta


@pytest.mark.parametrize("relay", [True, False], ids=["relay", "queued"])
async def test_paced_tokens_take_the_relay_when_it_is_on(
    make_gateway: HarnessFactory, relay: bool
) -> None:
    tokens = [f"t{i} " for i in range(20)]
    gw = await make_gateway([Script.from_tokens(tokens, delay_ms=5)], stream_relay=relay)
    events = await gw.stream()
    assert_well_formed(events)
    assert [f.data["chunk"] for f in frames(events) if f.event == "text.delta"] == tokens
    await gw.settle()
    (session,) = gw.gateway.registry._sessions.values()
    if relay:  # all but the first frame (it waits for the head) and done
        assert session.log.relayed >= len(tokens) - 2
        # and all but the first token were taken in the upstream read's callback
        assert session.delivered >= len(tokens) - 1
    else:
        assert session.log.relayed == 0
        assert session.delivered == 0


async def test_a_client_that_falls_behind_the_relay_stops_the_upstream(
    make_gateway: HarnessFactory,
) -> None:
    # Paced tokens of 10 KB: the writer is caught up whenever one arrives, so each goes out
    # through the relay until the kernel's socket buffers (a few MB on loopback) and the
    # server's are full; then a send must wait, the relay hands it to the writer's task,
    # and the queue's bound stops the producer.
    token = "y" * 10_000
    script = Script.from_tokens([token] * 2000, delay_ms=0.5)
    gw = await make_gateway([script], queue_max_frames=8, stream_relay=True)
    reader, writer = await open_raw_stream(gw, {"input": "x"}, rcvbuf=4096)
    try:
        await reader.readuntil(b"event: stream.begin")
        await asyncio.sleep(1.0)  # the client stalls
        (session,) = gw.gateway.registry._sessions.values()
        assert session.running, "the stream finished although the client read nothing"
        assert session.log.relayed > 0
        assert not session.log.relaying
        assert session.log.pending() == 8  # the queue is full: the producer waits for room
        stalled_at = session.log.last_id
        await asyncio.sleep(0.2)
        assert session.log.last_id == stalled_at, "the producer kept going while the queue was full"
        body = b""
        while b"event: done" not in body[-4096:]:
            chunk = await reader.read(1 << 16)
            assert chunk, "the stream ended without done"
            body += chunk
        assert body.count(b"event: text.delta") == 2000
        assert body.count(token.encode()) == 2000
    finally:
        writer.transport.abort()
    await gw.settle()
    assert session.log.high_water <= 8
    assert session.log.paused_s > 0
    assert session.reason == "stop"


async def test_a_client_that_leaves_during_a_relayed_stream_cancels_it(
    make_gateway: HarnessFactory,
) -> None:
    tokens = [f"t{i} " for i in range(2000)]
    gw = await make_gateway([Script.from_tokens(tokens, delay_ms=2)], stream_relay=True)
    body = {"input": "x", "on_disconnect": "cancel"}
    reader, writer = await open_raw_stream(gw, body)
    for _ in range(5):
        await reader.readuntil(b"event: text.delta")
    (session,) = gw.gateway.registry._sessions.values()
    assert session.log.relayed > 0
    writer.transport.abort()
    await gw.settle()
    assert session.reason == "client_disconnected"
    assert not session.log.relaying


_PACED = [f"t{i} " for i in range(10)]


def _paced(end: End = "done", last: str | None = None) -> Script:
    """The paced tokens, no finish, then ``last`` (a raw event) if given, then ``end``."""
    script = Script.from_tokens(_PACED, delay_ms=5, finish=None, end=end)
    if last is None:
        return script
    return dataclasses.replace(script, steps=(*script.steps, Step(raw=last, delay_ms=5)))


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        (_paced("rst"), "UPSTREAM_PROTOCOL", "early"),
        (_paced("fin"), "UPSTREAM_PROTOCOL", "early"),
        (_paced("eof"), "UPSTREAM_PROTOCOL", "early"),
        (_paced("hang"), "UPSTREAM_TIMEOUT", "idle"),
        (_paced(last="data: {not json\n\n"), "UPSTREAM_PROTOCOL", "non-JSON"),
        (_paced(last="data: \udcff\n\n"), "UPSTREAM_PROTOCOL", "invalid UTF-8"),
    ],
    ids=["rst", "fin", "eof-without-done", "hang", "malformed", "invalid-utf8"],
)
async def test_a_fault_while_the_read_callback_takes_the_deltas(
    make_gateway: HarnessFactory, script: Script, code: str, words: str
) -> None:
    # Every token but the first came through the callback; the fault then reaches the
    # task (the connection's news, the idle timer, a parse error) and ends the stream
    # as it does on the queued path: the same error, word for word.
    queued = await make_gateway([script], idle_s=0.3, stream_relay=False)
    queued_error = frames(await queued.stream())[-2].data
    gw = await make_gateway([script], idle_s=0.3, stream_relay=True)
    events = await gw.stream()
    assert_well_formed(events)
    numbered = frames(events)
    assert [f.data["chunk"] for f in numbered if f.event == "text.delta"] == _PACED
    assert numbered[-2].event == "error" and numbered[-1].data["reason"] == "error"
    assert numbered[-2].data["code"] == code and words in str(numbered[-2].data["message"])
    assert numbered[-2].data == queued_error
    # A response that arrived whole (EOF, a bad event then [DONE]) may go back to the
    # pool; one abandoned midway must be closed.
    await gw.settle(upstream_closed=script.end in ("rst", "fin", "hang"))
    (session,) = gw.gateway.registry._sessions.values()
    assert session.delivered >= len(_PACED) - 1


async def test_a_read_with_the_last_token_and_done_ends_the_turn(
    make_gateway: HarnessFactory,
) -> None:
    # The last token, the finish and [DONE] in one read: the callback delivers the token,
    # the task reads the end; the connection goes back to the pool.
    tokens = [*_PACED, "last"]
    steps = [Step(text=t, delay_ms=5) for t in _PACED]
    steps.append(Step(raw=_sse_text("last") + _sse_finish() + "data: [DONE]\n\n", delay_ms=5))
    gw = await make_gateway([Script(steps=tuple(steps), end="eof")], stream_relay=True)
    events = await gw.stream()
    assert_well_formed(events)
    numbered = frames(events)
    assert [f.data["chunk"] for f in numbered if f.event == "text.delta"] == tokens
    assert numbered[-1].data["reason"] == "stop"
    await gw.settle()
    (session,) = gw.gateway.registry._sessions.values()
    assert session.delivered >= len(tokens) - 1


def _sse_text(text: str) -> str:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {orjson.dumps(chunk).decode()}\n\n"


def _sse_finish() -> str:
    chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return f"data: {orjson.dumps(chunk).decode()}\n\n"


async def test_a_cancelled_stream_takes_no_delta_in_the_callback(
    make_gateway: HarnessFactory,
) -> None:
    # A read that comes between a cancel and the task's waking is not run through the
    # engine: the stream ends where it was cancelled, as on the queued path.
    script = Script.from_tokens([f"t{i} " for i in range(200)], delay_ms=20)
    gw = await make_gateway([script], stream_relay=True)
    reader, writer = await open_raw_stream(gw, {"input": "x"})
    try:
        await reader.readuntil(b"event: text.delta")
        (session,) = gw.gateway.registry._sessions.values()
        last = session.log.last_id
        assert session.cancel()
        assert session.deliver(UpstreamDelta("late")) is False
        assert session.log.last_id == last
        await gw.settle()
    finally:
        writer.close()
    assert session.reason == "cancelled"
    assert "late" not in [f.data.get("chunk") for f in session.log.frames]
