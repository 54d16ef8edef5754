"""This replica's view of the shared state: the parts, built and started together."""

from __future__ import annotations

from typing import Unpack

import redis.asyncio as aioredis

from toolforge.log import get_logger
from toolforge.runtime.cluster.commands import CommandChannel, CommandHandler
from toolforge.runtime.cluster.connection import (
    Connection,
    ConnectionOptions,
    RedisUnavailable,
    safe_url,
)
from toolforge.runtime.cluster.gate import RedisGate, SlotQueue
from toolforge.runtime.cluster.heartbeat import Heartbeat
from toolforge.runtime.cluster.idempotency import IdempotencyRecords
from toolforge.runtime.cluster.resume import ResumeBuffers

__all__ = ["RedisCluster"]

log = get_logger("toolforge.runtime.cluster")


class RedisCluster:
    """Built once at start-up when ``REDIS_URL`` is set, closed after the stream registry.

    ``conn`` (the pool, the timeout, the scripts), ``heartbeat`` (this replica's alive key
    and leases), ``buffers`` (resume buffers), ``idempotency``, ``commands`` (the control
    channel) and ``slots`` (the global tool limit): each part is one concept, and none of
    them knows about HTTP. ``options``: the connection's (:class:`ConnectionOptions`);
    ``flush_s`` and ``resume_ttl_s``: the resume buffers' pace and life; ``mirror_caps``:
    one mirror round trip's most commands and bytes (``REDIS_MIRROR_MAX_ENTRIES``,
    ``REDIS_MIRROR_MAX_BYTES``).
    """

    def __init__(
        self,
        url: str,
        *,
        flush_s: float,
        resume_ttl_s: float,
        mirror_caps: tuple[int, int] = (512, 1 << 20),
        **options: Unpack[ConnectionOptions],
    ) -> None:
        self.conn = Connection(url, options)
        self.heartbeat = Heartbeat(self.conn)
        entries, size = mirror_caps
        self.buffers = ResumeBuffers(
            self.conn,
            flush_s=flush_s,
            resume_ttl_s=resume_ttl_s,
            max_entries=entries,
            max_bytes=size,
        )
        self.idempotency = IdempotencyRecords(self.conn, self.buffers, self.heartbeat)
        self.commands = CommandChannel(self.conn, self.buffers)
        self.slots = SlotQueue(self.conn, self.heartbeat, self.commands.released)

    @property
    def redis(self) -> aioredis.Redis:
        """The shared client, for state another part of the runtime keeps in Redis."""
        return self.conn.redis

    def gate(self, limit: int) -> RedisGate:
        """The executor's gate for ``limit`` tool calls at once across the replicas."""
        return RedisGate(self.slots, limit)

    async def start(self, handler: CommandHandler) -> None:
        """Heartbeat and the control channel (forwarded commands go to ``handler``). A
        Redis that is down now is not fatal: the gateway serves, and what needs Redis
        fails with :class:`RedisUnavailable` until it is back."""
        self.commands.serve(handler)
        try:
            await self.heartbeat.beat()
        except RedisUnavailable as exc:
            log.warning("redis.unavailable", url=safe_url(self.conn.url), error=exc.message)
        self.conn.spawn(self.heartbeat.run())
        self.conn.spawn(self.commands.listen())

    async def aclose(self) -> None:
        """After the registry closed: flush the mirrors (the streams have ended), stop."""
        await self.buffers.flush()
        await self.heartbeat.stop()
        await self.conn.aclose()
