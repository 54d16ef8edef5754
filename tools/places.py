"""``places.search``: find demo places by what they serve, distance and opening time.

Deterministic and fixture-backed (``tools/fixtures/places.json``): the same arguments give
the same answer on every machine, which is what the demo, the goldens and the eval
harness need. Distances are fixed in the fixture, measured from one demo origin.

Matching is forgiving, because small models write queries like "cheap pizza near me" or
copy the user's request ("book a table for 2 at 7pm"): the query is cut into words, filler
words are dropped ("near", "me", "tonight", "restaurant" or "dinner", and the words of the
booking itself: "book", "table", "people", numbers and times such as "2" or "7pm"; none
says *which* place), and a place matches when
at least one remaining word equals a word of its name, category, cuisine or tags (plural
``s`` ignored on both sides). Results are ranked by the number of matching words, then
distance, then id. A query of only filler words matches every place in range.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from toolforge.core.tool_specs import ToolSpec

__all__ = [
    "FIXTURES",
    "HHMM",
    "HHMM_PATTERN",
    "Place",
    "PlacesSearchArgs",
    "is_open",
    "load_places",
    "minutes",
    "places_search_spec",
    "search",
]

FIXTURES: Final = Path(__file__).resolve().parent / "fixtures"
HHMM_PATTERN: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
HHMM = Annotated[str, StringConstraints(pattern=HHMM_PATTERN)]
"""A local time of day, 24-hour ``"HH:MM"``."""

# Words that say nothing about which place is meant.
_FILLER: Final = frozenset(
    "a an and any at best cheap dinner dining eat food find for good i in is lunch me meal "
    "near nearby of on open place please restaurant some something the to tonight want "
    "we where with"
    # ... and the booking's own words: what to do, for how many, when.
    " am book booking can get guest if my now our party people person pm reservation reserve"
    " seat table there today us you".split()
)
_WORD: Final = re.compile(r"[0-9a-z]+")
# A number or a time of day ("2", "19", "7pm", "730am"): which place is not in it.
_NUMERIC: Final = re.compile(r"[0-9]+([ap]m)?")


class Place(BaseModel):
    """One fixture place."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    category: str
    cuisine: str
    tags: tuple[str, ...]
    address: str
    distance_km: float
    opens: HHMM
    closes: HHMM
    rating: float
    price: str
    capacity: int


class PlacesSearchArgs(BaseModel):
    # No docstring: pydantic would put it in the JSON Schema the model reads. The field
    # descriptions are written for the model.

    model_config = ConfigDict(extra="forbid", title="places.search")

    query: str = Field(
        min_length=1,
        max_length=200,
        description='What to look for: a cuisine, dish or kind of place, e.g. "italian", '
        '"sushi", "coffee", "cocktail bar".',
    )
    radius_km: float = Field(
        default=5.0,
        gt=0,
        le=50,
        description="Only places within this distance of the user, in kilometres.",
    )
    open_at: HHMM | None = Field(
        default=None,
        description='Only places open at this local time, 24-hour "HH:MM", e.g. "19:00". '
        "Omit to ignore opening hours.",
    )
    limit: int = Field(default=5, ge=1, le=10, description="The most places to return.")


def minutes(hhmm: str) -> int:
    """``"19:30"`` → 1170."""
    hours, mins = hhmm.split(":")
    return int(hours) * 60 + int(mins)


def is_open(place: Place, hhmm: str) -> bool:
    """Whether ``place`` is open at ``hhmm``; hours past midnight (18:00-02:00) count."""
    t, opens, closes = minutes(hhmm), minutes(place.opens), minutes(place.closes)
    if opens < closes:
        return opens <= t < closes
    return t >= opens or t < closes  # open overnight


def load_places(path: Path = FIXTURES / "places.json") -> tuple[Place, ...]:
    """The fixture places, validated."""
    doc = orjson.loads(path.read_bytes())
    return tuple(Place.model_validate(p) for p in doc["places"])


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


_FILLER_STEMS: Final = frozenset(_stem(w) for w in _FILLER)


def _words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.casefold())}


def search(places: Sequence[Place], args: PlacesSearchArgs) -> dict[str, object]:
    """The pure search behind the tool."""
    wanted = {w for w in _words(args.query) - _FILLER_STEMS if not _NUMERIC.fullmatch(w)}
    ranked: list[tuple[int, float, str, Place]] = []
    for place in places:
        if place.distance_km > args.radius_km:
            continue
        if args.open_at is not None and not is_open(place, args.open_at):
            continue
        text = " ".join((place.name, place.category, place.cuisine, *place.tags))
        # "gluten-free" is one tag, and also the words "gluten" and "free".
        score = len(wanted & (_words(text) | _words(text.replace("-", ""))))
        if wanted and score == 0:
            continue
        ranked.append((-score, place.distance_km, place.id, place))
    ranked.sort(key=lambda r: r[:3])
    found = [
        {
            "id": p.id,
            "name": p.name,
            "category": p.category,
            "cuisine": p.cuisine,
            "tags": list(p.tags),
            "address": p.address,
            "distance_km": p.distance_km,
            "hours": f"{p.opens}-{p.closes}",
            "rating": p.rating,
            "price": p.price,
        }
        for *_, p in ranked[: args.limit]
    ]
    return {
        "query": args.query,
        "radius_km": args.radius_km,
        "open_at": args.open_at,
        "count": len(found),
        "places": found,
    }


def places_search_spec(places: Sequence[Place] | None = None) -> ToolSpec[PlacesSearchArgs]:
    """The ``places.search`` tool over ``places`` (the fixture by default)."""
    data = tuple(places) if places is not None else load_places()

    async def places_search(args: PlacesSearchArgs) -> dict[str, object]:
        return search(data, args)

    return ToolSpec(
        name="places.search",
        description="Search nearby restaurants, cafes and bars by cuisine, dish or kind of "
        "place, optionally only those within a radius or open at a given time. Returns "
        "places with their id (for bookings.create), distance, hours and rating.",
        args_model=PlacesSearchArgs,
        fn=places_search,
        idempotent=True,
        output_allowlist=frozenset({"*"}),  # fixture data, nothing private
    )
