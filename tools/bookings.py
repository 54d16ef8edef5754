"""``bookings.create``: reserve a table at a demo place, idempotently.

Deterministic and fixture-backed: the places come from ``places.json`` and the slots that
are already full from ``bookings.json``. Bookings live in a :class:`BookingBook` held by
the registry that created the tool (in memory, per gateway process).

* **Idempotent by its inputs.** The booking id is a hash of all the arguments, so the
  same request made twice — a retried tool call, a replayed stream — returns the same
  confirmation and books one table, not two.
* **Typed, permanent failures**, never retried: an unknown place (``NOT_FOUND``), a time
  outside opening hours (``TOOL_FAILED``, reason ``closed``) and a full slot
  (:class:`BookingFullError`, ``BOOKING_FULL``), each with a message that tells the model
  what to do instead (the free half-hour slots nearest the one asked for).
* ``guest_name`` and ``contact`` are personal data: they are in the tool's ``redact_keys``,
  so logs and artifacts never hold them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from toolforge.core.tool_specs import PermanentToolError, ToolSpec
from toolforge.errors import ErrorCode
from toolforge.tools.places import FIXTURES, Place, is_open, load_places, minutes

__all__ = [
    "SLOT_PATTERN",
    "BookingBook",
    "BookingFullError",
    "BookingsCreateArgs",
    "bookings_create_spec",
    "load_full_slots",
]

SLOT_PATTERN: Final = r"^([01][0-9]|2[0-3]):(00|30)$"
# How many free alternatives a "full" or "closed" answer suggests.
_ALTERNATIVES: Final = 3


class BookingFullError(PermanentToolError):
    """The place has no table left at that time (``BOOKING_FULL``)."""

    def __init__(self, place: Place, time: str, alternatives: Sequence[str]) -> None:
        hint = f"; free times nearby: {', '.join(alternatives)}" if alternatives else ""
        super().__init__(
            f"{place.name} is fully booked at {time}{hint}",
            code=ErrorCode.BOOKING_FULL,
            details=[
                {
                    "reason": "full",
                    "place_id": place.id,
                    "time": time,
                    "alternatives": ",".join(alternatives),
                }
            ],
        )


class BookingsCreateArgs(BaseModel):
    # No docstring: pydantic would put it in the JSON Schema the model reads. The field
    # descriptions are written for the model.

    model_config = ConfigDict(extra="forbid", title="bookings.create")

    place_id: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$",
        description='The place\'s id, as returned by places.search, e.g. "trattoria-roma".',
    )
    time: str = Field(
        pattern=SLOT_PATTERN,
        description='Reservation time today, 24-hour "HH:MM" on the hour or half hour, '
        'e.g. "19:30".',
    )
    party_size: int = Field(ge=1, le=20, description="Number of guests, 1 to 20.")
    guest_name: Annotated[str, StringConstraints(min_length=1, max_length=80)] | None = Field(
        default=None, description="Name for the reservation, if the user gave one."
    )
    contact: Annotated[str, StringConstraints(min_length=3, max_length=120)] | None = Field(
        default=None, description="Phone number or email for the reservation, if given."
    )


def load_full_slots(path: Path = FIXTURES / "bookings.json") -> frozenset[tuple[str, str]]:
    """``(place_id, "HH:MM")`` slots that are already full in the fixture."""
    doc = orjson.loads(path.read_bytes())
    return frozenset((s["place_id"], s["time"]) for s in doc["full"])


def _slot(total_minutes: int) -> str:
    return f"{total_minutes // 60 % 24:02d}:{total_minutes % 60:02d}"


class BookingBook:
    """The bookings made so far, and the fixture's full slots."""

    def __init__(
        self,
        places: Sequence[Place],
        full: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self._places = {p.id: p for p in places}
        self._full = full
        self._bookings: dict[str, dict[str, object]] = {}

    def __len__(self) -> int:
        return len(self._bookings)

    def _free_near(self, place: Place, time: str) -> list[str]:
        """Free half-hour slots nearest ``time`` (earlier first on a tie)."""
        start = minutes(time)
        candidates = [start + sign * 30 * step for step in range(1, 48) for sign in (-1, 1)]
        free = [
            _slot(m)
            for m in candidates
            if 0 <= m < 24 * 60
            and is_open(place, _slot(m))
            and (place.id, _slot(m)) not in self._full
        ]
        return free[:_ALTERNATIVES]

    def book(self, args: BookingsCreateArgs) -> dict[str, object]:
        place = self._places.get(args.place_id)
        if place is None:
            raise PermanentToolError(
                f"no place with id {args.place_id!r}; use an id returned by places.search",
                code=ErrorCode.NOT_FOUND,
                details=[{"reason": "unknown_place", "place_id": args.place_id}],
            )
        if not is_open(place, args.time):
            alternatives = self._free_near(place, args.time)
            raise PermanentToolError(
                f"{place.name} is closed at {args.time} (open {place.opens}-{place.closes}); "
                f"try {', '.join(alternatives) or 'another place'}",
                details=[{"reason": "closed", "place_id": place.id, "time": args.time}],
            )
        if (place.id, args.time) in self._full:
            raise BookingFullError(place, args.time, self._free_near(place, args.time))
        key = orjson.dumps(args.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        booking_id = "bk_" + hashlib.sha256(key).hexdigest()[:12]
        # setdefault: a repeat of the same request returns the first confirmation.
        return self._bookings.setdefault(
            booking_id,
            {
                "booking_id": booking_id,
                "status": "confirmed",
                "place_id": place.id,
                "place_name": place.name,
                "address": place.address,
                "time": args.time,
                "party_size": args.party_size,
                "guest_name": args.guest_name,
                "contact": args.contact,
            },
        )


def bookings_create_spec(
    places: Sequence[Place] | None = None, book: BookingBook | None = None
) -> ToolSpec[BookingsCreateArgs]:
    """The ``bookings.create`` tool over ``book`` (fixture places and full slots by
    default)."""
    if book is None:
        book = BookingBook(places if places is not None else load_places(), load_full_slots())
    bound = book

    async def bookings_create(args: BookingsCreateArgs) -> dict[str, object]:
        return bound.book(args)

    return ToolSpec(
        name="bookings.create",
        description="Book a table at a place found with places.search, for a time today "
        "and a party size. Booking the same request again returns the same booking. "
        "Fails with BOOKING_FULL (and nearby free times) when the slot is taken.",
        args_model=BookingsCreateArgs,
        fn=bookings_create,
        redact_keys=frozenset({"guest_name", "contact"}),
        idempotent=True,
        # docs/tools.md: what logs and artifacts keep of a booking (not who booked it).
        output_allowlist=frozenset(
            {"booking_id", "status", "place_id", "place_name", "time", "party_size"}
        ),
    )
