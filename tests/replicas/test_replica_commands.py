"""Pause, resume and the WebSocket across replicas (docs/protocol.md, docs/websocket.md):
two gateway processes and a real ``redis-server``. A stream run by A is paused, resumed
and cancelled through B; a socket that drops on A comes back on B and follows the
stream from its resume buffer, its commands forwarded to A."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from tests.replicas.conftest import Replica, ReplicaFactory, assert_whole, read_sse
from tests.replicas.test_replicas import body, read_some, text_of, words
from toolforge.eval.loopback import Event


@contextlib.asynccontextmanager
async def socket(replica: Replica) -> AsyncIterator[ClientConnection]:
    url = replica.url.replace("http://", "ws://") + "/v1/stream/ws"
    async with connect(url, open_timeout=5) as ws:
        yield ws


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(message).decode())


async def receive(ws: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
    return message


async def answer_to(ws: ClientConnection, kind: str, frames: list[dict[str, Any]]) -> Any:
    """Read until the answer to ``kind`` (frames that come first are kept)."""
    while True:
        message = await receive(ws)
        if message.get("type") == "error":
            raise AssertionError(message)
        if message.get("type") == "answer" and message["to"] == kind:
            return message["answer"]
        frames.append(message)


async def post(replica: Replica, stream_id: str, name: str) -> dict[str, Any]:
    response = await replica.client.post(f"{replica.url}/v1/streams/{stream_id}/{name}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_streams_on_a_are_paused_resumed_and_cancelled_while_paused_through_b(
    replicas: ReplicaFactory,
) -> None:
    a, b = await replicas(2)
    for then in ("resume", "cancel"):
        first = await read_some(a, "slow:60:20", 3)  # it runs on A, unread
        stream_id = str(first[0].data["stream_id"])
        events: list[Event] = []
        arrived = asyncio.Event()

        async def seen(
            event: Event, events: list[Event] = events, arrived: asyncio.Event = arrived
        ) -> None:
            events.append(event)
            arrived.set()

        url = f"{b.url}/v1/streams/{stream_id}"
        follower = asyncio.create_task(
            read_sse(b.client, "GET", url, headers={"Last-Event-ID": "3"}, on_event=seen)
        )
        try:
            assert await post(b, stream_id, "pause") == {"stream_id": stream_id, "paused": True}
            async with asyncio.timeout(10):
                while "stream.paused" not in [e.event for e in events]:
                    arrived.clear()
                    await arrived.wait()
            await asyncio.sleep(1.5)  # the whole script takes 1.2 s unpaused
            kinds = [e.event for e in events]
            held = kinds[kinds.index("stream.paused") + 1 :]
            assert "done" not in held and held.count("text.delta") <= 2, held
            answer = await post(b, stream_id, then)
            rest = await asyncio.wait_for(follower, 10)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        whole = first + rest
        assert_whole(whole)
        kinds = [e.event for e in whole]
        assert kinds.count("stream.paused") == 1
        if then == "resume":
            assert answer == {"stream_id": stream_id, "paused": False}
            assert kinds.count("stream.resumed") == 1
            assert whole[-1].data["reason"] == "stop" and text_of(whole) == words(60)
        else:
            assert answer["cancelled"] is True and answer["reason"] == "cancelled"
            assert "stream.resumed" not in kinds and whole[-1].data["reason"] == "cancelled"


async def test_a_socket_dropped_on_a_resumes_on_b_and_commands_the_stream_there(
    replicas: ReplicaFactory,
) -> None:
    a, b = await replicas(2)
    first: list[dict[str, Any]] = []
    async with socket(a) as ws:
        await send(ws, {"type": "start", "request": body("slow:40:20")})
        while sum(f.get("event") == "text.delta" for f in first) < 5:
            first.append(await receive(ws))
    stream_id = first[0]["data"]["stream_id"]
    last = first[-1]["id"]
    rest: list[dict[str, Any]] = []
    async with socket(b) as ws:
        await send(ws, {"type": "resume", "stream_id": stream_id, "after": last})
        answer = await asyncio.wait_for(_pause_through(ws, rest), 10)
        assert answer == {"stream_id": stream_id, "paused": True}
        await asyncio.sleep(1.2)  # the rest of the script takes under 0.8 s unpaused
        with contextlib.suppress(TimeoutError):
            while True:
                rest.append(orjson.loads(await asyncio.wait_for(ws.recv(), 0.05)))
        assert "done" not in [f.get("event") for f in rest]
        await send(ws, {"type": "resume"})
        assert (await answer_to(ws, "resume", rest))["paused"] is False
        while not rest or rest[-1].get("event") != "done":
            rest.append(await receive(ws))
        # Done: the socket may follow another stream, here or elsewhere.
        await send(ws, {"type": "start", "request": body("slow:3:1")})
        again = [await receive(ws)]
        assert again[0]["event"] == "stream.begin"
    numbered = [f for f in first + rest if "id" in f]
    assert [f["id"] for f in numbered] == list(range(1, len(numbered) + 1))
    events = [f["event"] for f in numbered]
    assert events.count("done") == 1 and events[-1] == "done"
    assert numbered[-1]["data"]["reason"] == "stop"
    assert events.count("stream.paused") == 1 and events.count("stream.resumed") == 1
    chunks = "".join(f["data"]["chunk"] for f in numbered if f["event"] == "text.delta")
    assert chunks == words(40)
    # The same stream, as SSE resumes it through B: the same frames.
    replay = await b.resume(stream_id, "0")
    assert text_of(replay) == words(40)


async def _pause_through(ws: ClientConnection, frames: list[dict[str, Any]]) -> Any:
    frames.append(await receive(ws))  # the stream's next frame: the socket follows it
    await send(ws, {"type": "pause"})
    return await answer_to(ws, "pause", frames)
