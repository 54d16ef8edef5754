"""One stream, end to end (SPEC §3-§5): model turns, tools mid-stream, the JSON guarantee.

A ``StreamSession`` owns exactly one producer task. The task runs *turns*: each turn is
one upstream generation whose text goes through a sans-IO ``Framer`` into the session's
``FrameLog`` (waiting whenever the client is ``QUEUE_MAX_FRAMES`` behind: backpressure).

- At a tool call's END the turn stops the upstream generation (its request is closed,
  which stops the model server generating), the session emits ``tool.call``, runs the
  tool through the ``ToolExecutor``, emits ``tool.result`` and starts the next turn with
  the model's own text up to that END plus the result, in the same client stream. The
  resumed prompt extends the previous one exactly, so a server's prompt cache applies.
- At an OBJECT or RESULT frame's END the body is decided by ``app.core.guarantee``:
  valid as is, repaired locally, repaired by one model call (``prompts/repair.txt``,
  temperature 0), or replaced by a minimal schema-valid object marked ``degraded``.

Whatever happens — the model finishes, the upstream dies, the model breaks the framing,
the client goes, someone cancels — the task ends the same way: an ``error`` frame if
something failed, then exactly one ``done``, then the artifacts. Cancellation is owned:
``cancel(reason)`` cancels the task's anyio cancel scope, which closes the upstream
response (and its TCP connection) and any running tool at its next await, well within
SPEC §4's 50 ms.

Why an anyio scope and not ``task.cancel()``: httpx and httpcore are built on anyio and
shield their connection-pool cleanup with anyio scopes. A native cancel ignores those
shields: under load it can land inside httpcore's cleanup and leave a pool entry ACTIVE
and its socket open for good (found by bench/gateway.py's B4). anyio's scope delivery
respects them, and our own cleanup of the upstream runs shielded too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio

from app.core.events import FrameKind
from app.core.framer import BodyClosed, Framer
from app.core.gbnf import FrameGrammar
from app.core.guarantee import (
    Degraded,
    FinalOutcome,
    NeedsModelRepair,
    Repaired,
    Valid,
    after_model_repair,
    end_fields,
    finish_frame,
    give_up,
    render_repair_prompt,
)
from app.core.json_validator import StreamingJSONValidator
from app.core.native_tools import (
    AssembledCall,
    ToolCallAssembler,
    assistant_tool_call_message,
    tool_result_message,
)
from app.core.prompt import render_tool_result
from app.core.schemas import CompiledSchema
from app.core.wire import (
    DONE,
    ERROR,
    JSON_END,
    RESULT_END,
    STREAM_BEGIN,
    TOOL_CALL,
    TOOL_RESULT,
    Frame,
)
from app.errors import ErrorCode, JSONError, ModelBehaviorError, ToolForgeError, UpstreamError
from app.log import (
    ARTIFACTS_WRITE_FAILED,
    CLIENT_DISCONNECTED,
    FRAME_DEGRADED,
    FRAME_REPAIRED,
    STREAM_FINISHED,
    STREAM_INTERNAL_ERROR,
    STREAM_STARTED,
    UPSTREAM_ERROR,
    get_logger,
)
from app.runtime.artifacts import RunArtifacts
from app.runtime.executor import Approval, ToolExecutor
from app.runtime.frame_log import FrameLog, decode_frames
from app.runtime.metrics import GatewayMetrics
from app.upstream.base import ChatRequest, Upstream, UpstreamDelta

__all__ = ["SessionLimits", "StreamPlan", "StreamSession"]

log = get_logger(__name__)

DisconnectPolicy = Literal["cancel", "continue"]

# Bodies above this are decided in a worker thread (see StreamSession._decide).
_REPAIR_IN_THREAD_BYTES = 8 * 1024
# Constrained mode: how long to wait after a tool call's END for the usage chunk that
# follows it (llama-server sends it within a millisecond or two of the last token).
_USAGE_AFTER_END_S = 0.25


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Everything a session needs, resolved from the HTTP request."""

    stream_id: str
    chat: ChatRequest
    mode: str
    on_disconnect: DisconnectPolicy = "cancel"
    # The context-budget decision behind the upstream (SPEC §6), when the gateway made one;
    # its budget_tokens goes in stream.begin, the whole decision in metrics.json.
    budget: Mapping[str, Any] | None = None
    prompt_record: Mapping[str, Any] = field(default_factory=dict)
    # Schemas the model may use in OBJECT / RESULT frames, by name ("Any" included).
    schemas: Mapping[str, CompiledSchema] = field(default_factory=dict)
    # The RESULT frame's schema, whatever name the model writes in it (SPEC §2).
    result_schema: str | None = None
    # Every registered schema: an OBJECT frame naming one the request did not declare is
    # still held to it; only a name nobody registered falls back to Any.
    registered: Mapping[str, CompiledSchema] = field(default_factory=dict)
    tools_allow: tuple[str, ...] | None = None  # None: every model-facing tool
    max_tool_calls: int = 8
    idempotency_key: str | None = None
    # Constrained mode (SPEC §4): every turn's request carries this grammar for its ids,
    # the model repair call a JSON-only one. None in the other modes.
    grammar: FrameGrammar | None = None


@dataclass(frozen=True, slots=True)
class SessionLimits:
    queue_max_frames: int = 128
    max_frame_bytes: int = 64 * 1024
    max_json_depth: int = 16
    frame_timeout_s: float = 15.0
    repair_retries: int = 1


@dataclass(slots=True)
class _Turn:
    """How one generation ended: with a tool call to run, or not."""

    tool: BodyClosed | None = None
    assistant_text: str = ""  # the model's text up to and including the tool call's END
    native_calls: list[AssembledCall] = field(default_factory=list)  # native mode


@dataclass(slots=True)
class _Stats:
    started: float = 0.0
    first_token_at: float | None = None
    chunks: int = 0
    usage: dict[str, Any] | None = None
    finish: str | None = None
    turns: int = 0
    tool_calls: int = 0
    repairs: int = 0
    degraded_frames: int = 0
    degraded_ids: set[int] = field(default_factory=set)
    # llama-server's per-call timings (cache_n: prompt tokens reused from the cache), in
    # call order: shows whether a resumed turn hit the prompt cache (SPEC §4).
    upstream_timings: list[dict[str, Any]] = field(default_factory=list)
    # Time to first token of each turn: the first is the stream's TTFT, the others show
    # what a resume after a tool costs (prompt cache or not).
    turn_ttft_ms: list[float] = field(default_factory=list)
    # The RESULT and OBJECT values, for result.json (the log keeps only encoded frames).
    results: list[object] = field(default_factory=list)
    objects: list[object] = field(default_factory=list)


class StreamSession:
    """The producer of one stream and the log its readers follow."""

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
    ) -> None:
        self.plan = plan
        self.id = plan.stream_id
        self._upstream = upstream
        self._limits = limits
        self._artifacts = artifacts
        self._metrics = metrics
        self._executor = executor
        self._repair_template = repair_template
        self._clock = clock
        self.log = FrameLog(max_pending=limits.queue_max_frames, clock=clock)
        self._seen_ids: set[str] = set()  # frame ids are unique across all turns
        self._task: asyncio.Task[None] | None = None
        self._scope = anyio.CancelScope()
        self._cancel_reason: str | None = None
        self._approvals: dict[str, asyncio.Future[bool]] = {}
        self._tool_logs: list[dict[str, object]] = []
        self._stats = _Stats()
        self._ended = False  # done is appended and the artifacts are written
        self._end_waiters: list[asyncio.Future[None]] = []
        self.reason: str | None = None
        self.finished_at: float | None = None
        self.stats: dict[str, Any] = {}

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

    def client_left(self) -> None:
        """The primary client disconnected: cancel, or keep going for a resume."""
        self.log.detach_primary()
        if self.running:
            log.info(CLIENT_DISCONNECTED, stream_id=self.id, policy=self.plan.on_disconnect)
            if self.plan.on_disconnect == "cancel":
                self.cancel("client_disconnected")

    def approve(self, call_id: str, approved: bool) -> bool:
        """Answer a pending approval; False if no call with that id is waiting."""
        waiter = self._approvals.get(call_id)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(approved)
        return True

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

    # -- the producer ------------------------------------------------------------------

    async def _push(self, frame: Frame) -> None:
        if self.log.pending() >= self._limits.queue_max_frames:
            await self.log.wait_for_room()
        self._append(frame)

    def _append(self, frame: Frame) -> None:
        """Into the frame log, with room checked (``_push``, or the token loop itself)."""
        self.log.append(frame)
        event = frame.event
        if event == RESULT_END:
            self._stats.results.append(frame.data)
        elif event == JSON_END:
            self._stats.objects.append(frame.data)

    async def _run(self) -> None:
        stats = self._stats
        stats.started = self._clock()
        error: ToolForgeError | None = None
        # Counted and logged once this step yields (the upstream request is out by then):
        # a log line and the metrics cost tens of µs, and this is the time to first token.
        asyncio.get_running_loop().call_soon(self._started)
        budget = self.plan.budget
        self.log.append(
            Frame(
                STREAM_BEGIN,
                {
                    "stream_id": self.id,
                    "model": self.plan.chat.model,
                    "mode": self.plan.mode,
                    "budget_tokens": budget["budget_tokens"] if budget else None,
                },
            )
        )
        try:
            with self._scope:
                messages = self.plan.chat.messages  # each turn adds to a new list
                while True:
                    chat = self._turn_request(messages)
                    turn = await self._turn(chat)
                    if turn.tool is not None:  # a sentinel tool call
                        envelope = await self._call_tool(turn.tool)
                        result = render_tool_result(turn.tool.id, turn.tool.name, envelope)
                        messages = [
                            *messages,
                            {"role": "assistant", "content": turn.assistant_text},
                            {"role": "user", "content": result},
                        ]
                    elif turn.native_calls:  # the upstream's own tool_calls
                        calls = turn.native_calls
                        replies = [
                            tool_result_message(call.id, await self._call_tool(_native(call)))
                            for call in calls
                        ]
                        messages = [
                            *messages,
                            assistant_tool_call_message(calls, turn.assistant_text),
                            *replies,
                        ]
                    else:
                        break
            if self._scope.cancelled_caught and self._cancel_reason is None:
                self._cancel_reason = "cancelled"
        except ToolForgeError as exc:
            error = exc
            if not isinstance(exc, _Reported):
                self.log.append(Frame(ERROR, exc.to_dict()))
            if isinstance(exc, UpstreamError) and self._metrics is not None:
                self._metrics.upstream_error(str(exc.code))
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
            self.log.append(Frame(ERROR, error.to_dict()))
        await self._finish(error)

    def _started(self) -> None:
        if self._metrics is not None:
            self._metrics.stream_started()
        log.info(STREAM_STARTED, stream_id=self.id, model=self.plan.chat.model, mode=self.plan.mode)

    def _turn_request(self, messages: Sequence[Mapping[str, Any]]) -> ChatRequest:
        """The next turn's request: the plan's with ``messages`` and, in constrained mode,
        the grammar of this turn (ids after every id seen so far; no tool call once
        ``max_tool_calls`` are spent)."""
        chat = self.plan.chat
        if messages is not chat.messages:
            chat = dataclasses.replace(chat, messages=messages)
        grammar = self.plan.grammar
        if grammar is None:
            return chat
        tools_left = self._stats.tool_calls < self.plan.max_tool_calls
        return _with_grammar(chat, grammar.next_turn(self._seen_ids, allow_tools=tools_left))

    async def _turn(self, chat: ChatRequest) -> _Turn:
        """One upstream generation, framed; returns early at a tool call."""
        stats = self._stats
        stats.turns += 1
        framer = Framer(
            max_frame_bytes=self._limits.max_frame_bytes,
            max_depth=self._limits.max_json_depth,
            seen_ids=self._seen_ids,
        )
        raw: list[str] = []  # this turn's text: blocks of _RAW_BLOCK deltas, then the rest
        pieces = 0  # deltas in raw since the last block
        assembler = (
            ToolCallAssembler(id_prefix=f"call_{stats.turns}_")
            if self.plan.mode == "native"
            else None
        )
        frame_opened_at: float | None = None
        frame_timeout = self._limits.frame_timeout_s
        queue_max = self._limits.queue_max_frames
        turn_started: float | None = self._clock()
        # Until the stream's first content frame is out, hand it to the writer as soon
        # as it exists rather than after the rest of the read it came in (TTFT).
        flush_first = stats.first_token_at is None
        frames_before = self.log.last_id
        deltas = self._upstream.stream(chat)
        try:
            async for delta in deltas:
                if delta.text:
                    now = self._clock()
                    if turn_started is not None:  # this turn's first token
                        stats.turn_ttft_ms.append(round((now - turn_started) * 1e3, 3))
                        turn_started = None
                        if stats.first_token_at is None:
                            stats.first_token_at = now
                    stats.chunks += 1
                    raw.append(delta.text)
                    pieces += 1
                    if pieces == _RAW_BLOCK:  # one string per block: memory per open stream
                        raw[-_RAW_BLOCK:] = ["".join(raw[-_RAW_BLOCK:])]
                        pieces = 0
                    for item in framer.feed(delta.text):
                        if type(item) is Frame:
                            if self.log.pending() < queue_max:
                                self._append(item)  # the usual case: no coroutine per token
                            else:
                                await self._push(item)
                        elif isinstance(item, BodyClosed):
                            if item.kind is FrameKind.TOOL_CALL:
                                if self.plan.grammar is not None:
                                    await self._collect_usage(deltas)
                                return _Turn(item, _up_to_end(raw, item))
                            await self._push(await self._decide(item))
                    if framer.error is not None:
                        raise _Reported(framer.error)
                    if flush_first and self.log.last_id > frames_before:
                        flush_first = False
                        await asyncio.sleep(0)
                    # FRAME_TIMEOUT_MS: a frame that stays open this long is abandoned,
                    # so a model that trickles forever cannot hold a tool call hostage.
                    if framer.open_frame_id is None:
                        frame_opened_at = None
                    elif frame_opened_at is None:
                        frame_opened_at = now
                    elif now - frame_opened_at > frame_timeout:
                        raise ModelBehaviorError(
                            ErrorCode.FRAME_TIMEOUT,
                            f"frame {framer.open_frame_id!r} stayed open longer than "
                            f"{frame_timeout * 1000:.0f} ms (FRAME_TIMEOUT_MS)",
                            frame_id=framer.open_frame_id,
                        )
                if assembler is not None and delta.tool_calls:
                    assembler.feed(delta.tool_calls)
                self._account(delta)
            for item in framer.close():  # text held back, or a frame left open
                if type(item) is Frame:
                    await self._push(item)
            if framer.error is not None:
                raise _Reported(framer.error)
            if assembler is not None and assembler.has_calls:
                # finish_reason "tool_calls" (or "stop" from servers that say so anyway)
                return _Turn(native_calls=assembler.finish(), assistant_text="".join(raw))
            return _Turn()
        finally:
            # Leaving early (a tool call, an error, a cancel) must close the upstream
            # response now, not whenever the generator is garbage-collected, and the
            # close itself must not be cut short by the cancel that brought us here.
            with anyio.CancelScope(shield=True):
                await _aclose(deltas)

    async def _collect_usage(self, deltas: AsyncIterator[UpstreamDelta]) -> None:
        """Constrained mode: the grammar ends the generation at the call's END, so its last
        chunks (finish reason, usage, llama-server's timings) follow at once; read them
        for the accounting, briefly, rather than lose this turn's usage by closing."""
        with anyio.move_on_after(_USAGE_AFTER_END_S):
            try:
                async for delta in deltas:
                    self._account(delta)
            except UpstreamError:  # the call is complete; its accounting is not worth an error
                log.debug("upstream.usage_lost", stream_id=self.id)

    def _account(self, delta: UpstreamDelta) -> None:
        if delta.finish_reason is not None:
            self._stats.finish = delta.finish_reason
        if delta.usage is not None:  # the last chunk only: keep the per-token path bare
            self._add_usage(delta)

    def _add_usage(self, delta: UpstreamDelta) -> None:
        """Token usage adds up over turns and repair calls."""
        if delta.usage is None:
            return
        counts = dict(delta.usage)
        timings = counts.pop("timings", None)  # per call, not a sum: kept apart
        if isinstance(timings, dict):
            self._stats.upstream_timings.append(timings)
        usage = self._stats.usage
        if usage is None:
            self._stats.usage = counts
            return
        for key, value in counts.items():
            if isinstance(value, int) and isinstance(usage.get(key, 0), int):
                usage[key] = usage.get(key, 0) + value

    # -- the JSON guarantee ---------------------------------------------------------------

    def _schema_for(self, closed: BodyClosed) -> CompiledSchema | None:
        plan = self.plan
        result = plan.schemas.get(plan.result_schema) if plan.result_schema else None
        if closed.kind is FrameKind.RESULT and result is not None:
            return result
        return (
            plan.schemas.get(closed.name)
            or plan.registered.get(closed.name)
            or plan.schemas.get("Any")
        )

    async def _decide(self, closed: BodyClosed) -> Frame:
        """The END frame of an OBJECT or RESULT body: valid, repaired, or degraded."""
        schema = self._schema_for(closed)
        event = JSON_END if closed.kind is FrameKind.OBJECT else RESULT_END
        if schema is None:  # no schema registry in this session: syntax is all we check
            if closed.error is not None:
                raise closed.error
            fields = end_fields(Valid(closed.value))
            return Frame(event, {"id": closed.id, "length": closed.length, **fields})
        parsed = closed.error if closed.error is not None else closed.value
        if closed.length > _REPAIR_IN_THREAD_BYTES:
            # Local repair of a large, damaged body can take a quarter of a second
            # (json_repair is pure Python): do it off the event loop, so other streams'
            # tokens keep flowing meanwhile.
            first = await anyio.to_thread.run_sync(finish_frame, closed.text, parsed, schema)
        else:
            first = finish_frame(closed.text, parsed, schema)
        outcome: FinalOutcome
        if not isinstance(first, NeedsModelRepair):
            outcome = first
        elif self._limits.repair_retries > 0:
            reply = await self._model_repair(schema, first)
            outcome = after_model_repair(reply, schema, first.errors)
        else:
            outcome = give_up(schema, first.errors)
        if isinstance(outcome, Repaired):
            self._stats.repairs += 1
            log.info(FRAME_REPAIRED, stream_id=self.id, frame_id=closed.id, via=outcome.via)
        elif isinstance(outcome, Degraded):
            self._stats.degraded_frames += 1
            self._stats.degraded_ids.add(self.log.last_id + 1)
            log.warning(
                FRAME_DEGRADED,
                stream_id=self.id,
                frame_id=closed.id,
                errors=[e.to_dict() for e in outcome.errors],
            )
        return Frame(event, {"id": closed.id, "length": closed.length, **end_fields(outcome)})

    async def _model_repair(self, schema: CompiledSchema, need: NeedsModelRepair) -> str | None:
        """Ask the model once to fix the body (temperature 0). None if that fails."""
        prompt = render_repair_prompt(
            self._repair_template, schema=schema, text=need.text, errors=need.errors
        )
        chat = dataclasses.replace(
            self.plan.chat,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=min(4096, 256 + len(need.text)),
        )
        if self.plan.grammar is not None:  # constrained: the reply can only be the JSON
            chat = _with_grammar(chat, self.plan.grammar.json_value(schema.schema))
        parts: list[str] = []
        deltas = self._upstream.stream(chat)
        try:
            async for delta in deltas:
                parts.append(delta.text)
                self._add_usage(delta)  # a repair call does not end the stream
        except UpstreamError as exc:
            log.warning(UPSTREAM_ERROR, stream_id=self.id, purpose="repair", code=str(exc.code))
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await _aclose(deltas)
        return "".join(parts)

    # -- tools ----------------------------------------------------------------------------

    async def _call_tool(self, closed: BodyClosed) -> dict[str, object]:
        """Run one tool call (or refuse it); emit its frames; return the envelope that goes
        back to the model (every mode renders it its own way)."""
        stats = self._stats
        stats.tool_calls += 1
        name = closed.name
        if closed.error is not None:
            return await self._refuse(
                closed,
                ErrorCode.INVALID_JSON,
                f"the arguments are not valid JSON ({closed.error.message}); "
                "write the call again with strict JSON arguments",
            )
        if stats.tool_calls > self.plan.max_tool_calls:
            return await self._refuse(
                closed,
                ErrorCode.TOOL_CALL_LIMIT,
                f"this stream allows {self.plan.max_tool_calls} tool calls (max_tool_calls); "
                "answer now with the information you have",
            )
        executor = self._executor
        if executor is None:
            return await self._refuse(
                closed, ErrorCode.TOOL_UNAVAILABLE, "this gateway runs no tools"
            )
        spec = executor.registry.get(name)
        needs_approval = spec is not None and spec.needs_approval
        call: dict[str, object] = {"id": closed.id, "name": name, "args": closed.value}
        if needs_approval:
            call["needs_approval"] = True
        await self._push(Frame(TOOL_CALL, call))
        result = await executor.run(
            name,
            closed.value,
            call_id=closed.id,
            idempotency_key=self.plan.idempotency_key,
            approval=self._approval(closed.id) if needs_approval else None,
            allow=self.plan.tools_allow,
        )
        await self._push(Frame(TOOL_RESULT, result.frame_data()))
        self._tool_logs.append(result.record.to_dict())
        if self._metrics is not None:
            self._metrics.tool_call(name, "ok" if result.ok else "error")
        return result.envelope.to_dict()

    async def _refuse(self, closed: BodyClosed, code: ErrorCode, message: str) -> dict[str, object]:
        error = {"code": str(code), "message": message}
        await self._push(
            Frame(
                TOOL_RESULT,
                {
                    "id": closed.id,
                    "name": closed.name,
                    "ok": False,
                    "error": error,
                    "duration_ms": 0.0,
                    "attempts": 0,
                    "cached": False,
                    "performance_warning": False,
                },
            )
        )
        self._tool_logs.append(
            {"call_id": closed.id, "name": closed.name, "args": None, "error": error, "attempts": 0}
        )
        if self._metrics is not None:
            self._metrics.tool_call(closed.name, "refused")
        return {"ok": False, "data": None, "warnings": [], "errors": [error]}

    def _approval(self, call_id: str) -> Approval:
        async def wait_for_decision() -> bool:
            waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._approvals[call_id] = waiter
            try:
                return await waiter
            finally:
                self._approvals.pop(call_id, None)

        return wait_for_decision

    # -- the end --------------------------------------------------------------------------

    async def _finish(self, error: ToolForgeError | None) -> None:
        stats = self._stats
        ended = self._clock()
        if self._cancel_reason is not None:
            reason = self._cancel_reason
        elif error is not None:
            reason = "error"
        else:
            reason = stats.finish or "stop"
        self.reason = reason
        self.stats = self._summary(ended)
        self.log.append(
            Frame(
                DONE,
                {
                    "reason": reason,
                    "usage": stats.usage
                    if stats.usage is not None
                    else {"completion_chunks": stats.chunks},
                    "metrics": {
                        k: self.stats[k]
                        for k in ("ttft_ms", "duration_ms", "tokens_per_s", "frames")
                    },
                },
            )
        )
        self.log.close()
        self.finished_at = self._clock()
        log.info(
            STREAM_FINISHED,
            stream_id=self.id,
            reason=reason,
            **{k: self.stats[k] for k in ("ttft_ms", "duration_ms", "tokens", "frames")},
        )
        if self._metrics is not None:
            ttft = self.stats["ttft_ms"]
            self._metrics.stream_finished(
                reason,
                ended - stats.started,
                None if ttft is None else ttft / 1000,
                self.stats["frame_counts"],
                self.stats["tokens"],
                self.log.paused_s,
            )
        await self._write_artifacts(reason, error)
        self._ended = True
        for waiter in self._end_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._end_waiters.clear()

    def _summary(self, ended: float) -> dict[str, Any]:
        stats = self._stats
        usage = stats.usage
        tokens = int(usage.get("completion_tokens", stats.chunks)) if usage else stats.chunks
        first = stats.first_token_at
        generating = ended - first if first is not None else 0.0
        return {
            "ttft_ms": None if first is None else round((first - stats.started) * 1e3, 3),
            "duration_ms": round((ended - stats.started) * 1e3, 3),
            "tokens": tokens,
            "upstream_chunks": stats.chunks,
            "tokens_per_s": round(tokens / generating, 2) if generating > 0 else None,
            "frames": self.log.last_id + 1,  # the done frame included
            "frame_counts": dict(self.log.event_counts),
            "turns": stats.turns,
            "tool_calls": stats.tool_calls,
            "repairs": stats.repairs,
            "degraded_frames": stats.degraded_frames,
            "queue_high_water": self.log.high_water,
            "queue_max_frames": self._limits.queue_max_frames,
            "queue_paused_ms": round(self.log.paused_s * 1e3, 3),
            "bytes_written": self.log.bytes_written,
            "budget": self.plan.budget,
            "turn_ttft_ms": stats.turn_ttft_ms,
            "upstream_timings": stats.upstream_timings,
        }

    async def _write_artifacts(self, reason: str, error: ToolForgeError | None) -> None:
        if self._artifacts is None:
            return
        result = {
            "stream_id": self.id,
            "reason": reason,
            "error": error.to_dict() if error is not None else None,
            "results": self._stats.results,
            "objects": self._stats.objects,
        }
        try:
            await self._artifacts.write(
                # Decoded in the writer's thread, from a snapshot of the encoded frames:
                # a long stream's frames never cost the event loop a second time.
                frames=_records(
                    tuple(self.log.encoded_after(0)), frozenset(self._stats.degraded_ids)
                ),
                prompt=dict(self.plan.prompt_record),
                result=result,
                tool_logs=self._tool_logs,
                metrics={"stream_id": self.id, "reason": reason, **self.stats},
            )
        except Exception:  # the stream is already complete for the client; log, go on
            log.exception(ARTIFACTS_WRITE_FAILED, stream_id=self.id)


def _records(encoded: tuple[bytes, ...], degraded: frozenset[int]) -> Iterator[dict[str, object]]:
    """frames.ndjson's records: id, event, data, and ``degraded`` where SPEC §4 marks it."""
    for seq, frame in enumerate(decode_frames(encoded), start=1):
        record: dict[str, object] = {"id": seq, "event": frame.event, "data": frame.data}
        if seq in degraded:
            record["degraded"] = True
        yield record


class _Reported(ModelBehaviorError):
    """A framing error whose ``error`` frame the framer already emitted."""

    def __init__(self, error: ModelBehaviorError) -> None:
        super().__init__(error.code, error.message, frame_id=error.frame_id)


def _native(call: AssembledCall) -> BodyClosed:
    """A native tool call as the framer would have closed it: parsed strictly, so both
    modes run tools under exactly the same rules."""
    validator = StreamingJSONValidator(frame_id=call.id)
    value: object = None
    error: JSONError | None = None
    try:
        validator.feed(call.arguments_text)
        value = validator.close()
    except JSONError as exc:
        error = exc
    return BodyClosed(
        FrameKind.TOOL_CALL,
        call.id,
        call.tool_name,
        call.arguments_text,
        value,
        error,
        len(call.arguments_text.encode("utf-8")),
    )


def _with_grammar(chat: ChatRequest, grammar: str) -> ChatRequest:
    # ``grammar``: llama-server's request field for a GBNF grammar.
    return dataclasses.replace(chat, extra={**chat.extra, "grammar": grammar})


_RAW_BLOCK: Final = 64


def _up_to_end(raw: list[str], call: BodyClosed) -> str:
    """The model's text of this turn up to and including the call's END sentinel.

    The real END is the last occurrence so far: an earlier one can only sit inside a JSON
    string of the body (where it is content), and the model's text after the END in the
    same chunk is dropped: the model should have stopped there.
    """
    text = "".join(raw)
    end = f"\u27e6END_TOOL_CALL id={call.id}\u27e7"
    cut = text.rfind(end)
    return text[: cut + len(end)] if cut >= 0 else text


async def _aclose(deltas: AsyncIterator[UpstreamDelta]) -> None:
    aclose = getattr(deltas, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # closing a broken stream may fail; it is closed either way
            log.debug("upstream.close_failed")
