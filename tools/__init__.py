"""Demo and local tools, one module each, registered explicitly (SPEC §5).

:func:`default_registry` is what the gateway serves: the deterministic, fixture-backed demo
pack (``places.search``, ``bookings.create``). Each call builds fresh tool state (the
bookings made so far), so every app and every test starts clean.

Fixtures live in ``tools/fixtures/``; the tools' input schemas are exported to
``schemas/tools/`` by ``python -m toolforge.tools.export_schemas`` (a test fails when they drift).
"""

from __future__ import annotations

from toolforge.core.tools import ToolRegistry
from toolforge.tools.bookings import BookingBook, bookings_create_spec, load_full_slots
from toolforge.tools.places import load_places, places_search_spec

__all__ = ["default_registry"]


def default_registry() -> ToolRegistry:
    """A registry with the demo tools, over one shared copy of the fixture places."""
    places = load_places()
    return ToolRegistry(
        [
            places_search_spec(places),
            bookings_create_spec(book=BookingBook(places, load_full_slots())),
        ]
    )
