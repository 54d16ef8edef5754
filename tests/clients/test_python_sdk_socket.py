"""The Python SDK's WebSocket transport (``transport="ws"``, docs/websocket.md) against a
real gateway on loopback, with the sync and the async client: a client tool answered on
the socket, approvals on the socket, a dropped socket resumed on a new one, and a socket
without a key refused with a typed error. The SDK offers the subprotocol of several frames
per message and reads a gateway that selects it, or one that selects none, the same.

A pass-through TCP proxy in front of the gateway counts the connections: a stream whose
results and approvals travel on its socket opens exactly one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.api.conftest import HarnessFactory, sentinel_reply
from tests.api.test_auth import KEY_A
from tests.clients.conftest import DropProxy, call, tokens
from tests.clients.test_python_sdk import (
    MODES,
    _approval_registry,
    assert_complete,
    get_weather,
    in_thread,
    run,
)
from tests.tcp import LoopbackTcpServer
from toolforge.eval.scripted_upstream import Script
from toolforge_client import (
    AsyncToolForge,
    BadRequestError,
    PermissionDeniedError,
    StreamResult,
    ToolForge,
)
from toolforge_client.frames import ToolCall


def _never(seen: bytes) -> bool:
    return False


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_tool_answered_on_the_socket(
    make_gateway: HarnessFactory, mode: str
) -> None:
    gw = await make_gateway(
        [tokens("Checking. " + call("t1", "get_weather", {"city": "Oslo"})),
         tokens(sentinel_reply("Sunny."))]
    )  # fmt: skip
    async with DropProxy(gw.url, _never) as proxy:
        result = await run(
            mode, proxy.url, "Weather?", tools=[], client_tools=[get_weather], transport="ws"
        )
    assert proxy.connections == 1  # the socket only: the result went on it, no POST
    assert_complete(result)
    assert result.stream_id is not None and result.stream_id.startswith("s_")
    assert [(c.name, c.executor) for c in result.tool_calls] == [("get_weather", "client")]
    assert result.tool_results[0].ok
    assert result.tool_results[0].result == {"city": "Oslo", "sky": "clear"}
    assert result.value == {"answer": "Sunny."}


@pytest.mark.parametrize("mode", MODES)
async def test_approvals_on_the_socket(make_gateway: HarnessFactory, mode: str) -> None:
    ran: list[float] = []
    script = [tokens(call("t1", "slow", {"seconds": 0})), tokens(sentinel_reply())]
    gw = await make_gateway(script * 2, tools=_approval_registry(ran))
    async with DropProxy(gw.url, _never) as proxy:
        # by callback: denied
        denied = await run(mode, proxy.url, "x", on_approval=lambda c: False, transport="ws")
        # by hand: approved, the answer read back from the socket
        answers: list[dict[str, Any]] = []
        if mode == "sync":

            def go() -> StreamResult:
                with ToolForge(proxy.url) as client, client.stream("x", transport="ws") as s:
                    for event in s:
                        if isinstance(event.data, ToolCall) and event.data.needs_approval:
                            answers.append(s.approve(event.data.id))
                    return s.result

            approved = await in_thread(go)
        else:
            async with AsyncToolForge(proxy.url) as client:
                async with await client.stream("x", transport="ws") as s:
                    async for event in s:
                        if isinstance(event.data, ToolCall) and event.data.needs_approval:
                            answers.append(await s.approve(event.data.id))
                    approved = s.result
    assert proxy.connections == 2  # one socket per stream, nothing else
    assert denied.tool_results[0].ok is False
    assert denied.tool_results[0].error is not None
    assert denied.tool_results[0].error.code == "TOOL_APPROVAL_DENIED"
    assert answers == [{"stream_id": approved.stream_id, "call_id": "t1", "approved": True}]
    assert approved.tool_results[0].ok
    assert_complete(approved)
    assert ran == [0]  # only the approved call ran


@pytest.mark.parametrize("mode", MODES)
async def test_a_dropped_socket_resumes_on_a_new_one(
    make_gateway: HarnessFactory, mode: str
) -> None:
    words = [f"w{i} " for i in range(60)]
    gw = await make_gateway(
        [Script.from_tokens([*words, sentinel_reply()], delay_ms=10)], disconnect_grace_ms=5000
    )
    # cut among the frames: a few hundred bytes past the handshake's answer (the frames
    # may be compressed, so counted in bytes, not read)
    async with DropProxy(gw.url, lambda seen: len(seen.partition(b"\r\n\r\n")[2]) > 200) as proxy:
        result = await run(mode, proxy.url, "x", transport="ws")
    assert proxy.dropped == 1 and proxy.connections == 2
    assert result.resumes == 1
    assert_complete(result)  # every frame once: nothing lost, nothing twice
    assert result.text.startswith("".join(words))
    assert result.value == {"answer": "Two places are open."}
    assert len(gw.upstream.requests) == 1  # the model was not asked again


@pytest.mark.parametrize("mode", MODES)
async def test_a_socket_without_a_key_is_refused(make_gateway: HarnessFactory, mode: str) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])], api_keys=KEY_A)
    for key in (None, "tf-key-wrong-wrong-wrong"):
        with pytest.raises(PermissionDeniedError) as refused:
            if mode == "sync":
                await in_thread(lambda k=key: ToolForge(gw.url, api_key=k).run(  # type: ignore[misc]
                    "Hi", transport="ws"))  # fmt: skip
            else:
                async with AsyncToolForge(gw.url, api_key=key) as client:
                    await client.run("Hi", transport="ws")
        assert refused.value.status_code == 403
        assert "refused the socket" in refused.value.message
    assert gw.upstream.requests == []
    # with the key: streamed; a bad request on the socket is a typed error too
    if mode == "sync":
        result = await in_thread(lambda: ToolForge(gw.url, api_key=KEY_A).run("Hi", transport="ws"))
    else:
        async with AsyncToolForge(gw.url, api_key=KEY_A) as client:
            result = await client.run("Hi", transport="ws")
            with pytest.raises(BadRequestError):
                await client.run("Hi", transport="ws", max_tool_calls=-1)
    assert result.value == {"answer": "ok"}


def test_the_transport_is_checked() -> None:
    with ToolForge() as client:
        with pytest.raises(ValueError, match="transport"):
            client.stream("x", transport="carrier-pigeon")  # type: ignore[typeddict-item]
        with pytest.raises(ValueError, match="idempotency_key"):
            client.stream("x", transport="ws", idempotency_key="k1")


class OfferProxy(LoopbackTcpServer):
    """A TCP proxy in front of the gateway that keeps each handshake's answer, and with
    ``hide_offer`` renames the client's ``Sec-WebSocket-Protocol`` header on the way in:
    the gateway then sees no subprotocol offered, as an older gateway selects none."""

    def __init__(self, target: str, *, hide_offer: bool) -> None:
        super().__init__()
        self._host, port = target.removeprefix("http://").split(":")
        self._port = int(port)
        self._hide = hide_offer
        self.requests: list[bytes] = []
        self.answers: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, heads: list[bytes],
                       hide: bool) -> None:  # fmt: skip
            head = await src.readuntil(b"\r\n\r\n")
            heads.append(head)  # as sent
            if hide:
                head = head.replace(b"Sec-WebSocket-Protocol:", b"X-Hidden-Protocol:")
            dst.write(head)
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()

        pumps = [
            asyncio.create_task(pump(reader, up_writer, self.requests, self._hide)),
            asyncio.create_task(pump(up_reader, writer, self.answers, False)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            writer.transport.abort()
            up_writer.transport.abort()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hide_offer", [False, True], ids=["selected", "not-selected"])
async def test_batched_frames_or_one_per_message_read_the_same(
    make_gateway: HarnessFactory, mode: str, hide_offer: bool
) -> None:
    words = "".join(f"w{i} " for i in range(300))  # fast: the frame log hands over batches
    gw = await make_gateway(
        [tokens("Checking. " + call("t1", "get_weather", {"city": "Oslo"})),
         tokens(words + sentinel_reply("Sunny."))]
    )  # fmt: skip
    async with OfferProxy(gw.url, hide_offer=hide_offer) as proxy:
        result = await run(
            mode, proxy.url, "Weather?", tools=[], client_tools=[get_weather], transport="ws"
        )
    (request,), (answer,) = proxy.requests, proxy.answers
    assert b"Sec-WebSocket-Protocol: toolforge.frames.v1" in request  # the SDK offers it
    assert answer.startswith(b"HTTP/1.1 101")
    selected = b"sec-websocket-protocol: toolforge.frames.v1" in answer.lower()
    assert selected is not hide_offer
    assert_complete(result)
    assert result.tool_results[0].result == {"city": "Oslo", "sky": "clear"}
    assert result.text.startswith("Checking. " + words)
    assert result.value == {"answer": "Sunny."}
