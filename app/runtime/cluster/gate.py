"""The global tool limit: a fair (FIFO across replicas) counting semaphore of
``TOOL_CONCURRENCY`` slots, in Lua (Redis in Action §6.3's design). A holder's slot is
leased for ``REPLICA_TTL_S`` and renewed by its heartbeat, so a replica that dies frees its
slots; a Redis that does not answer leaves the limit to this replica's own gate."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Final

from toolforge.runtime.cluster.connection import Connection, RedisUnavailable, quietly
from toolforge.runtime.cluster.heartbeat import Heartbeat
from toolforge.runtime.cluster.keys import SEM_KEYS, SEM_RELEASED
from toolforge.runtime.executor import FifoGate

__all__ = ["RedisGate", "SlotQueue"]

# A waiter for a tool slot looks again this often even when no release was announced
# (a holder's lease that expired announces nothing).
_SEM_POLL_S: Final = 0.1


class SlotQueue:
    """The semaphore's two operations, for this replica."""

    def __init__(self, conn: Connection, heartbeat: Heartbeat, released: asyncio.Event) -> None:
        self._conn = conn
        self._heartbeat = heartbeat
        self._released = released

    async def acquire(self, limit: int) -> str | None:
        """A global slot's token, FIFO across replicas; None if Redis is unreachable (the
        caller then relies on its own replica's gate)."""
        conn = self._conn
        token = secrets.token_hex(8)
        acquire = conn.script("sem_acquire")
        try:
            while True:
                self._released.clear()
                got = await conn.call(
                    "the tool limit",
                    acquire(keys=list(SEM_KEYS), args=[token, limit, conn.lease_ms]),
                )
                if got == 1:
                    self._heartbeat.hold(SEM_KEYS[0], token)
                    return token
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_SEM_POLL_S):
                        await self._released.wait()
        except RedisUnavailable as exc:
            conn.warn("redis.tool_limit_local", error=exc.message)
            conn.spawn(self._leave(token))
            return None
        except BaseException:
            conn.spawn(self._leave(token))  # cancelled while queued (or holding)
            raise

    def release(self, token: str) -> None:
        """Give the slot back (in the background: the caller may be cancelled)."""
        self._heartbeat.drop(SEM_KEYS[0], token)
        self._conn.spawn(self._leave(token))

    async def _leave(self, token: str) -> None:
        self._heartbeat.drop(SEM_KEYS[0], token)
        pipe = self._conn.redis.pipeline(transaction=False)
        pipe.zrem(SEM_KEYS[0], token)
        pipe.zrem(SEM_KEYS[1], token)
        pipe.zrem(SEM_KEYS[2], token)
        pipe.publish(SEM_RELEASED, b"1")
        await quietly(self._conn, "the tool limit", pipe.execute())


class RedisGate:
    """The executor's gate (``toolforge.runtime.executor.Gate``) across replicas: this
    replica's FIFO gate first (its own queue, depth and metrics), then a global slot."""

    def __init__(self, slots: SlotQueue, limit: int) -> None:
        self._slots = slots
        self._local = FifoGate(limit)
        self.limit = limit
        self._tokens: list[str | None] = []

    @property
    def active(self) -> int:
        """Slots held here (the local gate's: the global slot comes with each)."""
        return self._local.active

    def would_wait(self) -> bool:
        return self._local.would_wait()

    @property
    def depth(self) -> int:
        return self._local.depth

    async def acquire(self) -> None:
        await self._local.acquire()
        try:
            token = await self._slots.acquire(self.limit)
        except BaseException:
            self._local.release()
            raise
        self._tokens.append(token)

    def release(self) -> None:
        token = self._tokens.pop() if self._tokens else None
        if token is not None:
            self._slots.release(token)
        self._local.release()
