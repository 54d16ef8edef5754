"""The booking workflow on the real SmolLM2-135M (docs/workflows.md), constrained mode: the runner's
steps and the narrowed grammar make a 135M model search, then book a place the search
returned, at the time and for the party the user asked. Asserts the protocol and the step
order, never the model's wording."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

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
    # The step order: one or more searches (a query of the user's words that finds
    # nothing is followed by one of their other words), then the booking, last.
    names = [c["name"] for c in calls]
    assert names[-1] == "bookings.create" and "places.search" in names
    assert names.index("places.search") < names.index("bookings.create")
    booking = calls[-1]
    assert results[-1]["ok"] and results[-1]["id"] == booking["id"]
    searched = {
        p["id"]
        for r in results
        if r["ok"] and r["name"] == "places.search"
        for p in r["result"]["places"]
    }
    assert booking["args"]["place_id"] in searched  # the narrowed grammar's doing
    # "for 2 at 7pm": grounded, every booking attempt is at 19:00 for 2.
    for call in calls:
        if call["name"] == "bookings.create":
            assert (call["args"]["time"], call["args"]["party_size"]) == ("19:00", 2), call
    (end,) = [e.data for e in events if e.event == "result.end"]
    assert end["value"]["place_id"] == booking["args"]["place_id"]
    done = events[-1].data
    assert done["reason"] == "stop"
    assert done["workflow"]["completed_steps"] == ["places.search", "bookings.create"]
    assert done["workflow"]["iterations"] == len(calls) and done["workflow"]["nudges"] == 0


async def test_the_booking_workflow_through_the_openai_sdk(live: Live) -> None:
    """The same run asked for with the official OpenAI SDK (``toolforge.workflow``): the
    completion's content is the booking, of a place the search returned."""
    async with AsyncOpenAI(
        base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=1200
    ) as sdk:
        reply = await sdk.chat.completions.create(
            model="toolforge",
            messages=[{"role": "user", "content": BODY["input"]}],
            temperature=0.2,
            seed=42,
            max_tokens=384,
            extra_body={"toolforge": {"workflow": "book_a_table"}},
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    booking = orjson.loads(choice.message.content or "")
    trace = (reply.model_extra or {})["toolforge"]
    assert trace["mode"] == "constrained"
    calls = trace["server_tools"]
    searched = {
        p["id"]
        for c in calls
        if c["name"] == "places.search" and c.get("ok")
        for p in c["result"]["places"]
    }
    assert calls[-1]["name"] == "bookings.create" and calls[-1]["ok"]
    assert booking["place_id"] == calls[-1]["args"]["place_id"] in searched
    assert trace["workflow"]["completed_steps"] == ["places.search", "bookings.create"]
