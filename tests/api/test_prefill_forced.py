"""The booking workflow over HTTP in front of a scripted llama-server, with the text each
turn's grammar forces sent as a prefill (LLAMA_PREFILL_FORCED, the default) and without:
the server that is sent the prefix and the grammar of the middle answers with the middle
only, as llama-server does, and the client's frames are the same as when it decodes the
whole call (docs/servers.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import HarnessFactory, assert_well_formed, frames
from tests.core.gbnf_matcher import parse
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script

ASK = "Find pizza near me; book a table for 2 at 7pm."
ARGS = (
    ("t1", "places.search", '{"query": "pizza"}'),
    ("t2", "bookings.create", '{"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}'),
)


def _begin(call_id: str, name: str) -> str:
    return sentinels.begin(FrameKind.TOOL_CALL, call_id, name) + "{"


def _tokens(text: str) -> list[str]:
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def _seen(events: list[Event]) -> list[tuple[str, Any]]:
    """What a client reads, less what differs run to run (ids of runs, timings)."""
    out: list[tuple[str, Any]] = []
    for event in frames(events):
        data = dict(event.data)
        for key in ("stream_id", "duration_ms", "metrics", "usage", "booking_id"):
            data.pop(key, None)
        if event.event == "tool.result":
            data["result"] = {k: v for k, v in data["result"].items() if k != "booking_id"}
        if event.event in ("result.delta", "result.end"):
            continue  # the booking's id is random
        out.append((event.event, data))
    return out


async def _run(make_gateway: HarnessFactory, *, prefill: bool) -> tuple[list[Event], Any]:
    if prefill:  # llama-server answers with what comes after the prefill, and no suffix
        texts = [args[1:] for _, _, args in ARGS]
    else:
        texts = [sentinels.frame(FrameKind.TOOL_CALL, i, n, a) for i, n, a in ARGS]
    gw = await make_gateway(
        [Script.from_tokens(_tokens(t)) for t in texts],
        upstream_kind="llama_server",
        llama_prefill_forced=prefill,
    )
    events = await gw.stream({"input": ASK, "workflow": "book_a_table", "mode": "constrained"})
    assert_well_formed(events)
    return events, gw.upstream.requests


@pytest.mark.parametrize("prefill", [True, False])
async def test_each_turn_is_sent_as_its_setting_says(
    make_gateway: HarnessFactory, prefill: bool
) -> None:
    events, requests = await _run(make_gateway, prefill=prefill)
    assert events[-1].data["reason"] == "stop"
    assert len(requests) == 2
    for request, (call_id, name, args) in zip(requests, ARGS, strict=True):
        body = request.json
        last = body["messages"][-1]
        grammar = parse(body["grammar"])
        whole = sentinels.frame(FrameKind.TOOL_CALL, call_id, name, args)
        if prefill:
            assert last == {"role": "assistant", "content": _begin(call_id, name)}
            assert grammar.accepts(args[1:]) and not grammar.accepts(whole)
        else:
            assert last["role"] == "user"
            assert grammar.accepts(whole)
    # The second turn repeats the first call whole, prefix and suffix included: the engine
    # read the same text either way.
    echoed = next(m for m in requests[1].json["messages"] if m["role"] == "assistant")
    assert echoed["content"].startswith(_begin("t1", "places.search"))
    assert echoed["content"].endswith(sentinels.end(FrameKind.TOOL_CALL, "t1"))


async def test_the_client_reads_the_same_frames_either_way(make_gateway: HarnessFactory) -> None:
    on, _ = await _run(make_gateway, prefill=True)
    off, _ = await _run(make_gateway, prefill=False)
    assert _seen(on) == _seen(off)
    calls = [e.data for e in frames(on) if e.event == "tool.call"]
    assert [c["args"] for c in calls] == [
        {"query": "pizza"},
        {"place_id": "trattoria-roma", "time": "19:00", "party_size": 2},
    ]
    (end,) = [e.data for e in frames(on) if e.event == "result.end"]
    assert end["value"]["place_id"] == "trattoria-roma"
