"""The gateway harness for API tests: a real gateway on loopback in front of a real
scripted upstream (``toolforge.eval.loopback``, shared with the conformance runner).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import ToolRegistry
from toolforge.eval.loopback import Event, Harness, frames, open_raw_stream, serve, start_gateway
from toolforge.eval.scripted_upstream import ScriptLike

__all__ = [
    "SDK",
    "Event",
    "Harness",
    "HarnessFactory",
    "assert_well_formed",
    "frames",
    "make_gateway",
    "open_raw_stream",
    "sdk",
    "sentinel_reply",
    "serve",
    "upstream_closed_within",
]

HarnessFactory = Callable[..., Awaitable[Harness]]
SDK = Callable[[Harness], AsyncOpenAI]


@pytest.fixture
async def make_gateway(tmp_path: Path) -> AsyncIterator[HarnessFactory]:
    async with contextlib.AsyncExitStack() as stack:

        async def factory(
            scripts: Iterable[ScriptLike] = (),
            *,
            tools: ToolRegistry | None = None,
            routes: dict[str, ScriptLike] | None = None,
            **settings: Any,
        ) -> Harness:
            return await start_gateway(
                stack, tmp_path / "artifacts", scripts, tools=tools, routes=routes, **settings
            )

        yield factory


async def upstream_closed_within(gw: Harness, seconds: float) -> float:
    """How long until the upstream has no connection open (at most ``seconds``)."""
    started = time.perf_counter()
    async with asyncio.timeout(seconds):
        await gw.upstream.wait_connections_closed()
    return time.perf_counter() - started


def assert_well_formed(events: list[Event]) -> None:
    """The protocol invariants every stream keeps (docs/protocol.md)."""
    numbered = frames(events)
    assert numbered[0].event == "stream.begin"
    assert [int(e.id) for e in numbered] == list(range(1, len(numbered) + 1))
    assert [e.event for e in numbered].count("done") == 1
    assert numbered[-1].event == "done"


def sentinel_reply(answer: str = "Two places are open.") -> str:
    body = orjson.dumps({"answer": answer}).decode()
    return "Here you go. " + sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", body)


@pytest.fixture
async def sdk() -> AsyncIterator[SDK]:
    """The official ``openai`` client, pointed at a harness gateway (closed after the test)."""
    clients: list[AsyncOpenAI] = []

    def make(gw: Harness) -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
