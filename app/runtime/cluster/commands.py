"""Commands for a stream run by another replica, over Redis pub/sub.

A command (:mod:`toolforge.runtime.commands`: cancel, an approval, a client tool's result)
posted to a replica that does not run the stream is published on the owner's channel
``tf:c:{owner}``; the owner applies it with the same function a local command goes
through and answers on the asker's channel with the answer, or the error, it gave. The
same channel carries the tool slots' release notices (:mod:`.gate`).

Every message carries ``v``, :data:`WIRE_VERSION`, the shape of the envelope and of the
command in it. Replicas of two releases run side by side during a rolling upgrade: a
message of another version (or of a release before the field, which has none) is never
read as ours. A command is answered with the typed refusal
``COMMAND_VERSION_UNSUPPORTED`` (503, retryable: the stream's replica runs another
release; the upgrade ends it), and an answer of another version is that refusal too.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
from redis.exceptions import RedisError

from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.runtime.cluster.connection import Connection, RedisUnavailable
from toolforge.runtime.cluster.keys import SEM_RELEASED, channel
from toolforge.runtime.cluster.resume import ResumeBuffers

__all__ = ["WIRE_VERSION", "CommandChannel", "CommandHandler", "RemoteError", "version_refusal"]

# The envelope's shape: 2 is {v, stream_id, command, reply_to, corr} out and {v, corr,
# answer | error + status} back, the command as ``runtime.commands.to_wire`` writes it.
# Raise it whenever either changes shape; a release before the field sent none (1).
WIRE_VERSION: Final = 2

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


def version_refusal(version: object) -> dict[str, Any]:
    """The reply that refuses a message of envelope version ``version`` (an error and
    its status, readable by a replica of any release: every one reads those two keys)."""
    error = ToolForgeError(
        ErrorCode.COMMAND_VERSION_UNSUPPORTED,
        f"replicas of two releases: a stream command in wire format v{version or 1} met "
        f"one that reads v{WIRE_VERSION}; retry once the rolling upgrade is over, or send "
        "it to the replica that runs the stream",
    ).to_dict()
    return {"v": WIRE_VERSION, "error": error | {"retryable": True}, "status": 503}


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
        stream = await self._buffers.find_announced(stream_id)
        if stream is None or stream.owner == conn.replica_id:
            return None
        corr = secrets.token_hex(8)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[corr] = waiter
        message = {"v": WIRE_VERSION, "stream_id": stream_id, "command": command}
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
                    try:
                        self._on_message(orjson.loads(message["data"]))
                    except (orjson.JSONDecodeError, TypeError, KeyError):  # not ours to read
                        conn.warn("cluster.command_unreadable", channel=str(message["channel"]))
            except (RedisUnavailable, RedisError, OSError) as exc:
                conn.warn("redis.unavailable", error=str(exc))
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(conn.timeout_s):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_message(self, message: dict[str, Any]) -> None:
        if not isinstance(message, dict) or "corr" not in message:
            raise TypeError("a control message is an object with 'corr'")
        if "reply_to" not in message:  # an answer to one of ours
            waiter = self._replies.get(message.get("corr", ""))
            if waiter is not None and not waiter.done():
                version = message.get("v")
                waiter.set_result(message if version == WIRE_VERSION else version_refusal(version))
            return
        self._conn.spawn(self._answer(message))

    async def _answer(self, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"v": WIRE_VERSION, "corr": message["corr"]}
        try:
            if message.get("v") != WIRE_VERSION:
                reply = version_refusal(message.get("v")) | reply
            elif self._handler is None:
                raise ToolForgeError(ErrorCode.INTERNAL, "this replica takes no commands yet")
            else:
                reply["answer"] = await self._handler(message["stream_id"], message["command"])
        except ToolForgeError as exc:
            reply |= {"error": exc.to_dict(), "status": exc.http_status}
        with contextlib.suppress(RedisUnavailable):
            await self._conn.call(
                "a reply",
                self._conn.redis.publish(channel(message["reply_to"]), orjson.dumps(reply)),
            )
