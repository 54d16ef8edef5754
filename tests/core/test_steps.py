"""The workflow runner's pure parts (docs/workflows.md), without a loop: definitions and
their validation, the step and error trackers, and the policy's every decision and
budget, as the values it returns. Narrowing and grounding: tests/core/test_grounding.py."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.core.decisions import (
    ACCEPT,
    CONTINUE,
    OPEN,
    Complete,
    Fail,
    Proceed,
    Refuse,
    Rescue,
    Respond,
    Retry,
    Run,
    WorkflowSummary,
)
from toolforge.core.steps import ErrorTracker, StepEnforcer, StepTracker, WorkflowPolicy
from toolforge.core.workflow import Prerequisite, WorkflowDef, parse_workflow
from toolforge.errors import ErrorCode, RequestError, WorkflowError
from toolforge.tools import default_registry

TOOLS = ["places.search", "bookings.create"]
BOOK: dict[str, Any] = {
    "name": "book",
    "tools": TOOLS,
    "required_steps": ["places.search"],
    "terminal_tools": ["bookings.create"],
    "prerequisites": {
        "bookings.create": [{"tool": "places.search", "match_arg": "place_id", "result_key": "id"}]
    },
}
SCHEMAS = {spec.name: spec.input_schema for spec in default_registry()}
FOUND = {"ok": True, "data": {"places": [{"id": "trattoria-roma"}, {"id": "pizza-place"}]}}
OK = {"ok": True, "data": {"booking_id": "b1"}}
FAILED = {"ok": False, "data": None, "errors": [{"code": "TOOL_FAILED", "message": "no"}]}


def workflow(**changes: Any) -> WorkflowDef:
    return parse_workflow({**BOOK, **changes}, known_tools=TOOLS)


def policy(**changes: Any) -> WorkflowPolicy:
    return WorkflowPolicy(workflow(**changes), schemas=SCHEMAS)


ASK = [{"role": "user", "content": "Find pizza near me; book a table for 2 at 7pm."}]


# -- definitions --------------------------------------------------------------------------------


def test_a_definition_parses_with_its_defaults() -> None:
    wf = workflow()
    assert wf.max_iterations == 10 and wf.max_retries_per_step == 3 and wf.max_tool_errors == 2
    assert wf.compaction == "tiered" and wf.keep_recent == 2 and wf.rescue and wf.narrow
    assert wf.prerequisites["bookings.create"] == (Prerequisite("places.search", "place_id", "id"),)
    assert parse_workflow(_doc(wf), known_tools=TOOLS) == wf


def _doc(wf: WorkflowDef) -> dict[str, Any]:
    doc = wf.to_dict()
    doc.pop("source")
    return doc


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"tools": ["places.search", "nope.tool"]}, "'nope.tool' does not exist"),
        ({"terminal_tools": ["places.search"]}, "also a required step"),
        ({"required_steps": ["respond"]}, "not in 'tools'"),
        ({"prerequisites": {"bookings.create": ["respond"]}}, "not in 'tools'"),
        ({"prerequisites": {"bookings.create": ["bookings.create"]}}, "its own prerequisite"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"terminal_tools": []}, "terminal_tools"),
        ({"surprise": True}, "surprise"),
        ({"tools": ["places.search", "places.search"]}, "twice"),
    ],
)
def test_bad_definitions_say_what_is_wrong(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_workflow({**BOOK, **changes}, known_tools=TOOLS, source="workflows/x.json")
    assert caught.value.code is ErrorCode.WORKFLOW_INVALID
    assert says in caught.value.message and "workflows/x.json" in caught.value.message


def test_a_definition_must_be_an_object() -> None:
    with pytest.raises(RequestError, match="WORKFLOW_INVALID"):
        parse_workflow(["not", "an", "object"], known_tools=TOOLS)


# -- the trackers ----------------------------------------------------------------------------


def test_step_tracker() -> None:
    tracker = StepTracker(["a", "b"])
    assert tracker.pending() == ["a", "b"] and not tracker.is_satisfied()
    assert tracker.summary_hint() == "[No steps completed yet]"
    tracker.record("b")
    tracker.record("b")
    assert tracker.pending() == ["a"]
    tracker.record("a")
    assert tracker.is_satisfied() and tracker.summary_hint() == "[Steps completed: b, a]"


def test_error_tracker_allows_max_in_a_row_and_resets_on_progress() -> None:
    errors = ErrorTracker(max_retries=1, max_tool_errors=2)
    errors.record_retry()
    assert not errors.retries_exhausted
    errors.record_retry()
    assert errors.retries_exhausted
    errors.reset_retries()
    errors.record_result(False)
    errors.record_result(False)
    assert not errors.tool_errors_exhausted
    errors.record_result(True)
    errors.record_result(False)
    errors.record_result(False)
    assert not errors.tool_errors_exhausted
    errors.record_result(False)
    assert errors.tool_errors_exhausted


def test_argument_matched_values_come_from_results_or_arguments() -> None:
    steps = StepEnforcer([], ["c"], {"c": [Prerequisite("a", "x", "id"), Prerequisite("b", "y")]})
    assert steps.unmet("c", {"x": "1", "y": 2}) == Prerequisite("a", "x", "id")
    steps.record("a", {}, {"items": [{"id": "1"}, {"id": "2", "more": {"id": "3"}}]})
    assert steps.values(Prerequisite("a", "x", "id")) == ["1", "2", "3"]
    assert steps.unmet("c", {"x": "9", "y": 2}) == Prerequisite("a", "x", "id")
    assert steps.unmet("c", {"x": "3", "y": 2}) == Prerequisite("b", "y")
    steps.record("b", {"y": 2}, None)
    assert steps.unmet("c", {"x": "3", "y": 2}) is None
    assert steps.unmet("c", {"x": "3", "y": 5}) == Prerequisite("b", "y")


# -- the policy's decisions ----------------------------------------------------------------


def refused(decision: object) -> Refuse:
    assert isinstance(decision, Refuse), decision
    return decision


def failed(decision: object) -> WorkflowError:
    assert isinstance(decision, Fail), decision
    return decision.error


def test_premature_terminal_calls_escalate_then_exhaust() -> None:
    p = policy()
    refusals = [refused(p.check_call("bookings.create", {"place_id": "x"})) for _ in range(4)]
    assert [r.nudge.tier for r in refusals] == [1, 2, 3, 3]
    assert [r.code for r in refusals] == [ErrorCode.STEP_REQUIRED] * 4
    assert [r.fatal is not None for r in refusals] == [False, False, False, True]
    fatal = refusals[3].fatal
    assert fatal is not None and fatal.code is ErrorCode.STEP_ENFORCEMENT_EXHAUSTED
    assert fatal.context["pending_steps"] == ["places.search"]
    assert p.summary().failure is fatal and p.summary().nudges == 4


def test_progress_resets_the_escalation() -> None:
    p = policy()
    p.begin_turn(ASK)
    assert refused(p.check_call("bookings.create", {})).nudge.tier == 1
    assert refused(p.check_call("bookings.create", {})).nudge.tier == 2
    assert p.check_call("places.search", {"query": "x"}) == Run("places.search")
    p.record("places.search", {"query": "x"}, {"ok": True, "data": {}})
    assert p.end_batch() is CONTINUE
    # The search succeeded: a premature call would start at tier 1 again (here the step
    # is done, so the booking is refused for its prerequisite's value, tier 1 too).
    again = refused(p.check_call("bookings.create", {"place_id": "x"}))
    assert again.code is ErrorCode.PREREQUISITE_MISSING and again.nudge.tier == 1


def test_a_terminal_call_with_a_matched_argument_ends_the_workflow() -> None:
    p = policy()
    p.begin_turn(ASK)
    p.record("places.search", {"query": "pizza"}, FOUND)
    assert p.end_batch() is CONTINUE
    p.begin_turn(ASK)
    bad = refused(p.check_call("bookings.create", {"place_id": "7"}))
    assert bad.code is ErrorCode.PREREQUISITE_MISSING and bad.name == "bookings.create"
    assert "trattoria-roma" in bad.nudge.message and bad.fatal is None
    assert p.check_call("bookings.create", {"place_id": "pizza-place"}) == Run("bookings.create")
    assert not p.summary().finished
    p.record("bookings.create", {"place_id": "pizza-place"}, OK)
    assert p.end_batch() == Complete("bookings.create", {"booking_id": "b1"})
    summary = p.summary()
    assert summary.completed_steps == ("places.search", "bookings.create")
    assert summary.finished and summary.result_tool == "bookings.create"
    assert summary.result == {"booking_id": "b1"} and summary.failure is None


def test_tool_errors_and_retries_and_iterations_exhaust() -> None:
    p = policy(max_tool_errors=1, max_retries_per_step=1, max_iterations=4)
    ended = []
    for _ in range(2):
        p.begin_turn(ASK)
        p.record("places.search", {}, FAILED)
        ended.append(p.end_batch())
    assert ended[0] is CONTINUE
    assert failed(ended[1]).code is ErrorCode.TOOL_ERRORS_EXHAUSTED
    assert p.summary().failure is failed(ended[1])
    p = policy(max_retries_per_step=1)
    p.begin_turn(ASK)
    retry = p.no_call("thinking...")
    assert isinstance(retry, Retry) and retry.nudge.kind == "retry"
    error = failed(p.no_call("still thinking, sk-abcdefghijklmnopqrstuvwxyz0123456789"))
    assert error.code is ErrorCode.RETRIES_EXHAUSTED
    assert "abcdefghijklmnop" not in str(error.context["last_text"])  # redacted
    p = policy(max_iterations=2)
    assert isinstance(p.begin_turn(ASK), Proceed) and isinstance(p.begin_turn(ASK), Proceed)
    error = failed(p.begin_turn(ASK))
    assert error.code is ErrorCode.MAX_ITERATIONS
    assert error.context["iterations"] == 2 and p.summary().iterations == 2


def test_rescue_finds_calls_in_text_unless_switched_off() -> None:
    text = 'Calling Places_Search({"query": "pizza"})'
    found = policy().no_call(text)
    assert isinstance(found, Rescue) and [c.name for c in found.calls] == ["places.search"]
    assert isinstance(policy(rescue=False).no_call(text), Retry)


def test_unknown_tools_use_the_retry_budget() -> None:
    p = policy(max_retries_per_step=0)
    refusal = refused(p.check_call("weather.get", {}))
    assert refusal.code is ErrorCode.TOOL_NOT_FOUND and refusal.name == "weather.get"
    assert refusal.fatal is not None and refusal.fatal.code is ErrorCode.RETRIES_EXHAUSTED
    assert "places.search, bookings.create" in refusal.nudge.message


def test_a_call_is_named_as_the_workflow_spells_the_tool() -> None:
    p = policy()
    # Arguments that did not parse: only named (the engine refuses the call), no budget.
    assert p.check_call("Bookings_Create", None, parsed=False) == Run("bookings.create")
    assert p.check_call("weather.get", None, parsed=False) == Run("weather.get")
    assert p.summary().nudges == 0
    early = refused(p.check_call("Bookings_Create", {"place_id": "x"}))
    assert early.name == "bookings.create" and early.code is ErrorCode.STEP_REQUIRED
    assert p.check_call("places_search", {"query": "x"}) == Run("places.search")


def test_respond_is_answered_in_place() -> None:
    p = policy(tools=[*TOOLS, "respond"], required_steps=[], terminal_tools=["respond"])
    said = p.check_call("Respond", {"content": "Which city?"})
    assert said == Respond("respond", {"content": "Which city?"})
    assert p.check_call("respond", {"content": 7}) == Respond("respond", {"content": ""})


def test_the_turn_is_sent_compacted_and_the_summary_keeps_what_was_given() -> None:
    seen: list[tuple[int, str]] = []

    def compactor(messages: list[Any], hint: str) -> list[Any]:
        seen.append((len(messages), hint))
        return messages[-1:]

    p = WorkflowPolicy(workflow(), schemas=SCHEMAS, compactor=compactor)
    history = [{"role": "system", "content": "rules"}, *ASK]
    started = p.begin_turn(history)
    assert isinstance(started, Proceed) and list(started.messages) == ASK
    assert started.hints is not None and started.hints.narrowed["bookings.create"] is None
    assert seen == [(2, "[No steps completed yet]")]
    assert p.summary().messages == tuple(history) and p.step_hint() == seen[0][1]


def test_the_summary_is_a_value_taken_when_asked() -> None:
    p = policy()
    before = p.summary()
    p.begin_turn(ASK)
    p.record("places.search", {"query": "pizza"}, FOUND)
    assert before == WorkflowSummary("book", pending_steps=("places.search",))
    with pytest.raises(AttributeError):
        before.iterations = 9  # type: ignore[misc]
    assert p.summary().to_dict() == {
        "name": "book",
        "completed_steps": ["places.search"],
        "pending_steps": [],
        "iterations": 1,
        "nudges": 0,
        "rescued": 0,
        "finished": False,
    }


def test_the_open_policy_never_objects() -> None:
    messages = [{"role": "user", "content": "hi"}]
    started = OPEN.begin_turn(messages)
    assert started == Proceed(messages) and started.messages is messages
    assert OPEN.no_call("anything") is ACCEPT
    assert OPEN.check_call("Not_A.Tool", None, parsed=False) == Run("Not_A.Tool")
    assert OPEN.check_call("bookings.create", {}) == Run("bookings.create")
    OPEN.record("bookings.create", {}, FAILED)
    assert OPEN.end_batch() is CONTINUE
    assert OPEN.summary() is None and OPEN.step_hint() is None
