"""The tool executor: runs one validated tool call under the rules of docs/tools.md.

One call, in order (each step's failure is an envelope for the model, never an exception;
only cancellation propagates):

1. **May it run?** ``registry.check_allowed`` with the request's allow/deny lists, the
   same rule as what the model was shown.
2. **Arguments**: size (32 KB), strict JSON, then the tool's pydantic model
   (:func:`toolforge.core.tool_specs.validate_args`). A rejected call never reaches the tool.
3. **Idempotency**: with an ``Idempotency-Key``, the call's derived key
   (:func:`toolforge.core.tool_specs.derive_call_key`) looks up a bounded LRU of successful
   results; a hit is returned with ``cached=True`` and the tool does not run. A second call with the
   same key while the first is running waits for it instead of running the tool twice.
4. **Approval** (``needs_approval``): wait for the approval callable, up to
   ``approval_timeout_s``; denied or timed out is an envelope. This happens *before* a
   concurrency slot is taken: a human deciding must not hold one of the ten slots.
5. **Concurrency**: a global FIFO gate of ``concurrency`` slots (default 10,
   docs/tools.md). Queue depth, high-water and wait are attributes and logged.
6. **Attempts**: each under ``asyncio.timeout(timeout_s)`` (``TOOL_TIMEOUT_MS``).
   :class:`~toolforge.core.tool_specs.TransientToolError` and timeouts are retried ``spec.retries``
   times after a fixed ``spec.retry_delay_s`` (2 and 2 s, docs/tools.md); any other
   exception is permanent and not retried. Every attempt is logged with redacted
   arguments. The slot is held through the retry delay: retries are rare, and giving the
   slot back would send the call to the back of the queue.
7. **Result**: sentinel characters escaped, then at most 64 KB of JSON
   (``TOOL_OUTPUT_TOO_LARGE``). Slower than the soft target (5 s, docs/tools.md) →
   ``performance_warning``; the call still completes.

Why a hand-written FIFO gate rather than ``asyncio.Semaphore``: the semaphore of the
3.11 we run is FIFO in practice (its waiters are a deque, and ``locked()`` makes a
newcomer queue behind them), but only since a series of fixes to hangs and barging
(gh-90155, PRs 93222 and 97549, 2022), its documentation promises no order, and its
queue is visible only through the private ``_waiters``. Ours is FIFO by construction,
hands a released slot straight to the oldest waiter, and exposes its queue depth.

Time comes in: ``clock`` (monotonic seconds) for durations and waits, ``wall_clock`` for
the record's timestamps, ``sleep`` for retry delays, so tests neither wait nor flake.
Per-attempt timeouts use the event loop's own clock (``asyncio.timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol, cast

import orjson

from toolforge.core.protocol import frames
from toolforge.core.protocol.sentinels import CLOSE, ESCAPES, OPEN
from toolforge.core.redact import redact
from toolforge.core.tool_rules import apply_allowlist
from toolforge.core.tool_specs import (
    MAX_ARGS_BYTES,
    MAX_RESULT_BYTES,
    ToolEnvelope,
    ToolError,
    ToolInvocationRecord,
    ToolOutput,
    ToolRegistry,
    ToolSpec,
    TransientToolError,
    derive_call_key,
    dump_json,
    escape_sentinels_json,
    has_sentinels,
    validate_args,
)
from toolforge.errors import ErrorCode
from toolforge.log import TOOL_ATTEMPT, TOOL_FINISHED, TOOL_QUEUED, get_logger

__all__ = [
    "PERFORMANCE_WARNING",
    "SENTINELS_ESCAPED",
    "Approval",
    "FifoGate",
    "Gate",
    "ToolExecutor",
    "ToolResult",
]

log = get_logger(__name__)

Approval = Callable[[], Awaitable[bool]]
"""Resolves ``True`` (approved) or ``False`` (denied); the session wires it to
``POST /v1/streams/{id}/approvals/{call_id}``."""

PERFORMANCE_WARNING: Final = "performance_warning"
SENTINELS_ESCAPED: Final = "sentinels_escaped"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One finished call. ``envelope`` goes to the model; ``record`` (redacted) to logs and
    ``tool_logs.json``; :meth:`frame` is the ``tool.result`` frame (docs/protocol.md).

    ``attempts`` counts runs of the tool (0: rejected before running). ``duration_ms``
    covers the attempts and retry delays, not the queue or approval wait
    (``queue_wait_ms``). A cached result repeats the original's figures with
    ``cached=True``; its ``record.attempts`` is 0, since nothing ran for this call.
    """

    envelope: ToolEnvelope
    record: ToolInvocationRecord
    attempts: int
    duration_ms: float
    cached: bool
    performance_warning: bool
    queue_wait_ms: float

    @property
    def ok(self) -> bool:
        return self.envelope.ok

    def frame(self) -> frames.ToolResult:
        """The ``tool.result`` frame (docs/protocol.md): ``result`` is the envelope's data,
        ``error`` its first error."""
        errors = self.envelope.errors
        return frames.ToolResult(
            id=self.record.call_id,
            name=self.record.name,
            ok=self.envelope.ok,
            result=self.envelope.data,
            error=cast(frames.ToolResultError, errors[0]) if errors else None,
            duration_ms=self.duration_ms,
            attempts=self.attempts,
            cached=self.cached,
            performance_warning=self.performance_warning,
        )


class Gate(Protocol):
    """What the executor needs of its concurrency limit: :class:`FifoGate` in one process,
    ``toolforge.runtime.cluster.RedisGate`` across replicas (REDIS_URL)."""

    @property
    def active(self) -> int: ...

    @property
    def depth(self) -> int: ...

    def would_wait(self) -> bool: ...

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


class FifoGate:
    """At most ``limit`` holders; the others wait in arrival order.

    ``release`` hands the slot directly to the oldest live waiter, so a task arriving in
    between cannot take it first. A waiter cancelled after the hand-off passes the slot on.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("concurrency limit must be >= 1")
        self.limit = limit
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def active(self) -> int:
        """Slots held now."""
        return self._active

    @property
    def depth(self) -> int:
        """Callers waiting now."""
        return sum(1 for w in self._waiters if not w.done())

    def would_wait(self) -> bool:
        return self._active >= self.limit or self.depth > 0

    async def acquire(self) -> None:
        if not self.would_wait():
            self._active += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed to us as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; _active stays
                return
        self._active -= 1


class _Outcome:
    """What the attempts produced: data or an error, and how long it all took."""

    __slots__ = ("attempts", "data", "duration_s", "error")

    def __init__(self) -> None:
        self.attempts = 0
        self.data: object = None
        self.error: ToolError | None = None
        self.duration_s = 0.0


class ToolExecutor:
    """Runs tool calls from one registry under a global concurrency limit.

    One instance per gateway (the limit is global, docs/tools.md). ``concurrency`` is
    ``TOOL_CONCURRENCY``; ``default_timeout_s`` is ``TOOL_TIMEOUT_MS / 1000``, used by
    tools whose spec has no ``timeout_s``.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        concurrency: int = 10,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
        default_timeout_s: float = 8.0,
        soft_target_s: float = 5.0,
        approval_timeout_s: float = 300.0,
        max_args_bytes: int = MAX_ARGS_BYTES,
        max_result_bytes: int = MAX_RESULT_BYTES,
        cache_size: int = 1024,
        gate: Gate | None = None,
    ) -> None:
        self.registry = registry
        # ``gate``: the limit shared by every replica (REDIS_URL); else this process's own.
        self._gate: Gate = gate if gate is not None else FifoGate(concurrency)
        self._clock = clock
        self._sleep = sleep
        self._wall = wall_clock
        self.default_timeout_s = default_timeout_s
        self.soft_target_s = soft_target_s
        self.approval_timeout_s = approval_timeout_s
        self.max_args_bytes = max_args_bytes
        self.max_result_bytes = max_result_bytes
        self._cache: OrderedDict[str, ToolResult] = OrderedDict()
        self._cache_size = cache_size
        self._inflight: dict[str, asyncio.Future[None]] = {}
        # Queue metrics (docs/tools.md): cumulative since start, for /metrics and metrics.json.
        self.queue_high_water = 0
        self.queued_total = 0
        self.queue_wait_ms_total = 0.0
        self.queue_wait_ms_max = 0.0

    @property
    def running(self) -> int:
        """Tool calls holding a concurrency slot now."""
        return self._gate.active

    @property
    def queue_depth(self) -> int:
        """Tool calls waiting for a slot now."""
        return self._gate.depth

    async def run(
        self,
        spec_name: str,
        args_raw: object,
        *,
        call_id: str,
        idempotency_key: str | None = None,
        approval: Approval | None = None,
        allow: Collection[str] | None = None,
        deny: Collection[str] = (),
        confirming: bool = False,
    ) -> ToolResult:
        """Run one call and return its result; failures are envelopes, not exceptions.

        ``args_raw`` is the parsed arguments (the framer's value) or JSON text (a native
        tool call's ``arguments`` string). ``allow``/``deny`` are the request's lists
        (``None``: every model-facing tool). ``approval`` is awaited for
        ``needs_approval`` tools; without one they are denied.

        ``confirming``: the gateway's own call of a confirming tool (docs/tools.md,
        ``ToolSpec.confirm_with``), which is never model-facing: the allow list does not
        apply, the deny list does, and only a hidden ``needs_approval`` tool qualifies, so
        the flag cannot open any other tool.
        """
        started_at = self._wall()
        try:
            if confirming:
                spec = self._confirming_spec(spec_name, deny)
            else:
                spec = self.registry.check_allowed(spec_name, allow, deny)
            args = validate_args(spec, args_raw, limit=self.max_args_bytes)
        except ToolError as exc:
            return self._rejected(spec_name, call_id, args_raw, exc, started_at)
        args_json = args.model_dump(mode="json")
        logged_args = redact(args_json, extra_keys=spec.redact_keys)
        if idempotency_key is None:
            return await self._approve_and_execute(
                spec, args, logged_args, call_id, approval, started_at
            )
        key = derive_call_key(idempotency_key, call_id, spec.name, args_json)
        while True:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return self._replay(hit, call_id, logged_args)
            pending = self._inflight.get(key)
            if pending is None:
                break
            # The same call is running: wait for it (not cancelling it if we are), then
            # look again. A failure is not cached, so we then run it ourselves.
            await asyncio.wait({pending})
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        try:
            result = await self._approve_and_execute(
                spec, args, logged_args, call_id, approval, started_at
            )
            if result.ok:
                self._cache[key] = result
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            return result
        finally:
            del self._inflight[key]
            done.set_result(None)

    def _confirming_spec(self, name: str, deny: Collection[str]) -> ToolSpec[Any]:
        spec = self.registry.get(name)
        if spec is None or spec.model_facing or not spec.needs_approval or name in deny:
            raise ToolError(
                ErrorCode.TOOL_NOT_ALLOWED,
                f"{name} is not a confirming tool (hidden, approval-gated) this gateway runs",
            )
        return spec

    # -- steps --------------------------------------------------------------------------

    async def _approve_and_execute(
        self,
        spec: ToolSpec[Any],
        args: object,
        logged_args: object,
        call_id: str,
        approval: Approval | None,
        started_at: float,
    ) -> ToolResult:
        if spec.needs_approval:
            refusal = await self._ask(spec, approval)
            if refusal is not None:
                return self._rejected(spec.name, call_id, logged_args, refusal, started_at)
        return await self._execute(spec, args, logged_args, call_id, started_at)

    async def _ask(self, spec: ToolSpec[Any], approval: Approval | None) -> ToolError | None:
        if approval is None:
            return ToolError(
                ErrorCode.TOOL_APPROVAL_DENIED,
                f"{spec.name} needs approval and no one can approve it here",
            )
        try:
            async with asyncio.timeout(self.approval_timeout_s):
                granted = await approval()
        except TimeoutError:
            return ToolError(
                ErrorCode.TOOL_APPROVAL_TIMEOUT,
                f"{spec.name} was not approved within {self.approval_timeout_s:g} s",
                retryable=True,
            )
        except Exception as exc:  # a broken approver denies; it never breaks the stream
            return ToolError(
                ErrorCode.TOOL_APPROVAL_DENIED,
                f"{spec.name} could not be approved (the approver failed: {type(exc).__name__})",
            )
        if granted is True:
            return None
        return ToolError(ErrorCode.TOOL_APPROVAL_DENIED, f"{spec.name} was denied by the user")

    async def _execute(
        self,
        spec: ToolSpec[Any],
        args: object,
        logged_args: object,
        call_id: str,
        started_at: float,
    ) -> ToolResult:
        queued_at = self._clock()
        if self._gate.would_wait():
            depth = self._gate.depth + 1
            self.queued_total += 1
            self.queue_high_water = max(self.queue_high_water, depth)
            log.info(
                TOOL_QUEUED, tool=spec.name, call_id=call_id, depth=depth, running=self.running
            )
        await self._gate.acquire()
        wait_ms = _ms(self._clock() - queued_at)
        self.queue_wait_ms_total += wait_ms
        self.queue_wait_ms_max = max(self.queue_wait_ms_max, wait_ms)
        try:
            outcome = await self._attempts(spec, args, logged_args, call_id, wait_ms)
        except asyncio.CancelledError:
            log.info(TOOL_FINISHED, tool=spec.name, call_id=call_id, outcome="cancelled")
            raise
        finally:
            self._gate.release()
        return self._finish(spec, call_id, logged_args, outcome, wait_ms, started_at)

    async def _attempts(
        self,
        spec: ToolSpec[Any],
        args: object,
        logged_args: object,
        call_id: str,
        wait_ms: float,
    ) -> _Outcome:
        out = _Outcome()
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self.default_timeout_s
        max_attempts = spec.retries + 1
        start = self._clock()
        while True:
            out.attempts += 1
            attempt_start = self._clock()
            transient = False
            crash: Exception | None = None
            try:
                async with asyncio.timeout(timeout_s):
                    out.data = await spec.fn(args)
            except TimeoutError:
                out.error = ToolError(
                    ErrorCode.TOOL_TIMEOUT,
                    f"{spec.name} did not finish within {timeout_s:g} s",
                    retryable=True,
                )
                transient = True
            except TransientToolError as exc:
                out.error, transient = exc, True
            except ToolError as exc:  # PermanentToolError, or any typed refusal
                out.error = exc
            except Exception as exc:  # a bug in the tool: permanent, and not for the model
                out.error = ToolError(
                    ErrorCode.TOOL_FAILED,
                    f"{spec.name} failed with an internal error ({type(exc).__name__})",
                )
                crash = exc
            else:
                out.error = None
            retry = transient and out.attempts < max_attempts
            (log.info if out.error is None else log.warning)(
                TOOL_ATTEMPT,
                exc_info=crash,
                tool=spec.name,
                call_id=call_id,
                attempt=out.attempts,
                max_attempts=max_attempts,
                outcome="ok" if out.error is None else str(out.error.code),
                error=None if out.error is None else out.error.message,
                retry_in_s=spec.retry_delay_s if retry else None,
                duration_ms=_ms(self._clock() - attempt_start),
                queue_wait_ms=wait_ms,
                args=logged_args,
            )
            if not retry:
                break
            await self._sleep(spec.retry_delay_s)
        out.duration_s = self._clock() - start
        if out.error is not None and out.error.retryable and out.attempts > 1:
            err = out.error
            out.error = ToolError(
                err.code,
                f"{err.message} (gave up after {out.attempts} attempts)",
                retryable=True,
                details=err.details,
            )
        return out

    # -- results ------------------------------------------------------------------------

    def _finish(
        self,
        spec: ToolSpec[Any],
        call_id: str,
        logged_args: object,
        outcome: _Outcome,
        wait_ms: float,
        started_at: float,
    ) -> ToolResult:
        slow = outcome.duration_s > self.soft_target_s
        warnings: list[dict[str, str]] = []
        if slow:
            warnings.append(
                {
                    "code": PERFORMANCE_WARNING,
                    "message": f"{spec.name} took {outcome.duration_s:.1f} s; "
                    f"the target is {self.soft_target_s:g} s",
                }
            )
        data: object = None
        raw: object = None
        produced = outcome.data
        if isinstance(produced, ToolOutput):
            raw = produced.raw
            produced = produced.data
        error = outcome.error
        if error is None:
            try:
                data = self._checked_output(produced, warnings)
            except ToolError as exc:
                error = exc
        envelope = (
            ToolEnvelope.success(data, warnings)
            if error is None
            else ToolEnvelope.failure(error, warnings)
        )
        error_dict = None if error is None else _redacted_error(error, spec)
        record = ToolInvocationRecord(
            call_id=call_id,
            name=spec.name,
            args=logged_args,
            result=None
            if error is not None
            else redact(apply_allowlist(data, spec.output_allowlist), extra_keys=spec.redact_keys),
            error=error_dict,
            started_at=started_at,
            ended_at=self._wall(),
            attempts=outcome.attempts,
            raw=raw,
        )
        duration_ms = _ms(outcome.duration_s)
        (log.warning if slow or error is not None else log.info)(
            TOOL_FINISHED,
            tool=spec.name,
            call_id=call_id,
            ok=error is None,
            error_code=None if error is None else str(error.code),
            attempts=outcome.attempts,
            duration_ms=duration_ms,
            queue_wait_ms=wait_ms,
            performance_warning=slow,
            cached=False,
        )
        return ToolResult(
            envelope=envelope,
            record=record,
            attempts=outcome.attempts,
            duration_ms=duration_ms,
            cached=False,
            performance_warning=slow,
            queue_wait_ms=wait_ms,
        )

    def _checked_output(self, data: object, warnings: list[dict[str, str]]) -> object:
        return checked_output(data, warnings, self.max_result_bytes)

    def _rejected(
        self,
        name: str,
        call_id: str,
        args: object,
        error: ToolError,
        started_at: float,
    ) -> ToolResult:
        """A call that never ran: not allowed, bad arguments, denied or unapproved."""
        spec = self.registry.get(name)
        keys = spec.redact_keys if spec is not None else frozenset[str]()
        if error.code is ErrorCode.ARGUMENTS_TOO_LARGE:
            logged: object = f"<{error.details[0]['size'] if error.details else '?'} bytes>"
        else:
            logged = redact(args, extra_keys=keys)
        log.info(
            TOOL_FINISHED,
            tool=name,
            call_id=call_id,
            ok=False,
            error_code=str(error.code),
            attempts=0,
            args=logged,
        )
        record = ToolInvocationRecord(
            call_id=call_id,
            name=name,
            args=logged,
            result=None,
            error=_redacted_error(error, spec),
            started_at=started_at,
            ended_at=self._wall(),
            attempts=0,
        )
        return ToolResult(
            envelope=ToolEnvelope.failure(error),
            record=record,
            attempts=0,
            duration_ms=0.0,
            cached=False,
            performance_warning=False,
            queue_wait_ms=0.0,
        )

    def _replay(self, hit: ToolResult, call_id: str, logged_args: object) -> ToolResult:
        now = self._wall()
        log.info(
            TOOL_FINISHED,
            tool=hit.record.name,
            call_id=call_id,
            ok=hit.ok,
            attempts=0,
            cached=True,
        )
        record = replace(
            hit.record, call_id=call_id, args=logged_args, started_at=now, ended_at=now, attempts=0
        )
        return replace(hit, record=record, cached=True, queue_wait_ms=0.0)


def _redacted_error(error: ToolError, spec: ToolSpec[Any] | None) -> dict[str, object]:
    keys = spec.redact_keys if spec is not None else frozenset[str]()
    out = redact(error.to_dict(), extra_keys=keys)
    assert isinstance(out, dict)
    return out


def _ms(seconds: float) -> float:
    return round(max(seconds, 0.0) * 1000.0, 3)


def client_result(
    name: str,
    call_id: str,
    args: object,
    *,
    ok: bool,
    data: object,
    error: ToolError | None,
    duration_s: float,
    started_at: float,
    ended_at: float,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> ToolResult:
    """A client-side tool's result (docs/tools.md), posted by the client or its timeout:
    checked like any tool output (sentinels escaped, size capped), redacted for the
    logs. The client ran it once: ``attempts`` is 1, 0 when nothing came."""
    warnings: list[dict[str, str]] = []
    if ok and error is None:
        try:
            data = checked_output(data, warnings, max_result_bytes)
        except ToolError as exc:
            error = exc
    envelope = (
        ToolEnvelope.success(data, warnings)
        if error is None
        else ToolEnvelope.failure(error, warnings)
    )
    timed_out = error is not None and error.code == ErrorCode.CLIENT_TOOL_TIMEOUT
    record = ToolInvocationRecord(
        call_id=call_id,
        name=name,
        args=redact(args),
        result=None if error is not None else redact(data),
        error=None if error is None else cast(dict[str, object], redact(error.to_dict())),
        started_at=started_at,
        ended_at=ended_at,
        attempts=0 if timed_out else 1,
    )
    return ToolResult(
        envelope=envelope,
        record=record,
        attempts=0 if timed_out else 1,
        duration_ms=_ms(duration_s),
        cached=False,
        performance_warning=False,
        queue_wait_ms=0.0,
    )


def checked_output(data: object, warnings: list[dict[str, str]], max_bytes: int) -> object:
    """Escape sentinels, check the size, and return a detached JSON copy (docs/protocol.md,
    docs/tools.md)."""
    try:
        blob = dump_json(data)
    except TypeError as exc:
        raise ToolError(
            ErrorCode.TOOL_OUTPUT_INVALID, f"the tool returned a value that is not JSON: {exc}"
        ) from exc
    if has_sentinels(blob):
        blob = escape_sentinels_json(blob)
        warnings.append(
            {
                "code": SENTINELS_ESCAPED,
                "message": "sentinel characters in the result were written as "
                f"{ESCAPES[OPEN]}/{ESCAPES[CLOSE]}",
            }
        )
    if len(blob) > max_bytes:
        raise ToolError(
            ErrorCode.TOOL_OUTPUT_TOO_LARGE,
            f"the result is {len(blob)} bytes of JSON; the limit is "
            f"{max_bytes}: ask for less (a narrower query, a smaller limit)",
            details=[{"size": str(len(blob)), "limit": str(max_bytes)}],
        )
    return orjson.loads(blob)
