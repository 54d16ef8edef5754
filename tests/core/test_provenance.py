"""Argument provenance (toolforge.core.provenance), pure: what the user's message states,
read by type and format in English, German and French alike; each argument held to its
declared sources or the defaults; optional arguments nothing provides left out."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.core.provenance import (
    Anything,
    Calls,
    Held,
    Results,
    User,
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
    narrowed = narrow_properties("book", BOOKING, DECLARED, Held(said_in(text)), defaults=True)
    assert narrowed is not None
    props = narrowed["properties"]
    assert props["date"] == {"enum": ["2026-12-03"]}
    assert props["time"] == {"enum": ["19:30"]}
    assert props["party_size"] == {"enum": [2]}
    # Optional arguments nothing provides are left out, never invented.
    assert props["contact"] is False and props["note"] is False
    # Nothing holds a place id yet, and it is required: its schema decides (a default).
    assert props["place_id"] == BOOKING["properties"]["place_id"]


def test_a_value_the_schema_would_refuse_is_never_offered() -> None:
    # 7:15pm is no slot (the pattern wants :00 or :30), 40 is over the maximum: the user
    # said nothing usable, so each keeps its schema rather than block the call.
    said = said_in("40 of us at 7:15pm on 2026-12-03")
    narrowed = narrow_properties("book", BOOKING, DECLARED, Held(said), defaults=True)
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
    assert props["unit"] == {"type": "string"}  # an optional plain string keeps its schema
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
