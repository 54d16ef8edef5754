"""One stream, end to end: the driver of the turn engine (docs/protocol.md).

The rules of the conversation are :class:`toolforge.core.engine.Conversation`'s: it says which
request to send, which frames to emit, when a tool runs and when a body is repaired. A
``StreamSession`` owns exactly one producer task that does what the engine asks
(the table in :mod:`toolforge.core.engine.actions`) and owns everything the engine must not
know about: the upstream's delta streams, the tool executor, the clock, the frame log
with its backpressure (it waits whenever the client is ``QUEUE_MAX_FRAMES`` behind),
cancellation, metrics, logs and the artifacts.

Whatever happens — the model finishes, the upstream dies, the model breaks the framing,
the client goes, someone cancels — the task ends the same way: an ``error`` frame if
something failed, then exactly one ``done``, then the artifacts. Cancellation is owned:
``cancel(reason)`` cancels the task's anyio cancel scope, which closes the upstream
response (and its TCP connection) and any running tool at its next await, well within
docs/protocol.md's 50 ms.

**The read callback.** While the engine only reads the model (its action is a plain
``ReadModel`` whose frames fit the queue, nothing paused), the task does not read the
upstream itself: it waits in the generation's ``follow()`` (OpenAI-compatible streams over
the gateway's own transport, :class:`toolforge.upstream.openai_compat.ChatStream`), and
each delta is sent to the engine from the socket's read callback (:meth:`deliver`), its
frames appended there and handed to the relay at the end of the read. Anything else the
engine asks for goes back to the task (``_handoff``), which does it as before; so does the
generation's end, an error, and the idle timeout. ``STREAM_RELAY=false`` reads every
delta in the task.

Why an anyio scope and not ``task.cancel()``: httpx and httpcore are built on anyio and
shield their connection-pool cleanup with anyio scopes. A native cancel ignores those
shields: under load it can land inside httpcore's cleanup and leave a pool entry ACTIVE
and its socket open for good (found by bench/gateway.py's B4). anyio's scope delivery
respects them, and our own cleanup of the upstream runs shielded too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio

from toolforge.core.engine import (
    MODEL_END,
    AskModel,
    CallModel,
    Conversation,
    CountTokens,
    Emit,
    Finish,
    ModelReply,
    ReadModel,
    RefuseTool,
    RepairBody,
    RunTool,
    StopModel,
    ToolOutcome,
)
from toolforge.core.guarantee import Degraded, Outcome, Repaired, finish_frame
from toolforge.core.protocol.frames import (
    Error,
    Frame,
    JsonEnd,
    ResultEnd,
    StreamPaused,
    StreamResumed,
)
from toolforge.core.tool_specs import MAX_RESULT_BYTES, ToolError
from toolforge.errors import ErrorCode, ToolForgeError, UpstreamError
from toolforge.log import (
    CLIENT_DISCONNECTED,
    FRAME_DEGRADED,
    FRAME_REPAIRED,
    STREAM_FINISHED,
    STREAM_INTERNAL_ERROR,
    STREAM_STARTED,
    UPSTREAM_ERROR,
    get_logger,
)
from toolforge.runtime.artifacts import RunArtifacts
from toolforge.runtime.context import TokenCounter
from toolforge.runtime.executor import Approval, ToolExecutor, client_result
from toolforge.runtime.frame_log import FrameLog
from toolforge.runtime.metrics import GatewayMetrics
from toolforge.runtime.planner import SessionLimits, StreamPlan
from toolforge.runtime.run_record import RunRecord
from toolforge.runtime.tracing import Tracing
from toolforge.upstream.base import DeltaConsumer, DeltaStream, Upstream, UpstreamDelta

__all__ = ["ClientAnswer", "StreamSession"]

log = get_logger(__name__)

Deltas = DeltaStream


@dataclass(frozen=True, slots=True)
class ClientAnswer:
    """What a client posted for one of its tool calls (or its timeout)."""

    ok: bool
    result: object = None
    error: ToolError | None = None


# What the token loop sends the flow when deliver() has sent it the delta already.
_HANDED_OFF: Final = object()

# Bodies above this are decided in a worker thread (see StreamSession._repair_body).
_REPAIR_IN_THREAD_BYTES: Final = 8 * 1024
# After a tool call's END, how long to read the generation's trailing chunks when the mode
# asks for it (constrained: llama-server sends the usage within a millisecond or two).
_USAGE_AFTER_END_S: Final = 0.25


class StreamSession:
    """The producer of one stream and the log its readers follow."""

    # Slots, not an instance dict: CPython shares one key table among a class's instances
    # only while it has fewer than 30 attribute names, and a session has more; each would
    # carry a dict of its own, about 1.3 KB more per stream (docs/performance.md, "Memory
    # per stream"). A new attribute goes here too (AttributeError otherwise).
    __slots__ = (
        "_answered",
        "_approvals",
        "_artifacts",
        "_cancel_reason",
        "_client_calls",
        "_clock",
        "_counter",
        "_end_waiters",
        "_ended",
        "_executor",
        "_fault",
        "_flow",
        "_followers",
        "_grace",
        "_handoff",
        "_limits",
        "_metrics",
        "_opening",
        "_orphaned",
        "_pause_limit",
        "_paused_at",
        "_paused_total",
        "_record",
        "_scope",
        "_span",
        "_task",
        "_tracing",
        "_unpaused",
        "_upstream",
        "conversation",
        "delivered",
        "finished_at",
        "id",
        "log",
        "plan",
        "reason",
        "stats",
    )

    def __init__(
        self,
        plan: StreamPlan,
        *,
        upstream: Upstream,
        limits: SessionLimits,
        artifacts: RunArtifacts | None,
        metrics: GatewayMetrics | None = None,
        executor: ToolExecutor | None = None,
        repair_template: str = "",
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | None = None,
    ) -> None:
        self.plan = plan
        self._tracing = tracing  # OpenTelemetry spans; None (off): one check per model call
        self._span: Any = None
        self.id = plan.stream_id
        self._upstream = upstream
        self._limits = limits
        self._artifacts = artifacts
        self._metrics = metrics
        self._executor = executor
        self._clock = clock
        self.conversation = Conversation(
            plan.engine_config(
                limits, runs_tools=executor is not None, repair_template=repair_template
            )
        )
        # Measures the prompt for compaction (docs/context.md): only streams with a budget use it.
        self._counter = TokenCounter(upstream) if plan.context is not None else None
        self.log = FrameLog(
            max_pending=limits.queue_max_frames, clock=clock, relay=limits.stream_relay
        )
        self._task: asyncio.Task[None] | None = None
        self._scope = anyio.CancelScope()
        self._cancel_reason: str | None = None
        self._approvals: dict[str, asyncio.Future[bool]] = {}
        # Client-side tool calls waiting for their result, and those already answered.
        self._client_calls: dict[str, asyncio.Future[ClientAnswer]] = {}
        self._answered: set[str] = set()
        self._record = RunRecord()
        self._opening: Sequence[Frame] = ()  # stream.begin, until the upstream request is out
        self._ended = False  # done is appended and the artifacts are written
        self._end_waiters: list[asyncio.Future[None]] = []
        # Disconnects (client_left): the primary client gone and not back yet, the timer
        # of its grace, and the other readers following the stream.
        self._orphaned = False
        self._grace: asyncio.TimerHandle | None = None
        self._followers = 0
        # A client's pause (docs/protocol.md): while ``_unpaused`` is set the driver reads
        # nothing from the model and starts no model call; resume() or the pause's limit
        # resolves it. The frame clock (FRAME_TIMEOUT_MS) leaves the paused time out.
        self._unpaused: asyncio.Future[None] | None = None
        self._paused_at = 0.0
        self._paused_total = 0.0
        self._pause_limit: asyncio.TimerHandle | None = None
        self.reason: str | None = None
        self.finished_at: float | None = None
        self.stats: dict[str, Any] = {}
        # While the task sleeps in a generation's follow() (deliver): the engine's flow,
        # and what deliver hands back to the task (the action it could not do itself, or
        # an exception the flow raised).
        self._flow: Any = None
        self._handoff: object = None
        self._fault: BaseException | None = None
        self.delivered = 0  # deltas taken in the read callback (tests, bench)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start the stream's task (once) and return it."""
        if self._task is not None:
            raise RuntimeError("a session starts once")
        self._task = asyncio.create_task(self._run(), name=f"stream:{self.id}")
        return self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self.log.closed

    def cancel(self, reason: str = "cancelled") -> bool:
        """Stop the stream: upstream and tools cancelled, ``done`` with ``reason``."""
        if self._task is None or self._task.done() or self.log.closed:
            return False
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._scope.cancel()
        return True

    # -- disconnects: a drop is not a cancel ------------------------------------------
    #
    # ``on_disconnect`` says what the primary client leaving means. "cancel": the stream
    # is cancelled at once. "continue": it runs to its end with nobody throttling it.
    # "grace" (the default): it runs on for ``disconnect_grace_s``, still throttled by
    # the primary cursor where the client left it, so it produces at most
    # QUEUE_MAX_FRAMES more frames for nobody; a resume (``reader_joined``) within the
    # grace takes the primary's place and the stream goes on as if nothing happened;
    # otherwise the grace's timer cancels it, as "cancel" would have at once. Readers
    # that follow the stream (a resume while the primary was still connected) keep it
    # alive while they read; the grace starts when the last of them leaves.

    def client_left(self) -> None:
        """The primary client disconnected: cancel, keep going, or wait for a resume."""
        policy = self.plan.on_disconnect
        if not self.running:
            self.log.detach_primary()
            return
        grace_s = self._limits.disconnect_grace_s
        log.info(CLIENT_DISCONNECTED, stream_id=self.id, policy=policy, grace_s=grace_s)
        if policy == "grace" and grace_s > 0:
            self._orphaned = True
            if self._followers:
                self.log.detach_primary()  # they read on; none of them throttles
            else:
                self._start_grace()
            return
        self.log.detach_primary()
        if policy != "continue":
            self.cancel("client_disconnected")

    def reader_joined(self, after: int) -> bool:
        """Another reader (a resume, a replay) starts after id ``after``. True: the
        stream was waiting for its client to come back, and this reader is now its
        primary one (it throttles the producer, and its leaving is a disconnect)."""
        if not (self._orphaned and self.running):
            self._followers += 1
            return False
        self._orphaned = False
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        frame_log = self.log
        frame_log.attach_primary()
        frame_log.written(max(0, min(after, frame_log.last_id)), 0, primary=True)
        return True

    def reader_left(self) -> None:
        """A reader that :meth:`reader_joined` answered False for has gone."""
        self._followers -= 1
        if not self._followers and self._orphaned and self._grace is None and self.running:
            frame_log = self.log
            frame_log.attach_primary()  # from here on, bounded by the queue again
            frame_log.written(frame_log.last_id, 0, primary=True)
            self._start_grace()

    def _start_grace(self) -> None:
        loop = asyncio.get_running_loop()
        self._grace = loop.call_later(self._limits.disconnect_grace_s, self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        self._orphaned = False
        self.log.detach_primary()
        self.cancel("client_disconnected")

    # -- pause: the client's own backpressure ---------------------------------------------

    @property
    def paused(self) -> bool:
        return self._unpaused is not None

    def pause(self) -> bool:
        """Stop reading the model until :meth:`resume`, or for ``pause_max_s`` at most:
        ``stream.paused`` now, the upstream read held where it is (TCP throttles the model
        server, as for a slow client). False if the stream has ended; pausing a paused
        stream changes nothing. Cancel, the disconnect grace and client tool timeouts run
        on while paused."""
        if not self.running:
            return False
        if self._unpaused is None:
            loop = asyncio.get_running_loop()
            self._unpaused = loop.create_future()
            self._paused_at = self._clock()
            limit_s = self._limits.pause_max_s
            self._pause_limit = loop.call_later(limit_s, self.resume, "pause_limit")
            if self._opening:  # stream.begin goes first
                self._open_log()
            self.log.append(StreamPaused(max_ms=round(limit_s * 1000)))
        return True

    def resume(self, reason: Literal["resumed", "pause_limit"] = "resumed") -> bool:
        """Read the model again (``stream.resumed``); False if it was not paused."""
        unpaused = self._unpaused
        if unpaused is None:
            return False
        self._unpaused = None
        if self._pause_limit is not None:
            self._pause_limit.cancel()
            self._pause_limit = None
        paused_s = self._clock() - self._paused_at
        self._paused_total += paused_s
        if not self.log.closed:
            self.log.append(StreamResumed(reason=reason, paused_ms=round(paused_s * 1000)))
        if not unpaused.done():
            unpaused.set_result(None)
        return True

    def approve(self, call_id: str, approved: bool) -> bool:
        """Answer a pending approval; False if no call with that id is waiting."""
        waiter = self._approvals.get(call_id)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(approved)
        return True

    def post_tool_result(
        self, call_id: str, answer: ClientAnswer
    ) -> Literal["accepted", "unknown", "duplicate"]:
        """A client-side tool's result for call ``call_id`` (docs/tools.md): the stream resumes."""
        if call_id in self._answered:
            return "duplicate"
        waiter = self._client_calls.get(call_id)
        if waiter is None or waiter.done():
            return "unknown"
        self._answered.add(call_id)
        waiter.set_result(answer)
        return "accepted"

    @property
    def pending_tool_results(self) -> list[str]:
        return [cid for cid, waiter in self._client_calls.items() if not waiter.done()]

    @property
    def pending_approvals(self) -> list[str]:
        return [cid for cid, waiter in self._approvals.items() if not waiter.done()]

    async def wait(self) -> None:
        """Until the stream ended and its artifacts are written."""
        if self._ended:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._end_waiters.append(waiter)
        await waiter  # one future per caller: a cancelled one leaves the others waiting

    # -- the producer: the engine's actions, done -----------------------------------------

    async def _run(self) -> None:
        self._record.started = self._clock()
        if self._tracing is not None:
            self._span = self._tracing.stream_span(
                self.id, self.plan.chat.model, self.plan.mode.name
            )
        # Opened, counted and logged once this step yields (the upstream request is out by
        # then): stream.begin's frame, a log line and the metrics cost tens of µs, and until
        # the request is out they are time to first token.
        asyncio.get_running_loop().call_soon(self._started)
        finish: Finish | None = None
        error: ToolForgeError | None = None
        flow = self.conversation.flow()
        try:
            with self._scope:
                finish = await self._drive(flow)
            if self._scope.cancelled_caught and self._cancel_reason is None:
                self._cancel_reason = "cancelled"
        except asyncio.CancelledError:
            # A native cancel from outside (the event loop shutting down): end the stream
            # properly below instead of vanishing, then return.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if self._cancel_reason is None:
                self._cancel_reason = "shutdown"
        except Exception as exc:  # a bug of ours: still end the stream with a frame
            log.exception(STREAM_INTERNAL_ERROR, stream_id=self.id)
            error = ToolForgeError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            self.log.append(Error.of(error))
        finally:
            flow.close()
        if finish is not None and self._cancel_reason is None:
            error = finish.error
        await self._finish(finish.reason if finish is not None else "error", error)

    def _started(self) -> None:
        self._open_log()
        if self._metrics is not None:
            self._metrics.stream_started()
        log.info(
            STREAM_STARTED, stream_id=self.id, model=self.plan.chat.model, mode=self.plan.mode.name
        )

    async def _drive(self, flow: Any) -> Finish:
        """Do each action of ``flow`` and send it the result, until it finishes."""
        log_ = self.log
        queue_max = self._limits.queue_max_frames
        clock = self._clock
        record = self._record
        deltas: Deltas | None = None  # the open generation, if any
        # The open generation's follow(): its deltas are delivered in the socket's read
        # callback (deliver) while the engine only reads the model; None: read them here.
        follow: Callable[[DeltaConsumer], Awaitable[None]] | None = None
        relay = self._limits.stream_relay
        self._flow = flow
        tracing = self._tracing
        model_span: Any = None  # with tracing: the open generation's span
        flush_first = True  # until the first content frame is handed to the writer
        action: object = next(flow)
        try:
            if type(action) is Emit and action.outcome is None:  # stream.begin: _open_log
                self._opening = action.frames
                action = flow.send(None)
            while True:
                result: object = None
                try:
                    kind = type(action)
                    if kind is ReadModel:  # per token: kept free of calls where it can be
                        frames: Sequence[Frame] = action.frames  # type: ignore[attr-defined]
                        if frames:
                            for frame in frames:
                                if log_.pending() < queue_max:
                                    self._append(frame)
                                else:
                                    await self._push(frame)
                            if flush_first:
                                # Hand the stream's first content frame to the writer now,
                                # not after the rest of the read it came in (TTFT).
                                flush_first = False
                                await asyncio.sleep(0)
                        if self._unpaused is not None:  # paused: the model waits
                            await self._unpaused
                        if follow is not None and not flush_first:
                            # The next deltas go to deliver() in the read callback: no
                            # task step per token. Back here when the flow needs more
                            # than a read (its action in _handoff), or the generation
                            # does (its end, an error, a stall): read on below.
                            await follow(self)
                        if self._handoff is not None:
                            result = _HANDED_OFF
                        else:
                            # The next event, read inline: no coroutine per token.
                            try:
                                delta = await deltas.__anext__()  # type: ignore[union-attr]
                            except StopAsyncIteration:
                                # The generator finished, and its own clean-up ran: nothing
                                # to close (a shielded close costs an anyio scope per turn).
                                result = MODEL_END
                                deltas = None
                                if model_span is not None:
                                    tracing.end_model(model_span)  # type: ignore[union-attr]
                                    model_span = None
                            else:
                                result = self._timed(delta)
                    elif kind is Emit:
                        emit: Emit = action  # type: ignore[assignment]
                        frames = emit.frames
                        if emit.outcome is None and len(frames) == 1 and log_.pending() < queue_max:
                            self._append(frames[0])  # the usual Emit: no coroutine for it
                        else:
                            await self._emit(emit)
                    elif kind is CallModel:
                        if self._unpaused is not None:  # paused between turns
                            await self._unpaused
                        record.turn_started = clock()
                        trace_token = None
                        if tracing is not None:  # current while the request goes out
                            model_span, trace_token = tracing.model_span(
                                self._span,
                                action.request.model,  # type: ignore[attr-defined]
                                tracing.server_url,
                            )
                        deltas = self._upstream.stream(action.request)  # type: ignore[attr-defined]
                        follow = getattr(deltas, "follow", None) if relay else None
                        # The first read, inlined as above: this is the time to first token.
                        try:
                            delta = await deltas.__anext__()
                        except StopAsyncIteration:  # nothing at all: the generation is over
                            result = MODEL_END
                            deltas = None
                        else:
                            result = self._timed(delta)
                        finally:
                            if trace_token is not None:
                                tracing.detach(trace_token)  # type: ignore[union-attr]
                            if self._opening:  # the task did not wait: _started has not run
                                self._open_log()
                        if deltas is None and model_span is not None:
                            tracing.end_model(model_span)  # type: ignore[union-attr]
                            model_span = None
                    elif kind is StopModel:
                        assert deltas is not None
                        drain = action.drain  # type: ignore[attr-defined]
                        result = await self._drain(deltas) if drain else ()
                        await _close(deltas)
                        deltas = None
                        if model_span is not None:
                            tracing.end_model(model_span)  # type: ignore[union-attr]
                            model_span = None
                    elif kind is RepairBody:
                        result = await self._repair_body(action)  # type: ignore[arg-type]
                    elif kind is AskModel:
                        result = await self._ask(action)  # type: ignore[arg-type]
                    elif kind is RunTool:
                        result = await self._run_tool(action)  # type: ignore[arg-type]
                    elif kind is RefuseTool:
                        self._refused(action)  # type: ignore[arg-type]
                    elif kind is CountTokens:
                        assert self._counter is not None
                        if self._opening:  # measured before the first turn: begin goes out
                            self._open_log()
                        result = await self._counter.count(action.text)  # type: ignore[attr-defined]
                    elif kind is Finish:
                        return action  # type: ignore[return-value]
                    else:
                        raise TypeError(f"unknown engine action {action!r}")
                except ToolForgeError as exc:  # the engine decides what a failure means
                    if deltas is not None:
                        await _close(deltas)
                        deltas = None
                    if model_span is not None:
                        tracing.end_model(model_span, exc)  # type: ignore[union-attr]
                        model_span = None
                    if isinstance(exc, UpstreamError) and self._metrics is not None:
                        self._metrics.upstream_error(str(exc.code))
                    action = flow.throw(exc)
                    continue
                if result is _HANDED_OFF:  # deliver() sent the flow its delta already
                    action = self._handed_off()
                else:
                    action = flow.send(result)
        finally:
            self._flow = None
            if self._opening:  # the flow ended before it called the model
                self._open_log()
            # Leaving early (a cancel, a bug) must close the upstream response now, not
            # whenever the generator is garbage-collected.
            if deltas is not None:
                await _close(deltas)
            if model_span is not None:
                tracing.end_model(model_span)  # type: ignore[union-attr]

    def deliver(self, delta: UpstreamDelta) -> bool:
        """A delta of the open generation, in the socket's read callback while the task
        sleeps in its ``follow()``: what the task's read would do with it, done here
        while the flow asks only for the next read and its frames fit the queue. Else the
        flow's action goes back to the task (``_handoff``), which does it: False."""
        if self._cancel_reason is not None:  # cancelled: the task stops at its await
            return False
        self.delivered += 1
        try:
            action = self._flow.send(self._timed(delta))
            if type(action) is ReadModel and self._unpaused is None:
                frames: Sequence[Frame] = action.frames
                if not frames:
                    return True
                log_ = self.log
                if log_.pending() + len(frames) <= self._limits.queue_max_frames:
                    log_.hold()  # to the relay in settle(), with the rest of this read's
                    append = self._append
                    for frame in frames:
                        append(frame)
                    return True
        except BaseException as exc:  # a failure of ours: the task raises it
            self._fault = exc
            self._handoff = _HANDED_OFF
            return False
        self._handoff = action
        return False

    def _timed(self, delta: UpstreamDelta) -> tuple[UpstreamDelta, float]:
        """What the flow is sent for a delta read now: it and the stream's clock (the
        paused time left out); a turn's first text times its first token."""
        now = self._clock()
        if delta.text:
            self._record.token(now)
        return delta, now - self._paused_total

    def settle(self) -> None:
        """The read that brought the delivered deltas is done: their frames go out."""
        self.log.flush()

    def _handed_off(self) -> object:
        """The action ``deliver`` left for the task (or the flow's exception, raised)."""
        action, self._handoff = self._handoff, None
        fault, self._fault = self._fault, None
        if fault is not None:
            raise fault
        return action

    async def _drain(self, deltas: Deltas) -> tuple[UpstreamDelta, ...]:
        """The generation's trailing chunks (finish reason, usage, llama-server's timings),
        read briefly rather than lose the turn's accounting by closing at once."""
        trailing: list[UpstreamDelta] = []
        with anyio.move_on_after(_USAGE_AFTER_END_S):
            try:
                async for delta in deltas:
                    if delta.finish_reason is not None or delta.usage is not None:
                        trailing.append(delta)
            except UpstreamError:  # the call is complete; its accounting is not worth an error
                log.debug("upstream.usage_lost", stream_id=self.id)
        return tuple(trailing)

    # -- frames ---------------------------------------------------------------------------

    def _open_log(self) -> None:
        """Append the stream's opening frames (the engine's first ``Emit``: ``stream.begin``).

        They are held back until the first model call's request is on the wire: encoded
        and appended before it, they cost about 30 µs of time to first event, cold (B1).
        ``_started`` appends them when this task first waits, which is for the upstream's
        answer; the first model call does if the generation answered without a wait, and
        ``_drive`` on its way out if the flow never called the model. Either way they go
        in before any other frame, and no client waits for them: the response's head waits
        for the first frame after ``stream.begin`` (``toolforge.api.sse``).
        """
        opening, self._opening = self._opening, ()
        for frame in opening:
            self._append(frame)

    async def _push(self, frame: Frame) -> None:
        if self.log.pending() >= self._limits.queue_max_frames:
            await self.log.wait_for_room()
        self._append(frame)

    def _append(self, frame: Frame) -> None:
        """Into the frame log, with room checked (``_push``, or the token loop itself)."""
        self.log.append(frame)
        kind = type(frame)
        if kind is ResultEnd:
            self._record.results.append(frame.data)
        elif kind is JsonEnd:
            self._record.objects.append(frame.data)

    async def _emit(self, action: Emit) -> None:
        outcome = action.outcome
        if outcome is not None:
            frame_id = action.frames[-1].data.get("id")
            if isinstance(outcome, Repaired):
                log.info(FRAME_REPAIRED, stream_id=self.id, frame_id=frame_id, via=outcome.via)
            elif isinstance(outcome, Degraded):
                self._record.degraded_ids.add(self.log.last_id + len(action.frames))
                log.warning(
                    FRAME_DEGRADED,
                    stream_id=self.id,
                    frame_id=frame_id,
                    errors=[e.to_dict() for e in outcome.errors],
                )
        for frame in action.frames:
            await self._push(frame)

    # -- the JSON guarantee -----------------------------------------------------------------

    async def _repair_body(self, action: RepairBody) -> Outcome:
        if len(action.text) > _REPAIR_IN_THREAD_BYTES:
            # Local repair of a large, damaged body can take a quarter of a second
            # (json_repair is pure Python): do it off the event loop, so other streams'
            # tokens keep flowing meanwhile.
            return await anyio.to_thread.run_sync(
                finish_frame, action.text, action.parsed, action.schema
            )
        return finish_frame(action.text, action.parsed, action.schema)

    async def _ask(self, action: AskModel) -> ModelReply:
        """One whole model call (the repair of a body). Its failure is an answer: None."""
        parts: list[str] = []
        usage: list[UpstreamDelta] = []
        deltas = self._upstream.stream(action.request)
        try:
            async for delta in deltas:
                parts.append(delta.text)
                if delta.usage is not None:
                    usage.append(delta)
        except UpstreamError as exc:
            log.warning(
                UPSTREAM_ERROR, stream_id=self.id, purpose=action.purpose, code=str(exc.code)
            )
            return ModelReply(None, tuple(usage))
        finally:
            await _close(deltas)
        return ModelReply("".join(parts), tuple(usage))

    # -- tools ------------------------------------------------------------------------------

    async def _run_tool(self, action: RunTool) -> ToolOutcome:
        if self._tracing is None:
            return await self._run_tool_untraced(action)
        span = self._tracing.tool_span(self._span, action.name, action.id, action.executor)
        ok, code = False, "cancelled"
        try:
            outcome = await self._run_tool_untraced(action)
            ok = bool(outcome.envelope.get("ok"))
            errors = outcome.envelope.get("errors")
            first = errors[0] if isinstance(errors, list) and errors else None
            code = str(first.get("code")) if isinstance(first, dict) else "tool_error"
            return outcome
        finally:
            self._tracing.end_tool(span, ok, code)

    async def _run_tool_untraced(self, action: RunTool) -> ToolOutcome:
        if action.executor == "client":
            return await self._client_tool(action)
        executor = self._executor
        assert executor is not None  # the engine refuses every call when there is none
        result = await executor.run(
            action.name,
            action.args,
            call_id=action.id,
            idempotency_key=self.plan.idempotency_key,
            approval=self._approval(action.id) if action.needs_approval else None,
            allow=self.plan.tools_allow,
            confirming=action.executor == "gateway",
        )
        self._record.tool_logs.append(result.record.to_dict())
        if self._metrics is not None:
            self._metrics.tool_call(
                action.name, "ok" if result.ok else "error", result.duration_ms / 1000
            )
        return ToolOutcome(result.frame(), result.envelope.to_dict())

    async def _client_tool(self, action: RunTool) -> ToolOutcome:
        """Wait for the client's result (pings go on meanwhile), at most
        ``CLIENT_TOOL_TIMEOUT_MS``; then it is checked like any tool output."""
        waiter: asyncio.Future[ClientAnswer] = asyncio.get_running_loop().create_future()
        self._client_calls[action.id] = waiter
        started, wall = self._clock(), time.time()
        answer: ClientAnswer
        try:
            with anyio.fail_after(self._limits.client_tool_timeout_s):
                answer = await waiter
        except TimeoutError:
            timeout = self._limits.client_tool_timeout_s
            answer = ClientAnswer(
                ok=False,
                error=ToolError(
                    ErrorCode.CLIENT_TOOL_TIMEOUT,
                    f"the client did not post a result for {action.name} within "
                    f"{timeout:g} s; go on without it",
                    retryable=True,
                ),
            )
        finally:
            self._client_calls.pop(action.id, None)
        result = client_result(
            action.name,
            action.id,
            action.args,
            ok=answer.ok,
            data=answer.result,
            error=answer.error,
            duration_s=self._clock() - started,
            started_at=wall,
            ended_at=time.time(),
            max_result_bytes=self._executor.max_result_bytes
            if self._executor is not None
            else MAX_RESULT_BYTES,
        )
        self._record.tool_logs.append(result.record.to_dict())
        if self._metrics is not None:
            self._metrics.tool_call(
                action.name, "ok" if result.ok else "error", result.duration_ms / 1000
            )
        return ToolOutcome(result.frame(), result.envelope.to_dict())

    def _refused(self, action: RefuseTool) -> None:
        self._record.tool_logs.append(
            {
                "call_id": action.id,
                "name": action.name,
                "args": None,
                "error": dict(action.error),
                "attempts": 0,
            }
        )
        if self._metrics is not None:
            self._metrics.tool_call(action.name, "refused")

    def _approval(self, call_id: str) -> Approval:
        async def wait_for_decision() -> bool:
            waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._approvals[call_id] = waiter
            try:
                return await waiter
            finally:
                self._approvals.pop(call_id, None)

        return wait_for_decision

    # -- the end ----------------------------------------------------------------------------

    def _context_record(self) -> dict[str, Any] | None:
        """metrics.json's ``context``: the budget, its source, how tokens were counted,
        and each compaction (docs/context.md)."""
        policy = self.plan.context
        if policy is None or self._counter is None:
            return None
        return {
            "budget_tokens": policy.budget_tokens,
            "budget_source": policy.source,
            "strategy": policy.strategy.name,
            "threshold": policy.threshold,
            "token_counting": self._counter.method,
            "token_counts": self._counter.calls,
            "compactions": list(self.conversation.stats.compactions),
        }

    async def _finish(self, finished: str, error: ToolForgeError | None) -> None:
        record = self._record
        counts = self.conversation.stats
        ended = self._clock()
        if self._cancel_reason is not None:
            reason = self._cancel_reason
        elif error is not None:
            reason = "error"
        else:
            reason = finished
        self.reason = reason
        summary = self.stats = record.summary(
            ended,
            counts,
            self.log,
            queue_max_frames=self._limits.queue_max_frames,
            budget=self.plan.budget,
            context=self._context_record(),
        )
        self.log.append(record.done(reason, counts, summary))
        self.log.close()
        if self._grace is not None:  # ended (or cancelled) while waiting for its client
            self._grace.cancel()
            self._grace = None
        if self._pause_limit is not None:  # ended (or cancelled) while paused
            self._pause_limit.cancel()
            self._pause_limit = None
        self._unpaused = None
        self.finished_at = self._clock()
        log.info(
            STREAM_FINISHED,
            stream_id=self.id,
            reason=reason,
            **{k: summary[k] for k in ("ttft_ms", "duration_ms", "tokens", "frames")},
        )
        if self._span is not None and self._tracing is not None:
            self._tracing.end_stream(self._span, reason, counts.usage)
            self._span = None
        if self._metrics is not None:
            ttft = summary["ttft_ms"]
            self._metrics.stream_finished(
                reason,
                ended - record.started,
                None if ttft is None else ttft / 1000,
                summary["frame_counts"],
                summary["tokens"],
                self.log.paused_s,
                model=self.plan.chat.model,
                mode=self.plan.mode.name,
                prompt_tokens=int((counts.usage or {}).get("prompt_tokens") or 0),
            )
            if counts.guardrails:
                self._metrics.guardrail_actions(counts.guardrails)
        if self._artifacts is not None:
            await record.write(
                self._artifacts,
                self.log,
                stream_id=self.id,
                reason=reason,
                error=error,
                prompt=self.plan.prompt_record,
                summary=summary,
            )
        self._ended = True
        for waiter in self._end_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._end_waiters.clear()


async def _close(deltas: AsyncIterator[UpstreamDelta]) -> None:
    """Close a generation now, and let no cancel cut the close short."""
    aclose = getattr(deltas, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await aclose()
        except Exception:  # closing a broken stream may fail; it is closed either way
            log.debug("upstream.close_failed")
