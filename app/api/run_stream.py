"""The response that writes one *run* of a stream: its frames after a given id, in another
wire format, until that format's writer says the run has ended.

AG-UI (``/v1/agui``) and the AI SDK's UI stream (``/v1/ui/chat``) end a run before the
stream ends when a tool call waits for a person's approval: the run is over for the
client, while the stream waits for the decision, which the client's next request brings;
that request's response is the next run of the same stream, from the frame after the
call. :class:`toolforge.api.sse.FrameStreamResponse` writes a stream to its end; this
writes it to the writer's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping
from typing import Any, Protocol, cast

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from toolforge.runtime.session import StreamSession

__all__ = [
    "RunStreamResponse",
    "RunWriter",
    "stream_headers",
    "until_disconnect",
    "write_until_gone",
]


class RunWriter(Protocol):
    """Encoded frames in, the format's bytes out; ``ended`` once the run is over."""

    @property
    def ended(self) -> bool: ...

    def batch(self, encoded: bytes) -> bytes: ...


class RunStreamResponse(Response):
    """``session``'s frames after id ``after``, written by ``writer``, until the run ends
    or the client leaves. ``primary``: this response throttles the producer, and its
    end is the client leaving (the plan's ``on_disconnect`` applies); otherwise it is a
    reader that joined."""

    media_type = "text/event-stream"

    def __init__(
        self,
        session: StreamSession,
        writer: RunWriter,
        *,
        after: int,
        primary: bool,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._writer = writer
        self._after = after
        self._primary = primary
        self.status_code = 200
        self.background = None
        self.raw_headers = stream_headers(session.id, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self._session
        left = session.client_left if self._primary else session.reader_left
        await write_until_gone(self._write(send), receive, on_end=left)

    async def _write(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        writer = self._writer
        last = b""  # held back one batch: the run's end goes with the body's end
        # follow() is an async generator: closed here, at once, when the run ends first
        follow = cast(
            AsyncGenerator[bytes, None],
            self._session.log.follow(self._after, primary=self._primary),
        )
        async with contextlib.aclosing(follow) as batches:
            async for batch in batches:
                if last:
                    await send({"type": "http.response.body", "body": last, "more_body": True})
                last = writer.batch(batch)
                if writer.ended:
                    break
        await send({"type": "http.response.body", "body": last, "more_body": False})


def stream_headers(stream_id: str, headers: Mapping[str, str] | None) -> list[tuple[bytes, bytes]]:
    """An event stream's response headers (no caching, no proxy buffering, its id), each
    once: a header the door sets itself (the UI message stream's ``cache-control``)
    replaces the default rather than repeat it."""
    own = {k.lower().encode("latin-1"): v.encode("latin-1") for k, v in (headers or {}).items()}
    defaults = (
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        (b"x-stream-id", stream_id.encode("latin-1")),
    )
    return [(k, v) for k, v in defaults if k not in own] + list(own.items())


async def write_until_gone(
    write: Coroutine[Any, Any, None],
    receive: Receive,
    *,
    on_end: Callable[[], None] | None = None,
) -> None:
    """Run ``write`` (a response's body being sent) until it ends or the client
    disconnects, whichever comes first: the other is cancelled, and both have stopped
    before ``on_end`` runs (the session told its client or reader left), however it ended.
    The writer's own error is raised then, after ``on_end``, for the server to log."""
    writing = asyncio.ensure_future(write)
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait((writing, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (writing, gone):
            task.cancel()
        # return_exceptions: a writer that failed stops the watcher and reaches on_end too
        await asyncio.gather(writing, gone, return_exceptions=True)
        if on_end is not None:
            on_end()
    if not writing.cancelled() and (failed := writing.exception()) is not None:
        raise failed


async def until_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the route has read the request body); a
    server that raises instead of sending ``http.disconnect`` has lost it too."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
