"""Shared state between gateway replicas, in Redis (docs/deployment.md).

With ``REDIS_URL`` unset nothing here is built: the gateway keeps its in-memory registry,
FIFO tool gate and idempotency records, and no request pays for a check. With it set, the
app builds one :class:`RedisCluster` at start-up, and these live in Redis, one module each:

- :mod:`.heartbeat`: ``tf:r:{replica}``, a key that expires after ``REPLICA_TTL_S`` unless
  the replica renews it, and the leases the replica holds, renewed with it.
- :mod:`.resume`: stream ownership (``tf:s:{id}:m``, ``{state: running|done|lost,
  owner}``) and resume buffers (``tf:s:{id}:f``, the frames' SSE blocks as sent), written
  by :mod:`.mirror`: one loop per replica, one pipelined round trip per flush interval
  for all its streams.
- :mod:`.idempotency`: ``tf:k:{sha256(key)}``, ``{h: body hash, s: stream id}``, claimed
  atomically (two replicas given the same key at once: one stream, one in-flight error).
- :mod:`.commands`: cancel, approvals and client tool results for a stream another
  replica runs, published on the owner's channel ``tf:c:{owner}`` and answered on ours.
- :mod:`.ratelimit`: per-key fixed windows and leased stream counts, the same for every
  replica.
- :mod:`.gate`: the global tool limit, a fair counting semaphore of ``TOOL_CONCURRENCY``
  slots.

The Lua scripts (one round trip each, atomic) are package data in ``lua/``;
:mod:`.connection` loads them. No module here knows HTTP: a failure is a
:class:`~toolforge.errors.ToolForgeError` (with the status hint every error of the tree
carries), and the API layer answers it.

Failures (docs/deployment.md, "What happens on each failure"): every call is bounded by
``REDIS_TIMEOUT_MS``; what needs Redis and cannot have it is a
:class:`RedisUnavailable` (``REDIS_UNAVAILABLE``, retryable). A running stream never
waits on Redis: its mirror falls behind (the stream goes on, resumable on its own replica
only until Redis is back and the mirror has caught up) and a tool slot falls back to
this replica's own gate. A replica that dies leaves its buffer; the first client that
resumes it elsewhere after ``REPLICA_TTL_S`` appends ``error`` (``STREAM_LOST``) and
``done`` to it, atomically, so every later reader sees the same end.
"""

from toolforge.runtime.cluster.commands import CommandHandler, RemoteError
from toolforge.runtime.cluster.connection import RedisUnavailable
from toolforge.runtime.cluster.gate import RedisGate
from toolforge.runtime.cluster.node import RedisCluster
from toolforge.runtime.cluster.ratelimit import RedisRateLimiter
from toolforge.runtime.cluster.resume import RemoteStream

__all__ = [
    "CommandHandler",
    "RedisCluster",
    "RedisGate",
    "RedisRateLimiter",
    "RedisUnavailable",
    "RemoteError",
    "RemoteStream",
]
