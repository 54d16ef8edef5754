"""Per-key rate limits (docs/security.md): requests per window and concurrent streams.

The gateway asks three things of the limiter's state, and nothing else
(:class:`RateLimiter`); :class:`MemoryRateLimiter` keeps it in this process, which is
right for one replica. A shared store (Redis, for replicas) implements the same three
methods:

* ``hit(key, limit)``: count one request of ``key`` in the current fixed window
  (``floor(now / limit.window_s)``); the answer is 0 when it may go on, else the seconds
  until the window ends (the ``Retry-After``). Over the limit, the request is still
  counted: a client that retries in a loop stays refused until the window turns. With
  Redis: ``INCR`` on ``<prefix>:<key>:<window index>`` and ``EXPIRE`` of one window.
* ``open_stream(key, limit)``: take one of the key's ``limit.streams`` concurrent
  streams, or answer False when all are taken. With Redis: ``INCR`` and, over the limit,
  ``DECR`` back; a replica that dies holding streams must not hold them forever (a TTL
  per replica's holdings, or a sorted set of leases).
* ``close_stream(key)``: give back one stream; called exactly once for every
  ``open_stream`` that answered True, when the stream has ended: not when its HTTP
  response does. A stream that goes on after its client left (``on_disconnect:
  "continue"``) holds its slot until its ``done`` (``toolforge.api.auth.StreamSlot``).

A limit of 0 means "no limit": the gateway does not call the limiter for it at all.

:class:`FailureThrottle` is the other limit here, by client address rather than by key:
failed API-key checks (a client guessing keys), counted per fixed window; past the limit
the address is refused until the window ends. It is kept in this process (a replica
counts what it sees) and holds at most :data:`MAX_TRACKED_ADDRESSES` addresses, so a
client with many addresses cannot grow it without bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "MAX_TRACKED_ADDRESSES",
    "FailureThrottle",
    "MemoryRateLimiter",
    "RateLimit",
    "RateLimiter",
]

# Enough for every client of a busy gateway within one window; an attacker with more
# addresses than this pushes out the oldest windows, never grows the table.
MAX_TRACKED_ADDRESSES = 10_000


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One key's limits; 0 switches a limit off."""

    requests: int = 0  # per window
    window_s: float = 60.0
    streams: int = 0  # open at once (POST /v1/stream, the proxy, resumes)


class RateLimiter(Protocol):
    """The state behind the per-key limits (see the module docstring)."""

    async def hit(self, key: str, limit: RateLimit) -> float:
        """Count a request; 0 if it may go on, else seconds until it may."""
        ...

    async def open_stream(self, key: str, limit: RateLimit) -> bool:
        """Take one of the key's concurrent streams; False when none is left."""
        ...

    async def close_stream(self, key: str) -> None:
        """Give back a stream that ``open_stream`` granted."""
        ...


@dataclass(slots=True)
class MemoryRateLimiter:
    """:class:`RateLimiter` in this process: one fixed window and one counter per key
    (the keys are the configured ones, so the state stays small)."""

    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (index, count)
    _streams: dict[str, int] = field(default_factory=dict)

    async def hit(self, key: str, limit: RateLimit) -> float:
        now = self.clock()
        index = math.floor(now / limit.window_s)
        seen, count = self._windows.get(key, (index, 0))
        count = count + 1 if seen == index else 1
        self._windows[key] = (index, count)
        if count <= limit.requests:
            return 0.0
        return (index + 1) * limit.window_s - now

    async def open_stream(self, key: str, limit: RateLimit) -> bool:
        open_now = self._streams.get(key, 0)
        if open_now >= limit.streams:
            return False
        self._streams[key] = open_now + 1
        return True

    async def close_stream(self, key: str) -> None:
        left = self._streams.get(key, 0) - 1
        if left > 0:
            self._streams[key] = left
        else:
            self._streams.pop(key, None)


@dataclass(slots=True)
class FailureThrottle:
    """Failed API-key checks per client address, in fixed windows of ``window_s``.

    :meth:`wait` is 0 while the address may try; after ``limit`` failures in the current
    window it is the seconds until the window ends (the ``Retry-After``). ``limit`` 0:
    never throttled. Sans-IO apart from the clock, which is injectable.
    """

    limit: int
    window_s: float
    clock: Callable[[], float] = time.monotonic
    max_addresses: int = MAX_TRACKED_ADDRESSES
    _windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # address -> (index, n)

    def wait(self, address: str) -> float:
        """Seconds until ``address`` may present a key again (0: now)."""
        if not self.limit:
            return 0.0
        seen = self._windows.get(address)
        if seen is None:
            return 0.0
        now = self.clock()
        index = math.floor(now / self.window_s)
        if seen[0] != index or seen[1] < self.limit:
            return 0.0
        return (index + 1) * self.window_s - now

    def failed(self, address: str) -> bool:
        """Count one failure of ``address``; True when this one reached the limit."""
        if not self.limit:
            return False
        index = math.floor(self.clock() / self.window_s)
        seen, count = self._windows.pop(address, (index, 0))
        count = count + 1 if seen == index else 1
        self._windows[address] = (index, count)  # re-inserted: the newest entry
        # Entries are re-inserted at each failure, so the first is the one that failed
        # longest ago: past windows go first, and the table never outgrows its bound.
        while len(self._windows) > self.max_addresses:
            del self._windows[next(iter(self._windows))]
        return count == self.limit
