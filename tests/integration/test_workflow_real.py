"""The booking workflow on the real SmolLM2-135M (SPEC §7), constrained mode: the runner's
steps and the narrowed grammar make a 135M model search, then book a place the search
returned. Asserts the protocol and the step order, never the model's wording."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import Live

pytestmark = pytest.mark.real

# The README's demo request, as the booking workflow, at one of the bench's seeds.
BODY: dict[str, Any] = {
    "input": "Find pizza near me; book a table for 2 at 7pm if open.",
    "workflow": "book_a_table",
    "mode": "constrained",
    "profile": "demo",
}


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # A loaded machine reads the prompt in minutes and writes a few tokens a second.
    return {"frame_timeout_ms": 600_000, "upstream_first_byte_timeout_s": 600}


async def test_the_booking_workflow_completes_on_the_embedded_model(live: Live) -> None:
    events = await live.stream(BODY)
    names = [e.event for e in events if e.event != "text.delta"]
    assert names[0] == "stream.begin" and names[-1] == "done"
    assert "error" not in names, [e.data for e in events if e.event == "error"]
    calls = [e.data for e in events if e.event == "tool.call"]
    results = [e.data for e in events if e.event == "tool.result"]
    # The step order: a search, then a booking (nothing else is offered in between).
    assert [c["name"] for c in calls] == ["places.search", "bookings.create"]
    assert all(r["ok"] for r in results)
    searched = {p["id"] for p in results[0]["result"]["places"]}
    assert calls[1]["args"]["place_id"] in searched  # the narrowed grammar's doing
    (end,) = [e.data for e in events if e.event == "result.end"]
    assert end["value"]["place_id"] == calls[1]["args"]["place_id"]
    done = events[-1].data
    assert done["reason"] == "stop"
    assert done["workflow"]["completed_steps"] == ["places.search", "bookings.create"]
    assert done["workflow"]["iterations"] == 2 and done["workflow"]["nudges"] == 0
