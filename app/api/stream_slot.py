"""A key's concurrent stream, for the front doors FastAPI serves (docs/deployment.md).

``POST /v1/stream`` and the proxy take one of the API key's concurrent streams in the
gateway's ASGI entry (:class:`toolforge.api.fastpath.GatewayApp`), by path. The wire
formats served as routes (``/v1/responses``, ``/v1/agui``, ``/v1/ui/chat``, the
WebSocket) take theirs here, and only for a request that starts a stream: the next run of
an AG-UI run or of a UI message after an approval follows a stream that holds its slot
already, as a resume does. :class:`StreamSlot` takes it (``RATE_LIMITED``, 429, at the
key's limit), lends it to the start sequence (so :func:`toolforge.api.auth.own` ties it to
the stream), and gives it back when the response has been sent, or when the stream ends,
if it goes on without its client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from toolforge.api.auth import Access, ApiKey
from toolforge.api.auth import StreamSlot as _Slot

__all__ = ["SlotHeld", "StreamSlot"]


class StreamSlot:
    """One request's hold on one of its key's concurrent streams (none without keys, or
    for a key with no such limit)."""

    def __init__(self, access: Access | None, slot: _Slot | None) -> None:
        self._access = access
        self._slot = slot

    @classmethod
    async def take(cls, app: Any, key: ApiKey | None) -> StreamSlot:
        """The slot, or the key's ``RateLimited`` refusal."""
        access: Access | None = getattr(app, "access", None)
        if access is None or key is None:
            return cls(None, None)
        return cls(access, await access.open_stream(key))

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Around the start sequence: the stream it starts holds the slot."""
        if self._access is None:
            yield
            return
        with self._access.serving(self._slot):
            yield

    async def release(self) -> None:
        """The request is over: the slot goes back now, or when its stream ends."""
        if self._access is not None:
            await self._access.request_ended(self._slot)
            self._access = None


class SlotHeld(Response):
    """``response``, then the slot given back (however the response ended)."""

    def __init__(self, response: Response, slot: StreamSlot) -> None:
        self._response = response
        self._slot = slot
        self.status_code = response.status_code
        self.background = None
        self.raw_headers = response.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._response(scope, receive, send)
        finally:
            await self._slot.release()
