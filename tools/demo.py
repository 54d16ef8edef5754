"""The demo pack (the default, ``TOOL_PACKS=demo``): ``places.search`` and
``bookings.create``, deterministic over ``tools/fixtures/``.

Each call of :func:`pack_tools` builds fresh tool state (the bookings made so far), so
every app and every test starts clean.
"""

from __future__ import annotations

from typing import Any

from toolforge.core.tool_specs import ToolSpec
from toolforge.settings import Settings
from toolforge.tools.bookings import BookingBook, bookings_create_spec, load_full_slots
from toolforge.tools.places import load_places, places_search_spec

__all__ = ["pack_tools"]


def pack_tools(settings: Settings) -> list[ToolSpec[Any]]:
    """The demo tools, over one shared copy of the fixture places (``settings`` unused)."""
    del settings
    places = load_places()
    return [
        places_search_spec(places),
        bookings_create_spec(book=BookingBook(places, load_full_slots())),
    ]
