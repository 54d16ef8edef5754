"""Shared state between gateway replicas, in Redis (docs/deployment.md).

With ``REDIS_URL`` unset nothing here is built: the gateway keeps its in-memory registry,
FIFO tool gate and idempotency records, and no request pays for a check. With it set, the
app builds one :class:`RedisCluster` at start-up and these live in Redis:

- **stream ownership**: ``tf:s:{id}:m``, a hash ``{state: running|done|lost, owner}``.
  Each replica announces itself with ``tf:r:{replica}`` (a key that expires after
  ``REPLICA_TTL_S`` unless the replica's heartbeat renews it).
- **resume buffers**: ``tf:s:{id}:f``, a Redis Stream of the frames' SSE bytes exactly as
  they were sent. A *mirror* task per stream follows the frame log like any other reader
  (it never throttles the producer) and appends whatever is new, at most every
  ``REDIS_FLUSH_MS``, in one round trip: the only Redis work while tokens flow, and not on
  the token's own path. Each entry's id is ``{last frame id}-0`` and carries ``f`` (its
  first frame id), ``d`` (the bytes) and ``e`` (``1`` on the entry holding ``done``), so a
  resume after frame *N* reads from ``(N-0``.
- **idempotency records**: ``tf:k:{sha256(key)}``, ``{h: body hash, s: stream id}``,
  claimed atomically (two replicas given the same key at once: one stream, one 409).
- **routing**: cancel, approvals and client tool results posted to a replica that does
  not run the stream are published on the owner's channel ``tf:c:{owner}``; the owner
  answers on the asker's channel with the HTTP status and body its own route gave.
- **per-key rate limits** (:class:`RedisRateLimiter`): fixed windows and leased stream
  counts, the same for every replica.
- **the global tool limit**: a fair (FIFO across replicas) counting semaphore of
  ``TOOL_CONCURRENCY`` slots (:class:`RedisGate`; Redis in Action §6.3's design, in Lua).
  A holder's slot is leased for ``REPLICA_TTL_S`` and renewed by its heartbeat, so a
  replica that dies frees its slots.

Failures (docs/deployment.md, "What happens on each failure"): every call is bounded by
``REDIS_TIMEOUT_MS``; what needs Redis and cannot have it is a typed 503
(``REDIS_UNAVAILABLE``). A running stream never waits on Redis: its mirror gives up (the
stream goes on, resumable on its own replica only) and a tool slot falls back to this
replica's own gate. A replica that dies leaves its buffer; the first client that resumes
it elsewhere after ``REPLICA_TTL_S`` appends ``error`` (``STREAM_LOST``) and ``done`` to
it, atomically, so every later reader sees the same end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from toolforge.core.protocol.frames import Done, Error, encode_frame
from toolforge.errors import ErrorCode, ToolForgeError
from toolforge.log import get_logger
from toolforge.runtime.executor import FifoGate
from toolforge.runtime.frame_log import decode_frames
from toolforge.runtime.session import StreamSession

__all__ = [
    "CommandHandler",
    "RateLimitLike",
    "RedisCluster",
    "RedisGate",
    "RedisRateLimiter",
    "RedisUnavailable",
    "RemoteError",
    "RemoteStream",
    "split_frames",
]

log = get_logger(__name__)

PREFIX: Final = "tf:"
_SEM_KEYS: Final = ("tf:sem:h", "tf:sem:q", "tf:sem:a", "tf:sem:n")
_SEM_RELEASED: Final = "tf:sem:rel"
# A waiter for a tool slot looks again this often even when no release was announced
# (a holder's lease that expired announces nothing).
_SEM_POLL_S: Final = 0.1
# How long a resuming reader blocks on the buffer before it checks the owner is alive.
_BLOCK_MS: Final = 500
# A mirror that could not write retries this often.
_RETRY_S: Final = 0.5

CommandHandler = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]
"""``(op, stream_id, payload) -> (HTTP status, JSON body)``: what the owner of a stream
runs for a command another replica forwarded (``toolforge.api.routes.local_command``)."""


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


class RemoteError(ToolForgeError):
    """An error the owner replica answered with, passed on as it was (status and body)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
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


def split_frames(data: bytes) -> list[bytes]:
    """Encoded frames back to back -> one ``bytes`` each. Every frame ends in a blank line
    and holds no other (``encode_frame``: one ``data:`` line, control characters escaped)."""
    parts = data.split(b"\n\n")
    return [part + b"\n\n" for part in parts[:-1]]


def _frames_key(stream_id: str) -> str:
    return f"{PREFIX}s:{stream_id}:f"


def _meta_key(stream_id: str) -> str:
    return f"{PREFIX}s:{stream_id}:m"


def _alive_key(replica: str) -> str:
    return f"{PREFIX}r:{replica}"


def _channel(replica: str) -> str:
    return f"{PREFIX}c:{replica}"


def _idem_key(key: str) -> str:
    # Hashed: a client's key may hold any character, and its length is the client's.
    return f"{PREFIX}k:{hashlib.sha256(key.encode()).hexdigest()}"


# -- Lua: each one round trip, atomic ------------------------------------------------------

# KEYS: frames, meta[, idem]. ARGV: entry id, first frame id, bytes, final (0/1), ttl ms,
# owner, the API key name that started it ("" for none). A stream another replica declared
# lost takes no more frames.
_APPEND: Final = """
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'lost' then return 0 end
redis.call('XADD', KEYS[1], ARGV[1], 'f', ARGV[2], 'd', ARGV[3], 'e', ARGV[4])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'state', 'done', 'owner', ARGV[6])
elseif not state then
  redis.call('HSET', KEYS[2], 'state', 'running', 'owner', ARGV[6])
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[2], 'key', ARGV[7]) end
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return 1
"""

# KEYS: idem, meta. ARGV: body hash, stream id, owner, ttl ms, API key name ("" for none).
# Returns 1 (claimed) or the record already there: {body hash, stream id}.
_CLAIM: Final = """
local rec = redis.call('HMGET', KEYS[1], 'h', 's')
if rec[1] then return rec end
redis.call('HSET', KEYS[1], 'h', ARGV[1], 's', ARGV[2])
redis.call('HSET', KEYS[2], 'state', 'running', 'owner', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'key', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""

# KEYS: frames, meta, the owner's alive key. ARGV: the last entry's frame id as read,
# entry id, first frame id, bytes, ttl ms. -1: the owner lives; 0: the stream has ended;
# -2: frames arrived meanwhile (read again); 1: the buffer now ends in STREAM_LOST.
_FINALIZE: Final = """
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
if redis.call('HGET', KEYS[2], 'state') ~= 'running' then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local n = 0
if #last > 0 then n = tonumber(string.match(last[1][1], '^(%d+)')) end
if n ~= tonumber(ARGV[1]) then return -2 end
redis.call('XADD', KEYS[1], ARGV[2], 'f', ARGV[3], 'd', ARGV[4], 'e', '1', 'l', '1')
redis.call('HSET', KEYS[2], 'state', 'lost')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""

# The fair semaphore. KEYS: holders (token -> lease end), queue (token -> ticket), queue
# liveness (token -> lease end), ticket counter. ARGV: token, limit, lease ms. Times are
# Redis's own (TIME), so replicas' clocks never disagree. 1: the slot is held.
_SEM_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, m in ipairs(dead) do redis.call('ZREM', KEYS[2], m) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], lease * 4) end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
  redis.call('PEXPIRE', KEYS[4], lease * 4)
end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) + rank < tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 4)
  return 1
end
redis.call('ZADD', KEYS[3], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[3], lease * 4)
return 0
"""

# KEYS: holders. ARGV: lease ms, tokens...: renew the leases of the slots still held.
_SEM_RENEW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 4) end
return 1
"""

# Per-key limits (the RateLimiter of docs/security.md's per-key rate limits), with Redis's clock.
# A fixed window: KEYS: the key's counter prefix. ARGV: requests, window ms. Returns 0 (go
# on) or the ms until the window turns. Over the limit the request still counts.
_WINDOW_HIT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
local index = math.floor(now / window)
local key = KEYS[1] .. ':' .. index
local count = redis.call('INCR', key)
if count == 1 then redis.call('PEXPIRE', key, window) end
if count <= tonumber(ARGV[1]) then return 0 end
return (index + 1) * window - now
"""

# Concurrent streams: KEYS: the key's lease set (token -> lease end). ARGV: token, limit,
# lease ms. 1: taken. Leases of a replica that died run out after ``lease``.
_STREAM_OPEN: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 4)
return 1
"""


class RedisCluster:
    """This replica's view of the shared state: built once at start-up when ``REDIS_URL``
    is set (``toolforge.api.app``), closed after the stream registry."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        flush_s: float,
        replica_ttl_s: float,
        resume_ttl_s: float,
        max_connections: int = 64,
        replica_id: str | None = None,
    ) -> None:
        self.url = url
        self.replica_id = replica_id or "r_" + secrets.token_hex(6)
        self.timeout_s = timeout_s
        self.flush_s = flush_s
        self.replica_ttl_s = replica_ttl_s
        self.ttl_ms = max(1000, int(resume_ttl_s * 1000))
        self.lease_ms = max(500, int(replica_ttl_s * 1000))
        # A bounded pool: the connections to Redis never grow with the load; a call that
        # finds none free waits for one within its own timeout.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s + _BLOCK_MS / 1000,
            socket_connect_timeout=timeout_s,
        )
        self.redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self._append = self.redis.register_script(_APPEND)
        self._claim = self.redis.register_script(_CLAIM)
        self._finalize = self.redis.register_script(_FINALIZE)
        self._sem_acquire = self.redis.register_script(_SEM_ACQUIRE)
        self._sem_renew = self.redis.register_script(_SEM_RENEW)
        self._window_hit = self.redis.register_script(_WINDOW_HIT)
        self._stream_open = self.redis.register_script(_STREAM_OPEN)
        self._handler: CommandHandler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._mirrors: set[asyncio.Task[None]] = set()
        self._replies: dict[str, asyncio.Future[tuple[int, dict[str, Any]]]] = {}
        self._released = asyncio.Event()
        self.held_slots: set[str] = set()
        # Leases renewed by the heartbeat: (sorted set, token) of the streams open here.
        self.held_leases: set[tuple[str, str]] = set()
        self.healthy = False
        self._warned_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, handler: CommandHandler) -> None:
        """Heartbeat and the control channel. A Redis that is down now is not fatal: the
        gateway serves, and what needs Redis answers 503 until it is back."""
        self._handler = handler
        try:
            await self._beat()
        except RedisUnavailable as exc:
            log.warning("redis.unavailable", url=_safe_url(self.url), error=exc.message)
        self._spawn(self._heartbeat())
        self._spawn(self._listen())

    async def aclose(self) -> None:
        """After the registry closed: flush the mirrors (the streams have ended), stop."""
        if self._mirrors:
            await asyncio.wait(self._mirrors, timeout=max(1.0, 4 * self.timeout_s))
        for task in [*self._tasks, *self._mirrors]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._mirrors, return_exceptions=True)
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                await self.redis.delete(_alive_key(self.replica_id))
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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

    def _warn(self, event: str, **fields: Any) -> None:
        """At most one warning a second: a Redis outage must not flood the log."""
        now = time.monotonic()
        if now - self._warned_at >= 1.0:
            self._warned_at = now
            log.warning(event, **fields)

    async def _beat(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(_alive_key(self.replica_id), b"1", px=int(self.replica_ttl_s * 1000))
        if self.held_slots:
            await self._sem_renew(
                keys=[_SEM_KEYS[0]], args=[self.lease_ms, *self.held_slots], client=pipe
            )
        for zkey, token in list(self.held_leases):
            await self._sem_renew(keys=[zkey], args=[self.lease_ms, token], client=pipe)
        await self.call("the heartbeat", pipe.execute())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.replica_ttl_s / 3)
            try:
                await self._beat()
            except RedisUnavailable as exc:
                self._warn("redis.unavailable", error=exc.message)

    # -- stream ownership and resume buffers --------------------------------------------

    def track(self, session: StreamSession, idempotency_key: str | None) -> None:
        """Mirror ``session``'s frames into its resume buffer until its ``done``."""
        task = asyncio.get_running_loop().create_task(
            self._mirror(session, idempotency_key), name=f"mirror:{session.id}"
        )
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _mirror(self, session: StreamSession, idempotency_key: str | None) -> None:
        frame_log = session.log
        keys = [_frames_key(session.id), _meta_key(session.id)]
        if idempotency_key is not None:
            keys.append(_idem_key(idempotency_key))
        refresh_s = max(0.5, self.ttl_ms / 3000)
        cursor = 0
        while True:
            if cursor == frame_log.last_id:
                if frame_log.closed:
                    return
                try:
                    async with asyncio.timeout(refresh_s):
                        await frame_log.wait()
                except TimeoutError:  # idle (a tool, a client): keep the keys alive
                    with contextlib.suppress(RedisUnavailable):
                        await self._refresh(keys)
                    continue
            # Gather what else comes within the flush interval into the same write: at
            # most one write per interval, the first frames reach their client before
            # any Redis work starts, and a short stream is one write, done included.
            if self.flush_s:
                await asyncio.sleep(self.flush_s)
            batch, end = frame_log.take(cursor)
            if batch is None:
                continue
            final = frame_log.closed and end == frame_log.last_id
            try:
                written = await self.call(
                    "the resume buffer",
                    self._append(
                        keys=keys,
                        args=[
                            f"{end}-0",
                            cursor + 1,
                            batch,
                            int(final),
                            self.ttl_ms,
                            self.replica_id,
                            session.plan.owner or "",
                        ],
                    ),
                )
            except RedisUnavailable as exc:
                # The stream goes on; its copy in Redis catches up once Redis is back
                # (the frame log still has every frame), or is given up once nobody
                # could resume it any more.
                self._warn("redis.mirror_behind", stream_id=session.id, error=exc.message)
                finished = session.finished_at
                if finished is not None and time.monotonic() - finished > self.ttl_ms / 1000:
                    return
                await asyncio.sleep(_RETRY_S)
                continue
            if not written:  # another replica declared it lost (we were cut off too long)
                return
            cursor = end
            if final:
                return

    async def _refresh(self, keys: list[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.pexpire(key, self.ttl_ms)
        await self.call("the resume buffer", pipe.execute())

    async def find(self, stream_id: str) -> RemoteStream | None:
        """The stream as Redis knows it, or None (never existed, or expired)."""
        meta = await self.call("resuming a stream", self.redis.hgetall(_meta_key(stream_id)))
        if not meta:
            return None
        key = meta.get(b"key")
        return RemoteStream(
            self,
            stream_id,
            meta[b"owner"].decode(),
            meta[b"state"].decode(),
            key=None if key is None else key.decode(),
        )

    # -- idempotency ----------------------------------------------------------------------

    async def replay_for(self, key: str, body_hash: str) -> RemoteStream | None:
        """As ``StreamRegistry.replay_for``, across replicas: the stream to replay, None
        for a new key; 422 for another body, 409 while it runs."""
        from toolforge.errors import RequestError

        record = await self.call("an Idempotency-Key", self.redis.hmget(_idem_key(key), ["h", "s"]))
        if record[0] is None:
            return None
        if record[0].decode() != body_hash:
            raise RequestError(
                ErrorCode.IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was used with a different request body; "
                "use a new key for a new request",
                http_status=422,
            )
        stream_id = record[1].decode()
        stream = await self.find(stream_id)
        if stream is None:
            return None
        if stream.state == "running" and await self.alive(stream.owner):
            raise RequestError(
                ErrorCode.IDEMPOTENCY_IN_FLIGHT,
                f"the request with this Idempotency-Key is still streaming as "
                f"{stream_id!r}; resume it with GET /v1/streams/{stream_id}",
                http_status=409,
            )
        return stream

    async def claim(
        self, key: str, body_hash: str, stream_id: str, api_key: str | None = None
    ) -> tuple[str, str] | None:
        """Claim ``key`` for a new stream (started with ``api_key``, a key name); the
        (body hash, stream id) holding it already, if any."""
        result = await self.call(
            "an Idempotency-Key",
            self._claim(
                keys=[_idem_key(key), _meta_key(stream_id)],
                args=[body_hash, stream_id, self.replica_id, self.ttl_ms, api_key or ""],
            ),
        )
        if result == 1:
            return None
        return bytes(result[0]).decode(), bytes(result[1]).decode()

    async def alive(self, replica: str) -> bool:
        if replica == self.replica_id:
            return True
        found = await self.call("a replica's heartbeat", self.redis.exists(_alive_key(replica)))
        return bool(found)

    # -- commands routed to the owner ----------------------------------------------------

    async def route(
        self, op: str, stream_id: str, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """Run ``op`` on the replica that owns ``stream_id``: its status and body, or None
        if no replica runs it (never existed, expired, or its replica died)."""
        stream = await self.find(stream_id)
        if stream is None or stream.owner == self.replica_id:
            return None
        corr = secrets.token_hex(8)
        waiter: asyncio.Future[tuple[int, dict[str, Any]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._replies[corr] = waiter
        message = orjson.dumps(
            {
                "op": op,
                "stream_id": stream_id,
                "payload": payload,
                "reply_to": self.replica_id,
                "corr": corr,
            }
        )
        try:
            receivers = await self.call(
                f"{op} on another replica", self.redis.publish(_channel(stream.owner), message)
            )
            if not receivers:
                return None  # its replica is gone: nothing to cancel, approve or feed
            try:
                async with asyncio.timeout(max(self.timeout_s * 4, 2.0)):
                    return await waiter
            except TimeoutError as exc:
                raise RedisUnavailable(f"{op} on replica {stream.owner}", exc) from exc
        finally:
            self._replies.pop(corr, None)

    async def _listen(self) -> None:
        """The control channel: commands for streams run here, replies to ours, and slot
        releases; resubscribes whenever the connection is lost."""
        while True:
            pubsub = self.redis.pubsub()
            try:
                await self.call(
                    "the control channel",
                    pubsub.subscribe(_channel(self.replica_id), _SEM_RELEASED),
                )
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None:
                        continue
                    if message["channel"] == _SEM_RELEASED.encode():
                        self._released.set()
                        continue
                    self._on_command(orjson.loads(message["data"]))
            except (RedisUnavailable, RedisError, OSError) as exc:
                self._warn("redis.unavailable", error=str(exc))
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.timeout_s):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_command(self, message: dict[str, Any]) -> None:
        if message.get("op") == "reply":
            waiter = self._replies.get(message.get("corr", ""))
            if waiter is not None and not waiter.done():
                waiter.set_result((int(message["status"]), message["body"]))
            return
        self._spawn(self._serve_command(message))

    async def _serve_command(self, message: dict[str, Any]) -> None:
        assert self._handler is not None
        try:
            status, body = await self._handler(
                message["op"], message["stream_id"], message.get("payload", {})
            )
        except ToolForgeError as exc:
            status, body = exc.http_status, {"error": exc.to_dict()}
        reply = orjson.dumps(
            {"op": "reply", "corr": message["corr"], "status": status, "body": body}
        )
        with contextlib.suppress(RedisUnavailable):
            await self.call("a reply", self.redis.publish(_channel(message["reply_to"]), reply))

    # -- the global tool limit -------------------------------------------------------------

    async def sem_acquire(self, limit: int) -> str | None:
        """A global slot's token, FIFO across replicas; None if Redis is unreachable (the
        caller then relies on its own replica's gate)."""
        token = secrets.token_hex(8)
        keys = list(_SEM_KEYS)
        try:
            while True:
                self._released.clear()
                acquiring = self._sem_acquire(keys=keys, args=[token, limit, self.lease_ms])
                got = await self.call("the tool limit", acquiring)
                if got == 1:
                    self.held_slots.add(token)
                    return token
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_SEM_POLL_S):
                        await self._released.wait()
        except RedisUnavailable as exc:
            self._warn("redis.tool_limit_local", error=exc.message)
            self._spawn(self._sem_leave(token))
            return None
        except BaseException:
            self._spawn(self._sem_leave(token))  # cancelled while queued (or holding)
            raise

    async def _sem_leave(self, token: str) -> None:
        self.held_slots.discard(token)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(_SEM_KEYS[0], token)
        pipe.zrem(_SEM_KEYS[1], token)
        pipe.zrem(_SEM_KEYS[2], token)
        pipe.publish(_SEM_RELEASED, b"1")
        with contextlib.suppress(RedisUnavailable):
            await self.call("the tool limit", pipe.execute())

    def sem_release(self, token: str) -> None:
        """Give the slot back (in the background: the caller may be cancelled)."""
        self.held_slots.discard(token)
        self._spawn(self._sem_leave(token))


class RedisGate:
    """The executor's gate (``toolforge.runtime.executor.Gate``) across replicas: this
    replica's FIFO gate first (its own queue, depth and metrics), then a global slot."""

    def __init__(self, cluster: RedisCluster, limit: int) -> None:
        self._cluster = cluster
        self._local = FifoGate(limit)
        self.limit = limit
        self._tokens: list[str | None] = []

    @property
    def active(self) -> int:
        return self._local.active

    @property
    def depth(self) -> int:
        return self._local.depth

    def would_wait(self) -> bool:
        return self._local.would_wait()

    async def acquire(self) -> None:
        await self._local.acquire()
        try:
            token = await self._cluster.sem_acquire(self.limit)
        except BaseException:
            self._local.release()
            raise
        self._tokens.append(token)

    def release(self) -> None:
        token = self._tokens.pop() if self._tokens else None
        if token is not None:
            self._cluster.sem_release(token)
        self._local.release()


class RemoteStream:
    """A stream known to Redis, read from its resume buffer (another replica runs it, or
    ran it)."""

    def __init__(
        self,
        cluster: RedisCluster,
        stream_id: str,
        owner: str,
        state: str,
        *,
        key: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.id = stream_id
        self.owner = owner  # the replica that runs (ran) it
        self.state = state
        self.key = key  # the API key name that started it (docs/security.md), None without keys

    async def follow(self, after: int = 0) -> AsyncIterator[bytes]:
        """The frames after id ``after``, in batches, until ``done``; ``b""`` whenever
        nothing came for a while (the writer's chance to ping). A dead owner's stream
        ends with ``error`` (``STREAM_LOST``) and ``done``."""
        cluster = self.cluster
        key = _frames_key(self.id)
        cursor = after
        while True:
            found = await cluster.call(
                "resuming a stream",
                cluster.redis.xread({key: f"{cursor}-0"}, count=512, block=_BLOCK_MS),
                extra_s=_BLOCK_MS / 1000,
            )
            entries = found[0][1] if found else []
            if not entries:
                yield b""
                if await self._check_owner():
                    return
                continue
            out: list[bytes] = []
            final = False
            for entry_id, fields in entries:
                last = int(entry_id.split(b"-", 1)[0])
                first = int(fields[b"f"])
                data = fields[b"d"]
                if first <= cursor:
                    if fields.get(b"l") == b"1":
                        # The end written for a lost stream, and this client holds frames
                        # the buffer never got: the same end, numbered after its own.
                        data = b"".join(
                            encode_frame(cursor + i, frame)
                            for i, frame in enumerate(decode_frames(split_frames(data)), 1)
                        )
                        last = cursor + 2
                    else:
                        data = b"".join(split_frames(data)[cursor - first + 1 :])
                out.append(data)
                cursor = last
                if fields.get(b"e") == b"1":
                    final = True
                    break
            yield b"".join(out)
            if final:
                return

    async def _check_owner(self) -> bool:
        """Nothing new: if the owner is dead, end the buffer with STREAM_LOST + done.
        True if the stream is gone from Redis altogether (its keys expired)."""
        cluster = self.cluster
        pipe = cluster.redis.pipeline(transaction=False)
        pipe.exists(_meta_key(self.id))
        pipe.exists(_alive_key(self.owner))
        meta, alive = await cluster.call("resuming a stream", pipe.execute())
        if not meta:  # expired: nothing more will come, whoever runs it
            return True
        if alive or self.owner == cluster.replica_id:
            return False
        key = _frames_key(self.id)
        latest = await cluster.call("resuming a stream", cluster.redis.xrevrange(key, count=1))
        n = int(latest[0][0].split(b"-", 1)[0]) if latest else 0
        data = _lost_frames(n, self.owner)
        result = await cluster.call(
            "resuming a stream",
            cluster._finalize(
                keys=[key, _meta_key(self.id), _alive_key(self.owner)],
                args=[n, f"{n + 2}-0", n + 1, data, cluster.ttl_ms],
            ),
        )  # 1, -1, -2: the next read shows where the buffer stands
        if result == 0:  # ended: done or lost, or expired
            found = await cluster.call(
                "resuming a stream", cluster.redis.exists(_meta_key(self.id))
            )
            return not found
        return False


def _lost_frames(n: int, owner: str) -> bytes:
    error = Error(
        code=ErrorCode.STREAM_LOST,
        message=(
            f"the replica running this stream ({owner}) stopped; the frames before this "
            "one are all that were kept. Send the request again to start over"
        ),
        retryable=True,
    )
    done = Done(
        reason="error",
        usage={},
        metrics={"ttft_ms": None, "duration_ms": 0.0, "tokens_per_s": None, "frames": n + 2},
    )
    return encode_frame(n + 1, error) + encode_frame(n + 2, done)


def _safe_url(url: str) -> str:
    """The URL without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


class RateLimitLike(Protocol):
    """A key's limits as the auth layer gives them: ``requests`` per ``window_s``, and
    ``streams`` open at once (0: no limit; the caller does not ask then)."""

    @property
    def requests(self) -> int: ...

    @property
    def window_s(self) -> float: ...

    @property
    def streams(self) -> int: ...


class RedisRateLimiter:
    """Per-key rate limits shared by every replica (docs/security.md, docs/deployment.md): the three
    methods of the auth layer's ``RateLimiter`` (``hit``, ``open_stream``, ``close_stream``), each
    one Lua call on Redis's clock, so every replica counts the same windows and streams.

    - ``hit``: a fixed window per key (``INCR`` of ``tf:rl:{sha256(key)}:{window index}``,
      expiring with its window); 0 if the request may go on, else the seconds until the
      window turns (the ``Retry-After``). Over the limit the request still counts.
    - ``open_stream`` / ``close_stream``: a sorted set of leases per key; each lease
      lasts ``REPLICA_TTL_S`` and is renewed by this replica's heartbeat, so the streams
      of a replica that dies are given back by themselves.

    A Redis that does not answer is a :class:`RedisUnavailable` (503), not a free pass.
    """

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._open: dict[str, list[str]] = {}  # key -> lease tokens taken here

    @staticmethod
    def _name(prefix: str, key: str) -> str:
        return f"{PREFIX}{prefix}:{hashlib.sha256(key.encode()).hexdigest()}"

    async def hit(self, key: str, limit: RateLimitLike) -> float:
        cluster = self._cluster
        wait_ms = await cluster.call(
            "the rate limit",
            cluster._window_hit(
                keys=[self._name("rl", key)],
                args=[limit.requests, max(1, int(limit.window_s * 1000))],
            ),
        )
        return int(wait_ms) / 1000

    async def open_stream(self, key: str, limit: RateLimitLike) -> bool:
        cluster = self._cluster
        zkey = self._name("rs", key)
        token = f"{cluster.replica_id}:{secrets.token_hex(6)}"
        taken = await cluster.call(
            "the stream limit",
            cluster._stream_open(keys=[zkey], args=[token, limit.streams, cluster.lease_ms]),
        )
        if not taken:
            return False
        self._open.setdefault(key, []).append(token)
        cluster.held_leases.add((zkey, token))
        return True

    async def close_stream(self, key: str) -> None:
        tokens = self._open.get(key)
        if not tokens:
            return
        token = tokens.pop()
        if not tokens:
            del self._open[key]
        cluster = self._cluster
        zkey = self._name("rs", key)
        cluster.held_leases.discard((zkey, token))
        with contextlib.suppress(RedisUnavailable):  # its lease runs out by itself
            await cluster.call("the stream limit", cluster.redis.zrem(zkey, token))
