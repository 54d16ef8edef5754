"""Stored responses (``store: true`` on ``POST /v1/responses``): in memory, or on Redis when
``REDIS_URL`` is set, so that any replica answers ``GET /v1/responses/{id}`` and continues
a conversation from its ``previous_response_id`` (docs/responses.md).

A record is one JSON object: ``response`` (the response object as ``GET`` returns it),
``input_items`` (the request's own input items, with ids), ``context`` (every item the
next response in the conversation starts from: the earlier context, this input, this
output) and ``owner`` (the API key's name, or null). Both stores bound what they keep:
each record lives ``RESPONSES_TTL_S`` after its last write; the memory store also keeps at
most ``RESPONSES_MAX_STORED`` records, dropping the oldest first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolforge.runtime.cluster import RedisUnavailable

__all__ = ["MemoryResponseStore", "RedisResponseStore", "ResponseStore"]

_PREFIX: Final = "tf:resp:"


class ResponseStore(Protocol):
    """Where stored responses live."""

    async def put(self, response_id: str, record: dict[str, Any]) -> None: ...
    async def get(self, response_id: str) -> dict[str, Any] | None: ...
    async def delete(self, response_id: str) -> bool: ...


class MemoryResponseStore:
    """This process's stored responses: at most ``max_records``, each for ``ttl_s``."""

    def __init__(
        self,
        *,
        max_records: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._records: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._max = max_records
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, response_id: str, record: dict[str, Any]) -> None:
        self._records[response_id] = (self._clock() + self._ttl_s, record)
        self._records.move_to_end(response_id)
        while len(self._records) > self._max:
            self._records.popitem(last=False)

    async def get(self, response_id: str) -> dict[str, Any] | None:
        found = self._records.get(response_id)
        if found is None:
            return None
        expires, record = found
        if self._clock() >= expires:
            del self._records[response_id]
            return None
        return record

    async def delete(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None


class RedisResponseStore:
    """Stored responses on Redis, shared by every replica: ``tf:resp:{id}``, one JSON
    string each, expiring ``ttl_s`` after its last write. A Redis that does not answer
    is a typed 503 (``REDIS_UNAVAILABLE``), as for the rest of the shared state."""

    def __init__(self, redis: aioredis.Redis, *, ttl_s: float) -> None:
        self._redis = redis
        self._ttl_ms = max(1000, int(ttl_s * 1000))

    async def put(self, response_id: str, record: dict[str, Any]) -> None:
        try:
            await self._redis.set(_PREFIX + response_id, orjson.dumps(record), px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable("a stored response", exc) from exc

    async def get(self, response_id: str) -> dict[str, Any] | None:
        try:
            raw = await self._redis.get(_PREFIX + response_id)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable("a stored response", exc) from exc
        if raw is None:
            return None
        record: dict[str, Any] = orjson.loads(raw)
        return record

    async def delete(self, response_id: str) -> bool:
        try:
            return bool(await self._redis.delete(_PREFIX + response_id))
        except (RedisError, OSError) as exc:
            raise RedisUnavailable("a stored response", exc) from exc
