"""Admission: a stream starts only with one of the upstream's slots, or is refused before
its response starts.

Why: the upstream pool has ``UPSTREAM_MAX_CONNECTIONS`` connections. A stream that could
not get one used to wait inside its own response for the pool timeout, then end with an
``error`` frame after the client had already been told 200 and read ``stream.begin``.
Here every stream takes a slot first, in :meth:`toolforge.runtime.stream_service.Streams.open`
(the one start sequence of every front door), and holds it for its whole life: the
gateway counts what it has promised the upstream, so a stream that starts has a connection
to start with.

A request that finds every slot held waits in a fair queue (first come, first served:
:class:`toolforge.runtime.executor.FifoGate`, the tool limit's gate, hands a freed slot
straight to the oldest waiter) for at most ``ADMISSION_TIMEOUT_MS``. Past that it is
refused with :class:`AdmissionRefused` (``UPSTREAM_UNAVAILABLE``, 503, retryable, and the
seconds to wait for the ``Retry-After`` header), which each front door answers in its own
error shape, before any byte of a stream. A waiter that gives up, or whose client goes,
leaves the queue with nothing held (the gate passes on a slot handed to it as it left).

The queue's depth and the slots in use are read by the metrics at scrape time; each
wait's length (admitted or refused) is observed once (docs/observability.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.runtime.executor import FifoGate
from toolforge.runtime.metrics import GatewayMetrics

__all__ = ["Admission", "AdmissionRefused"]


class AdmissionRefused(UpstreamError):
    """Every upstream slot stayed held for ``ADMISSION_TIMEOUT_MS``: 503 with the seconds
    to wait (the ``Retry-After`` header), before the stream starts."""

    http_status = 503
    retryable = True

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(ErrorCode.UPSTREAM_UNAVAILABLE, message)
        self.retry_after = max(1, math.ceil(retry_after_s))


class Admission:
    """``limit`` streams at once to the upstream; the others wait, in arrival order, for
    at most ``timeout_s`` (0: refused at once when no slot is free)."""

    def __init__(
        self,
        limit: int,
        timeout_s: float,
        *,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gate = FifoGate(limit)
        self.limit = limit
        self.timeout_s = timeout_s
        self._metrics = metrics
        self._clock = clock
        if metrics is not None:
            metrics.watch_admission(depth=lambda: self.depth, active=lambda: self.active)

    @property
    def active(self) -> int:
        """Slots held now (streams admitted and not ended)."""
        return self._gate.active

    @property
    def depth(self) -> int:
        """Requests waiting for a slot now."""
        return self._gate.depth

    async def acquire(self) -> None:
        """A slot, at once when one is free, else the oldest waiter's turn within the
        timeout: :class:`AdmissionRefused` past it. Each acquire pairs with one
        :meth:`release`."""
        gate = self._gate
        if not gate.would_wait():  # the common case: no clock, no metric, no wait
            await gate.acquire()
            return
        started = self._clock()
        try:
            if self.timeout_s <= 0:
                raise TimeoutError
            async with asyncio.timeout(self.timeout_s):
                await gate.acquire()
        except TimeoutError:
            self._waited(started, admitted=False)
            raise AdmissionRefused(
                f"all {self.limit} upstream connections (UPSTREAM_MAX_CONNECTIONS) stayed "
                f"busy for {self.timeout_s:g} s (ADMISSION_TIMEOUT_MS); retry after the "
                "Retry-After header's seconds",
                retry_after_s=max(1.0, self.timeout_s),
            ) from None
        self._waited(started, admitted=True)

    def release(self) -> None:
        """Give a slot back: the oldest waiter has it at once."""
        self._gate.release()

    def _waited(self, started: float, *, admitted: bool) -> None:
        if self._metrics is not None:
            self._metrics.admission_waited(self._clock() - started, admitted=admitted)
