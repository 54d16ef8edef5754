"""The harness for the client tests: a real gateway on loopback in front of a scripted
upstream (``toolforge.eval.loopback``, as in tests/api), the demo's scripts, and a TCP
proxy that can cut a connection mid-stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson

from tests.api.conftest import make_gateway, sentinel_reply  # the fixture, shared
from tests.tcp import LoopbackTcpServer
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script
from toolforge.timeline import DEMO_INPUT

__all__ = [
    "DEMO_INPUT",
    "DropProxy",
    "call",
    "demo_scripts",
    "demo_workflow_scripts",
    "make_gateway",
    "tokens",
]


def tokens(text: str, size: int = 4, delay_ms: float = 0) -> Script:
    return Script.from_tokens([text[i : i + size] for i in range(0, len(text), size)],
                              delay_ms=delay_ms)  # fmt: skip


def call(fid: str, name: str, args: object) -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, fid, name, orjson.dumps(args).decode())


def demo_scripts() -> list[Script]:
    """The README's demo, scripted: search, book, then an OBJECT and the RESULT."""
    search = call("t1", "places.search", {"query": "pizza", "radius_km": 2, "open_at": "19:00"})
    book = call(
        "t2", "bookings.create", {"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}
    )
    action = '{"mode":"book","target":{"kind":"place","id":"trattoria-roma"}}'
    obj = sentinels.frame(FrameKind.OBJECT, "o1", "Action", action)
    return [
        tokens("Let me look. " + search),
        tokens("Booking it. " + book),
        tokens("Done. " + obj + " " + sentinel_reply("Booked Trattoria Roma at 19:00.")),
    ]


def demo_workflow_scripts() -> list[Script]:
    """The demo request as `toolforge demo` sends it (the booking workflow): search, then
    book; the booking is the workflow's terminal call, which ends the stream."""
    return demo_scripts()[:2]


class DropProxy(LoopbackTcpServer):
    """A TCP proxy in front of the gateway: ``drop_when(bytes sent to the client so far)``
    true on the first connection cuts both sides of it (a dropped connection, as a
    flaky network makes); later connections pass through."""

    def __init__(self, target: str, drop_when: Callable[[bytes], bool]) -> None:
        super().__init__()
        self._host, port = target.removeprefix("http://").split(":")
        self._port = int(port)
        self._drop_when = drop_when
        self.connections = 0
        self.dropped = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)

        async def upstream() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            seen = b""
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
                if first:
                    seen += data
                    if self._drop_when(seen):
                        self.dropped += 1
                        writer.transport.abort()
                        up_writer.transport.abort()
                        return

        pumps = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            writer.transport.abort()
            up_writer.transport.abort()
