"""The demo pack (docs/tools.md): places.search and bookings.create, deterministic, fixture-backed,
run through the real executor."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolforge.core.tool_specs import ToolRegistry
from toolforge.runtime.executor import ToolExecutor, ToolResult
from toolforge.tools import default_registry
from toolforge.tools.bookings import BookingBook, BookingsCreateArgs, load_full_slots
from toolforge.tools.places import PlacesSearchArgs, is_open, load_places, search


async def _no_sleep(_delay: float) -> None:
    await asyncio.sleep(0)


@pytest.fixture
def registry() -> ToolRegistry:
    return default_registry()


@pytest.fixture
def executor(registry: ToolRegistry) -> ToolExecutor:
    return ToolExecutor(registry, sleep=_no_sleep)


async def call(executor: ToolExecutor, name: str, args: object, **kw: Any) -> ToolResult:
    kw.setdefault("call_id", "c1")
    return await executor.run(name, args, **kw)


def ids(result: ToolResult) -> list[str]:
    assert result.ok, result.envelope.errors
    data = result.envelope.data
    assert isinstance(data, dict)
    return [p["id"] for p in data["places"]]


# -- the registry -------------------------------------------------------------------------


def test_the_default_registry_serves_the_demo_pack(registry: ToolRegistry) -> None:
    assert [s.name for s in registry.visible()] == ["places.search", "bookings.create"]
    for spec in registry:
        assert spec.idempotent and not spec.needs_approval and spec.description
        schema = spec.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert "description" not in schema  # no Python docstring leaks to the model
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{spec.name}.{name} has no description"


def test_each_registry_has_its_own_bookings() -> None:
    assert default_registry().get("bookings.create") is not default_registry().get(
        "bookings.create"
    )


def test_fixtures_are_consistent() -> None:
    places = {p.id: p for p in load_places()}
    assert len(places) == 10
    for place_id, time in load_full_slots():
        assert place_id in places and is_open(places[place_id], time)


# -- places.search ------------------------------------------------------------------------


async def test_search_by_cuisine_within_the_default_radius(executor: ToolExecutor) -> None:
    assert ids(await call(executor, "places.search", {"query": "italian"})) == [
        "trattoria-roma",
        "bella-napoli",
    ]


async def test_radius_limits_the_distance(executor: ToolExecutor) -> None:
    result = await call(executor, "places.search", {"query": "italian", "radius_km": 2})
    assert ids(result) == ["trattoria-roma"]
    assert ids(await call(executor, "places.search", {"query": "seafood"})) == []
    far = await call(executor, "places.search", {"query": "seafood", "radius_km": 15})
    assert ids(far) == ["ocean-grill"]


async def test_open_at_filters_by_opening_hours(executor: ToolExecutor) -> None:
    noon = await call(executor, "places.search", {"query": "pizza", "open_at": "12:00"})
    assert ids(noon) == ["trattoria-roma"]  # bella-napoli opens at 17:30
    evening = await call(executor, "places.search", {"query": "pizza", "open_at": "19:00"})
    assert ids(evening) == ["trattoria-roma", "bella-napoli"]


async def test_hours_past_midnight(executor: ToolExecutor) -> None:
    late = await call(executor, "places.search", {"query": "late-night", "open_at": "01:00"})
    assert ids(late) == ["the-night-owl", "taco-loco"]  # both match once: nearer first
    early = await call(executor, "places.search", {"query": "late-night", "open_at": "05:00"})
    assert ids(early) == []


async def test_more_matching_words_rank_first_and_filler_is_ignored(
    executor: ToolExecutor,
) -> None:
    result = await call(
        executor,
        "places.search",
        {"query": "Cheap vegetarian CURRY restaurant near me", "radius_km": 10},
    )
    assert ids(result) == ["spice-route", "green-garden"]  # two words beat one
    anything = await call(executor, "places.search", {"query": "places near me", "limit": 3})
    assert ids(anything) == ["morning-brew", "le-petit-bistro", "green-garden"]  # by distance


async def test_the_words_of_the_booking_itself_are_filler(executor: ToolExecutor) -> None:
    """A small model copies the user's request into the query: "book a table for 2 at
    7pm" names no place, so it finds the places in range; "pizza" among them still ranks."""
    nearest = ["morning-brew", "le-petit-bistro", "green-garden"]
    for query in ("book a table for 2 at 7pm", "2", "7pm", "19:00", "Reserve tables, 4 people"):
        assert ids(await call(executor, "places.search", {"query": query, "limit": 3})) == nearest
    found = await call(executor, "places.search", {"query": "pizza table for 2 at 7pm"})
    assert ids(found) == ["trattoria-roma", "bella-napoli"]
    assert ids(await call(executor, "places.search", {"query": "sushi 7pm", "radius_km": 1})) == []


async def test_plurals_and_hyphenated_tags_match(executor: ToolExecutor) -> None:
    assert ids(await call(executor, "places.search", {"query": "tacos"})) == ["taco-loco"]
    assert ids(await call(executor, "places.search", {"query": "gluten free"})) == ["green-garden"]


async def test_search_results_are_deterministic_and_shaped(executor: ToolExecutor) -> None:
    first = await call(executor, "places.search", {"query": "sushi", "radius_km": 3})
    second = await call(executor, "places.search", {"query": "sushi", "radius_km": 3})
    assert first.envelope == second.envelope
    assert first.envelope.data == {
        "query": "sushi",
        "radius_km": 3.0,
        "open_at": None,
        "count": 1,
        "places": [
            {
                "id": "sakura-sushi",
                "name": "Sakura Sushi",
                "category": "restaurant",
                "cuisine": "japanese",
                "tags": ["sushi", "ramen", "omakase"],
                "address": "88 Cherry Lane",
                "distance_km": 2.5,
                "hours": "17:00-23:30",
                "rating": 4.8,
                "price": "$$$",
            }
        ],
    }


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"query": ""}, "$.query"),
        ({"query": "x", "radius_km": 0}, "$.radius_km"),
        ({"query": "x", "radius_km": 51}, "$.radius_km"),
        ({"query": "x", "open_at": "7pm"}, "$.open_at"),
        ({"query": "x", "open_at": "24:00"}, "$.open_at"),
        ({"query": "x", "limit": 11}, "$.limit"),
        ({"radius_km": 1}, "$.query"),
        ({"query": "x", "near": "me"}, "$.near"),
    ],
)
async def test_bad_search_arguments_name_the_path(
    executor: ToolExecutor, args: dict[str, Any], path: str
) -> None:
    result = await call(executor, "places.search", args)
    assert result.envelope.errors[0]["code"] == "TOOL_ARGS_INVALID"
    assert f"{path}: " in str(result.envelope.errors[0]["message"])


def test_search_is_a_pure_function() -> None:
    places = load_places()
    args = PlacesSearchArgs(query="coffee", limit=1)
    assert search(places, args) == search(places, args)
    assert search(places, args)["count"] == 1


# -- bookings.create ----------------------------------------------------------------------

BOOKING = {"place_id": "trattoria-roma", "time": "19:00", "party_size": 4}


async def test_a_booking_is_confirmed(executor: ToolExecutor) -> None:
    result = await call(executor, "bookings.create", BOOKING)
    assert result.ok
    data = result.envelope.data
    assert isinstance(data, dict)
    assert data["status"] == "confirmed" and data["place_name"] == "Trattoria Roma"
    assert str(data["booking_id"]).startswith("bk_") and len(str(data["booking_id"])) == 15


async def test_bookings_are_idempotent_by_their_inputs() -> None:
    places = load_places()
    book = BookingBook(places, load_full_slots())
    from toolforge.tools.bookings import bookings_create_spec

    executor = ToolExecutor(ToolRegistry([bookings_create_spec(book=book)]), sleep=_no_sleep)
    first = await call(executor, "bookings.create", BOOKING, call_id="a")
    again = await call(executor, "bookings.create", BOOKING, call_id="b")  # no key: runs again
    assert first.envelope == again.envelope and len(book) == 1
    other = await call(executor, "bookings.create", {**BOOKING, "party_size": 5})
    assert other.envelope.data != first.envelope.data and len(book) == 2


async def test_a_full_slot_is_a_typed_permanent_failure(executor: ToolExecutor) -> None:
    result = await call(
        executor, "bookings.create", {"place_id": "sakura-sushi", "time": "19:00", "party_size": 2}
    )
    assert result.attempts == 1  # permanent: not retried
    [error] = result.envelope.errors
    assert error["code"] == "BOOKING_FULL" and error["retryable"] is False
    assert error["message"] == (
        "Sakura Sushi is fully booked at 19:00; free times nearby: 18:30, 18:00, 20:00"
    )
    assert error["details"] == [
        {
            "reason": "full",
            "place_id": "sakura-sushi",
            "time": "19:00",
            "alternatives": "18:30,18:00,20:00",
        }
    ]


async def test_unknown_places_and_closed_times(executor: ToolExecutor) -> None:
    unknown = await call(executor, "bookings.create", {**BOOKING, "place_id": "nowhere"})
    assert unknown.envelope.errors[0]["code"] == "NOT_FOUND"
    closed = await call(executor, "bookings.create", {**BOOKING, "time": "09:00"})
    error = closed.envelope.errors[0]
    assert error["code"] == "TOOL_FAILED"
    assert error["message"] == (
        "Trattoria Roma is closed at 09:00 (open 11:30-22:30); try 11:30, 12:00, 12:30"
    )
    assert closed.attempts == 1


@pytest.mark.parametrize(
    ("change", "path", "constraint"),
    [
        ({"party_size": 21}, "$.party_size", "less_than_equal(le=20)"),
        ({"party_size": 0}, "$.party_size", "greater_than_equal(ge=1)"),
        ({"party_size": "4"}, "$.party_size", "int_type"),
        ({"time": "19:15"}, "$.time", "string_pattern_mismatch"),
        ({"place_id": "Trattoria Roma"}, "$.place_id", "string_pattern_mismatch"),
    ],
)
async def test_bad_booking_arguments_name_path_and_constraint(
    executor: ToolExecutor, change: dict[str, Any], path: str, constraint: str
) -> None:
    result = await call(executor, "bookings.create", {**BOOKING, **change})
    [error] = result.envelope.errors
    assert error["code"] == "TOOL_ARGS_INVALID" and result.attempts == 0
    assert f"{path}: " in str(error["message"]) and constraint in str(error["message"])


async def test_personal_data_is_redacted_in_the_record(executor: ToolExecutor) -> None:
    args = {**BOOKING, "guest_name": "Alice Martin", "contact": "+33 6 12 34 56 78"}
    result = await call(executor, "bookings.create", args)
    assert result.ok
    assert "Alice" not in repr(result.record) and "56 78" not in repr(result.record)
    data = result.envelope.data
    assert isinstance(data, dict) and data["guest_name"] == "Alice Martin"


async def test_a_repeated_idempotency_key_replays_the_booking(executor: ToolExecutor) -> None:
    first = await call(executor, "bookings.create", BOOKING, idempotency_key="idem")
    again = await call(executor, "bookings.create", BOOKING, idempotency_key="idem")
    assert again.cached and again.envelope == first.envelope


def test_args_models_accept_what_their_schema_describes() -> None:
    BookingsCreateArgs.model_validate_json(
        b'{"place_id":"a-b","time":"00:30","party_size":20,"guest_name":null}', strict=True
    )
