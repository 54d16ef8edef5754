"""Pause and resume (docs/protocol.md): ``POST /v1/streams/{id}/pause`` and ``/resume``,
and ``pause`` / ``resume`` on the WebSocket. A real gateway on loopback in front of the
scripted upstream: while paused no more of the model comes through, the stream stays
open and says so (``stream.paused`` / ``stream.resumed``), FRAME_TIMEOUT_MS leaves the
paused time out, PAUSE_MAX_S ends a pause by itself, and a paused stream is cancelled
at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from httpx_sse import aconnect_sse

from tests.api.conftest import Harness, HarnessFactory, sentinel_reply
from tests.api.test_stream_socket import receive, socket, start, until_done, well_formed
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script, Step

WORDS = [f"w{i} " for i in range(40)]  # 40 tokens, 15 ms apart: 0.6 s unpaused


def slow(delay_ms: float = 15) -> Script:
    return Script.from_tokens(WORDS, delay_ms=delay_ms)


def text(events: list[Event]) -> str:
    return "".join(e.data["chunk"] for e in events if e.event == "text.delta")


class Reader:
    """One ``POST /v1/stream`` read in the background, its events as they come."""

    def __init__(self, gw: Harness, body: dict[str, Any]) -> None:
        self.events: list[Event] = []
        self._arrived = asyncio.Event()
        self.task = asyncio.create_task(self._read(gw, body))

    async def _read(self, gw: Harness, body: dict[str, Any]) -> None:
        url = f"{gw.url}/v1/stream"
        async with aconnect_sse(gw.client, "POST", url, json=body) as source:
            async for sse in source.aiter_sse():
                if sse.event != "ping":
                    self.events.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
                    self._arrived.set()

    async def until(self, event: str, count: int = 1) -> Event:
        async with asyncio.timeout(5):
            while sum(e.event == event for e in self.events) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return [e for e in self.events if e.event == event][count - 1]

    @property
    def stream_id(self) -> str:
        return str(self.events[0].data["stream_id"])

    def after(self, event: str) -> list[Event]:
        index = next(i for i, e in enumerate(self.events) if e.event == event)
        return self.events[index + 1 :]


@contextlib.asynccontextmanager
async def reading(gw: Harness, body: dict[str, Any]) -> AsyncIterator[Reader]:
    reader = Reader(gw, body)
    try:
        yield reader
    finally:
        reader.task.cancel()
        await asyncio.gather(reader.task, return_exceptions=True)


async def command(gw: Harness, stream_id: str, name: str) -> dict[str, Any]:
    response = await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/{name}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_a_paused_stream_reads_no_more_of_the_model_until_resumed(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([slow()])
    async with reading(gw, {"input": "x", "mode": "sentinel"}) as reader:
        await reader.until("text.delta", 3)
        assert await command(gw, reader.stream_id, "pause") == {
            "stream_id": reader.stream_id,
            "paused": True,
        }
        paused = await reader.until("stream.paused")
        assert paused.data == {"max_ms": 60_000}
        # Pausing again changes nothing: no second frame.
        assert (await command(gw, reader.stream_id, "pause"))["paused"] is True
        # Longer than the whole script takes unpaused: the model's text stops coming (a
        # read already under way when the pause came may still land).
        await asyncio.sleep(1.0)
        held = reader.after("stream.paused")
        assert [e.event for e in held if e.event != "text.delta"] == []
        assert len(held) <= 2, held
        assert await command(gw, reader.stream_id, "resume") == {
            "stream_id": reader.stream_id,
            "paused": False,
        }
        done = await reader.until("done")
        assert done.data["reason"] == "stop"
    resumed = [e for e in reader.events if e.event == "stream.resumed"]
    assert len(resumed) == 1 and resumed[0].data["reason"] == "resumed"
    assert resumed[0].data["paused_ms"] >= 900
    assert [e.event for e in reader.events].count("stream.paused") == 1
    assert text(reader.events) == "".join(WORDS)  # nothing lost, nothing twice
    assert [int(e.id) for e in reader.events] == list(range(1, len(reader.events) + 1))
    # Resuming a stream that is not paused, or pausing one that ended: said, not refused.
    assert (await command(gw, reader.stream_id, "resume"))["paused"] is False
    assert (await command(gw, reader.stream_id, "pause"))["paused"] is False


async def test_a_paused_stream_is_cancelled_at_once(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([slow()])
    async with reading(gw, {"input": "x", "mode": "sentinel"}) as reader:
        await reader.until("text.delta", 2)
        await command(gw, reader.stream_id, "pause")
        await reader.until("stream.paused")
        started = time.perf_counter()
        answer = await command(gw, reader.stream_id, "cancel")
        assert answer["cancelled"] is True and answer["reason"] == "cancelled"
        done = await reader.until("done")
        assert time.perf_counter() - started < 1.0
    assert done.data["reason"] == "cancelled"
    assert "stream.resumed" not in [e.event for e in reader.events]
    await gw.settle(upstream_closed=True)  # the held upstream response is closed


async def test_a_pause_ends_by_itself_after_pause_max_s(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([slow()], pause_max_s=0.3)
    async with reading(gw, {"input": "x", "mode": "sentinel"}) as reader:
        await reader.until("text.delta", 2)
        await command(gw, reader.stream_id, "pause")
        assert (await reader.until("stream.paused")).data == {"max_ms": 300}
        resumed = await reader.until("stream.resumed")
        await reader.until("done")
    assert resumed.data["reason"] == "pause_limit"
    assert 250 <= resumed.data["paused_ms"] < 2000
    assert text(reader.events) == "".join(WORDS)


async def test_the_frame_timeout_leaves_the_paused_time_out(make_gateway: HarnessFactory) -> None:
    """A RESULT frame open across a pause longer than FRAME_TIMEOUT_MS is no timeout."""
    reply = sentinel_reply("Open late.")
    steps = [Step(text=reply[i : i + 4], delay_ms=20) for i in range(0, len(reply), 4)]
    gw = await make_gateway([Script(steps=(*steps, Step(finish="stop")))], frame_timeout_ms=400)
    async with reading(gw, {"input": "x", "mode": "sentinel"}) as reader:
        await reader.until("result.begin")
        await command(gw, reader.stream_id, "pause")
        await asyncio.sleep(0.8)  # twice FRAME_TIMEOUT_MS, with the frame open
        await command(gw, reader.stream_id, "resume")
        done = await reader.until("done")
    assert done.data["reason"] == "stop"
    assert "error" not in [e.event for e in reader.events]
    (end,) = [e for e in reader.events if e.event == "result.end"]
    assert end.data["value"] == {"answer": "Open late."}


async def test_pause_and_resume_on_the_socket(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([slow()])
    async with socket(gw) as ws:
        await ws.send(start({"input": "x", "mode": "sentinel"}))
        frames: list[dict[str, Any]] = []
        while sum(f.get("event") == "text.delta" for f in frames) < 3:
            frames.append(await receive(ws))
        await ws.send(orjson.dumps({"type": "pause"}).decode())
        while frames[-1].get("type") != "answer":
            frames.append(await receive(ws))
        assert frames[-1] == {
            "type": "answer",
            "to": "pause",
            "answer": {"stream_id": frames[0]["data"]["stream_id"], "paused": True},
        }
        await asyncio.sleep(1.0)
        with contextlib.suppress(TimeoutError):  # whatever came while paused
            while True:
                frames.append(orjson.loads(await asyncio.wait_for(ws.recv(), 0.05)))
        events = [f.get("event") for f in frames]
        held = events[events.index("stream.paused") + 1 :]
        assert "done" not in held and held.count("text.delta") <= 2, held
        await ws.send(orjson.dumps({"type": "resume"}).decode())
        frames = await until_done(ws, frames)
    answers = [f for f in frames if f.get("type") == "answer"]
    assert [a["to"] for a in answers] == ["pause", "resume"]
    assert answers[1]["answer"]["paused"] is False
    numbered = [f for f in frames if "id" in f]
    well_formed(numbered)
    assert "".join(f["data"]["chunk"] for f in numbered if f["event"] == "text.delta") == "".join(
        WORDS
    )
    assert [f["event"] for f in numbered].count("stream.resumed") == 1
