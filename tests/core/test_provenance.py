"""Argument provenance (toolforge.core.provenance), pure: what the user's message states,
read by type and format in English, German and French alike; each argument held to its
declared sources or the defaults; optional arguments nothing provides left out."""

from __future__ import annotations

import re
from typing import Any

import pytest

from toolforge.core.provenance import (
    Anything,
    Calls,
    Held,
    Results,
    User,
    blamed,
    date_form,
    described_values,
    named_values,
    narrow_properties,
    parse_sources,
    said_in,
)
from toolforge.core.workflow import parse_workflow
from toolforge.errors import RequestError

BOOKING: dict[str, Any] = {
    "type": "object",
    "properties": {
        "place_id": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):(00|30)$"},
        "party_size": {"type": "integer", "minimum": 1, "maximum": 20},
        "contact": {"anyOf": [{"type": "string", "minLength": 3}, {"type": "null"}]},
        "note": {"type": "string"},
    },
    "required": ["place_id", "date", "time", "party_size"],
    "additionalProperties": False,
}
USER = (User(),)
DECLARED = {"date": USER, "time": USER, "party_size": USER}
SEARCHED = (("search", {"query": "thai"}, {"places": [{"place_id": "p-17", "name": "Thai"}]}),)


@pytest.mark.parametrize(
    ("text", "numbers", "times", "dates"),
    [
        ("Book a table for two at 7:30pm on 3 December 2026", (2,), ("19:30",), ("2026-12-03",)),
        ("Table for 2 at 19:30 on 2026-12-03", (2,), ("19:30",), ("2026-12-03",)),
        (
            "Reserviere einen Tisch für zwei Personen um 19:30 Uhr am 3. Dezember 2026",
            (2,),
            ("19:30",),
            ("2026-12-03",),
        ),
        ("Tisch für 2 am 3.12.2026 um 19.30 Uhr", (2,), ("19:30",), ("2026-12-03",)),
        (
            "Réserve une table pour deux personnes à 19h30 le 3 décembre 2026",
            (2,),
            ("19:30",),
            ("2026-12-03",),
        ),
        ("une table pour 2 à 19h30, le 03/12/2026", (2,), ("19:30",), ("2026-12-03",)),
        ("at noon, midi, Mittag", (), ("12:00",), ()),
        ("6 people at 19:00, 3 kids, 0700", (6, 3, 700), ("19:00",), ()),
        ("2,5 km und 3.5 miles, ticket T-1001", (2.5, 3.5), (), ()),
        # Grouped thousands read both ways, a percent as itself and as a rate.
        ("$10,000 at 5% for 10 years", (10000, 10, 5, 0.05), (), ()),
        ("10.000 Euro, 1e-3, 1\u202f000\u202f000", (10000, 10, 0.001, 1000000), (), ()),
        ("at 13pm or 25:00 on 2026-02-30", (13,), (), ()),  # no such time or date: 13 a number
        # year first with slashes, a month's abbreviation with a dot, no space before the year
        (
            "on 2022/08/16, Jun.20,2023 and March.11, 2022",
            (),
            (),
            ("2022-08-16", "2023-06-20", "2022-03-11"),
        ),
    ],
)
def test_what_the_user_said_is_read_the_same_in_every_language(
    text: str, numbers: tuple[Any, ...], times: tuple[str, ...], dates: tuple[str, ...]
) -> None:
    said = said_in(text)
    assert (said.numbers, said.times, said.dates) == (numbers, times, dates)


def test_tokens_with_digits_are_identifiers_and_articles_are_not_numbers() -> None:
    said = said_in("Handle ticket T-1001 and order ORD_77; einen Tisch, une table")
    assert said.tokens == ("T-1001", "ORD_77")
    assert said.numbers == ()


@pytest.mark.parametrize(
    "text",
    [
        "Book a table for two at 7:30pm on 3 December 2026, please.",
        "Bitte reserviere einen Tisch für zwei Personen um 19:30 Uhr am 3. Dezember 2026.",
        "Réserve une table pour deux personnes à 19h30 le 3 décembre 2026, s'il te plaît.",
    ],
)
def test_a_german_or_french_user_gets_the_values_an_english_one_gets(text: str) -> None:
    held = Held(said_in(text), calls=SEARCHED)
    narrowed = narrow_properties("book", BOOKING, DECLARED, held, defaults=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["date"] == {"enum": ["2026-12-03"]}
    assert props["time"] == {"enum": ["19:30"]}
    assert props["party_size"] == {"enum": [2]}
    # Optional arguments nothing provides are left out, never invented.
    assert props["contact"] is False and props["note"] is False
    # The identifier is one a search returned (a default), not the "two" of the party.
    assert props["place_id"] == {"enum": ["p-17"]}


def test_an_identifier_nobody_named_keeps_a_workflows_tool_out_of_the_turn() -> None:
    # A workflow's required identifier that neither the user nor a result holds yet: the
    # call that finds it comes first. A plain request (no workflow) keeps its schema.
    held = Held(said_in("Book a table for two at 7:30pm on 3 December 2026"))
    assert narrow_properties("book", BOOKING, DECLARED, held, defaults=True) is None
    plain = narrow_properties("book", BOOKING, DECLARED, held, defaults=True, plain=True)
    assert plain is not None
    assert plain["properties"]["place_id"] == BOOKING["properties"]["place_id"]


def test_a_value_the_schema_would_refuse_is_never_offered() -> None:
    # 7:15pm is no slot (the pattern wants :00 or :30), 40 is over the maximum: the user
    # said nothing usable, so each keeps its schema rather than block the call.
    said = said_in("40 of us at 7:15pm on 2026-12-03")
    held = Held(said, calls=SEARCHED)
    narrowed = narrow_properties("book", BOOKING, DECLARED, held, defaults=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["time"] == BOOKING["properties"]["time"]
    assert props["party_size"] == BOOKING["properties"]["party_size"]
    assert props["date"] == {"enum": ["2026-12-03"]}


def test_defaults_take_identifiers_and_numbers_from_earlier_results() -> None:
    report = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "condition": {"type": "string"},
            "temp_c": {"type": "integer"},
            "ticket_id": {"type": "string"},
            "units": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city", "condition", "temp_c", "ticket_id"],
    }
    held = Held(
        said=said_in("What is the weather in Madrid? Then close ticket T-9."),
        calls=(
            ("get_weather", {"city": "Madrid"}, {"condition": "sunny", "temp_c": 24}),
            ("read_ticket", {"ticket_id": "T-9"}, {"id": "T-9", "text": "hot"}),
        ),
    )
    narrowed = narrow_properties("report", report, {}, held, defaults=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["temp_c"] == {"enum": [24]}  # the result's, not a number made up
    assert props["ticket_id"] == {"enum": ["T-9"]}
    assert props["city"] == report["properties"]["city"]  # a plain string stays free
    assert props["units"] == report["properties"]["units"]  # an enum is the schema's
    # Switched off (narrow: false / no defaults), nothing changes.
    assert narrow_properties("report", report, {}, held, defaults=False) is report


def test_declared_sources_results_calls_and_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "place_id": {"type": "string"},
            "query": {"type": "string"},
            "free": {"type": "string"},
        },
        "required": ["place_id", "query", "free"],
    }
    declared = {
        "place_id": (Results("places.search", "id"),),
        "query": (Calls("places.search", "query"), User()),
        "free": (Anything(),),
    }
    said = said_in("pizza near the station")
    # Nothing searched yet: the place id has no value, so the tool cannot be called.
    assert narrow_properties("book", schema, declared, Held(said), defaults=True) is None
    calls = (("places.search", {"query": "pizza"}, {"places": [{"id": "p1"}, {"id": "p2"}]}),)
    narrowed = narrow_properties("book", schema, declared, Held(said, calls), defaults=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["place_id"] == {"enum": ["p1", "p2"]}
    assert props["query"]["anyOf"][0] == {"enum": ["pizza"]}
    assert "station" in props["query"]["anyOf"][1]["pattern"]
    assert "the" not in props["query"]["anyOf"][1]["pattern"].split("|")  # a function word
    assert props["free"] == {"type": "string"}


def test_plain_requests_hold_required_numbers_to_the_users_and_leave_optional_ones_out() -> None:
    area = {
        "type": "object",
        "properties": {
            "base": {"type": "integer"},
            "height": {"type": "number"},
            "unit": {"type": "string"},
            "precision": {"type": "integer"},
        },
        "required": ["base", "height"],
    }
    held = Held(said_in("Area of a triangle with base 10 and height 5.5, in meters"))
    narrowed = narrow_properties("area", area, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["base"] == {"enum": [10]}  # 5.5 is no integer
    assert props["height"] == {"enum": [10, 5.5]}
    # An optional plain string is the user's too (their words), or left out.
    unit = re.compile(props["unit"]["pattern"])
    assert unit.match("meters") and not unit.match("cm")
    assert props["precision"] is False  # the user's numbers are the required ones
    # One more number than the required ones take: an optional number may take it.
    more = Held(said_in("base 10, height 5, precision 3"))
    narrowed = narrow_properties("area", area, {}, more, defaults=True, plain=True)
    assert narrowed is not None and narrowed["properties"]["precision"] == {"enum": [10, 5, 3]}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("users", "unknown source 'users'"),
        ([], "empty list"),
        ({"results": 3}, "a tool name"),
        ({"from": "x"}, "a source is"),
    ],
)
def test_a_bad_declaration_names_its_problem(doc: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_sources(doc, where="provenance.t.a")


def test_a_workflow_declares_provenance_and_its_sources_must_be_its_tools() -> None:
    base = {
        "name": "book",
        "tools": ["places.search", "bookings.create"],
        "required_steps": ["places.search"],
        "terminal_tools": ["bookings.create"],
        "grounded": {"places.search": ["query"]},
    }
    tools = ["places.search", "bookings.create"]
    wf = parse_workflow(
        {
            **base,
            "provenance": {
                "bookings.create": {"place_id": {"results": "places.search", "key": "id"}}
            },
        },
        known_tools=tools,
    )
    assert wf.provenance["bookings.create"]["place_id"] == (Results("places.search", "id"),)
    assert wf.provenance["places.search"]["query"] == (User(),)  # grounded is "user"
    again = {k: v for k, v in wf.to_dict().items() if k != "source"}
    assert parse_workflow(again, known_tools=tools) == wf
    with pytest.raises(RequestError, match=r"takes values from 'weather\.get'"):
        parse_workflow(
            {**base, "provenance": {"bookings.create": {"x": {"results": "weather.get"}}}},
            known_tools=tools,
        )
    with pytest.raises(RequestError, match="unknown source"):
        parse_workflow(
            {**base, "provenance": {"bookings.create": {"x": "nobody"}}}, known_tools=tools
        )


# -- identifiers, forms, and what a failed call's message says ---------------------------------


def test_an_identifier_named_code_or_ref_takes_the_ones_written_inside_results() -> None:
    # The error code of a log line is inside a string: the identifiers there are offered,
    # and the description's example ("e.g. E-1234") keeps the ones of its form.
    tool = {
        "type": "object",
        "properties": {
            "error_code": {"type": "string", "description": "the code, e.g. E-1234"},
            "other_code": {"type": "string"},
        },
        "required": ["error_code", "other_code"],
    }
    log = "07:11 INFO worker-1 ok\n07:12 INFO worker-2 ok\n07:17 ERROR payment E-4417 timeout"
    held = Held(said_in("Record the error"), calls=(("fetch_log", {}, {"log": log}),))
    props = narrow_properties("record", tool, {}, held, defaults=True)["properties"]  # type: ignore[index]
    assert props["error_code"] == {"enum": ["E-4417"]}
    assert props["other_code"] == {"enum": ["worker-1", "worker-2", "E-4417"]}


def test_a_number_the_user_gave_for_an_identifier_may_take_its_prefix() -> None:
    tool = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    }
    held = Held(said_in("Refund order 7781 for 2 people"))
    prop = narrow_properties("get_order", tool, {}, held, defaults=True)["properties"]["order_id"]  # type: ignore[index]
    # "7781" as written, or with a prefix nothing has shown yet; never the party's "2".
    assert prop["anyOf"][0] == {"enum": ["7781"]}
    pattern = prop["anyOf"][1]["pattern"]
    assert re.fullmatch(pattern, "ORD-7781") and not re.fullmatch(pattern, "ORD-2")
    # The tool refused "7781" and showed its form: the retry is held to that form.
    failed = Held(
        said_in("Refund order 7781"),
        failures={"get_order": ({"order_id": "7781"}, "bad order id '7781': like ORD-1234")},
        failed={("get_order", "order_id"): frozenset({"7781"})},
    )
    retry = narrow_properties("get_order", tool, {}, failed, defaults=True)
    assert retry["properties"]["order_id"] == {"enum": ["ORD-7781"]}  # type: ignore[index]


def test_an_identifier_a_tool_refused_is_not_offered_to_that_argument_elsewhere() -> None:
    # The look-up refused the user's "7781" and then found "ORD-7781": the refund's order
    # id is the one that worked, never the refused one (on any tool, by the argument's name).
    refund = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["order_id", "amount"],
    }
    found = {"order_id": "ORD-7781", "total": 59.9}
    held = Held(
        said_in("Refund order 7781 in full"),
        calls=(("get_order", {"order_id": "ORD-7781"}, found),),
        failed={("get_order", "order_id"): frozenset({"7781"})},
    )
    props = narrow_properties("refund_order", refund, {}, held, defaults=True)["properties"]  # type: ignore[index]
    assert props["order_id"] == {"enum": ["ORD-7781"]}
    # Not refused: the user's number stays offered beside the found one.
    plain = Held(said_in("Refund order 7781 in full"), calls=held.calls)
    props = narrow_properties("refund_order", refund, {}, plain, defaults=True)["properties"]  # type: ignore[index]
    assert "7781" in props["order_id"]["anyOf"][0]["enum"]


@pytest.mark.parametrize(
    ("message", "args", "blamed_args"),
    [
        (
            "category must be one of billing, bug, account",
            {"id": "T-1", "category": "x"},
            {"category"},
        ),
        ("no log for 'fetch'; known: checkout", {"service": "fetch"}, {"service"}),
        ("bad order id '77': ids look like ORD-1", {"order_id": "77"}, {"order_id"}),
        ("the upstream timed out", {"service": "fetch"}, set()),
    ],
)
def test_a_failed_calls_message_blames_the_arguments_it_names_or_quotes(
    message: str, args: dict[str, Any], blamed_args: set[str]
) -> None:
    assert blamed(args, message) == blamed_args


@pytest.mark.parametrize("refused", ["Billing", "BILLING", "billing "])
def test_a_refused_value_the_tools_list_holds_in_another_case_is_retried_as_listed(
    refused: str,
) -> None:
    # "Billing" refused with "must be one of billing, bug, ...": the model meant the
    # listed "billing", and its retry is held to it (not the list, where it took "bug").
    tool = {
        "type": "object",
        "properties": {"ticket_id": {"type": "string"}, "category": {"type": "string"}},
        "required": ["ticket_id", "category"],
    }
    args = {"ticket_id": "T-1001", "category": refused}
    message = "category must be one of billing, bug, feature_request, account"
    held = Held(said_in("Handle ticket T-1001"), failures={"classify": (args, message)})
    props = narrow_properties("classify", tool, {}, held, defaults=True)["properties"]  # type: ignore[index]
    assert props["category"] == {"enum": ["billing"]}


def test_the_retry_of_a_plain_string_takes_what_the_tools_message_offers() -> None:
    tool = {
        "type": "object",
        "properties": {"ticket_id": {"type": "string"}, "category": {"type": "string"}},
        "required": ["ticket_id", "category"],
    }
    args = {"ticket_id": "T-1001", "category": "TicketType1"}
    message = "category must be one of billing, bug, feature_request, account"
    held = Held(said_in("Handle ticket T-1001"), failures={"classify": (args, message)})
    props = narrow_properties("classify", tool, {}, held, defaults=True)["properties"]  # type: ignore[index]
    # The list the message names, in order; the identifier the message is not about keeps
    # its own narrowing.
    assert props["category"] == {"enum": ["billing", "bug", "feature_request", "account"]}
    assert props["ticket_id"] == {"enum": ["T-1001"]}
    # With the user as a source, the message's words the user also wrote come first.
    said = said_in("The checkout service is failing. Fetch its log.")
    service = {"type": "object", "properties": {"service": {"type": "string"}}}
    held = Held(
        said,
        spent=frozenset({"fetch"}),
        failures={"fetch_log": ({"service": "fetch"}, "no log for 'fetch'; known: checkout")},
    )
    props = narrow_properties("fetch_log", service, {"service": (User(),)}, held, defaults=False)[
        "properties"
    ]  # type: ignore[index]
    # Not "log": a word of the tool's own name (fetch_log) is no value for its argument.
    assert props["service"] == {"enum": ["checkout"]}


def test_a_description_that_shows_a_form_keeps_the_users_words_of_that_form() -> None:
    tool = {
        "type": "object",
        "properties": {"origin": {"type": "string", "description": "IATA code, e.g. CDG"}},
    }
    held = Held(said_in("Book the cheapest flight from CDG to JFK on 2026-12-03"))
    props = narrow_properties("search", tool, {"origin": (User(),)}, held, defaults=False)[
        "properties"
    ]  # type: ignore[index]
    # The codes the user gave, whole (never a part of one).
    assert props["origin"] == {"enum": ["CDG", "JFK"]}
    # A name of another form ("Ana Lima" is no IATA code) is not offered either.
    held = Held(said_in("Book the cheapest flight from CDG to JFK for Ana Lima."))
    props = narrow_properties("search", tool, {"origin": (User(),)}, held, defaults=False)[
        "properties"
    ]  # type: ignore[index]
    assert props["origin"] == {"enum": ["CDG", "JFK"]}


def test_a_code_the_user_gave_is_offered_whole_and_its_parts_never() -> None:
    tool = {"type": "object", "properties": {"incident": {"type": "string"}}}
    held = Held(said_in("Triage incident INC-88: find the owning team."))
    props = narrow_properties("get", tool, {"incident": (User(),)}, held, defaults=False)[
        "properties"
    ]  # type: ignore[index]
    assert props["incident"] == {"enum": ["INC-88"]}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("File a compliance report on Acme Robotics with its current status.", ("Acme Robotics",)),
        ("Triage incident INC-88: find the team. Page them if it is high.", ("INC-88",)),
        ("Jon Smith says his last order arrived damaged.", ("Jon Smith",)),
        ("Book a flight from CDG to JFK for Ana Lima.", ("CDG", "JFK", "Ana Lima")),
        ("Réserve une table pour deux chez Paul Bocuse.", ("Paul Bocuse",)),
        # A sentence's first word is no name; German capitalises its nouns: no names.
        ("Find pizza near me; book a table at 7pm if open.", ()),
        ("Bitte reserviere einen Tisch für zwei Personen um 19:30 Uhr.", ()),
    ],
)
def test_names_are_runs_of_capitals_where_capitals_mark_names(
    text: str, names: tuple[str, ...]
) -> None:
    assert said_in(text).names == names


def test_a_users_string_takes_the_names_they_gave_before_their_other_words() -> None:
    tool = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    held = Held(said_in("File a compliance report on Acme Robotics with its current status."))
    prop = narrow_properties("find", tool, {"name": (User(),)}, held, defaults=False)["properties"][
        "name"
    ]  # type: ignore[index]
    assert prop["anyOf"][0] == {"enum": ["Acme Robotics"]}
    assert prop["anyOf"][1]["pattern"].startswith("^(Acme|acme|Robotics|robotics)(")
    # Once those words are spent (the search found nothing), the other words come back,
    # and the name is no longer offered whole.
    spent = Held(held.said, spent=frozenset({"acme", "robotics"}))
    prop = narrow_properties("find", tool, {"name": (User(),)}, spent, defaults=False)[
        "properties"
    ]["name"]  # type: ignore[index]
    assert "anyOf" not in prop
    assert "compliance" in prop["pattern"]
    assert "Acme" not in prop["pattern"]


def test_a_message_that_names_none_of_the_users_words_leaves_the_users_words() -> None:
    # "no entity named 'File'": the user is the source, and the message's words are not
    # the user's; the retry keeps the user's words, less the ones that failed.
    tool = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    held = Held(
        said_in("File a report on Acme Robotics"),
        spent=frozenset({"file"}),
        failures={"find": ({"name": "File"}, "no entity named 'File'")},
        failed={("find", "name"): frozenset({"File"})},
    )
    prop = narrow_properties("find", tool, {"name": (User(),)}, held, defaults=False)["properties"][
        "name"
    ]  # type: ignore[index]
    # The names the user gave come first ("File" was the sentence's first word anyway).
    assert prop["anyOf"][0] == {"enum": ["Acme Robotics"]}
    assert prop["anyOf"][1]["pattern"].startswith("^(Acme|acme|Robotics|robotics)(")


def test_an_email_argument_takes_the_addresses_the_user_wrote_not_their_words() -> None:
    tool = {
        "type": "object",
        "properties": {"email": {"type": "string"}, "cc": {"type": "string", "format": "email"}},
        "required": ["email", "cc"],
    }
    held = Held(said_in("Send it to Ana Lima, ana@example.com, and copy bo@corp.io"))
    props = narrow_properties("send", tool, {"email": (User(),)}, held, defaults=True)["properties"]  # type: ignore[index]
    assert props["email"] == {"enum": ["ana@example.com", "bo@corp.io"]}
    assert props["cc"] == {"enum": ["ana@example.com", "bo@corp.io"]}


def test_a_plain_requests_required_string_takes_the_users_words() -> None:
    # With no workflow there are no results to read: a required plain string is the user's
    # (a name they wrote, or their words), never a description's text or a type's name.
    find = {
        "type": "object",
        "properties": {
            "cuisine": {"type": "string", "description": "Cuisine of the restaurant."},
            "location": {"type": "string"},
            "note": {"type": "string"},
        },
        "required": ["cuisine", "location"],
    }
    said = said_in("Find a sushi restaurant in Boston that is open on Sundays.", phrases=True)
    held = Held(said, plain=True)
    narrowed = narrow_properties("find", find, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    # optional: the user's words as well, or left out (never a made-up note)
    note_names, note_words = props["note"]["anyOf"]
    assert note_names == {"enum": ["Boston", "Sundays"]}
    assert re.match(note_words["pattern"], "open on Sundays")
    assert not re.match(note_words["pattern"], "closed on Mondays")
    assert narrowed["required"] == ["cuisine", "location"]
    for arg in ("cuisine", "location"):
        names, words = props[arg]["anyOf"]
        assert names == {"enum": ["Boston", "Sundays"]}
        pattern = re.compile(words["pattern"])
        # a run of the user's words as written, not only the names' ("sushi" is no name)
        assert pattern.match("sushi") and pattern.match("Boston")
        assert pattern.match("sushi restaurant") and pattern.match("open on Sundays")
        assert not pattern.match("Cuisine of the restaurant.") and not pattern.match("string")
        # words not side by side in the message, or a run that ends on a function word
        assert not pattern.match("Boston sushi") and not pattern.match("open on")
    # In a workflow, the same argument keeps its schema unless the workflow declares the user.
    workflow = narrow_properties("find", find, {}, Held(said), defaults=True)
    assert workflow is not None
    assert workflow["properties"]["cuisine"] == find["properties"]["cuisine"]


def test_a_plain_requests_string_with_a_pattern_takes_only_what_fits() -> None:
    code = {
        "type": "object",
        "properties": {"airport": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["airport"],
    }
    held = Held(said_in("Flights from CDG tomorrow"), plain=True)
    narrowed = narrow_properties("f", code, {}, held, defaults=True, plain=True)
    assert narrowed is not None and narrowed["properties"]["airport"] == {"enum": ["CDG"]}
    # nothing fits: the schema decides, the call is not blocked
    held = Held(said_in("flights tomorrow"), plain=True)
    narrowed = narrow_properties("f", code, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    assert narrowed["properties"]["airport"] == code["properties"]["airport"]


def test_a_quoted_value_is_offered_whole_and_runs_stay_inside_a_phrase() -> None:
    # A workflow's reading leaves quotes and runs out: only a plain request reads them.
    read = said_in("Review 'Ticket to Ride' in Paris, France")
    assert read.quoted == () and read.spans == ()
    said = said_in(
        "Review 'I love the food here! It's always fresh.' for the game "
        '"The Legend of Zelda: Breath of the Wild", in Paris, France. Then 2x^2 at x = 1.',
        phrases=True,
    )
    assert said.quoted == (
        "I love the food here! It's always fresh.",
        "The Legend of Zelda: Breath of the Wild",
    )
    assert {"Paris, France", "2x^2", "x = 1", "Legend of Zelda"} <= set(said.spans)
    # a sentence's end, a clause's colon or a quote ends a run
    assert not any("France. Then" in s or "Zelda: Breath" in s for s in said.spans)
    assert not any(s.startswith(("the ", "of ")) or s.endswith((" the", " of")) for s in said.spans)
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}},
        "required": ["title"],
    }
    held = Held(said, plain=True)
    narrowed = narrow_properties("f", schema, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    enum, runs = narrowed["properties"]["title"]["anyOf"]
    assert enum["enum"][:2] == list(said.quoted)
    assert re.fullmatch(r"\^\(.*\)\$", runs["pattern"])
    assert re.match(runs["pattern"], "2x^2") and not re.match(runs["pattern"], "2x2")


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("100 million shares and a payout of 50 million USD", (100_000_000, 50_000_000)),
        ("2,5 Milliarden Euro", (2_500_000_000,)),
        ("3 mille euros, 12 pommes", (3000, 12)),
        ("10 millionaires", (10,)),  # a word that starts like a scale is none
        ("grew 5% to 1.5 billion", (5, 0.05, 1_500_000_000)),
    ],
)
def test_a_scale_word_multiplies_the_number_before_it(
    text: str, numbers: tuple[float, ...]
) -> None:
    assert said_in(text).numbers == numbers


def test_a_list_of_numbers_is_one_the_user_wrote() -> None:
    said = said_in("Compare group A [3, 4, 5, 6, 4] with B [7, 8, 9, 8, 7] at (40.7128, -74.006).")
    assert said.lists == ([3, 4, 5, 6, 4], [7, 8, 9, 8, 7], [40.7128, -74.006])
    ints = {"type": "array", "items": {"type": "integer"}}
    schema = {
        "type": "object",
        "properties": {
            "a": ints,
            "b": ints,
            "point": {"type": "array", "items": {"type": "number"}},
        },
        "required": ["a", "b"],
    }
    held = Held(said, plain=True)
    narrowed = narrow_properties("t", schema, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["a"] == {"enum": [[3, 4, 5, 6, 4], [7, 8, 9, 8, 7]]}  # integers only
    assert props["point"] == {"enum": [[3, 4, 5, 6, 4], [7, 8, 9, 8, 7], [40.7128, -74.006]]}
    # none written: a required list keeps its schema, an optional one is left out
    held = Held(said_in("compare the two groups"), plain=True)
    narrowed = narrow_properties("t", schema, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    assert narrowed["properties"]["a"] == ints and narrowed["properties"]["point"] is False


@pytest.mark.parametrize(
    ("name", "description", "form"),
    [
        ("date", "Format: yyyy-mm-dd.", "%Y-%m-%d"),
        ("birth", "Must be in MM-DD-YYYY format.", "%m-%d-%Y"),
        ("when", "Check-in date. Format - DD/MM/YYYY.", "%d/%m/%Y"),
        ("when", "The date (month-day-year) of the game.", "%m-%d-%Y"),
        ("when", "Accepts a standard date, e.g., 2022-04-28.", "%Y-%m-%d"),
        ("check_in_date", "The day the stay begins.", "%Y-%m-%d"),  # a date by its name: ISO
        ("startDate", "", "%Y-%m-%d"),
        ("month", "In 'mm-yyyy' format.", None),  # no day: not a date
        ("city", "A city, e.g. Paris.", None),
        ("update", "candidate's mandate", None),
    ],
)
def test_a_plain_string_is_a_date_by_its_description_or_name(
    name: str, description: str, form: str | None
) -> None:
    assert date_form(name, {"type": "string", "description": description}) == form


def test_a_date_argument_takes_the_users_dates_in_the_described_form() -> None:
    schema = {
        "type": "object",
        "properties": {
            "check_in": {"type": "string", "description": "Format MM-DD-YYYY."},
            "check_out_date": {"type": "string"},
            "city": {"type": "string"},
        },
        "required": ["check_in", "check_out_date", "city"],
    }
    said = said_in("A room in Paris, France from July 10, 2022 to 20 juillet 2022.", phrases=True)
    narrowed = narrow_properties(
        "book", schema, {}, Held(said, plain=True), defaults=True, plain=True
    )
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["check_in"] == {"enum": ["07-10-2022", "07-20-2022"]}
    assert props["check_out_date"] == {"enum": ["2022-07-10", "2022-07-20"]}
    assert "enum" not in props["city"] or "2022-07-10" not in props["city"]["enum"]
    # No date written: a date argument stays a plain string of the user's words.
    said = said_in("A room in Paris this weekend.", phrases=True)
    narrowed = narrow_properties(
        "book", schema, {}, Held(said, plain=True), defaults=True, plain=True
    )
    assert narrowed is not None
    assert "pattern" in str(narrowed["properties"]["check_out_date"])


def test_a_possessive_names_its_owner() -> None:
    said = said_in(
        "What was Albert Einstein's work, and The Weeknd's tour? Ask O'Neil.", phrases=True
    )
    assert {"Albert Einstein", "The Weeknd"} <= set(said.names)
    assert "Albert Einstein" in said.spans and not any("'s" in s for s in said.spans)
    assert any("O'Neil" in n for n in said.names)  # an apostrophe inside a name stays


def _accepts(schema: dict[str, Any], value: dict[str, Any]) -> bool:
    from toolforge.core.schemas import compile_schema

    return compile_schema(schema, name="t", fallback=False).is_valid(value)


def test_a_number_written_once_goes_to_one_argument_of_a_plain_request() -> None:
    schema = {
        "type": "object",
        "properties": {
            "height": {"type": "integer"},
            "initial_velocity": {"type": "integer"},
            "gravity": {"type": "number"},
        },
        "required": ["height", "initial_velocity"],
    }
    said = said_in("An object dropped from 100 m, starting at zero.", phrases=True)
    assert said.numbers == (100, 0) and said.repeated == ()
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    assert _accepts(narrowed, {"height": 100, "initial_velocity": 0})
    assert not _accepts(narrowed, {"height": 100, "initial_velocity": 100})
    # written twice, a number may go to two arguments
    said = said_in("2 adults for 2 nights", phrases=True)
    assert said.repeated == (2,)
    rooms = {
        "type": "object",
        "properties": {"adults": {"type": "integer"}, "nights": {"type": "integer"}},
        "required": ["adults", "nights"],
    }
    narrowed = narrow_properties("f", rooms, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None and _accepts(narrowed, {"adults": 2, "nights": 2})
    # "12,000" is 12000 or 12 (grouped thousands, or a decimal comma): one number, one argument
    said = said_in("A car that travels 12,000 miles a year at 25 MPG", phrases=True)
    assert (12000, 12) in said.alike
    fuel = {
        "type": "object",
        "properties": {
            "distance": {"type": "integer"},
            "efficiency": {"type": "number"},
            "reduction": {"type": "integer"},
        },
        "required": ["distance", "efficiency"],
    }
    narrowed = narrow_properties("f", fuel, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    assert _accepts(narrowed, {"distance": 12000, "efficiency": 25})
    assert not _accepts(narrowed, {"distance": 12000, "efficiency": 25, "reduction": 12})
    assert not _accepts(narrowed, {"distance": 12, "efficiency": 25, "reduction": 25})
    # three required numbers and two written: no call keeps them apart, so none is asked to
    fuel["required"] = ["distance", "efficiency", "reduction"]
    narrowed = narrow_properties("f", fuel, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None and _accepts(
        narrowed, {"distance": 12000, "efficiency": 25, "reduction": 25}
    )
    # a workflow's numbers of one call may be the same (an amount and a total)
    said = said_in("An object dropped from 100 m, starting at zero.")
    narrowed = narrow_properties("f", schema, {}, Held(said), defaults=True)
    assert narrowed is not None and _accepts(narrowed, {"height": 100, "initial_velocity": 100})


def test_a_name_the_user_gave_goes_to_one_string_of_a_plain_request() -> None:
    schema = {
        "type": "object",
        "properties": {"player_name": {"type": "string"}, "team": {"type": "string"}},
        "required": ["player_name", "team"],
    }
    said = said_in(
        "Get point and rebound stats for player 'LeBron James' from last game", phrases=True
    )
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    assert _accepts(narrowed, {"player_name": "LeBron James", "team": "last game"})
    assert not _accepts(narrowed, {"player_name": "LeBron James", "team": "LeBron James"})
    assert not _accepts(narrowed, {"player_name": "LeBron James", "team": "LeBron"})  # its words
    # a run of words for the first, then the name for the second: still one each
    assert _accepts(narrowed, {"player_name": "rebound stats", "team": "LeBron James"})
    # two runs of words are not kept apart: that would take a branch per run
    assert _accepts(narrowed, {"player_name": "LeBron", "team": "LeBron"})


def test_a_plain_requests_flags_are_what_the_user_said_or_left_out() -> None:
    schema = {
        "type": "object",
        "properties": {
            "team": {"type": "string"},
            "detailed": {"type": "boolean"},
            "air_resistance": {"type": "boolean"},
            "cached": {"type": "boolean"},
            "strict": {"type": "boolean"},
        },
        "required": ["team", "strict"],
    }
    said = said_in("Warriors standings with details, without air resistance", phrases=True)
    held = Held(said, plain=True)
    narrowed = narrow_properties("f", schema, {}, held, defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["detailed"] == {"type": "boolean", "const": True}
    assert props["air_resistance"] == {"type": "boolean", "const": False}
    assert props["cached"] is False  # optional, not named: left out, its default applies
    assert props["strict"] == {"type": "boolean"}  # required, not named: the model's
    # a flag the user's words set is given: left out, its default would undo what they said
    assert narrowed["required"] == ["team", "strict", "detailed", "air_resistance"]
    assert _accepts(
        narrowed, {"team": "Warriors", "strict": True, "detailed": True, "air_resistance": False}
    )
    assert not _accepts(narrowed, {"team": "Warriors", "strict": True, "air_resistance": False})
    # a workflow's flags keep their schema
    narrowed = narrow_properties("f", schema, {}, Held(said_in(said.text)), defaults=True)
    assert narrowed is not None and narrowed["properties"]["detailed"] == {"type": "boolean"}


def test_a_documented_value_the_user_names_is_given_as_documented() -> None:
    schema = {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "temp_unit": {
                "type": "string",
                "description": "The unit ('Celsius' or 'Fahrenheit'). Default is 'Fahrenheit'.",
            },
            "vehicle": {"type": "string", "description": "'gas' or 'diesel' or 'electric'."},
            "detail_level": {
                "type": "string",
                "description": "Optional, default is 'basic'. Or 'detailed'.",
            },
        },
        "required": ["location", "vehicle"],
    }
    said = said_in(
        "Average temperature in Austin in celsius for my gas-powered car, in detail", phrases=True
    )
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    # by its words' stems, in any case: "celsius" names 'Celsius', "gas-powered" 'gas',
    # "in detail" 'detailed'; each as the description writes it, and required
    assert props["temp_unit"] == {"type": "string", "enum": ["Celsius"]}
    assert props["vehicle"] == {"type": "string", "enum": ["gas"]}
    assert props["detail_level"] == {"type": "string", "enum": ["detailed"]}
    assert narrowed["required"] == ["location", "vehicle", "temp_unit", "detail_level"]
    # Named by nothing: an optional one offers the documented values and the user's words,
    # or is left out; never a value made up.
    said = said_in("Average temperature in Austin", phrases=True)
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    unit = narrowed["properties"]["temp_unit"]
    args = {"location": "Austin", "vehicle": "gas"}
    assert _accepts(narrowed, args)  # left out: its default applies
    assert _accepts(narrowed, {**args, "temp_unit": "Fahrenheit"})
    assert not _accepts(narrowed, {**args, "temp_unit": "Kelvin"})
    assert "temp_unit" not in narrowed["required"] and unit != {"type": "string"}


def test_the_words_that_name_a_documented_value_are_not_another_arguments() -> None:
    schema = {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city."},
            "temp_unit": {
                "type": "string",
                "description": "The unit ('Celsius' or 'Fahrenheit'). Default is 'Fahrenheit'.",
            },
        },
        "required": ["location"],
    }
    said = said_in("Temperature in Austin in celsius", phrases=True)
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    assert narrowed["properties"]["temp_unit"] == {"type": "string", "enum": ["Celsius"]}
    # "celsius" named the unit: it is not also the location's (seen: location "celsius")
    for taken in ("celsius", "Celsius", "Austin in celsius"):
        assert not _accepts(narrowed, {"location": taken, "temp_unit": "Celsius"}), taken
    assert _accepts(narrowed, {"location": "Austin", "temp_unit": "Celsius"})
    # Where nothing else was said, the argument keeps what it had: the user's words.
    said = said_in("in celsius", phrases=True)
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    assert _accepts(narrowed, {"location": "celsius", "temp_unit": "Celsius"})


def test_a_descriptions_examples_are_no_vocabulary() -> None:
    assert described_values("Can be 'melting', 'freezing' or 'vaporization'.") == [
        "melting",
        "freezing",
        "vaporization",
    ]
    # An example illustrates: the user naming it picks it, but it is never offered alone.
    example = "The location, e.g. 'Amazon rainforest'. Default is 'Brazil'."
    assert described_values(example) == ["Amazon rainforest", "Brazil"]
    assert described_values(example, examples=False) == ["Brazil"]
    assert described_values("Say 'x' for example, like 'y'", examples=False) == ["x"]
    assert described_values(None) == []
    # A default written without quotes is documented too, up to its clause's end.
    assert described_values("If not provided, the default is km/h.") == ["km/h"]
    assert described_values("Defaults to square meters") == ["square meters"]
    assert described_values("Default is 5 days if not specified.") == ["5 days"]
    assert described_values("By default it is off. Default value is None.") == []
    assert described_values("'" + "a" * 41 + "'") == []  # a sentence in quotes, not a value
    said = said_in("Rain in the amazon rainforest, not melting", phrases=True)
    assert named_values(["Amazon rainforest", "rainforest trip", "the"], said) == [
        "Amazon rainforest"
    ]
    schema = {
        "type": "object",
        "properties": {"location": {"type": "string", "description": example}},
        "required": ["location"],
    }
    narrowed = narrow_properties(
        "f",
        schema,
        {},
        Held(said_in("Rain in Peru", phrases=True), plain=True),
        defaults=True,
        plain=True,
    )
    assert narrowed is not None
    assert not _accepts(narrowed, {"location": "Amazon rainforest"})
    assert _accepts(narrowed, {"location": "Brazil"}) and _accepts(narrowed, {"location": "Peru"})


def test_a_percentage_is_a_rates_fraction_unless_the_argument_is_in_percent() -> None:
    schema = {
        "type": "object",
        "properties": {
            "principal": {"type": "integer"},
            "rate": {"type": "number", "description": "Enter as a decimal: 5% is 0.05."},
            "annual_rate": {"type": "number", "description": "The rate as a percentage."},
            "years": {"type": "integer"},
        },
        "required": ["principal", "rate", "annual_rate", "years"],
    }
    said = said_in("Invest $10000 at 7% for 10 years", phrases=True)
    assert said.percents == ((7, 0.07),)
    narrowed = narrow_properties("f", schema, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert 0.07 in props["rate"]["enum"] and 7 not in props["rate"]["enum"]
    assert 7 in props["annual_rate"]["enum"] and 0.07 not in props["annual_rate"]["enum"]
    # an integer cannot be 0.07: the number as written
    assert 7 in props["principal"]["enum"] and 0.07 not in props["principal"]["enum"]
    # The argument's words are read to a bound: "percent" past it says nothing.
    far = {**schema["properties"]["rate"], "description": "x " * 5000 + "in percent"}
    wide = {**schema, "properties": {**schema["properties"], "rate": far}}
    narrowed = narrow_properties("f", wide, {}, Held(said, plain=True), defaults=True, plain=True)
    assert narrowed is not None and 0.07 in narrowed["properties"]["rate"]["enum"]
    # Written elsewhere too, the number stays: "5% for 5 years" still offers the rate 5.
    again = said_in("Invest $10000 at 5% for 5 years", phrases=True)
    narrowed = narrow_properties(
        "f", schema, {}, Held(again, plain=True), defaults=True, plain=True
    )
    assert narrowed is not None and {5, 0.05} <= set(narrowed["properties"]["rate"]["enum"])


def test_a_list_written_without_spaces_is_its_numbers() -> None:
    said = said_in("NPV of cash_flows=[200,300,400,500] at a rate of 10%", phrases=True)
    assert said.lists == ([200, 300, 400, 500],)
    assert {200, 300, 400, 500} <= set(said.numbers) and 200300400500 not in said.numbers
    assert said_in("a budget of 10,000 dollars").numbers[0] == 10000  # grouped, outside a list


def test_a_series_of_numbers_is_a_list_the_user_wrote() -> None:
    said = said_in("dataset_A has the values 12, 24, 36 and dataset_B 15, 30 and 45.")
    assert said.lists == ([12, 24, 36], [15, 30, 45])
    assert said_in("Die Werte 12, 24 und 36, dann 1, 2 et 3").lists == ([12, 24, 36], [1, 2, 3])
    # two numbers are no series; grouped thousands and percentages are not one either
    assert said_in("sizes 1, 2 please").lists == ()
    assert said_in("budgets of 10,000, 20,000 and 30,000").lists == ()
    assert said_in("rates of 5%, 6%, 7%").lists == ()
    # a list in brackets is read once, not again as a series
    assert said_in("[3, 4, 5] then 6, 7, 8").lists == ([3, 4, 5], [6, 7, 8])
