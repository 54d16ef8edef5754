"""The race every run response makes between writing its body and the client leaving
(``write_until_gone``, shared by the local and the remote run response): whichever ends
first stops the other, ``on_end`` runs once both have stopped, and a writer's own error
is raised after it. The responses themselves are tested end to end over loopback
(test_agui.py, test_ui_stream.py, tests/replicas/test_format_resume.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolforge.api.run_stream import stream_headers, write_until_gone


class Client:
    """An ASGI ``receive`` that blocks until ``leave()``, then says the client is gone."""

    def __init__(self) -> None:
        self._left = asyncio.Event()
        self.stopped = False  # receive() was cancelled while it waited

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, Any]:
        try:
            await self._left.wait()
        except asyncio.CancelledError:
            self.stopped = True
            raise
        return {"type": "http.disconnect"}


async def test_a_writer_that_ends_stops_the_watcher_then_on_end_runs() -> None:
    client, log = Client(), []

    async def write() -> None:
        log.append("written")

    await write_until_gone(write(), client.receive, on_end=lambda: log.append("ended"))
    assert log == ["written", "ended"]
    assert client.stopped


async def test_a_client_that_leaves_cancels_the_writer_then_on_end_runs() -> None:
    client, log = Client(), []

    async def write() -> None:
        client.leave()
        try:
            await asyncio.Event().wait()  # a body that never ends by itself
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    await write_until_gone(write(), client.receive, on_end=lambda: log.append("ended"))
    assert log == ["cancelled", "ended"]


async def test_a_writer_error_is_raised_after_on_end_and_the_watcher_stopped() -> None:
    client, log = Client(), []

    async def write() -> None:
        await asyncio.sleep(0)
        raise OSError("the socket broke")

    with pytest.raises(OSError, match="the socket broke"):
        await write_until_gone(write(), client.receive, on_end=lambda: log.append("ended"))
    assert log == ["ended"]
    assert client.stopped


async def test_without_on_end() -> None:
    client = Client()

    async def write() -> None:
        return None

    await write_until_gone(write(), client.receive)
    assert client.stopped


def test_an_event_streams_headers_are_each_sent_once() -> None:
    # The UI message stream sets its own cache-control: it replaces the default, and
    # every header of the answer appears once.
    headers = stream_headers(
        "s-1", {"Cache-Control": "no-cache", "x-vercel-ai-ui-message-stream": "v1"}
    )
    names = [k for k, _ in headers]
    assert len(names) == len(set(names))
    assert (b"x-vercel-ai-ui-message-stream", b"v1") in headers
    assert (b"x-stream-id", b"s-1") in headers
    assert dict(stream_headers("s-2", None))[b"cache-control"] == b"no-cache"
