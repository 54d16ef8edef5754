"""Per-key rate limits shared by every replica (docs/security.md): the three methods of the
auth layer's ``RateLimiter`` (``hit``, ``open_stream``, ``close_stream``), each one Lua call
on Redis's clock, so every replica counts the same windows and streams.

- ``hit``: a fixed window per key (``INCR`` of ``tf:rl:{sha256(key)}:{window index}``,
  expiring with its window); 0 if the request may go on, else the seconds until the
  window turns (the ``Retry-After``). Over the limit the request still counts.
- ``open_stream`` / ``close_stream``: a sorted set of leases per key; each lease lasts
  ``REPLICA_TTL_S`` and is renewed by this replica's heartbeat, so the streams of a
  replica that dies are given back by themselves.

A Redis that does not answer is a :class:`RedisUnavailable`, not a free pass.
"""

from __future__ import annotations

import secrets
from typing import Protocol

from toolforge.runtime.cluster.connection import Connection, quietly
from toolforge.runtime.cluster.heartbeat import Heartbeat
from toolforge.runtime.cluster.keys import hashed
from toolforge.runtime.ratelimit import RateLimit

__all__ = ["RedisRateLimiter"]


class RedisRateLimiter:
    """See the module docstring. Built on a cluster's connection and heartbeat."""

    def __init__(self, cluster: _HasParts) -> None:
        self._conn = cluster.conn
        self._heartbeat = cluster.heartbeat
        self._open: dict[str, list[str]] = {}  # key -> lease tokens taken here

    async def hit(self, key: str, limit: RateLimit) -> float:
        conn = self._conn
        wait_ms = await conn.call(
            "the rate limit",
            conn.script("window_hit")(
                keys=[hashed("rl", key)],
                args=[limit.requests, max(1, int(limit.window_s * 1000))],
            ),
        )
        return int(wait_ms) / 1000

    async def open_stream(self, key: str, limit: RateLimit) -> bool:
        conn = self._conn
        zkey = hashed("rs", key)
        token = f"{conn.replica_id}:{secrets.token_hex(6)}"
        taken = await conn.call(
            "the stream limit",
            conn.script("stream_open")(keys=[zkey], args=[token, limit.streams, conn.lease_ms]),
        )
        if not taken:
            return False
        self._open.setdefault(key, []).append(token)
        self._heartbeat.hold(zkey, token)
        return True

    async def close_stream(self, key: str) -> None:
        tokens = self._open.get(key)
        if not tokens:
            return
        token = tokens.pop()
        if not tokens:
            del self._open[key]
        zkey = hashed("rs", key)
        self._heartbeat.drop(zkey, token)
        await quietly(self._conn, "the stream limit", self._conn.redis.zrem(zkey, token))


class _HasParts(Protocol):
    @property
    def conn(self) -> Connection: ...

    @property
    def heartbeat(self) -> Heartbeat: ...
