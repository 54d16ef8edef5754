"""The WebSocket transport, ``GET /v1/stream/ws`` (docs/websocket.md): a real gateway on
loopback in front of the scripted upstream, driven by the ``websockets`` client. The same
frames as SSE; a client tool answered and an approval given on the socket; a dropped
socket resumed on a new one; 200 sockets at once; sockets without a key, or from another
site's page, refused before they open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.api.conftest import Harness, HarnessFactory, sentinel_reply
from tests.api.test_agui import approval_registry
from tests.api.test_auth import KEY_A, KEY_B
from tests.api.test_client_tools import WEATHER, calling
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script, Step


def ws_url(gw: Harness) -> str:
    return gw.url.replace("http://", "ws://") + "/v1/stream/ws"


@contextlib.asynccontextmanager
async def socket(gw: Harness, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    async with connect(ws_url(gw), open_timeout=5, **kwargs) as ws:
        yield ws


async def receive(ws: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 5))
    return message


async def until_done(ws: ClientConnection, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    while not frames or frames[-1].get("event") != "done":
        frames.append(await receive(ws))
    return frames


def start(request: dict[str, Any]) -> str:
    return orjson.dumps({"type": "start", "request": request}).decode()


def well_formed(frames: list[dict[str, Any]], first: int = 1) -> None:
    numbered = [f for f in frames if "id" in f]
    assert [f["id"] for f in numbered] == list(range(first, first + len(numbered)))
    assert numbered[-1]["event"] == "done"


async def test_a_stream_on_a_socket(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("Two open.")])])
    async with socket(gw) as ws:
        await ws.send(start({"input": "Pizza?"}))
        frames = await until_done(ws, [])
    well_formed(frames)
    assert frames[0]["event"] == "stream.begin"
    (result,) = [f for f in frames if f["event"] == "result.end"]
    assert result["data"]["value"] == {"answer": "Two open."}
    assert frames[-1]["data"]["reason"] == "stop"


async def test_a_client_tool_answered_on_the_socket(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([calling(), Script.from_tokens([sentinel_reply("Sunny.")])])
    async with socket(gw) as ws:
        await ws.send(start({"input": "Weather?", "client_tools": [WEATHER], "tools": []}))
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1]["event"] != "tool.call":
            frames.append(await receive(ws))
        call = frames[-1]["data"]
        assert call["executor"] == "client" and call["args"] == {"city": "Oslo"}
        result = {"type": "tool_result", "call_id": call["id"], "ok": True, "result": {"sky": 1}}
        await ws.send(orjson.dumps(result).decode())
        answer = await receive(ws)
        while "id" in answer:  # frames may come before the command's answer
            frames.append(answer)
            answer = await receive(ws)
        assert answer["type"] == "answer" and answer["to"] == "tool_result"
        await until_done(ws, frames)
    well_formed(frames)
    (tool_result,) = [f for f in frames if f.get("event") == "tool.result"]
    assert tool_result["data"]["ok"] is True and tool_result["data"]["result"] == {"sky": 1}
    upstream = orjson.loads(gw.upstream.requests[-1].body)["messages"]
    assert '"sky":1' in upstream[-1]["content"]  # the result went back to the model


async def test_an_approval_given_on_the_socket(make_gateway: HarnessFactory) -> None:
    ran: list[int] = []
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", "book", '{"table": 4}')
    gw = await make_gateway(
        [Script.from_tokens([call]), Script.from_tokens([sentinel_reply("Booked.")])],
        tools=approval_registry(ran),
    )
    async with socket(gw) as ws:
        await ws.send(start({"input": "Book table 4.", "tools": ["book"]}))
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1]["event"] != "tool.call":
            frames.append(await receive(ws))
        assert frames[-1]["data"]["needs_approval"] is True
        await asyncio.sleep(0.1)
        assert ran == []
        await ws.send(orjson.dumps({"type": "approve", "call_id": "t1", "approved": True}).decode())
        await until_done(ws, frames)
    assert ran == [4]
    assert {
        "type": "answer",
        "to": "approve",
        "answer": {"stream_id": frames[0]["data"]["stream_id"], "call_id": "t1", "approved": True},
    } in frames
    (result,) = [f for f in frames if f.get("event") == "tool.result"]
    assert result["data"]["ok"] is True


async def test_a_dropped_socket_resumes_on_another(make_gateway: HarnessFactory) -> None:
    steps = (
        Step(text="Once "),
        Step(text="upon ", delay_ms=300),
        Step(text="a time.", delay_ms=300),
        Step(finish="stop"),
    )
    gw = await make_gateway([Script(steps=steps)], disconnect_grace_ms=5000)
    async with socket(gw) as ws:
        await ws.send(start({"input": "A story?", "result_schema": "Any"}))
        seen = [await receive(ws), await receive(ws)]  # stream.begin, the first text
    stream_id = seen[0]["data"]["stream_id"]
    last = seen[-1]["id"]
    async with socket(gw) as ws:
        resume = {"type": "resume", "stream_id": stream_id, "after": last}
        await ws.send(orjson.dumps(resume).decode())
        rest = await until_done(ws, [])
    frames = seen + rest
    well_formed(frames)
    text = "".join(f["data"]["chunk"] for f in frames if f["event"] == "text.delta")
    assert text == "Once upon a time."
    assert frames[-1]["data"]["reason"] == "stop"


async def test_two_hundred_sockets_at_once(make_gateway: HarnessFactory) -> None:
    count = 200
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])] * count)

    async def one() -> list[dict[str, Any]]:
        async with socket(gw) as ws:
            await ws.send(start({"input": "Hi"}))
            return await until_done(ws, [])

    async with asyncio.timeout(60):
        runs = await asyncio.gather(*(one() for _ in range(count)))
    for frames in runs:
        well_formed(frames)
        assert frames[-1]["data"]["reason"] == "stop"
    assert len({frames[0]["data"]["stream_id"] for frames in runs}) == count


async def test_a_socket_without_a_key_is_refused(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], api_keys=f"{KEY_A},{KEY_B}")
    for headers in ({}, {"Authorization": "Bearer tf-key-wrong-wrong-wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            async with socket(gw, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 403
    async with socket(gw, additional_headers={"Authorization": f"Bearer {KEY_A}"}) as ws:
        await ws.send(start({"input": "Hi"}))
        frames = await until_done(ws, [])
        stream_id = frames[0]["data"]["stream_id"]
    # another key may not follow it, nor command it
    async with connect(f"{ws_url(gw)}?token={KEY_B}", open_timeout=5) as ws:
        await ws.send(orjson.dumps({"type": "resume", "stream_id": stream_id, "after": 0}).decode())
        refusal = await receive(ws)
    assert refusal["type"] == "error" and refusal["error"]["code"] == "FORBIDDEN"
    assert gw.upstream.requests and len(gw.upstream.requests) == 1


async def test_a_page_of_another_site_is_refused(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    with pytest.raises(InvalidStatus) as refused:
        async with socket(gw, origin="https://evil.example"):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("not json", "BAD_REQUEST"),
        ('{"type": "cancel"}', "BAD_REQUEST"),  # no stream yet
        ('{"type": "start", "request": {"input": "x", "frobnicate": 1}}', None),
        ('{"type": "dance"}', "BAD_REQUEST"),
    ],
)
async def test_bad_messages_are_answered_not_fatal(
    make_gateway: HarnessFactory, message: str, code: str | None
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])])
    async with socket(gw) as ws:
        await ws.send(message)
        refusal = await receive(ws)
        assert refusal["type"] == "error"
        if code is not None:
            assert refusal["error"]["code"] == code
        await ws.send(start({"input": "Hi"}))  # the socket still serves
        frames = await until_done(ws, [])
    well_formed(frames)
