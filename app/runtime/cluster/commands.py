"""Commands for a stream run by another replica, over Redis pub/sub.

A command (:mod:`toolforge.runtime.commands`: cancel, an approval, a client tool's result)
posted to a replica that does not run the stream is published on the owner's channel
``tf:c:{owner}``; the owner applies it with the same function a local command goes
through and answers on the asker's channel with the answer, or the error, it gave. The
same channel carries the tool slots' release notices (:mod:`.gate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from redis.exceptions import RedisError

from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.runtime.cluster.connection import Connection, RedisUnavailable
from toolforge.runtime.cluster.keys import SEM_RELEASED, channel
from toolforge.runtime.cluster.resume import ResumeBuffers

__all__ = ["CommandChannel", "CommandHandler", "RemoteError"]

CommandHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""``(stream_id, command as sent) -> answer``: what the owner of a stream runs for a
command another replica forwarded; it raises a :class:`ToolForgeError` to refuse."""


class RemoteError(ToolForgeError):
    """An error the owner replica answered with, passed on as it was."""

    def __init__(self, error: dict[str, Any], status: int) -> None:
        try:
            code = ErrorCode(str(error.get("code")))
        except ValueError:  # a newer replica's code (a rolling deploy): passed on as is
            code = ErrorCode.INTERNAL
        super().__init__(code, str(error.get("message", "")))
        self.http_status = status
        self.retryable = bool(error.get("retryable", False))
        self._body = error

    def to_dict(self) -> dict[str, object]:
        return dict(self._body)


class CommandChannel:
    """This replica's control channel: commands in, answers out, and slot releases."""

    def __init__(self, conn: Connection, buffers: ResumeBuffers) -> None:
        self._conn = conn
        self._buffers = buffers
        self._handler: CommandHandler | None = None
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.released = asyncio.Event()  # a tool slot was given back somewhere

    def serve(self, handler: CommandHandler) -> None:
        """Apply forwarded commands with ``handler`` (the runtime's, never a route's)."""
        self._handler = handler

    async def send(self, stream_id: str, command: dict[str, Any]) -> dict[str, Any] | None:
        """Run ``command`` on the replica that owns ``stream_id``: its answer, or None if
        no other replica runs it (never existed, expired, or its replica died). Its
        refusal is raised here as a :class:`RemoteError`."""
        conn = self._conn
        stream = await self._buffers.find(stream_id)
        if stream is None or stream.owner == conn.replica_id:
            return None
        corr = secrets.token_hex(8)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[corr] = waiter
        message = {"stream_id": stream_id, "command": command}
        message |= {"reply_to": conn.replica_id, "corr": corr}
        what = f"{command.get('type')} on another replica"
        try:
            receivers = await conn.call(
                what, conn.redis.publish(channel(stream.owner), orjson.dumps(message))
            )
            if not receivers:
                return None  # its replica is gone: nothing to cancel, approve or feed
            try:
                async with asyncio.timeout(max(conn.timeout_s * 4, 2.0)):
                    reply = await waiter
            except TimeoutError as exc:
                raise RedisUnavailable(f"{what} ({stream.owner})", exc) from exc
        finally:
            self._replies.pop(corr, None)
        if "error" in reply:
            raise RemoteError(reply["error"], int(reply.get("status", 500)))
        answer: dict[str, Any] = reply["answer"]
        return answer

    async def listen(self) -> None:
        """Subscribe and dispatch; resubscribes whenever the connection is lost."""
        conn = self._conn
        while True:
            pubsub = conn.redis.pubsub()
            try:
                await conn.call(
                    "the control channel",
                    pubsub.subscribe(channel(conn.replica_id), SEM_RELEASED),
                )
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None:
                        continue
                    if message["channel"] == SEM_RELEASED.encode():
                        self.released.set()
                        continue
                    self._on_message(orjson.loads(message["data"]))
            except (RedisUnavailable, RedisError, OSError) as exc:
                conn.warn("redis.unavailable", error=str(exc))
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(conn.timeout_s):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_message(self, message: dict[str, Any]) -> None:
        if "reply_to" not in message:  # an answer to one of ours
            waiter = self._replies.get(message.get("corr", ""))
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            return
        self._conn.spawn(self._answer(message))

    async def _answer(self, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"corr": message["corr"]}
        try:
            if self._handler is None:
                raise ToolForgeError(ErrorCode.INTERNAL, "this replica takes no commands yet")
            reply["answer"] = await self._handler(message["stream_id"], message["command"])
        except ToolForgeError as exc:
            reply |= {"error": exc.to_dict(), "status": exc.http_status}
        with contextlib.suppress(RedisUnavailable):
            await self._conn.call(
                "a reply",
                self._conn.redis.publish(channel(message["reply_to"]), orjson.dumps(reply)),
            )
