"""The workflow runner's pure parts (SPEC §7, seed 001), without a loop: definitions and
their validation, the step and error trackers, the policy's every budget, and the
narrowed constrained-mode grammar (checked with the GBNF matcher)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.gbnf_matcher import parse
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar, TurnIds
from toolforge.core.protocol import sentinels
from toolforge.core.steps import (
    ErrorTracker,
    StepEnforcer,
    StepTracker,
    WorkflowPolicy,
    words_pattern,
)
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


# -- the policy --------------------------------------------------------------------------------


def test_premature_terminal_calls_escalate_then_exhaust() -> None:
    p = policy()
    refusals = [p.check_call("bookings.create", {"place_id": "x"}) for _ in range(4)]
    assert all(r is not None for r in refusals)
    assert [r.nudge.tier for r in refusals if r] == [1, 2, 3, 3]
    assert [r.code for r in refusals if r] == [ErrorCode.STEP_REQUIRED] * 4
    assert [r.fatal is not None for r in refusals if r] == [False, False, False, True]
    fatal = refusals[3].fatal if refusals[3] else None
    assert fatal is not None and fatal.code is ErrorCode.STEP_ENFORCEMENT_EXHAUSTED
    assert fatal.context["pending_steps"] == ["places.search"]


def test_progress_resets_the_escalation() -> None:
    p = policy()
    p.begin_turn()
    first = p.check_call("bookings.create", {})
    p.check_call("bookings.create", {})
    assert p.check_call("places.search", {"query": "x"}) is None
    p.record("places.search", {"query": "x"}, {"ok": True, "data": {}})
    assert p.end_batch() is None
    assert first is not None and p.steps.premature_attempts == 0


def test_a_terminal_call_with_a_matched_argument_ends_the_workflow() -> None:
    p = policy()
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    assert p.end_batch() is None
    p.begin_turn()
    bad = p.check_call("bookings.create", {"place_id": "7"})
    assert bad is not None and bad.code is ErrorCode.PREREQUISITE_MISSING
    assert "trattoria-roma" in bad.nudge.message and bad.fatal is None
    assert p.check_call("bookings.create", {"place_id": "pizza-place"}) is None
    p.record("bookings.create", {"place_id": "pizza-place"}, OK)
    assert p.end_batch() == ("bookings.create", {"booking_id": "b1"})
    assert p.summary()["completed_steps"] == ["places.search", "bookings.create"]


def test_tool_errors_and_retries_and_iterations_exhaust() -> None:
    p = policy(max_tool_errors=1, max_retries_per_step=1, max_iterations=4)
    for _ in range(2):
        p.begin_turn()
        p.record("places.search", {}, FAILED)
    with pytest.raises(WorkflowError) as caught:
        p.end_batch()
        p.begin_turn()
        p.record("places.search", {}, FAILED)
        p.end_batch()
    assert caught.value.code is ErrorCode.TOOL_ERRORS_EXHAUSTED
    p = policy(max_retries_per_step=1)
    p.begin_turn()
    assert p.no_call("thinking...").kind == "retry"  # type: ignore[union-attr]
    with pytest.raises(WorkflowError) as caught:
        p.no_call("still thinking, sk-abcdefghijklmnopqrstuvwxyz0123456789")
    assert caught.value.code is ErrorCode.RETRIES_EXHAUSTED
    assert "abcdefghijklmnop" not in str(caught.value.context["last_text"])  # redacted
    p = policy(max_iterations=2)
    p.begin_turn()
    p.begin_turn()
    with pytest.raises(WorkflowError) as caught:
        p.begin_turn()
    assert caught.value.code is ErrorCode.MAX_ITERATIONS
    assert caught.value.context["iterations"] == 2


def test_rescue_finds_calls_in_text_unless_switched_off() -> None:
    text = 'Calling Places_Search({"query": "pizza"})'
    found = policy().no_call(text)
    assert isinstance(found, list) and found[0].name == "places.search"
    assert not isinstance(policy(rescue=False).no_call(text), list)


def test_unknown_tools_use_the_retry_budget() -> None:
    p = policy(max_retries_per_step=0)
    refusal = p.check_call("weather.get", {})
    assert refusal is not None and refusal.code is ErrorCode.TOOL_NOT_FOUND
    assert refusal.fatal is not None and refusal.fatal.code is ErrorCode.RETRIES_EXHAUSTED
    assert "places.search, bookings.create" in refusal.nudge.message
    assert policy().canonical("Bookings_Create") == "bookings.create"


# -- narrowing -------------------------------------------------------------------------------


def _grammar() -> FrameGrammar:
    return FrameGrammar(
        tools=SCHEMAS, result=("AssistantReply", {"type": "object"}), max_tokens=256
    )


def _call(name: str, args: str, frame_id: str = "t1") -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)


def test_narrowing_leaves_out_a_tool_until_its_values_exist_then_allows_only_them() -> None:
    p = policy()
    ids = TurnIds("t1", (), "r1")
    hints = p.hints()
    assert hints.narrowed == {"bookings.create": None} and not hints.allow_result
    g = parse(
        _grammar().for_turn(
            ids, narrowed=hints.narrowed, allow_result=False, free_text=hints.free_text
        )
    )
    booking = '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}'
    assert g.accepts(_call("places.search", '{"query": "pizza"}'))
    assert not g.accepts(_call("bookings.create", booking))
    assert not g.accepts("Sure! " + _call("places.search", '{"query": "pizza"}'))
    assert not g.accepts(sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", "{}"))
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    hints = p.hints()
    # Search done, booking callable: only the booking, with a searched id.
    assert hints.narrowed["places.search"] is None
    g = parse(_grammar().for_turn(ids, narrowed=hints.narrowed, allow_result=False))
    assert g.accepts(_call("bookings.create", booking))
    made_up = '{"place_id": "seven", "time": "20:00", "party_size": 2}'
    assert not g.accepts(_call("bookings.create", made_up))
    assert not g.accepts(_call("places.search", '{"query": "pizza"}'))
    # Without narrowing the schema's own slug pattern is all there is.
    wide = policy(narrow=False).hints()
    g = parse(_grammar().for_turn(ids, narrowed=wide.narrowed, allow_result=False))
    assert g.accepts(_call("bookings.create", made_up))


def test_the_plain_grammar_is_unchanged_without_hints() -> None:
    ids = TurnIds("t1", (), "r1")
    assert _grammar().for_turn(ids) == _grammar().for_turn(ids, narrowed={}, allow_result=True)


def test_a_grounded_argument_is_a_few_of_the_users_own_words() -> None:
    p = policy(grounded={"places.search": ["query"]})
    ids = TurnIds("t1", (), "r1")
    user = "Find pizza near me; book a table for 2 at 7pm if open."
    p.prepare([{"role": "system", "content": "rules"}, {"role": "user", "content": user}])
    hints = p.hints()
    assert hints.narrowed["bookings.create"] is None  # nothing searched yet
    query = hints.narrowed["places.search"]["properties"]["query"]
    assert query["maxLength"] == SCHEMAS["places.search"]["properties"]["query"]["maxLength"]
    g = parse(_grammar().for_turn(ids, narrowed=hints.narrowed, allow_result=False))
    for ok in ("pizza", "Find pizza near", "find pizza", "pizza 7pm", "book table 2"):
        assert g.accepts(_call("places.search", f'{{"query": "{ok}"}}')), ok
    for bad in ("SELECT * FROM pizzas", "sushi", "pizza pizza pizza pizza pizza pizza pizza", ""):
        assert not g.accepts(_call("places.search", f'{{"query": "{bad}"}}')), bad
    # Function words say nothing: "at if", "Find pizza near me" are not offered.
    for said_nothing in ("at if", "a", "Find pizza near me", "book a table"):
        assert not g.accepts(_call("places.search", f'{{"query": "{said_nothing}"}}'))
    # The later user turns do not change it; the other arguments keep their schema.
    p.prepare([{"role": "user", "content": "sushi please"}])
    g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
    assert g.accepts(_call("places.search", '{"query": "pizza", "radius_km": 2}'))
    assert not g.accepts(_call("places.search", '{"query": "sushi"}'))
    # narrow: false turns it off; a grounded tool outside the workflow is refused.
    assert policy(grounded={"places.search": ["query"]}, narrow=False).hints().narrowed == {}
    with pytest.raises(RequestError, match="grounded names 'weather'"):
        workflow(grounded={"weather": ["city"]})


def test_user_words_come_from_the_first_user_message_text_parts_too() -> None:
    from toolforge.core.steps import user_words

    parts = [{"type": "text", "text": "Pizza?"}, {"type": "image_url", "image_url": {}}]
    assert user_words([{"role": "user", "content": parts}]) == ["Pizza", "pizza"]
    assert words_pattern(["Pizza", "pizza"]) == "^(Pizza|pizza)( (Pizza|pizza)){0,5}$"
    assert user_words([{"role": "user", "content": "?!"}]) == []
    assert words_pattern([]) is None


@pytest.mark.parametrize(
    ("text", "times", "numbers"),
    [
        ("Find pizza near me; book a table for 2 at 7pm if open.", ("19:00",), (2,)),
        ("table for two at 7:30 p.m. or 21:00", ("19:30", "21:00"), (2,)),
        ("12am, 12 PM, noon and midnight", ("00:00", "12:00"), ()),
        ("6 people at 19:00, 3 kids, 0700", ("19:00",), (6, 3, 700)),
        ("at 13pm or 25:00", (), (25, 0)),  # no such times: the digits are only numbers
        ("ONE table, Eleven guests", (), (1, 11)),
        ("nothing here", (), ()),
    ],
)
def test_user_values_read_times_and_numbers(
    text: str, times: tuple[str, ...], numbers: tuple[int, ...]
) -> None:
    from toolforge.core.steps import user_values

    said = user_values([{"role": "system", "content": "at 9pm"}, {"role": "user", "content": text}])
    assert said.times == times and said.numbers == numbers
    assert said.words[0] == text.split()[0].strip(",")  # the first message's words too


def test_grounded_times_and_numbers_hold_the_booking_to_what_the_user_said() -> None:
    p = policy(grounded={"bookings.create": ["time", "party_size"]})
    ids = TurnIds("t1", (), "r1")
    p.prepare([{"role": "user", "content": "Find pizza near me; book a table for 2 at 7pm."}])
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    booking = p.hints().narrowed["bookings.create"]["properties"]
    assert booking["time"]["enum"] == ["19:00"] and booking["party_size"]["enum"] == [2]
    g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))

    def books(time: str, size: int) -> bool:
        args = f'{{"place_id": "trattoria-roma", "time": "{time}", "party_size": {size}}}'
        return g.accepts(_call("bookings.create", args))

    assert books("19:00", 2)
    assert not books("20:00", 2) and not books("07:00", 2) and not books("19:00", 3)
    # Said nothing usable: the argument keeps the tool's own schema. "7:15pm" is not a
    # slot (the schema's pattern wants :00 or :30), 40 is over party_size's maximum of 20.
    for text in ("book a table at trattoria", "40 of us at 7:15pm"):
        p = policy(grounded={"bookings.create": ["time", "party_size"]})
        p.prepare([{"role": "user", "content": text}])
        p.begin_turn()
        p.record("places.search", {"query": "pizza"}, FOUND)
        p.end_batch()
        props = p.hints().narrowed["bookings.create"]["properties"]
        assert props["time"] == SCHEMAS["bookings.create"]["properties"]["time"]
        assert props["party_size"] == SCHEMAS["bookings.create"]["properties"]["party_size"]


def test_words_that_found_nothing_are_not_offered_again() -> None:
    p = policy(grounded={"places.search": ["query"]})
    ids = TurnIds("t1", (), "r1")
    p.prepare([{"role": "user", "content": "Find pizza near me; book a table for 2 at 7pm."}])

    def accepts(query: str) -> bool:
        g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
        return g.accepts(_call("places.search", f'{{"query": "{query}"}}'))

    assert accepts("2 7pm") and accepts("book table")
    p.begin_turn()
    p.record("places.search", {"query": "2 7pm"}, {"ok": True, "data": {"places": []}})
    p.end_batch()
    assert not accepts("2 7pm") and not accepts("7pm") and not accepts("2")
    assert accepts("book table") and accepts("Find pizza")
    p.begin_turn()
    p.record("places.search", {"query": "book table"}, {"ok": True, "data": {"places": []}})
    p.end_batch()
    assert not accepts("book table") and accepts("pizza near")
    # A search that found something spends nothing (and opens the booking).
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    assert p.hints().narrowed["places.search"] is None  # done: only the booking now
    assert p._spent_words == {"2", "7pm", "book", "table"}


def test_a_matched_value_whose_call_failed_for_good_is_not_offered_again() -> None:
    p = policy()
    ids = TurnIds("t1", (), "r1")
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()

    def offered() -> list[Any] | None:
        schema = p.hints().narrowed["bookings.create"]
        return None if schema is None else schema["properties"]["place_id"]["enum"]

    assert offered() == ["trattoria-roma", "pizza-place"]
    booking = {"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}

    def failed(code: str, retryable: bool = False) -> dict[str, Any]:
        error = {"code": code, "message": "no", "retryable": retryable}
        return {"ok": False, "data": None, "errors": [error]}

    for harmless in (failed("TOOL_ARGS_INVALID"), failed("TOOL_TIMEOUT", retryable=True)):
        p.begin_turn()
        p.record("bookings.create", booking, harmless)
        p.end_batch()
        assert offered() == ["trattoria-roma", "pizza-place"]
    p = policy()
    p.begin_turn()
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    p.begin_turn()
    p.record("bookings.create", booking, failed("BOOKING_FULL"))
    p.end_batch()
    assert offered() == ["pizza-place"]
    g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
    assert not g.accepts(_call("bookings.create", orjson_dumps(booking)))
    p.begin_turn()
    p.record("bookings.create", {**booking, "place_id": "pizza-place"}, failed("TOOL_FAILED"))
    p.end_batch()
    # None left: the booking is not offered, the search is again (another query).
    assert p.hints().narrowed["bookings.create"] is None
    assert "places.search" not in p.hints().narrowed


def orjson_dumps(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


def test_a_search_whose_every_place_failed_spends_its_words() -> None:
    p = policy(grounded={"places.search": ["query"]})
    p.prepare([{"role": "user", "content": "Find pizza near me"}])
    p.begin_turn()
    p.record("places.search", {"query": "near me"}, FOUND)  # found two, both fail below
    p.end_batch()
    closed = {"ok": False, "data": None, "errors": [{"code": "TOOL_FAILED", "retryable": False}]}
    for place in ("trattoria-roma", "pizza-place"):
        assert "near" not in p._spent_words
        p.begin_turn()
        p.record("bookings.create", {"place_id": place, "time": "19:00", "party_size": 2}, closed)
        p.end_batch()
    assert p._spent_words == {"near", "me"}
    query = p.hints().narrowed["places.search"]["properties"]["query"]
    assert query["pattern"] == words_pattern(["Find", "find", "pizza"])
