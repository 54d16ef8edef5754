"""The response that writes one run of a stream *another replica runs*, in another wire
format: :class:`toolforge.api.run_stream.RunStreamResponse`, read from the stream's resume
buffer in Redis (:class:`toolforge.runtime.cluster.RemoteStream`) instead of a frame log.

An AG-UI run or a UI message that answers an approval may land on any replica: the
decision goes to the owner (``Streams.command``), and this replica re-encodes the
mirrored frames after the call into the format, as ``GET /v1/streams/{id}`` serves them
as SSE (:class:`toolforge.api.sse.RemoteStreamResponse`). It is never the primary reader:
it cannot throttle a producer in another process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

import orjson
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from toolforge.api.run_stream import RunWriter, stream_headers, write_until_gone
from toolforge.errors import ToolForgeError
from toolforge.runtime.cluster import RemoteStream

__all__ = ["RemoteRunResponse"]


class RemoteRunResponse(Response):
    """``stream``'s frames after id ``after``, written by ``writer``, until the run ends,
    the stream ends or the client leaves."""

    media_type = "text/event-stream"

    def __init__(
        self,
        stream: RemoteStream,
        writer: RunWriter,
        *,
        after: int,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._stream = stream
        self._writer = writer
        self._after = after
        self.status_code = 200
        self.background = None
        self.raw_headers = stream_headers(stream.id, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await write_until_gone(self._write(send), receive)

    async def _write(self, send: Send) -> None:
        frames: AsyncIterator[bytes] = self._stream.follow(self._after)
        try:
            try:
                # The first read before the head: a Redis that fails now is its error
                # body with its status, not a 200 that ends at once.
                batch: bytes | None = await anext(frames)
            except ToolForgeError as exc:
                await send(
                    {
                        "type": "http.response.start",
                        "status": exc.http_status,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                body = orjson.dumps({"error": exc.to_dict()})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            except StopAsyncIteration:
                batch = None
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            writer = self._writer
            last = b""  # held back one batch: the run's end goes with the body's end
            while batch is not None:
                if batch:  # b"": nothing came for a while
                    if last:
                        await send({"type": "http.response.body", "body": last, "more_body": True})
                    last = writer.batch(batch)
                    if writer.ended:
                        break
                try:
                    batch = await anext(frames)
                except (StopAsyncIteration, ToolForgeError):
                    batch = None  # the end, or Redis gone: the body ends where it is
            await send({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            aclose = getattr(frames, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
