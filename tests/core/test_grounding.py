"""Grounding (toolforge.core.grounding), pure: arguments narrowed to the values earlier
results hold and to the user's own words, times and numbers, as the workflow policy hands
them to constrained mode's grammar (checked with the GBNF matcher)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.gbnf_matcher import parse
from tests.core.test_steps import FOUND, SCHEMAS, policy, workflow
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar, TurnIds
from toolforge.core.grounding import Grounding, user_values, user_words, words_pattern
from toolforge.core.protocol import sentinels
from toolforge.core.steps import WorkflowPolicy
from toolforge.errors import RequestError


def said(p: WorkflowPolicy, text: str) -> None:
    """The turn that sends ``text`` as the first user message."""
    p.begin_turn([{"role": "system", "content": "rules"}, {"role": "user", "content": text}])


def query_pattern(p: WorkflowPolicy) -> object:
    schema = p.hints().narrowed["places.search"]
    assert schema is not None
    return schema["properties"]["query"].get("pattern")


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
    assert hints.narrowed["bookings.create"] is None and not hints.allow_result
    # The search's optional arguments hold nothing yet: left out, never invented.
    search = hints.narrowed["places.search"]["properties"]
    assert search["radius_km"] is False and search["limit"] is False
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
    p.begin_turn([])
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
    unnarrowed = policy(narrow=False)
    unnarrowed.begin_turn([])
    unnarrowed.record("places.search", {"query": "pizza"}, FOUND)
    unnarrowed.end_batch()
    wide = unnarrowed.hints()
    g = parse(_grammar().for_turn(ids, narrowed=wide.narrowed, allow_result=False))
    assert g.accepts(_call("bookings.create", made_up))


def test_the_plain_grammar_is_unchanged_without_hints() -> None:
    ids = TurnIds("t1", (), "r1")
    assert _grammar().for_turn(ids) == _grammar().for_turn(ids, narrowed={}, allow_result=True)


def test_a_grounded_argument_is_a_few_of_the_users_own_words() -> None:
    p = policy(grounded={"places.search": ["query"]})
    ids = TurnIds("t1", (), "r1")
    user = "Find pizza near me; book a table for 2 at 7pm if open."
    said(p, user)
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
    # The later user turns do not change it; an optional argument nothing provides (the
    # user's "2" is no radius) is left out.
    p.begin_turn([{"role": "user", "content": "sushi please"}])
    g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
    assert g.accepts(_call("places.search", '{"query": "pizza"}'))
    assert not g.accepts(_call("places.search", '{"query": "pizza", "radius_km": 2}'))
    assert not g.accepts(_call("places.search", '{"query": "sushi"}'))
    # narrow: false turns it off (only the legal tools are left); a grounded tool outside
    # the workflow is refused.
    wide = policy(grounded={"places.search": ["query"]}, narrow=False).hints().narrowed
    assert wide == {"bookings.create": None}
    with pytest.raises(RequestError, match="grounded names 'weather'"):
        workflow(grounded={"weather": ["city"]})


def test_user_words_come_from_the_first_user_message_text_parts_too() -> None:
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
        ("at 13pm or 25:00", (), (13,)),  # no such times: "13pm" is a number with a unit
        ("ONE table, Eleven guests", (), (1, 11)),
        ("nothing here", (), ()),
    ],
)
def test_user_values_read_times_and_numbers(
    text: str, times: tuple[str, ...], numbers: tuple[int, ...]
) -> None:
    said = user_values([{"role": "system", "content": "at 9pm"}, {"role": "user", "content": text}])
    assert said.times == times and said.numbers == numbers
    assert said.words[0] == text.split()[0].strip(",")  # the first message's words too


def test_grounded_times_and_numbers_hold_the_booking_to_what_the_user_said() -> None:
    p = policy(grounded={"bookings.create": ["time", "party_size"]})
    ids = TurnIds("t1", (), "r1")
    said(p, "Find pizza near me; book a table for 2 at 7pm.")
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
        said(p, text)
        p.record("places.search", {"query": "pizza"}, FOUND)
        p.end_batch()
        props = p.hints().narrowed["bookings.create"]["properties"]
        assert props["time"] == SCHEMAS["bookings.create"]["properties"]["time"]
        assert props["party_size"] == SCHEMAS["bookings.create"]["properties"]["party_size"]


def test_words_that_found_nothing_are_not_offered_again() -> None:
    p = policy(grounded={"places.search": ["query"]})
    ids = TurnIds("t1", (), "r1")
    said(p, "Find pizza near me; book a table for 2 at 7pm.")

    def accepts(query: str) -> bool:
        g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
        return g.accepts(_call("places.search", f'{{"query": "{query}"}}'))

    assert accepts("2 7pm") and accepts("book table")
    p.record("places.search", {"query": "2 7pm"}, {"ok": True, "data": {"places": []}})
    p.end_batch()
    assert not accepts("2 7pm") and not accepts("7pm") and not accepts("2")
    assert accepts("book table") and accepts("Find pizza")
    p.begin_turn([])
    p.record("places.search", {"query": "book table"}, {"ok": True, "data": {"places": []}})
    p.end_batch()
    assert not accepts("book table") and accepts("pizza near")
    # Spent: "2", "7pm", "book", "table"; "me", "a", "for", "at" are never offered.
    assert query_pattern(p) == words_pattern(["Find", "find", "pizza", "near"])
    # A search that found something spends nothing (and opens the booking).
    p.begin_turn([])
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    assert p.hints().narrowed["places.search"] is None  # done: only the booking now


def test_a_search_that_found_something_spends_nothing() -> None:
    grounding = Grounding(workflow(grounded={"places.search": ["query"]}), SCHEMAS)
    grounding.hear([{"role": "user", "content": "pizza near me"}])
    grounding.succeeded("places.search", {"query": "pizza near"}, FOUND["data"])
    assert grounding.spent_words == set()
    grounding.succeeded("places.search", {"query": "pizza near"}, {"places": []})
    assert grounding.spent_words == {"pizza", "near"}
    narrowed = grounding.narrowed(lambda prereq: [])
    assert narrowed["bookings.create"] is None  # nothing found: no value to book
    # Every word spent ("me" is never offered): the query keeps the tool's own schema.
    query = narrowed["places.search"]["properties"]["query"]
    assert query == SCHEMAS["places.search"]["properties"]["query"]


def test_a_matched_value_whose_call_failed_for_good_is_not_offered_again() -> None:
    p = policy()
    ids = TurnIds("t1", (), "r1")
    p.begin_turn([])
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
        p.begin_turn([])
        p.record("bookings.create", booking, harmless)
        p.end_batch()
        assert offered() == ["trattoria-roma", "pizza-place"]
    p = policy()
    p.begin_turn([])
    p.record("places.search", {"query": "pizza"}, FOUND)
    p.end_batch()
    p.begin_turn([])
    p.record("bookings.create", booking, failed("BOOKING_FULL"))
    p.end_batch()
    assert offered() == ["pizza-place"]
    g = parse(_grammar().for_turn(ids, narrowed=p.hints().narrowed, allow_result=False))
    assert not g.accepts(_call("bookings.create", orjson_dumps(booking)))
    p.begin_turn([])
    p.record("bookings.create", {**booking, "place_id": "pizza-place"}, failed("TOOL_FAILED"))
    p.end_batch()
    # None left: the booking is not offered, the search is again (another query).
    assert p.hints().narrowed["bookings.create"] is None
    assert p.hints().narrowed["places.search"] is not None


def orjson_dumps(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


def test_a_search_whose_every_place_failed_spends_its_words() -> None:
    p = policy(grounded={"places.search": ["query"]})
    said(p, "Find pizza near me")
    p.record("places.search", {"query": "near me"}, FOUND)  # found two, both fail below
    p.end_batch()
    closed = {"ok": False, "data": None, "errors": [{"code": "TOOL_FAILED", "retryable": False}]}
    patterns = []
    for place in ("trattoria-roma", "pizza-place"):
        p.begin_turn([])
        p.record("bookings.create", {"place_id": place, "time": "19:00", "party_size": 2}, closed)
        p.end_batch()
        patterns.append(p.hints().narrowed["places.search"])
    # One place left after the first failure: the search is done, not offered; after the
    # second none is, and the search is offered again without "near" ("me" never was).
    assert patterns[0] is None
    query = patterns[1]["properties"]["query"]
    assert query["pattern"] == words_pattern(["Find", "find", "pizza"])


def test_words_whose_call_failed_for_good_are_not_offered_again() -> None:
    p = policy(grounded={"places.search": ["query"]})
    said(p, "Find pizza near me")
    failed = {"ok": False, "data": None, "errors": [{"code": "TOOL_FAILED", "retryable": False}]}
    p.record("places.search", {"query": "near"}, failed)
    p.end_batch()
    assert query_pattern(p) == words_pattern(["Find", "find", "pizza"])
    # A bad argument or a retryable failure says nothing of the words: nothing spent.
    for harmless in (
        {"ok": False, "errors": [{"code": "TOOL_ARGS_INVALID", "retryable": False}]},
        {"ok": False, "errors": [{"code": "TOOL_TIMEOUT", "retryable": True}]},
    ):
        p.begin_turn([])
        p.record("places.search", {"query": "pizza"}, harmless)
        p.end_batch()
        assert query_pattern(p) == words_pattern(["Find", "find", "pizza"])
