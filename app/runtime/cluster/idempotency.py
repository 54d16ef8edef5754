"""Idempotency records shared by the replicas: ``tf:k:{sha256(key)}`` holds ``{h: body
hash, s: stream id}``, claimed atomically, so two replicas given the same key at once start
one stream, and the other request gets the in-flight error."""

from __future__ import annotations

from toolforge.runtime.cluster.connection import Connection
from toolforge.runtime.cluster.heartbeat import Heartbeat
from toolforge.runtime.cluster.keys import idem_key, meta_key
from toolforge.runtime.cluster.resume import RemoteStream, ResumeBuffers
from toolforge.runtime.streams import StreamRegistry

__all__ = ["IdempotencyRecords"]


class IdempotencyRecords:
    def __init__(self, conn: Connection, buffers: ResumeBuffers, heartbeat: Heartbeat) -> None:
        self._conn = conn
        self._buffers = buffers
        self._heartbeat = heartbeat

    async def replay_for(self, key: str, body_hash: str) -> RemoteStream | None:
        """As ``StreamRegistry.replay_for``, across replicas: the stream to replay, None
        for a new key; reused for another body, in flight while it runs."""
        conn = self._conn
        record = await conn.call("an Idempotency-Key", conn.redis.hmget(idem_key(key), ["h", "s"]))
        if record[0] is None:
            return None
        if record[0].decode() != body_hash:
            raise StreamRegistry.key_reused()
        stream_id = record[1].decode()
        stream = await self._buffers.find(stream_id)
        if stream is None:
            return None
        if stream.state == "running" and await self._heartbeat.alive(stream.owner):
            raise StreamRegistry.in_flight(stream_id)
        return stream

    async def claim(
        self, key: str, body_hash: str, stream_id: str, api_key: str | None = None
    ) -> tuple[str, str] | None:
        """Claim ``key`` for a new stream (started with ``api_key``, a key name); the
        (body hash, stream id) holding it already, if any."""
        conn = self._conn
        result = await conn.call(
            "an Idempotency-Key",
            conn.script("claim")(
                keys=[idem_key(key), meta_key(stream_id)],
                args=[body_hash, stream_id, conn.replica_id, self._buffers.ttl_ms, api_key or ""],
            ),
        )
        if result == 1:
            return None
        return bytes(result[0]).decode(), bytes(result[1]).decode()
