"""The turn engine: the rules of one model conversation as a step machine. No I/O.

Theory of operation
-------------------
``Conversation.flow()`` is a generator of :mod:`~toolforge.core.engine.actions`. The driver
(:class:`toolforge.runtime.session.StreamSession`) does each action and sends back its result;
it never decides anything about the conversation, and the engine never awaits, reads a
clock or touches a socket. A whole stream, as the engine sees it::

    Emit(stream.begin)
    loop:                                      one turn = one generation
        policy.begin_turn        -> Proceed(messages, hints) | Fail
        CallModel(mode.turn_request(...))
        for each model event:                  (delta, now) ... MODEL_END
            frames <- reader.feed(delta.text)  text.delta, json.begin/delta, result.begin/delta
            OBJECT / RESULT END  -> RepairBody [-> AskModel]  -> Emit(json.end / result.end)
            TOOL_CALL END        -> StopModel, the turn ends at the call
            ReadModel(frames)
        no tool calls            -> policy.no_call: Accept (leave the loop) | Retry (nudge,
                                    ask again) | Rescue (the text's call) | Fail
        each call                -> policy.check_call: Run | Respond | Refuse (tool.result
                                    error, step.nudge); Emit(tool.call), RunTool,
                                    Emit(tool.result) (or RefuseTool: bad arguments, over
                                    max_tool_calls, no executor); policy.record
        policy.end_batch         -> Continue | Complete (the RESULT, leave) | Fail
        messages <- mode.continuation(messages, turn, envelopes)
    Finish(reason)

Errors: a ``ToolForgeError`` raised here (a framing violation, FRAME_TIMEOUT) or thrown in
by the driver (an upstream error) becomes an ``error`` frame and ``Finish("error")``. A
cancel is the driver's: it closes the generator and writes ``done`` itself.

The rules that differ by mode are the :class:`~toolforge.core.engine.modes.Mode` strategy's;
those of a workflow are the policy's (:mod:`toolforge.core.decisions`: a plain stream's,
``OPEN``, never objects). Everything here holds in every mode, with every policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, assert_never, cast

import orjson

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.context import ContextPolicy, compact
from toolforge.core.decisions import (
    OPEN,
    Accept,
    Complete,
    Continue,
    Fail,
    Nudge,
    Proceed,
    Refuse,
    Rescue,
    Respond,
    Retry,
    Run,
    TurnHints,
    TurnPolicy,
    WorkflowSummary,
)
from toolforge.core.engine.actions import (
    MODEL_END,
    Action,
    AskModel,
    CallModel,
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
from toolforge.core.engine.modes import Mode, ReaderLimits, Turn
from toolforge.core.events import FrameKind
from toolforge.core.framer import BodyClosed
from toolforge.core.gbnf import next_turn_ids
from toolforge.core.guarantee import (
    Degraded,
    FinalOutcome,
    NeedsModelRepair,
    Repaired,
    Valid,
    after_model_repair,
    give_up,
    render_repair_prompt,
)
from toolforge.core.messages import Message, MessageType, message
from toolforge.core.protocol.frames import (
    ContextCompacted,
    Diagnostics,
    Error,
    Frame,
    JsonEnd,
    ResultBegin,
    ResultDelta,
    ResultEnd,
    StepNudge,
    StreamBegin,
    ToolCall,
    ToolResult,
)
from toolforge.core.rescue import RescuedCall
from toolforge.core.schemas import CompiledSchema
from toolforge.errors import ErrorCode, ModelBehaviorError, ToolForgeError

__all__ = ["Conversation", "ConversationConfig", "ConversationStats", "Flow"]

Flow = Generator[Action, Any, None]
_Decision = TypeVar("_Decision")

_READ: ReadModel = ReadModel()  # the usual answer to a token that completes no frame
# The turn's text is kept as one string per this many deltas: a long open stream holds a
# few hundred strings, not one per token. Sixteen: an open stream holds at most 15 loose
# token strings (about 57 bytes each) besides its blocks, about 1 KB less per paced stream
# than at 64 (bench.load's B5), for one join of 16 strings per 16 tokens.
_RAW_BLOCK: Final = 16


@dataclass(slots=True)
class ConversationConfig:
    """One conversation's rules, resolved from the request (see the runtime planner).

    Not frozen, unlike the engine's values: one is built per stream, and a frozen
    dataclass's ``__init__`` costs a ``object.__setattr__`` per field. Nothing mutates it."""

    stream_id: str
    request: ChatRequest  # the first turn's; later turns replace its messages
    mode: Mode
    # Schemas the model may use in OBJECT / RESULT frames, by name ("Any" included).
    schemas: Mapping[str, CompiledSchema] = field(default_factory=dict)
    # The RESULT frame's schema, whatever name the model writes in it (docs/protocol.md).
    result_schema: str | None = None
    # Every registered schema: an OBJECT frame naming one the request did not declare is
    # still held to it; only a name nobody registered falls back to Any.
    registered: Mapping[str, CompiledSchema] = field(default_factory=dict)
    max_tool_calls: int = 8
    runs_tools: bool = True  # False: a gateway with no executor refuses every call
    approval_tools: frozenset[str] = frozenset()  # tools whose calls wait for approval
    # docs/tools.md: a tool whose successful call the gateway confirms with another (hidden,
    # approval-gated) tool, by name: facts.propose -> facts.commit (ToolSpec.confirm_with).
    confirmations: Mapping[str, str] = field(default_factory=dict)
    budget_tokens: int | None = None  # stream.begin's (docs/servers.md)
    limits: ReaderLimits = field(default_factory=ReaderLimits)
    frame_timeout_s: float = 15.0  # FRAME_TIMEOUT_MS
    repair_retries: int = 1  # REPAIR_RETRIES: model repair calls per body
    repair_template: str = ""  # prompts/repair.txt
    # Tools the *client* runs (the OpenAI-compatible proxy's): a turn that calls one ends
    # the conversation with its tool.call frames (executor "client") and reason
    # "tool_calls"; the client answers in its next request.
    client_tools: frozenset[str] = frozenset()
    # Tools the client runs while the stream waits (POST /v1/stream's client_tools,
    # docs/tools.md), with their parameters' schemas: the arguments are checked here first.
    awaited_tools: Mapping[str, CompiledSchema] = field(default_factory=dict)
    max_nudges: int = 1  # turns asked again because the reader's guardrails said so
    # Context compaction (docs/context.md, toolforge.core.context): before each turn that continues
    # the conversation, the prompt is measured against the policy's budget and compacted
    # over its threshold. None: never measured (no budget known, or compaction off).
    context: ContextPolicy | None = None
    # The step hint compaction puts in its summary ("[Steps completed: a, b]"). None: the
    # policy's (a workflow's StepTracker), else the tools whose calls succeeded, in order.
    step_hint: Callable[[], str] | None = None
    # Measure (and compact) the first turn's prompt too: for a caller that brings a long
    # history (a workflow's initial_messages). Off for /v1/stream: a measure before the
    # first request would be time to first token, and the request's own prompt is the
    # client's to size.
    fit_first_turn: bool = False
    # A workflow run: the policy that decides before every turn and call, outside the
    # message history (toolforge.core.steps). None: a plain stream, whose policy never
    # objects (toolforge.core.decisions.OPEN).
    workflow: TurnPolicy | None = None


@dataclass(slots=True)
class ConversationStats:
    """What the conversation counted, for ``done``, metrics.json and logs."""

    turns: int = 0
    chunks: int = 0  # deltas with text
    tool_calls: int = 0
    repairs: int = 0
    degraded_frames: int = 0
    usage: dict[str, Any] | None = None  # summed over turns and repair calls
    finish: str | None = None  # the last finish reason the upstream gave
    # What the guardrails did, by kind (rescued calls, nudges, respond, ...): done.guardrails.
    guardrails: dict[str, int] = field(default_factory=dict)
    # llama-server's per-call timings (cache_n: prompt tokens reused from the cache), in
    # call order: shows whether a resumed turn hit the prompt cache (docs/protocol.md).
    upstream_timings: list[dict[str, Any]] = field(default_factory=list)
    # Each compaction's context.compacted numbers, in order (metrics.json).
    compactions: list[dict[str, int]] = field(default_factory=list)
    # What the workflow's policy knows, as of its last decision (done.workflow is its
    # to_dict()); None: no workflow.
    workflow: WorkflowSummary | None = None


class Conversation:
    """The step machine of one stream: see the module docstring."""

    def __init__(self, config: ConversationConfig) -> None:
        self.config = config
        self.stats = ConversationStats()
        self._mode = config.mode
        self._seen_ids: set[str] = set()  # frame ids are unique across all turns
        self._completed: dict[str, None] = {}  # tools whose calls succeeded, in order
        self._policy: TurnPolicy = config.workflow if config.workflow is not None else OPEN
        self.stats.workflow = self._policy.summary()
        self.last_text = ""  # the last turn's text, as the model wrote it

    def flow(self) -> Flow:
        """The actions of the whole conversation; send each one's result back."""
        config = self.config
        yield Emit(
            (
                StreamBegin(
                    stream_id=config.stream_id,
                    model=config.request.model,
                    mode=self._mode.name,
                    budget_tokens=config.budget_tokens
                    if config.budget_tokens is not None or config.context is None
                    else config.context.budget_tokens,
                    budget_source=config.context.source if config.context is not None else None,
                ),
            )
        )
        try:
            messages = config.request.messages
            if config.context is not None and config.fit_first_turn:
                messages = yield from self._fit(messages)
            policy = self._policy
            while True:
                started = self._decided(policy.begin_turn(messages))
                match started:
                    case Proceed():
                        pass
                    case Fail(error):  # MAX_ITERATIONS
                        raise error
                    case _:
                        assert_never(started)
                turn = yield from self._turn(started.messages, started.hints)
                for note in turn.notes:
                    self._note(note)
                if turn.nudge is not None and self.stats.guardrails.get("nudge", 0) < (
                    config.max_nudges
                ):
                    # The reader's guardrails refused the turn (no usable call where one
                    # was required, an unknown tool): nothing of it was shown; ask again.
                    self._note("nudge")
                    step = self.stats.turns
                    messages = [
                        *messages,
                        message("assistant", turn.text, MessageType.TEXT_RESPONSE, step=step),
                        message("user", turn.nudge, MessageType.RETRY_NUDGE, step=step),
                    ]
                    if config.context is not None:
                        messages = yield from self._fit(messages)
                    continue
                if turn.frames:
                    yield Emit(turn.frames)
                for body in turn.bodies:
                    yield from self._decide(body)
                if not turn.calls:
                    # The answer, or (a workflow needs a call) a call rescued from the text,
                    # or a nudge.
                    after = self._decided(policy.no_call(self.last_text))
                    match after:
                        case Accept():
                            pass
                        case Retry(nudge):
                            self._note("nudge")
                            yield Emit((_nudge_frame(nudge, None),))
                            step = self.stats.turns  # compaction drops an old nudge (phase 1)
                            messages = [
                                *messages,
                                message(
                                    "assistant",
                                    self.last_text,
                                    MessageType.TEXT_RESPONSE,
                                    step=step,
                                ),
                                message("user", nudge.message, MessageType.RETRY_NUDGE, step=step),
                            ]
                            if config.context is not None:
                                messages = yield from self._fit(messages)
                            continue
                        case Rescue(calls):
                            turn = self._rescued_turn(calls)
                        case Fail(error):  # RETRIES_EXHAUSTED
                            raise error
                        case _:
                            assert_never(after)
                if not turn.calls:
                    if self.stats.finish == "tool_calls":  # a call that was the answer
                        self.stats.finish = "stop"
                    break
                handed = [call for call in turn.calls if call.name in config.client_tools]
                if handed:  # the client runs these: the conversation ends here
                    yield Emit(
                        tuple(
                            ToolCall(
                                id=call.id,
                                name=call.name,
                                args=call.value,
                                executor="client",
                                rescued=True if call.id in turn.rescued else None,
                            )
                            for call in handed
                        )
                    )
                    self.stats.tool_calls += len(handed)
                    self.stats.finish = "tool_calls"
                    break
                envelopes = []
                for call in turn.calls:
                    envelope = yield from self._tool(call, call.id in turn.rescued)
                    envelopes.append(envelope)
                    if envelope.get("ok"):
                        self._completed[call.name] = None
                ended = self._decided(policy.end_batch())
                match ended:
                    case Continue():
                        pass
                    case Complete(tool, result):  # a terminal tool succeeded: the answer
                        yield Emit(self._terminal_result(tool, result))
                        self.stats.finish = "stop"
                        break
                    case Fail(error):  # TOOL_ERRORS_EXHAUSTED
                        raise error
                    case _:
                        assert_never(ended)
                known = len(messages)
                messages = _stamped(
                    self._mode.continuation(messages, turn, envelopes), known, self.stats.turns
                )
                if config.context is not None:
                    messages = yield from self._fit(messages)
        except _Reported as exc:  # its error frame is out already (the framer made it)
            yield Finish("error", exc.error)
            return
        except ToolForgeError as exc:
            yield Emit((Error.of(exc),))
            yield Finish("error", exc)
            return
        yield Finish(self.stats.finish or "stop")

    def _decided(self, decision: _Decision) -> _Decision:
        """A decision of the policy, its state's summary kept for ``done`` (a cancel may
        end the flow at any action)."""
        self.stats.workflow = self._policy.summary()
        return decision

    # -- the context budget (docs/context.md) -----------------------------------------------------

    def _fit(self, messages: Sequence[Mapping[str, Any]]) -> Generator[Action, Any, Any]:
        """``messages`` measured and, over the threshold, compacted (``context.compacted``);
        over the budget with nothing left to cut, ``CONTEXT_BUDGET_EXCEEDED``."""
        policy = self.config.context
        assert policy is not None
        given = self.config.step_hint
        hint = given() if given is not None else self._policy.step_hint()
        if hint is None:
            hint = f"[Steps completed: {', '.join(self._completed)}]" if self._completed else ""
        done = yield from compact(policy, messages, step_hint=hint)
        if done is None:
            return messages
        self.stats.compactions.append(done.to_dict())
        yield Emit((ContextCompacted(**done.to_dict()),))
        return done.messages

    # -- a turn -------------------------------------------------------------------------

    def _turn(self, messages: Any, hints: TurnHints | None) -> Generator[Action, Any, Turn]:
        """One generation, framed; ends early at a sentinel tool call."""
        stats = self.stats
        config = self.config
        stats.turns += 1
        reader = self._mode.reader(config.limits, self._seen_ids, stats.turns)
        request = self._mode.turn_request(
            config.request,
            messages,
            seen_ids=self._seen_ids,
            tools_left=stats.tool_calls < config.max_tool_calls,
            hints=hints,
        )
        frame_timeout = config.frame_timeout_s
        framer = reader.framer  # read per token: its attributes, not the reader's properties
        feed = framer.feed
        raw: list[str] = []  # the turn's text: blocks of _RAW_BLOCK deltas, then the rest
        pieces = 0  # deltas in raw since the last block
        opened_at: float | None = None  # when the frame now open was first seen open
        event = yield CallModel(request)
        while event is not MODEL_END:
            delta, now = event
            frames: list[Frame] | None = None
            if delta.text:
                stats.chunks += 1
                raw.append(delta.text)
                pieces += 1
                if pieces == _RAW_BLOCK:
                    raw[-_RAW_BLOCK:] = ["".join(raw[-_RAW_BLOCK:])]
                    pieces = 0
                items: list[Any] = feed(delta.text)
                for item in items:
                    if type(item) is BodyClosed:
                        break
                else:  # the usual token: its frames go out as the list the framer made
                    frames = items
                if frames is None:  # a frame's END among them: the slow path
                    start = 0  # items[start:] are frames not yet handed over
                    for index, item in enumerate(items):
                        if type(item) is not BodyClosed:
                            continue
                        if index > start:
                            yield Emit(items[start:index])
                        start = index + 1
                        if item.kind is FrameKind.TOOL_CALL:
                            for trailing in (yield StopModel(self._mode.drains_after_call)):
                                self._account(trailing)
                            self.last_text = "".join(raw)
                            return reader.ended_at(item, self.last_text)
                        yield from self._decide(item)
                    frames = items[start:]
                if framer.error is not None:
                    if frames:  # the violation's error frame is the last of them
                        yield Emit(frames)
                    raise _Reported(framer.error)
                # FRAME_TIMEOUT_MS: a frame that stays open this long is abandoned, so a
                # model that trickles forever cannot hold a tool call hostage.
                open_id = framer.open_frame_id
                if open_id is None:
                    opened_at = None
                elif opened_at is None:
                    opened_at = now
                elif now - opened_at > frame_timeout:
                    if frames:
                        yield Emit(frames)
                    raise ModelBehaviorError(
                        ErrorCode.FRAME_TIMEOUT,
                        f"frame {open_id!r} stayed open longer than "
                        f"{frame_timeout * 1000:.0f} ms (FRAME_TIMEOUT_MS)",
                        frame_id=open_id,
                    )
            if delta.tool_calls:
                reader.tool_call_pieces(delta)
            if delta.reasoning:
                thought = reader.reasoning(delta.reasoning)
                if thought:
                    frames = [*thought, *(frames or ())]
            if delta.finish_reason is not None or delta.usage is not None:
                self._account(delta)
            event = yield (ReadModel(frames) if frames else _READ)
        tail = [item for item in framer.close() if type(item) is not BodyClosed]
        if tail:  # text held back, or the error of a frame left open
            yield Emit(tail)  # type: ignore[arg-type]
        if framer.error is not None:
            raise _Reported(framer.error)
        self.last_text = "".join(raw)
        return reader.finished(self.last_text)

    def _note(self, kind: str) -> None:
        guardrails = self.stats.guardrails
        guardrails[kind] = guardrails.get(kind, 0) + 1

    def _account(self, delta: UpstreamDelta) -> None:
        if delta.finish_reason is not None:
            self.stats.finish = delta.finish_reason
        self._add_usage(delta)

    def _add_usage(self, delta: UpstreamDelta) -> None:
        """Token usage adds up over turns and repair calls."""
        if delta.usage is None:
            return
        counts = dict(delta.usage)
        timings = counts.pop("timings", None)  # per call, not a sum: kept apart
        if isinstance(timings, dict):
            self.stats.upstream_timings.append(timings)
        usage = self.stats.usage
        if usage is None:
            self.stats.usage = counts
            return
        for key, value in counts.items():
            if isinstance(value, int) and isinstance(usage.get(key, 0), int):
                usage[key] = usage.get(key, 0) + value

    # -- the JSON guarantee (docs/protocol.md) -----------------------------------------------------

    def _schema_for(self, closed: BodyClosed) -> CompiledSchema | None:
        config = self.config
        result = config.schemas.get(config.result_schema) if config.result_schema else None
        if closed.kind is FrameKind.RESULT and result is not None:
            return result
        return (
            config.schemas.get(closed.name)
            or config.registered.get(closed.name)
            or config.schemas.get("Any")
        )

    def _decide(self, closed: BodyClosed) -> Generator[Action, Any, None]:
        """The END frame of an OBJECT or RESULT body: valid, repaired, or degraded."""
        schema = self._schema_for(closed)
        outcome: FinalOutcome
        if schema is None:  # no schema registry for this conversation: syntax is all
            if closed.error is not None:
                raise closed.error
            outcome = Valid(closed.value)
        else:
            parsed = closed.error if closed.error is not None else closed.value
            first = yield RepairBody(closed.text, parsed, schema)
            if not isinstance(first, NeedsModelRepair):
                outcome = first
            elif self.config.repair_retries > 0:
                prompt = render_repair_prompt(
                    self.config.repair_template, schema=schema, text=first.text, errors=first.errors
                )
                request = self._mode.repair_request(
                    self.config.request, prompt, schema, len(first.text)
                )
                reply: ModelReply = yield AskModel(request)
                for delta in reply.usage:  # a repair call does not end the stream
                    self._add_usage(delta)
                outcome = after_model_repair(reply.text, schema, first.errors)
            else:
                outcome = give_up(schema, first.errors)
            if isinstance(outcome, Repaired):
                self.stats.repairs += 1
            elif isinstance(outcome, Degraded):
                self.stats.degraded_frames += 1
        diagnostics: Diagnostics | None = None
        if isinstance(outcome, Degraded) and not outcome.in_band:
            # Out of band only where the schema leaves no room for it in the value.
            diagnostics = cast(Diagnostics, outcome.diagnostics)
        end = JsonEnd if closed.kind is FrameKind.OBJECT else ResultEnd
        frame = end(
            id=closed.id,
            length=closed.length,
            value=outcome.value,
            repaired=isinstance(outcome, Repaired),
            degraded=isinstance(outcome, Degraded),
            diagnostics=diagnostics,
        )
        yield Emit((frame,), outcome)

    # -- tools (docs/tools.md) --------------------------------------------------------------------

    def _tool(
        self, closed: BodyClosed, rescued: bool = False
    ) -> Generator[Action, Any, Mapping[str, object]]:
        """Run one tool call, or refuse it; return the envelope that goes back to the model.
        The policy decides first (a workflow's steps and prerequisites): a refused call
        gets its ``tool.result`` error and a ``step.nudge``; nothing restarts."""
        self.stats.tool_calls += 1
        policy = self._policy
        decided = self._decided(
            policy.check_call(closed.name, closed.value, parsed=closed.error is None)
        )
        if decided.name != closed.name:  # the policy's spelling of the tool's name
            closed = dataclasses.replace(closed, name=decided.name)
        match decided:
            case Run():
                envelope = yield from self._checked_tool(closed, rescued)
            case Respond(_, data):  # the built-in answer tool: nothing to run
                envelope = yield from self._respond(closed, data, rescued)
            case Refuse(_, code, nudge, fatal):
                self._note("nudge")
                envelope = yield from self._refuse(closed, code, nudge.message)
                yield Emit((_nudge_frame(nudge, closed.id),))
                if fatal is not None:
                    raise fatal
                return envelope
            case _:
                assert_never(decided)
        policy.record(closed.name, closed.value, envelope)
        self.stats.workflow = policy.summary()
        return envelope

    def _checked_tool(
        self, closed: BodyClosed, rescued: bool = False
    ) -> Generator[Action, Any, Mapping[str, object]]:
        config = self.config
        if closed.error is not None:
            return (
                yield from self._refuse(
                    closed,
                    ErrorCode.INVALID_JSON,
                    f"the arguments are not valid JSON ({closed.error.message}); "
                    "write the call again with strict JSON arguments",
                )
            )
        if self.stats.tool_calls > config.max_tool_calls:
            return (
                yield from self._refuse(
                    closed,
                    ErrorCode.TOOL_CALL_LIMIT,
                    f"this stream allows {config.max_tool_calls} tool calls (max_tool_calls); "
                    "answer now with the information you have",
                )
            )
        awaited = config.awaited_tools.get(closed.name)
        if awaited is not None:
            return (yield from self._client_tool(closed, awaited, rescued))
        if not config.runs_tools:
            return (
                yield from self._refuse(
                    closed, ErrorCode.TOOL_UNAVAILABLE, "this gateway runs no tools"
                )
            )
        needs_approval = closed.name in config.approval_tools
        call = ToolCall(
            id=closed.id,
            name=closed.name,
            args=closed.value,
            needs_approval=True if needs_approval else None,
            rescued=True if rescued else None,
        )
        yield Emit((call,))
        outcome: ToolOutcome = yield RunTool(closed.id, closed.name, closed.value, needs_approval)
        yield Emit((outcome.frame,))
        confirm = config.confirmations.get(closed.name)
        if confirm is not None and outcome.envelope.get("ok") is True:
            return (yield from self._confirm(confirm, outcome.envelope))
        return outcome.envelope

    def _confirm(
        self, name: str, proposed: Mapping[str, object]
    ) -> Generator[Action, Any, Mapping[str, object]]:
        """docs/tools.md: the gateway's own call of the confirming tool ``name`` with the
        proposing call's result ``data``. It is a ``tool.call`` the model did not write,
        with a fresh id, that waits for a person's ``POST …/approvals/{id}``; the model
        never sees the tool, only the outcome, under ``confirmation`` in the proposing
        call's envelope (a denial is a normal outcome, not a tool error)."""
        frame_id = next_turn_ids(self._seen_ids, max_objects=0).call
        self._seen_ids.add(frame_id)
        args = proposed.get("data")
        yield Emit((ToolCall(id=frame_id, name=name, args=args, needs_approval=True),))
        outcome: ToolOutcome = yield RunTool(frame_id, name, args, True, executor="gateway")
        yield Emit((outcome.frame,))
        done = outcome.envelope
        return {
            **proposed,
            "confirmation": {
                "tool": name,
                "call_id": frame_id,
                "confirmed": done.get("ok") is True,
                "data": done.get("data"),
                "errors": done.get("errors", []),
            },
        }

    # -- workflows (docs/workflows.md)
    # -------------------------------------------------------------------

    def _respond(
        self, closed: BodyClosed, data: Mapping[str, object], rescued: bool
    ) -> Generator[Action, Any, Mapping[str, object]]:
        """The built-in ``respond`` tool's call and result, with no run: ``data`` is the
        answer the call carries."""
        yield Emit(
            (
                ToolCall(
                    id=closed.id,
                    name=closed.name,
                    args=closed.value,
                    rescued=True if rescued else None,
                ),
                ToolResult(
                    id=closed.id,
                    name=closed.name,
                    ok=True,
                    result=data,
                    duration_ms=0.0,
                    attempts=1,
                    cached=False,
                    performance_warning=False,
                ),
            )
        )
        return {"ok": True, "data": data, "warnings": [], "errors": []}

    def _rescued_turn(self, found: Sequence[RescuedCall]) -> Turn:
        """The first call rescued from a turn's text, as the engine's call (an id the
        stream has not used); the turn's text is what the model said. One call, as a
        sentinel turn has: the continuation answers it with one result."""
        self._note("rescued")
        calls: list[BodyClosed] = []
        for call in found[:1]:
            frame_id = next_turn_ids(self._seen_ids, max_objects=0).call
            self._seen_ids.add(frame_id)
            text = orjson.dumps(call.arguments).decode()
            calls.append(
                BodyClosed(
                    FrameKind.TOOL_CALL,
                    frame_id,
                    call.name,
                    text,
                    call.arguments,
                    None,
                    len(text.encode("utf-8")),
                )
            )
        return Turn(calls, self.last_text, rescued=frozenset(c.id for c in calls))

    def _terminal_result(self, name: str, data: object) -> tuple[Frame, ...]:
        """The successful terminal tool's result as the stream's RESULT frame."""
        frame_id = next_turn_ids(self._seen_ids, max_objects=0).result
        self._seen_ids.add(frame_id)
        text = orjson.dumps(data).decode()
        length = len(text.encode("utf-8"))
        return (
            ResultBegin(id=frame_id, schema=name),
            ResultDelta(id=frame_id, chunk=text),
            ResultEnd(id=frame_id, length=length, value=data, repaired=False, degraded=False),
        )

    def _client_tool(
        self, closed: BodyClosed, schema: CompiledSchema, rescued: bool
    ) -> Generator[Action, Any, Mapping[str, object]]:
        """A call the client runs: arguments checked, ``tool.call`` (executor "client")
        out, then the stream waits for the result the client posts."""
        if not schema.is_valid(closed.value):
            error = next(iter(schema.validator.iter_errors(closed.value)))
            path = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
            return (
                yield from self._refuse(
                    closed,
                    ErrorCode.TOOL_ARGS_INVALID,
                    f"{path}: {error.message}; call {closed.name} again with arguments "
                    "that match its parameters",
                )
            )
        call = ToolCall(
            id=closed.id,
            name=closed.name,
            args=closed.value,
            executor="client",
            rescued=True if rescued else None,
        )
        yield Emit((call,))
        outcome: ToolOutcome = yield RunTool(
            closed.id, closed.name, closed.value, executor="client"
        )
        yield Emit((outcome.frame,))
        return outcome.envelope

    def _refuse(
        self, closed: BodyClosed, code: ErrorCode, message: str
    ) -> Generator[Action, Any, Mapping[str, object]]:
        refusal = ToolResult(
            id=closed.id,
            name=closed.name,
            ok=False,
            error={"code": code, "message": message},
            duration_ms=0.0,
            attempts=0,
            cached=False,
            performance_warning=False,
        )
        yield Emit((refusal,))
        error = {"code": str(code), "message": message}
        yield RefuseTool(closed.id, closed.name, error)
        return {"ok": False, "data": None, "warnings": [], "errors": [error]}


def _stamped(messages: list[Mapping[str, Any]], known: int, step: int) -> list[Any]:
    """The continuation's new messages (after the first ``known``) stamped with the turn
    that made them: compaction keeps or cuts whole iterations."""
    for index in range(known, len(messages)):
        item = messages[index]
        if type(item) is Message and item.meta.step is None:
            messages[index] = item.with_step(step)
    return messages


def _nudge_frame(nudge: Nudge, call_id: str | None) -> StepNudge:
    return StepNudge(kind=nudge.kind, tier=nudge.tier, message=nudge.message, call_id=call_id)


class _Reported(ModelBehaviorError):
    """A framing violation whose ``error`` frame the framer already emitted."""

    def __init__(self, error: ModelBehaviorError) -> None:
        super().__init__(error.code, error.message, frame_id=error.frame_id)
        self.error = error
