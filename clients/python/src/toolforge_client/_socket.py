"""The WebSocket transport (``transport="ws"``): one socket to ``GET /v1/stream/ws`` carries
the stream's frames and the client's commands (tool results, approvals, cancel).

The gateway sends each frame as ``{"id", "event", "data"}``, a command's answer as
``{"type": "answer", ...}`` and a refused message as ``{"type": "error", ...}``
(docs/websocket.md). The SDK offers the subprotocol :data:`SUBPROTOCOL`: a gateway that
selects it sends every batch of frames as one message of JSON lines (one object per
line), which costs it one write per batch rather than one per frame. Every message is
read as lines, so a gateway that selects none (one object per message) reads the same.

A command is answered in order, but frames keep arriving while it waits: those read
before its answer are kept, in order, for the stream's reader. So the stream's helpers
(``approve``, ``submit_tool_result``, ``cancel``) are called from the code that reads the
stream (its loop, a callback), never beside it from another thread or task: one socket
has one reader.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Final, NamedTuple

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from toolforge_client.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    socket_error,
)

__all__ = ["SUBPROTOCOL", "AsyncSocket", "SocketFrame", "SyncSocket", "socket_url"]

# A frame may carry a large tool result or object: the gateway bounds what it sends.
_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024

SUBPROTOCOL: Final = "toolforge.frames.v1"
"""Several frames per message, as JSON lines (``Sec-WebSocket-Protocol``)."""
_OFFER: Final = [Subprotocol(SUBPROTOCOL)]


class SocketFrame(NamedTuple):
    """One frame off the socket, shaped as an SSE event (``data`` already parsed)."""

    event: str
    id: str
    data: Any


def socket_url(base_url: str) -> str:
    """``http://host`` → ``ws://host/v1/stream/ws`` (``https`` → ``wss``)."""
    scheme, sep, rest = base_url.partition("://")
    ws_scheme = {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme)
    return f"{ws_scheme}{sep}{rest}/v1/stream/ws"


def _read(line: str | bytes) -> tuple[str, Any]:
    """One object of a message: ``("frame", SocketFrame)``, ``("answer", dict)`` or
    ``("error", dict)``."""
    message = json.loads(line)
    if not isinstance(message, dict):
        return "other", message
    if "event" in message and "id" in message:
        return "frame", SocketFrame(message["event"], str(message["id"]), message["data"])
    kind = message.get("type")
    if kind == "answer":
        return "answer", message.get("answer") or {}
    if kind == "error":
        return "error", message.get("error") or {}
    return "other", message


def _handshake_error(exc: Exception, url: str) -> Exception:
    """The typed error for a socket that did not open."""
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        body = exc.response.body or b""
        reason = body.decode("utf-8", "replace").strip()[:300] or "refused"
        return socket_error(
            {"code": "FORBIDDEN" if status == 403 else None, "message": reason},
            status=status,
            prefix=f"the gateway refused the socket (HTTP {status}; a missing or unknown "
            "API key, a Host or Origin not allowed)",
        )
    cls = APITimeoutError if isinstance(exc, TimeoutError) else APIConnectionError
    return cls(f"opening {url}: {type(exc).__name__}: {exc}")


class SyncSocket:
    """A socket for the sync client."""

    def __init__(self, base_url: str, headers: Mapping[str, str], open_timeout: float) -> None:
        url = socket_url(base_url)
        try:
            self._ws: SyncConnection = connect(
                url,
                additional_headers=dict(headers),
                open_timeout=open_timeout,
                max_size=_MAX_MESSAGE_BYTES,
                subprotocols=_OFFER,
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise _handshake_error(exc, url) from exc
        self._kept: deque[SocketFrame] = deque()

    def open(self, message: dict[str, Any]) -> SocketFrame:
        """Send ``start`` or ``resume`` and wait for its first frame (kept for the reader,
        and returned): a refusal raises here, as an HTTP error does before an SSE stream
        starts."""
        self._send(message)
        while not self._kept:
            self._one()
        return self._kept[0]

    def frames(self) -> Iterator[SocketFrame]:
        """The frames, until the socket closes (a drop ends the iterator, as a dropped SSE
        response does: the stream resumes on a new socket)."""
        while True:
            if self._kept:
                yield self._kept.popleft()
                continue
            try:
                self._one()
            except APIConnectionError:
                return

    def command(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a command and return its answer (the HTTP route's JSON)."""
        self._send(message)
        while True:
            answer = self._one()
            if answer is not None:
                return answer

    def close(self) -> None:
        self._ws.close()

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._ws.send(json.dumps(message))
        except ConnectionClosed as exc:
            raise APIConnectionError(f"the socket closed: {exc}") from exc

    def _one(self) -> dict[str, Any] | None:
        """Read one message: a frame is kept, an answer returned, a refusal raised."""
        try:
            text = self._ws.recv()
        except ConnectionClosed as exc:
            raise APIConnectionError(f"the socket closed: {exc}") from exc
        return _take(self._kept, text)


class AsyncSocket:
    """A socket for the asyncio client."""

    def __init__(self, ws: AsyncConnection) -> None:
        self._ws = ws
        self._kept: deque[SocketFrame] = deque()

    @classmethod
    async def connect(
        cls, base_url: str, headers: Mapping[str, str], open_timeout: float
    ) -> AsyncSocket:
        url = socket_url(base_url)
        try:
            ws = await aconnect(
                url,
                additional_headers=dict(headers),
                open_timeout=open_timeout,
                max_size=_MAX_MESSAGE_BYTES,
                subprotocols=_OFFER,
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise _handshake_error(exc, url) from exc
        return cls(ws)

    async def open(self, message: dict[str, Any]) -> SocketFrame:
        """As :meth:`SyncSocket.open`."""
        await self._send(message)
        while not self._kept:
            await self._one()
        return self._kept[0]

    async def frames(self) -> AsyncIterator[SocketFrame]:
        while True:
            if self._kept:
                yield self._kept.popleft()
                continue
            try:
                await self._one()
            except APIConnectionError:
                return

    async def command(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._send(message)
        while True:
            answer = await self._one()
            if answer is not None:
                return answer

    async def close(self) -> None:
        await self._ws.close()

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed as exc:
            raise APIConnectionError(f"the socket closed: {exc}") from exc

    async def _one(self) -> dict[str, Any] | None:
        try:
            text = await self._ws.recv()
        except ConnectionClosed as exc:
            raise APIConnectionError(f"the socket closed: {exc}") from exc
        return _take(self._kept, text)


def _take(kept: deque[SocketFrame], text: str | bytes) -> dict[str, Any] | None:
    """A message's objects, one per line: frames kept, a command's answer returned, a
    refusal raised (the gateway sends either alone, as a message of its own)."""
    answer: dict[str, Any] | None = None
    lines = text.split("\n") if isinstance(text, str) else text.split(b"\n")
    for line in lines:
        if not line:
            continue
        kind, value = _read(line)
        if kind == "frame":
            kept.append(value)
        elif kind == "answer":
            answer = value
        elif kind == "error":
            error: APIStatusError = socket_error(value)
            raise error
        # else: an object this SDK does not know yet, left out
    return answer
