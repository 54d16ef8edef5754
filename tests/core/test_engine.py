"""The turn engine alone, with no event loop: scripted model results go in, the expected
actions come out, for every mode (sentinel, constrained, native).

``drive`` is the whole driver in twenty lines: it answers each action from a script the
way StreamSession does with real I/O, and records what the engine asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.engine import (
    MODEL_END,
    Action,
    AskModel,
    CallModel,
    ConstrainedMode,
    Conversation,
    ConversationConfig,
    Emit,
    Finish,
    Mode,
    ModelReply,
    NativeMode,
    ReadModel,
    RefuseTool,
    RepairBody,
    RunTool,
    SentinelMode,
    StopModel,
    ToolOutcome,
)
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar
from toolforge.core.guarantee import finish_frame
from toolforge.core.native_tools import ToolCallDelta
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import Frame, ToolResult
from toolforge.core.schemas import AssistantReply, builtin_registry, model_schema
from toolforge.errors import ErrorCode, UpstreamError

REGISTRY = builtin_registry()
SCHEMAS = {"AssistantReply": REGISTRY.get("AssistantReply"), "Any": REGISTRY.get("Any")}
GRAMMAR = FrameGrammar(
    tools={"places.search": {"type": "object", "properties": {"query": {"type": "string"}}}},
    result=("AssistantReply", model_schema(AssistantReply)),
)


def call(fid: str = "t1", args: str = '{"query": "pizza"}') -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, fid, "places.search", args)


def reply(body: str = '{"answer": "ok"}', fid: str = "r1") -> str:
    return sentinels.frame(FrameKind.RESULT, fid, "AssistantReply", body)


# -- the scripted driver ---------------------------------------------------------------------

Generation = Sequence[UpstreamDelta] | BaseException
A = TypeVar("A")


@dataclass
class Script:
    """What the model and the tools answer, in order."""

    turns: list[Generation]
    repairs: list[str | None] = field(default_factory=list)
    tool_ok: bool = True
    clock: Callable[[int], float] = lambda tick: 0.0  # the time of the i-th model event


@dataclass
class Run:
    actions: list[Action] = field(default_factory=list)

    @property
    def frames(self) -> list[Frame]:
        out: list[Frame] = []
        for action in self.actions:
            if isinstance(action, Emit | ReadModel):
                out.extend(action.frames)
        return out

    @property
    def events(self) -> list[str]:
        return [frame.event for frame in self.frames]

    def kinds(self, kind: type[A]) -> list[A]:
        return [a for a in self.actions if isinstance(a, kind)]

    @property
    def finish(self) -> Finish:
        last = self.actions[-1]
        assert isinstance(last, Finish)
        return last

    def text(self, event: str = "text.delta") -> str:
        return "".join(str(f.data["chunk"]) for f in self.frames if f.event == event)


def deltas(*texts: str, finish: str = "stop") -> list[UpstreamDelta]:
    return [*(UpstreamDelta(t) for t in texts), UpstreamDelta("", finish_reason=finish)]


def drive(conversation: Conversation, script: Script) -> Run:
    """Do each action the way the session would, from ``script``; no event loop."""
    run = Run()
    flow = conversation.flow()
    turns, repairs = list(script.turns), list(script.repairs)
    pending: list[UpstreamDelta] = []
    tick = 0
    action = next(flow)
    while True:
        run.actions.append(action)
        result: Any = None
        match action:
            case Finish():
                with pytest.raises(StopIteration):
                    next(flow)
                return run
            case CallModel() | ReadModel():
                if isinstance(action, CallModel):
                    generation = turns.pop(0)
                    if isinstance(generation, BaseException):
                        action = flow.throw(generation)
                        continue
                    pending = list(generation)
                if pending:
                    tick += 1
                    result = (pending.pop(0), script.clock(tick))
                else:
                    result = MODEL_END
            case StopModel():
                result = tuple(d for d in pending if d.usage or d.finish_reason)
                pending = []
            case RepairBody(text=text, parsed=parsed, schema=schema):
                result = finish_frame(text, parsed, schema)
            case AskModel():
                result = ModelReply(repairs.pop(0), (UpstreamDelta("", usage={"x": 1}),))
            case RunTool(id=cid, name=name):
                envelope = {"ok": script.tool_ok, "data": {"n": 1}, "warnings": [], "errors": []}
                frame = ToolResult(
                    id=cid,
                    name=name,
                    ok=script.tool_ok,
                    result=envelope["data"],
                    duration_ms=1.0,
                    attempts=1,
                    cached=False,
                    performance_warning=False,
                )
                result = ToolOutcome(frame, envelope)
        action = flow.send(result)


def conversation(
    mode: Mode | None = None, *, messages: Sequence[Mapping[str, Any]] = (), **config: Any
) -> Conversation:
    request = ChatRequest(model="m", messages=list(messages) or [{"role": "user", "content": "hi"}])
    return Conversation(
        ConversationConfig(
            stream_id="s_1",
            request=request,
            mode=mode or SentinelMode(),
            schemas=SCHEMAS,
            result_schema="AssistantReply",
            registered=REGISTRY.all(),
            repair_template="fix: $text ($errors)",
            **config,
        )
    )


MODES: list[Mode] = [SentinelMode(), ConstrainedMode(GRAMMAR), NativeMode()]
MODE_IDS = ["sentinel", "constrained", "native"]


# -- text ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_plain_text_streams_as_text_deltas_and_finishes(mode: Mode) -> None:
    run = drive(conversation(mode), Script([deltas("Hel", "lo", " world")]))
    assert run.events == ["stream.begin", "text.delta", "text.delta", "text.delta"]
    assert run.frames[0].data == {
        "stream_id": "s_1",
        "model": "m",
        "mode": mode.name,
        "budget_tokens": None,
    }
    assert run.text() == "Hello world"
    assert run.finish == Finish("stop")
    assert [type(a) for a in run.actions[:2]] == [Emit, CallModel]


def test_finish_reason_and_usage_come_from_the_upstream() -> None:
    usage = UpstreamDelta("", finish_reason="length", usage={"completion_tokens": 2})
    engine = conversation()
    run = drive(engine, Script([[UpstreamDelta("a"), UpstreamDelta("b"), usage]]))
    assert run.finish == Finish("length")
    assert engine.stats.usage == {"completion_tokens": 2} and engine.stats.chunks == 2


# -- frames split anywhere ------------------------------------------------------------------


def split(text: str, cuts: Iterable[int]) -> list[str]:
    points = sorted({c for c in cuts if 0 < c < len(text)})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


SAID = 'Sure. {"not": "a frame"} ' + reply('{"answer": "ok \\u27e6 fine"}') + " bye"


def outcome(run: Run) -> tuple[str, str, list[object]]:
    ends = [f.data for f in run.frames if f.event == "result.end"]
    return run.text(), run.text("result.delta"), ends


WHOLE = outcome(drive(conversation(), Script([deltas(SAID)])))


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_frames_split_one_character_at_a_time(mode: Mode) -> None:
    run = drive(conversation(mode), Script([deltas(*SAID)]))
    assert outcome(run) == WHOLE
    assert run.events[1:4] == ["text.delta"] * 3  # text goes out as it comes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(SAID) - 1), max_size=30))
def test_frames_split_anywhere_give_the_same_frames(cuts: list[int]) -> None:
    run = drive(conversation(), Script([deltas(*split(SAID, cuts))]))
    assert outcome(run) == WHOLE
    assert run.events.count("result.begin") == 1 and run.events.count("result.end") == 1


def test_the_result_is_decided_at_its_end() -> None:
    text, body, ends = WHOLE
    assert text == 'Sure. {"not": "a frame"}  bye'
    assert body == '{"answer": "ok \\u27e6 fine"}'
    assert ends == [
        {
            "id": "r1",
            "length": len(body),
            "value": {"answer": "ok \u27e6 fine"},
            "repaired": False,
            "degraded": False,
        }
    ]


# -- a tool call, then the resume -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_a_sentinel_tool_call_pauses_runs_and_resumes(mode: Mode) -> None:
    usage = UpstreamDelta("", finish_reason="stop", usage={"completion_tokens": 9})
    first = [UpstreamDelta("Looking. " + call()[:20]), UpstreamDelta(call()[20:] + "junk"), usage]
    run = drive(conversation(mode), Script([first, deltas(reply())]))
    assert run.events == [
        "stream.begin",
        "text.delta",
        "tool.call",
        "tool.result",
        "result.begin",
        "result.delta",
        "result.end",
    ]
    tool_call = run.frames[2].data
    assert tool_call == {"id": "t1", "name": "places.search", "args": {"query": "pizza"}}
    (stop,) = run.kinds(StopModel)
    assert stop.drain is mode.drains_after_call  # constrained reads the usage that follows
    (tool,) = run.kinds(RunTool)
    assert (tool.id, tool.name, tool.args) == ("t1", "places.search", {"query": "pizza"})
    first_call, second_call = (a.request for a in run.kinds(CallModel))
    # The resumed prompt extends the previous one exactly (the prompt cache applies).
    assert second_call.messages[: len(first_call.messages)] == first_call.messages
    assistant, result = second_call.messages[-2:]
    # The model's text up to the call's END, without what it wrote after it.
    assert assistant == {"role": "assistant", "content": "Looking. " + call()}
    assert result["role"] == "user" and result["content"].startswith("Result of tool call t1")
    assert run.finish == Finish("stop")


def test_constrained_turns_carry_the_grammar_of_their_ids_and_of_the_tools_left() -> None:
    script = Script([deltas(call("t1")), deltas(call("t2")), deltas(reply())])
    run = drive(conversation(ConstrainedMode(GRAMMAR), max_tool_calls=2), script)
    grammars = [a.request.extra["grammar"] for a in run.kinds(CallModel)]
    assert ["id=t1 " in g for g in grammars] == [True, False, False]
    assert ["id=t2 " in g for g in grammars] == [False, True, False]
    assert "BEGIN_TOOL_CALL" not in grammars[2]  # both calls spent: only the result is left


def test_native_tool_calls_are_assembled_run_in_order_and_answered_as_tool_messages() -> None:
    pieces = [
        UpstreamDelta("", tool_calls=(ToolCallDelta(0, "c1", "places__search", '{"que'),)),
        UpstreamDelta("", tool_calls=(ToolCallDelta(0, None, None, 'ry": "a"}'),)),
        UpstreamDelta("", tool_calls=(ToolCallDelta(1, None, "places__search", "{}"),)),
        UpstreamDelta("", finish_reason="tool_calls"),
    ]
    run = drive(conversation(NativeMode()), Script([pieces, deltas("done")]))
    runs = run.kinds(RunTool)
    assert [(a.id, a.args) for a in runs] == [("c1", {"query": "a"}), ("call_1_1", {})]
    assert run.events == ["stream.begin", *["tool.call", "tool.result"] * 2, "text.delta"]
    messages = run.kinds(CallModel)[1].request.messages
    assistant, *tools = messages[-3:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "call_1_1"]
    assert [(m["role"], m["tool_call_id"]) for m in tools] == [("tool", "c1"), ("tool", "call_1_1")]


def test_a_call_needing_approval_says_so() -> None:
    run = drive(
        conversation(approval_tools=frozenset({"places.search"})),
        Script([deltas(call()), deltas("ok")]),
    )
    (tool,) = run.kinds(RunTool)
    assert tool.needs_approval and run.frames[1].data["needs_approval"] is True


# -- the JSON guarantee ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_body_that_fails_its_schema_is_repaired_by_one_model_call(mode: Mode) -> None:
    engine = conversation(mode)
    run = drive(engine, Script([deltas(reply('{"answer": 5}'))], repairs=['{"answer": "five"}']))
    (ask,) = run.kinds(AskModel)
    assert ask.request.temperature == 0.0
    assert ask.request.messages[0]["content"].startswith("fix: ")
    assert ("grammar" in ask.request.extra) is (mode.name == "constrained")
    end = run.frames[-1]
    assert end.event == "result.end" and end.data["value"] == {"answer": "five"}
    assert end.data["repaired"] is True and end.data["degraded"] is False
    assert engine.stats.repairs == 1 and engine.stats.usage == {"x": 1}  # the repair's usage


def test_a_syntax_slip_is_repaired_locally_without_the_model() -> None:
    run = drive(conversation(), Script([deltas(reply('{"answer": "ok",}'))]))
    assert not run.kinds(AskModel)
    assert run.frames[-1].data["value"] == {"answer": "ok"}
    assert run.frames[-1].data["repaired"] is True


@pytest.mark.parametrize(("retries", "asks"), [(1, 1), (0, 0)])
def test_a_body_nobody_can_repair_degrades_and_the_stream_goes_on(retries: int, asks: int) -> None:
    engine = conversation(repair_retries=retries)
    script = Script([deltas(reply('{"answer": 5}') + " after")], repairs=[None])
    run = drive(engine, script)
    assert len(run.kinds(AskModel)) == asks
    end = next(f for f in run.frames if f.event == "result.end")
    assert end.data["degraded"] is True and end.data["repaired"] is False
    assert end.data["value"]["diagnostics"]["error"] == "schema_repair_failed"
    emit = next(a for a in run.kinds(Emit) if end in a.frames)
    assert emit.outcome is not None
    assert run.text() == " after" and run.finish == Finish("stop")
    assert engine.stats.degraded_frames == 1


# -- limits and refusals -------------------------------------------------------------------------


def test_calls_over_max_tool_calls_are_refused_and_the_model_told_to_answer() -> None:
    script = Script([deltas(call("t1")), deltas(call("t2")), deltas(reply())])
    engine = conversation(max_tool_calls=1)
    run = drive(engine, script)
    assert len(run.kinds(RunTool)) == 1
    (refused,) = run.kinds(RefuseTool)
    assert refused.id == "t2" and refused.error["code"] == ErrorCode.TOOL_CALL_LIMIT
    results = [f.data for f in run.frames if f.event == "tool.result"]
    assert results[1]["ok"] is False and results[1]["attempts"] == 0
    resumed = run.kinds(CallModel)[2].request.messages[-1]["content"]
    assert "max_tool_calls" in resumed and engine.stats.tool_calls == 2


def test_arguments_that_are_not_json_are_refused_not_run() -> None:
    run = drive(conversation(), Script([deltas(call(args='{"query": pizza}')), deltas("ok")]))
    assert not run.kinds(RunTool)
    (refused,) = run.kinds(RefuseTool)
    assert refused.error["code"] == ErrorCode.INVALID_JSON
    assert "tool.call" not in run.events  # announced only after END and strict parsing


def test_a_gateway_without_tools_refuses_every_call() -> None:
    run = drive(conversation(runs_tools=False), Script([deltas(call()), deltas("ok")]))
    (refused,) = run.kinds(RefuseTool)
    assert refused.error["code"] == ErrorCode.TOOL_UNAVAILABLE


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_an_upstream_error_becomes_an_error_frame_and_finish(mode: Mode) -> None:
    error = UpstreamError(ErrorCode.UPSTREAM_UNAVAILABLE, "connection refused")
    run = drive(conversation(mode), Script([deltas(call()), error]))
    assert run.events[-1] == "error"
    assert run.frames[-1].data == error.to_dict()
    assert run.finish == Finish("error", error)


def test_an_upstream_error_mid_generation_is_the_same() -> None:
    error = UpstreamError(ErrorCode.UPSTREAM_PROTOCOL, "bad chunk")
    engine = conversation()
    flow = engine.flow()
    assert isinstance(next(flow), Emit)
    assert isinstance(flow.send(None), CallModel)
    assert isinstance(flow.send((UpstreamDelta("hi"), 0.0)), ReadModel)
    emit = flow.throw(error)
    assert isinstance(emit, Emit) and emit.frames[0].event == "error"
    assert flow.send(None) == Finish("error", error)


def test_a_framing_violation_ends_the_stream_with_one_error_frame() -> None:
    tool = FrameKind.TOOL_CALL
    bad = (
        "hi "
        + sentinels.begin(tool, "t1", "places.search")
        + "{}"
        + sentinels.end(FrameKind.RESULT, "t1")
    )
    run = drive(conversation(), Script([deltas(bad, "more")]))
    assert run.events.count("error") == 1 and run.events[-1] == "error"
    assert run.finish.reason == "error" and run.finish.error is not None
    assert run.frames[-1].data["code"] == run.finish.error.code


def test_a_frame_left_open_too_long_times_out_with_the_clock_it_is_given() -> None:
    trickle = [sentinels.begin(FrameKind.RESULT, "r1", "AssistantReply"), '{"an', 'swer"', ": 1"]
    run = drive(
        conversation(frame_timeout_s=1.0),
        Script([deltas(*trickle)], clock=lambda tick: tick * 0.6),
    )
    assert run.finish.reason == "error"
    assert run.frames[-1].data["code"] == ErrorCode.FRAME_TIMEOUT


def test_a_cancel_is_the_drivers_closing_the_flow() -> None:
    flow = conversation().flow()
    next(flow)
    assert isinstance(flow.send(None), CallModel)
    flow.close()  # what StreamSession does on cancel: no Finish, no frames
    with pytest.raises(StopIteration):
        next(flow)
