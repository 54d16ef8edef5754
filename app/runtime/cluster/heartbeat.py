"""This replica's heartbeat: its alive key, and the leases it holds (tool slots, streams
of a rate-limited key) renewed with it, so a replica that dies frees them by itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

from toolforge.runtime.cluster.connection import Connection, RedisUnavailable
from toolforge.runtime.cluster.keys import alive_key

__all__ = ["Heartbeat"]


class Heartbeat:
    """Renews ``tf:r:{replica}`` every third of ``REPLICA_TTL_S``, and every lease held."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._leases: defaultdict[str, set[str]] = defaultdict(set)  # sorted set -> tokens

    def hold(self, zkey: str, token: str) -> None:
        """Renew ``token``'s lease in ``zkey`` from now on."""
        self._leases[zkey].add(token)

    def drop(self, zkey: str, token: str) -> None:
        tokens = self._leases.get(zkey)
        if tokens is not None:
            tokens.discard(token)
            if not tokens:
                del self._leases[zkey]

    def held(self, zkey: str) -> set[str]:
        return set(self._leases.get(zkey, ()))

    async def beat(self) -> None:
        conn = self._conn
        pipe = conn.redis.pipeline(transaction=False)
        pipe.set(alive_key(conn.replica_id), b"1", px=int(conn.replica_ttl_s * 1000))
        renew = conn.script("lease_renew")
        for zkey, tokens in list(self._leases.items()):
            await renew(keys=[zkey], args=[conn.lease_ms, *tokens], client=pipe)
        await conn.call("the heartbeat", pipe.execute())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._conn.replica_ttl_s / 3)
            try:
                await self.beat()
            except RedisUnavailable as exc:
                self._conn.warn("redis.unavailable", error=exc.message)

    async def alive(self, replica: str) -> bool:
        """Whether ``replica``'s heartbeat is current (this replica always is)."""
        conn = self._conn
        if replica == conn.replica_id:
            return True
        found = await conn.call("a replica's heartbeat", conn.redis.exists(alive_key(replica)))
        return bool(found)

    async def stop(self) -> None:
        """This replica leaves: its alive key goes at once, not when it expires."""
        conn = self._conn
        with contextlib.suppress(RedisUnavailable):
            await conn.call("the heartbeat", conn.redis.delete(alive_key(conn.replica_id)))
