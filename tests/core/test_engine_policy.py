"""The engine acts on its policy's decisions, and on nothing else of it: a scripted policy
(any :class:`~toolforge.core.decisions.TurnPolicy`) answers each decision point, and the
engine's actions and frames follow. Then a real workflow policy through the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.core.test_engine import Script, conversation, deltas, drive
from toolforge.core.decisions import (
    ACCEPT,
    CONTINUE,
    AfterBatch,
    AfterText,
    BeforeCall,
    BeforeTurn,
    Complete,
    Fail,
    Messages,
    Nudge,
    Proceed,
    Refuse,
    Rescue,
    Respond,
    Retry,
    Run,
    WorkflowSummary,
)
from toolforge.core.engine import CallModel, Emit, Finish, RefuseTool, RunTool
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.rescue import RescuedCall
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow
from toolforge.errors import ErrorCode, WorkflowError, workflow_error


def tool_call(name: str, args: str = '{"query": "pizza"}', fid: str = "t1") -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, fid, name, args)


class Scripted:
    """A policy that answers from queues (then never objects) and notes what it is asked."""

    def __init__(
        self,
        *,
        turns: list[BeforeTurn] | None = None,
        texts: list[AfterText] | None = None,
        calls: list[BeforeCall] | None = None,
        batches: list[AfterBatch] | None = None,
    ) -> None:
        self.turns, self.texts = turns or [], texts or []
        self.calls, self.batches = calls or [], batches or []
        self.asked: list[str] = []
        self.recorded: list[tuple[str, bool]] = []

    def begin_turn(self, messages: Messages) -> BeforeTurn:
        self.asked.append("begin_turn")
        return self.turns.pop(0) if self.turns else Proceed(messages)

    def no_call(self, text: str) -> AfterText:
        self.asked.append(f"no_call {text}")
        return self.texts.pop(0) if self.texts else ACCEPT

    def check_call(self, name: str, args: object, *, parsed: bool = True) -> BeforeCall:
        self.asked.append(f"check_call {name}")
        return self.calls.pop(0) if self.calls else Run(name)

    def record(self, name: str, args: object, envelope: Mapping[str, object]) -> None:
        self.asked.append(f"record {name}")
        self.recorded.append((name, envelope.get("ok") is True))

    def end_batch(self) -> AfterBatch:
        self.asked.append("end_batch")
        return self.batches.pop(0) if self.batches else CONTINUE

    def step_hint(self) -> str | None:
        return None

    def summary(self) -> WorkflowSummary:
        done = tuple(name for name, ok in self.recorded if ok)
        return WorkflowSummary("scripted", completed_steps=done, nudges=len(self.asked))


def failure(code: ErrorCode) -> WorkflowError:
    return workflow_error(code, f"scripted {code}", context={})


def test_a_refused_call_gets_its_error_and_a_nudge_and_never_runs() -> None:
    nudge = Nudge("step", 1, "search first")
    policy = Scripted(calls=[Refuse("bookings.create", ErrorCode.STEP_REQUIRED, nudge)])
    engine = conversation(workflow=policy)
    run = drive(engine, Script([deltas(tool_call("Bookings_Create", "{}")), deltas("ok")]))
    assert not run.kinds(RunTool)
    (refused,) = run.kinds(RefuseTool)
    assert refused.name == "bookings.create" and refused.error["code"] == "STEP_REQUIRED"
    result, step = [f for f in run.frames if f.event in ("tool.result", "step.nudge")]
    assert result.data["name"] == "bookings.create" and result.data["ok"] is False
    assert step.data == {"kind": "step", "tier": 1, "message": "search first", "call_id": "t1"}
    # A refusal is not recorded; the turn after it is asked for as usual.
    assert policy.asked == [
        "begin_turn",
        "check_call Bookings_Create",
        "end_batch",
        "begin_turn",
        "no_call ok",
    ]
    assert run.finish == Finish("stop") and engine.stats.guardrails == {"nudge": 1}
    assert engine.stats.workflow == policy.summary()


def test_a_fatal_refusal_ends_the_stream_after_its_nudge() -> None:
    fatal = failure(ErrorCode.STEP_ENFORCEMENT_EXHAUSTED)
    policy = Scripted(
        calls=[Refuse("places.search", ErrorCode.STEP_REQUIRED, Nudge("step", 3, "no"), fatal)]
    )
    run = drive(conversation(workflow=policy), Script([deltas(tool_call("places.search"))]))
    assert run.events[-3:] == ["tool.result", "step.nudge", "error"]
    assert run.frames[-1].data["code"] == "STEP_ENFORCEMENT_EXHAUSTED"
    assert run.finish == Finish("error", fatal) and len(run.kinds(CallModel)) == 1


def test_a_failed_turn_start_asks_the_model_nothing() -> None:
    error = failure(ErrorCode.MAX_ITERATIONS)
    run = drive(conversation(workflow=Scripted(turns=[Fail(error)])), Script([]))
    assert not run.kinds(CallModel)
    assert run.events == ["stream.begin", "error"] and run.finish == Finish("error", error)


def test_the_turn_is_requested_as_the_policy_says() -> None:
    sent = [{"role": "user", "content": "compacted"}]
    run = drive(conversation(workflow=Scripted(turns=[Proceed(sent)])), Script([deltas("hi")]))
    (asked,) = run.kinds(CallModel)
    assert asked.request.messages == sent


def test_a_retry_sends_the_text_back_with_the_nudge() -> None:
    policy = Scripted(texts=[Retry(Nudge("retry", 1, "call a tool"))])
    run = drive(conversation(workflow=policy), Script([deltas("hmm"), deltas("fine")]))
    nudges = [f.data for f in run.frames if f.event == "step.nudge"]
    assert nudges == [{"kind": "retry", "tier": 1, "message": "call a tool", "call_id": None}]
    second = run.kinds(CallModel)[1].request.messages
    assert [(m["role"], m["content"]) for m in second[-2:]] == [
        ("assistant", "hmm"),
        ("user", "call a tool"),
    ]
    assert run.finish == Finish("stop")


def test_a_rescued_call_runs_as_the_turns_own() -> None:
    found = RescuedCall("places.search", {"query": "pizza"}, "call_syntax")
    policy = Scripted(texts=[Rescue((found,))])
    text = 'places.search({"query": "pizza"})'
    run = drive(conversation(workflow=policy), Script([deltas(text), deltas("done")]))
    (ran,) = run.kinds(RunTool)
    assert ran.name == "places.search" and ran.args == {"query": "pizza"}
    call = next(f.data for f in run.frames if f.event == "tool.call")
    assert call["rescued"] is True and call["id"] == ran.id
    assert policy.recorded == [("places.search", True)]


def test_the_call_runs_under_the_policys_name() -> None:
    policy = Scripted(calls=[Run("places.search")])
    run = drive(
        conversation(workflow=policy), Script([deltas(tool_call("Places_Search")), deltas("ok")])
    )
    (ran,) = run.kinds(RunTool)
    assert ran.name == "places.search"
    assert [f.data["name"] for f in run.frames if f.event in ("tool.call", "tool.result")] == [
        "places.search",
        "places.search",
    ]


def test_respond_answers_in_place_and_complete_ends_with_the_result() -> None:
    answer = {"content": "Which city?"}
    policy = Scripted(calls=[Respond("respond", answer)], batches=[Complete("respond", answer)])
    run = drive(
        conversation(workflow=policy),
        Script([deltas(tool_call("respond", '{"content": "Which city?"}'))]),
    )
    assert not run.kinds(RunTool) and not run.kinds(RefuseTool)
    result = next(f.data for f in run.frames if f.event == "tool.result")
    assert result["ok"] is True and result["result"] == answer
    assert run.events[-3:] == ["result.begin", "result.delta", "result.end"]
    assert run.frames[-1].data["value"] == answer
    assert run.finish == Finish("stop") and len(run.kinds(CallModel)) == 1


def test_a_cancel_mid_call_leaves_the_summary_of_the_last_decision() -> None:
    policy = Scripted()
    engine = conversation(workflow=policy)
    flow = engine.flow()
    action: Any = next(flow)
    answers = iter([deltas(tool_call("places.search"))[0]])
    while not isinstance(action, RunTool):
        if isinstance(action, CallModel):
            action = flow.send((next(answers), 0.0))
        elif isinstance(action, Emit):
            action = flow.send(None)
        else:
            action = flow.send(())
    flow.close()  # the driver's cancel
    assert policy.asked == ["begin_turn", "check_call places.search"]
    assert engine.stats.workflow == WorkflowSummary("scripted", nudges=2)


# -- a workflow policy through the engine --------------------------------------------------------


def test_a_workflow_refuses_an_early_booking_then_completes_with_it() -> None:
    definition = parse_workflow(
        {
            "name": "book",
            "tools": ["places.search", "bookings.create"],
            "required_steps": ["places.search"],
            "terminal_tools": ["bookings.create"],
        },
        known_tools=["places.search", "bookings.create"],
    )
    engine = conversation(workflow=WorkflowPolicy(definition))
    early = tool_call("bookings.create", '{"place_id": "p"}')
    search = tool_call("places.search", fid="t2")
    booking = tool_call("bookings.create", '{"place_id": "p"}', "t3")
    run = drive(engine, Script([deltas(early), deltas(search), deltas(booking)]))
    assert [a.name for a in run.kinds(RunTool)] == ["places.search", "bookings.create"]
    assert [r.error["code"] for r in run.kinds(RefuseTool)] == ["STEP_REQUIRED"]
    assert run.finish == Finish("stop") and run.frames[-1].data["value"] == {"n": 1}
    summary = engine.stats.workflow
    assert summary is not None and summary.to_dict() == {
        "name": "book",
        "completed_steps": ["places.search", "bookings.create"],
        "pending_steps": [],
        "iterations": 3,
        "nudges": 1,
        "rescued": 0,
        "finished": True,
    }
    assert summary.result_tool == "bookings.create" and summary.result == {"n": 1}


def test_a_plain_stream_has_no_summary() -> None:
    engine = conversation()
    drive(engine, Script([deltas(tool_call("places.search")), deltas("ok")]))
    assert engine.stats.workflow is None and engine.stats.tool_calls == 1
