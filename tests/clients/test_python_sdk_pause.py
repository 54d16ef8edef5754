"""The Python SDK's ``Stream.pause()`` / ``resume()`` (sync and async, over SSE and on the
socket) are the gateway's commands (docs/protocol.md, pause): against a real gateway on
loopback, no new model tokens come through while paused, however long the pause, and the
stream goes on whole after resume. The script trickles 40 tokens 15 ms apart: unpaused,
the 1 s pause would see all of them."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import pytest

from tests.api.conftest import HarnessFactory
from tests.clients.conftest import DropProxy
from tests.clients.test_python_sdk import MODES, in_thread
from toolforge.eval.scripted_upstream import Script
from toolforge_client import AsyncToolForge, Event, ToolForge

WORDS = [f"w{i} " for i in range(40)]
PAUSE_S = 1.0


def _never(seen: bytes) -> bool:
    return False


@pytest.mark.parametrize("transport", ["sse", "ws"])
@pytest.mark.parametrize("mode", MODES)
async def test_pause_stops_the_model_until_resume(
    make_gateway: HarnessFactory, mode: str, transport: Literal["sse", "ws"]
) -> None:
    gw = await make_gateway([Script.from_tokens(WORDS, delay_ms=15)])
    events: list[Event] = []
    answers: list[dict[str, Any]] = []
    async with DropProxy(gw.url, _never) as proxy:
        if mode == "sync":

            def go() -> None:
                with ToolForge(proxy.url) as client:
                    with client.stream("x", mode="sentinel", transport=transport) as s:
                        for event in s:
                            events.append(event)
                            if sum(e.event == "text.delta" for e in events) == 3 and not answers:
                                answers.append(s.pause())
                                time.sleep(PAUSE_S)  # not reading: the model waits anyway
                                answers.append(s.resume())

            await in_thread(go)
        else:
            async with AsyncToolForge(proxy.url) as client:
                s = await client.stream("x", mode="sentinel", transport=transport)
                async with s:
                    async for event in s:
                        events.append(event)
                        if sum(e.event == "text.delta" for e in events) == 3 and not answers:
                            answers.append(await s.pause())
                            await asyncio.sleep(PAUSE_S)
                            answers.append(await s.resume())
    stream_id = events[0].data.stream_id
    assert answers == [
        {"stream_id": stream_id, "paused": True},
        {"stream_id": stream_id, "paused": False},
    ]
    names = [e.event for e in events]
    assert names.count("stream.paused") == 1 and names.count("stream.resumed") == 1
    held = names[names.index("stream.paused") + 1 : names.index("stream.resumed")]
    # What the gateway read of the model while paused: a read under way at most.
    assert held.count("text.delta") <= 2, held
    resumed = events[names.index("stream.resumed")].data
    assert resumed.reason == "resumed" and resumed.paused_ms >= PAUSE_S * 900
    assert names[-1] == "done" and events[-1].data.reason == "stop"
    assert "".join(e.data.chunk for e in events if e.event == "text.delta") == "".join(WORDS)
    if transport == "ws":
        assert proxy.connections == 1  # the commands went on the socket


@pytest.mark.parametrize("mode", MODES)
async def test_the_clients_pause_and_unpause_by_stream_id(
    make_gateway: HarnessFactory, mode: str
) -> None:
    """``client.pause(id)`` / ``client.unpause(id)``: the HTTP routes, for a stream that
    another process reads."""
    gw = await make_gateway([Script.from_tokens(WORDS, delay_ms=15)])
    events: list[Event] = []

    async def command(stream_id: str) -> list[dict[str, Any]]:
        if mode == "sync":
            with ToolForge(gw.url) as client:
                paused = await in_thread(lambda: client.pause(stream_id))
                await asyncio.sleep(0.5)
                return [paused, await in_thread(lambda: client.unpause(stream_id))]
        async with AsyncToolForge(gw.url) as client:
            paused = await client.pause(stream_id)
            await asyncio.sleep(0.5)
            return [paused, await client.unpause(stream_id)]

    async with AsyncToolForge(gw.url) as reader:
        async with await reader.stream("x", mode="sentinel") as s:
            commanded: asyncio.Task[list[dict[str, Any]]] | None = None
            async for event in s:
                events.append(event)
                if event.event == "text.delta" and commanded is None:
                    commanded = asyncio.create_task(command(str(s.stream_id)))
            assert commanded is not None
            answers = await commanded
    assert [a["paused"] for a in answers] == [True, False]
    names = [e.event for e in events]
    held = names[names.index("stream.paused") + 1 : names.index("stream.resumed")]
    assert held.count("text.delta") <= 2, held
    assert events[names.index("stream.resumed")].data.paused_ms >= 450
