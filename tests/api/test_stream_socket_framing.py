"""The WebSocket's two message framings (docs/websocket.md): a client that offers the
subprotocol ``toolforge.frames.v1`` reads each batch of frames as one message of JSON
lines; any other client one frame per message. A real gateway on loopback in front of the
scripted upstream, driven by the ``websockets`` client and, for SSE, by httpx.

The same scripted run — a client tool answered, a pause and its resume, a drop and a
resume after the last id — yields the same frames over SSE, over a socket of one frame
per message and over a batched socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

import orjson
import pytest
from httpx_sse import EventSource, aconnect_sse
from websockets.asyncio.client import ClientConnection, connect

from tests.api.conftest import Harness, HarnessFactory, sentinel_reply
from tests.api.test_auth import KEY_A
from tests.api.test_client_tools import WEATHER, calling
from tests.api.test_stream_socket import start, well_formed, ws_url
from toolforge.core.protocol.socket_messages import SUBPROTOCOL
from toolforge.eval.scripted_upstream import Script, Step

Frame = dict[str, Any]

# The second turn after the tool's result: a pause and a drop each fit in the gaps.
GAP_MS = 800
TURN_2 = Script(
    steps=(
        Step(text="It is "),
        Step(text="sunny ", delay_ms=GAP_MS),
        Step(text="in Oslo. ", delay_ms=GAP_MS),
        Step(text=sentinel_reply("Sunny.")),
        Step(finish="stop"),
    )
)
BODY = {"input": "Weather in Oslo?", "client_tools": [WEATHER], "tools": []}


class Transport(Protocol):
    async def start(self, body: Frame) -> None: ...
    async def frame(self) -> Frame: ...
    async def command(self, stream_id: str, message: Frame) -> None: ...
    async def drop(self) -> None: ...
    async def resume(self, stream_id: str, after: int) -> None: ...
    async def close(self) -> None: ...


class Sse:
    """``POST /v1/stream``, its commands as HTTP posts, a drop resumed by Last-Event-ID."""

    def __init__(self, gw: Harness) -> None:
        self._gw = gw
        self._stack = contextlib.AsyncExitStack()
        self._events: AsyncIterator[Any] | None = None

    async def _open(self, method: str, url: str, **kwargs: Any) -> None:
        source: EventSource = await self._stack.enter_async_context(
            aconnect_sse(self._gw.client, method, url, **kwargs)
        )
        source.response.raise_for_status()
        self._events = source.aiter_sse()

    async def start(self, body: Frame) -> None:
        await self._open("POST", f"{self._gw.url}/v1/stream", json=body)

    async def frame(self) -> Frame:
        assert self._events is not None
        while True:
            sse = await asyncio.wait_for(anext(self._events), 5)
            if sse.event != "ping":
                return {"id": int(sse.id), "event": sse.event, "data": orjson.loads(sse.data)}

    async def command(self, stream_id: str, message: Frame) -> None:
        base = f"{self._gw.url}/v1/streams/{stream_id}"
        match message:
            case {"type": "tool_result", "call_id": call_id, **rest}:
                response = await self._gw.client.post(f"{base}/tool_results/{call_id}", json=rest)
            case {"type": kind}:
                response = await self._gw.client.post(f"{base}/{kind}")
        assert response.status_code == 200, response.text

    async def drop(self) -> None:
        await self.close()
        self._stack = contextlib.AsyncExitStack()

    async def resume(self, stream_id: str, after: int) -> None:
        url = f"{self._gw.url}/v1/streams/{stream_id}"
        await self._open("GET", url, headers={"Last-Event-ID": str(after)})

    async def close(self) -> None:
        await self._stack.aclose()


class Socket:
    """``GET /v1/stream/ws`` offering ``subprotocols``: every message read, its lines
    kept apart (frames for the run, answers checked)."""

    def __init__(self, gw: Harness, subprotocols: list[str]) -> None:
        self._gw = gw
        self._offer = subprotocols
        self._ws: ClientConnection | None = None
        self._lines: list[Frame] = []
        self.messages: list[str] = []  # every message read, as it came
        self.selected: list[str | None] = []  # each socket's subprotocol

    async def _connect(self) -> ClientConnection:
        offer: Any = self._offer or None
        self._ws = await connect(ws_url(self._gw), open_timeout=5, subprotocols=offer)
        self.selected.append(self._ws.subprotocol)
        return self._ws

    async def start(self, body: Frame) -> None:
        await (await self._connect()).send(start(body))

    async def _line(self) -> Frame:
        while not self._lines:
            assert self._ws is not None
            message = await asyncio.wait_for(self._ws.recv(), 5)
            assert isinstance(message, str)
            self.messages.append(message)
            self._lines.extend(orjson.loads(line) for line in message.split("\n"))
        return self._lines.pop(0)

    async def frame(self) -> Frame:
        while True:
            line = await self._line()
            if "id" in line:
                return line
            assert line["type"] == "answer", line  # a command's answer, between frames

    async def command(self, stream_id: str, message: Frame) -> None:
        assert self._ws is not None
        await self._ws.send(orjson.dumps(message).decode())

    async def drop(self) -> None:
        await self.close()
        self._lines.clear()

    async def resume(self, stream_id: str, after: int) -> None:
        message = {"type": "resume", "stream_id": stream_id, "after": after}
        await (await self._connect()).send(orjson.dumps(message).decode())

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
            self._ws = None


async def the_run(transport: Transport) -> list[Frame]:
    """The client tool answered, a pause and a resume in the second turn's first gap, a
    drop in its second gap and a resume after the last frame read."""
    frames: list[Frame] = []

    async def until(event: str, test: Any = None) -> Frame:
        """Read until a frame ``event`` (whose data passes ``test``) has come."""
        async with asyncio.timeout(10):
            while True:
                for f in frames:
                    if f["event"] == event and (test is None or test(f["data"])):
                        return f
                frames.append(await transport.frame())

    await transport.start(BODY)
    stream_id = (await until("stream.begin"))["data"]["stream_id"]
    call = (await until("tool.call"))["data"]
    result = {"type": "tool_result", "call_id": call["id"], "ok": True, "result": {"sky": 1}}
    await transport.command(stream_id, result)
    await until("text.delta", lambda d: d["chunk"] == "It is ")  # the next is a gap away
    await transport.command(stream_id, {"type": "pause"})
    await until("stream.paused")
    await asyncio.sleep(GAP_MS / 1000 + 0.3)  # the next token waits on the gateway
    await transport.command(stream_id, {"type": "resume"})
    await until("stream.resumed")
    await until("text.delta", lambda d: d["chunk"] == "sunny ")
    await transport.drop()  # "in Oslo." is a gap away
    await transport.resume(stream_id, frames[-1]["id"])
    await until("done")
    await transport.close()
    return [_steady(f, stream_id) for f in frames]


def _steady(frame: Frame, stream_id: str) -> Frame:
    """``frame`` without what differs from run to run: the stream's id, and timings."""
    steady: Frame = orjson.loads(orjson.dumps(frame).replace(stream_id.encode(), b"s_ID"))
    for timing in ("duration_ms", "paused_ms", "metrics"):
        steady["data"].pop(timing, None)
    return steady


async def test_the_same_frames_over_sse_and_both_framings(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([calling(), TURN_2] * 3, disconnect_grace_ms=5000)
    over_sse = await the_run(Sse(gw))
    plain, batched = Socket(gw, []), Socket(gw, [SUBPROTOCOL])
    one_per_message = await the_run(plain)
    in_lines = await the_run(batched)
    well_formed(over_sse)
    events = [f["event"] for f in over_sse]
    for event in ("tool.call", "tool.result", "stream.paused", "stream.resumed", "result.end"):
        assert events.count(event) == 1, events
    assert over_sse[-1]["data"]["reason"] == "stop"
    assert one_per_message == over_sse
    assert in_lines == over_sse
    assert plain.selected == [None, None] and batched.selected == [SUBPROTOCOL, SUBPROTOCOL]
    assert all("\n" not in m for m in plain.messages)


async def test_a_fast_stream_comes_in_fewer_messages_than_frames(
    make_gateway: HarnessFactory,
) -> None:
    words = [f"w{i} " for i in range(2000)]
    gw = await make_gateway([Script.from_tokens([*words, sentinel_reply()])] * 2)
    runs = {}
    for offer in ([], [SUBPROTOCOL]):
        async with connect(ws_url(gw), open_timeout=5, subprotocols=offer or None) as ws:  # type: ignore[arg-type]
            await ws.send(start({"input": "Go"}))
            messages: list[str] = []
            async with asyncio.timeout(30):
                while not messages or '"event":"done"' not in messages[-1]:
                    messages.append(str(await ws.recv()))
        lines = [orjson.loads(line) for m in messages for line in m.split("\n")]
        runs[bool(offer)] = (messages, [orjson.dumps(f) for f in lines])
    (plain, plain_frames), (batched, batched_frames) = runs[False], runs[True]
    assert len(plain) == len(plain_frames)  # one frame per message
    assert len(batched) < len(batched_frames) // 2  # several frames per message
    assert len(batched_frames) == len(plain_frames) > 2000
    well_formed([orjson.loads(f) for f in batched_frames])
    text = "".join(
        orjson.loads(f)["data"]["chunk"]
        for f in batched_frames
        if orjson.loads(f)["event"] == "text.delta"
    )
    assert text.startswith("".join(words))


@pytest.mark.parametrize(
    ("offer", "selected"),
    [
        ([], None),
        (["graphql-transport-ws"], None),
        (["toolforge.frames.v2", "toolforge.frames"], None),
        (["graphql-transport-ws", SUBPROTOCOL], SUBPROTOCOL),
    ],
)
async def test_only_the_known_subprotocol_is_selected(
    make_gateway: HarnessFactory, offer: list[str], selected: str | None
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])])
    async with connect(ws_url(gw), open_timeout=5, subprotocols=offer or None) as ws:  # type: ignore[arg-type]
        assert ws.response is not None
        assert ws.response.headers.get("Sec-WebSocket-Protocol") == selected
        assert ws.subprotocol == selected
        await ws.send(start({"input": "Hi"}))
        frames: list[Frame] = []
        while not frames or frames[-1]["event"] != "done":
            message = str(await asyncio.wait_for(ws.recv(), 5))
            assert selected is not None or "\n" not in message
            frames.extend(orjson.loads(line) for line in message.split("\n"))
    well_formed(frames)


async def test_a_browser_key_in_the_query_with_the_subprotocol(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])], api_keys=KEY_A)
    url = f"{ws_url(gw)}?token={KEY_A}"
    async with connect(url, open_timeout=5, subprotocols=[SUBPROTOCOL]) as ws:  # type: ignore[list-item]
        assert ws.response is not None
        assert ws.response.headers.get("Sec-WebSocket-Protocol") == SUBPROTOCOL
        await ws.send(start({"input": "Hi"}))
        frames: list[Frame] = []
        while not frames or frames[-1]["event"] != "done":
            message = str(await asyncio.wait_for(ws.recv(), 5))
            frames.extend(orjson.loads(line) for line in message.split("\n"))
    well_formed(frames)
    (result,) = [f for f in frames if f["event"] == "result.end"]
    assert result["data"]["value"] == {"answer": "ok"}
