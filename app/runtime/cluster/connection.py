"""This replica's connection to Redis: the bounded pool, every call's timeout, the Lua
scripts (``lua/*.lua``, package data), and the background tasks the cluster owns."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Coroutine
from importlib.resources import files
from typing import Any, Final, NotRequired, TypedDict

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from redis.typing import EncodableT
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:  # a dependency; without it (or older than 3.2), redis-py's own parts
    import hiredis

from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.log import get_logger

__all__ = ["BLOCK_MS", "PARSER", "Connection", "ConnectionOptions", "RedisUnavailable"]

log = get_logger("toolforge.runtime.cluster")

# How long a resuming reader blocks on the buffer before it checks the owner is alive.
BLOCK_MS: Final = 500
# What reads Redis's replies: redis-py takes the ``hiredis`` parser (a dependency) when it
# can import it, its pure-Python one otherwise; the start-up log line says which.
PARSER: Final = "hiredis" if HIREDIS_AVAILABLE else "python"


class RedisUnavailable(ToolForgeError):
    """``REDIS_URL`` is set and Redis did not answer within ``REDIS_TIMEOUT_MS``."""

    http_status = 503
    retryable = True

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        why = f" ({type(cause).__name__})" if cause is not None else ""
        super().__init__(
            ErrorCode.REDIS_UNAVAILABLE,
            f"Redis (REDIS_URL) did not answer{why}, and {what} needs it; retry shortly, "
            "or send the request to the replica that runs the stream",
        )


class ConnectionOptions(TypedDict):
    """How a replica connects: ``REDIS_TIMEOUT_MS`` (as seconds), ``REPLICA_TTL_S``,
    ``REDIS_MAX_CONNECTIONS`` (64 unless given), and the replica's id (a random one)."""

    timeout_s: float
    replica_ttl_s: float
    max_connections: NotRequired[int]
    replica_id: NotRequired[str | None]


class Connection:
    """The pool and the conventions every Redis call here follows: each one bounded by
    ``timeout_s``, each failure a :class:`RedisUnavailable` naming what needed Redis."""

    def __init__(self, url: str, options: ConnectionOptions) -> None:
        self.url = url
        self.replica_id = options.get("replica_id") or "r_" + secrets.token_hex(6)
        self.timeout_s = timeout_s = options["timeout_s"]
        self.replica_ttl_s = options["replica_ttl_s"]
        self.lease_ms = max(500, int(self.replica_ttl_s * 1000))
        # A bounded pool: the connections to Redis never grow with the load; a call that
        # finds none free waits for one within its own timeout.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=options.get("max_connections", 64),
            timeout=timeout_s,
            socket_timeout=timeout_s + BLOCK_MS / 1000,
            socket_connect_timeout=timeout_s,
        )
        packer = "python"
        kwargs = pool.connection_kwargs
        if HIREDIS_AVAILABLE and (
            kwargs.get("encoding", "utf-8"),
            kwargs.get("encoding_errors", "strict"),
        ) == ("utf-8", "strict"):
            pool.connection_class = hiredis_packing(pool.connection_class)
            packer = "hiredis"
        log.info("redis.client", url=safe_url(url), parser=PARSER, packer=packer)
        self.redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self.healthy = False
        self._scripts: dict[str, AsyncScript] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned_at = 0.0

    def script(self, name: str) -> AsyncScript:
        """The Lua script ``lua/{name}.lua``, registered once (EVALSHA, loaded on a miss)."""
        found = self._scripts.get(name)
        if found is None:
            source = (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
            found = self._scripts[name] = self.redis.register_script(source)
        return found

    async def call(self, what: str, awaitable: Any, extra_s: float = 0.0) -> Any:
        """``awaitable`` within ``REDIS_TIMEOUT_MS`` (+ ``extra_s`` for a blocking read),
        or :class:`RedisUnavailable` naming ``what`` needed it."""
        try:
            async with asyncio.timeout(self.timeout_s + extra_s):
                result = await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            self.healthy = False
            raise RedisUnavailable(what, exc) from exc
        self.healthy = True
        return result

    def warn(self, event: str, **fields: Any) -> None:
        """At most one warning a second: a Redis outage must not flood the log."""
        now = time.monotonic()
        if now - self._warned_at >= 1.0:
            self._warned_at = now
            log.warning(event, **fields)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A background task owned here: cancelled and awaited by :meth:`aclose`."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Stop the background tasks, then close the pool."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()


_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def hiredis_packing(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    """``cls`` (redis-py's asyncio connection for the URL's scheme: TCP, TLS or a Unix
    socket) packing its commands with ``hiredis.pack_command``, as redis-py's own
    synchronous client does with hiredis, instead of its asyncio client's pure-Python
    packer. The bytes on the wire are the same (tests/replicas/test_hiredis.py compares
    them); the mirror's EVALSHA packs in about 1 µs instead of 7 (bench/RESULTS.md). A
    value hiredis refuses (None, a bool) goes to redis-py's packer, for its DataError."""
    found = _PACKING.get(cls)
    if found is not None:
        return found
    python_pack = cls.pack_command

    def pack_command(self: AbstractConnection, *args: EncodableT) -> list[bytes]:
        # A command name of several words ("SCRIPT LOAD") is sent as several arguments,
        # split here as redis-py's own packers do.
        name = args[0]
        if isinstance(name, str):
            args = (*name.encode().split(), *args[1:])
        elif isinstance(name, bytes) and b" " in name:
            args = (*name.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]
        except TypeError:
            return python_pack(self, *args)

    found = _PACKING[cls] = type(
        f"Hiredis{cls.__name__}", (cls,), {"pack_command": pack_command, "__doc__": cls.__doc__}
    )
    return found


def safe_url(url: str) -> str:
    """The URL without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


async def quietly(conn: Connection, what: str, awaitable: Any) -> None:
    """A best-effort call: a Redis that does not answer is let go (a lease runs out by
    itself, a key expires)."""
    with contextlib.suppress(RedisUnavailable):
        await conn.call(what, awaitable)
