"""The SSE edge: a session's frame log written to one client, with pings and disconnects.

Built on sse-starlette's ``EventSourceResponse``, which races the writer against the
client's ``http.disconnect`` and a ping task in one task group, sets
``X-Accel-Buffering: no`` and serialises sends with a lock. We hand it bytes that are
already encoded (``app.core.wire``) and already coalesced (``FrameLog.follow``), so its
per-event cost is paid once per batch, not once per frame or token.
"""

from __future__ import annotations

from collections.abc import Mapping

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.types import Receive, Scope, Send

from app.runtime.session import StreamSession

__all__ = ["FrameStreamResponse"]


def _ping() -> ServerSentEvent:
    # No id: pings are not frames (docs/protocol.md), so they never move Last-Event-ID.
    return ServerSentEvent(event="ping", data="{}", sep="\n")  # encodes to wire.PING_BYTES


class FrameStreamResponse(EventSourceResponse):
    """Write ``session``'s frames after id ``after`` to the client, then follow it live.

    The *primary* response (the one that started the stream) throttles the producer and,
    when it ends for any reason — the stream finished, the client left before or after
    the headers, the server shuts down — tells the session, which cancels the upstream
    unless the request asked for ``on_disconnect: "continue"``.
    """

    def __init__(
        self,
        session: StreamSession,
        *,
        after: int = 0,
        primary: bool = False,
        ping_interval_s: float = 15.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._primary = primary
        super().__init__(
            session.log.follow(after, primary=primary),
            headers={"Cache-Control": "no-store", "X-Stream-Id": session.id, **(headers or {})},
            ping=ping_interval_s,
            ping_message_factory=_ping,
            sep="\n",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._primary:
                self._session.client_left()
