"""The demo request on the real SmolLM2-135M in constrained mode (docs/protocol.md,
docs/servers.md): the grammar makes a 135M model call the tool with well-formed frames, answer with
a valid reply, and resume after the tool from the prompt cache."""

from __future__ import annotations

from tests.integration.conftest import DEMO, Live
from toolforge.core.guarantee import validate
from toolforge.core.schemas import builtin_registry


async def test_the_demo_request_calls_the_tool_then_answers(live: Live) -> None:
    events = await live.stream(DEMO)
    names = [e.event for e in events]
    begin, done = events[0], events[-1]
    assert begin.data["mode"] == "constrained" and begin.data["budget_tokens"] == 4096
    assert "error" not in names, [e.data for e in events if e.event == "error"]
    calls = [e.data for e in events if e.event == "tool.call"]
    results = [e.data for e in events if e.event == "tool.result"]
    assert calls and calls[0]["name"] == "places.search"
    assert len(results) == len(calls) and results[0]["ok"] is True
    assert names.index("tool.result") > names.index("tool.call")
    (end,) = [e.data for e in events if e.event == "result.end"]
    assert end["degraded"] is False
    assert validate(builtin_registry().get("AssistantReply"), end["value"]) == []
    assert done.event == "done" and done.data["reason"] == "stop"
    metrics = await live.metrics(begin.data["stream_id"])
    assert metrics["budget"]["device"] == "cpu" and metrics["degraded_frames"] == 0


async def test_the_resumed_turn_comes_from_the_prompt_cache(live: Live) -> None:
    events = await live.stream(DEMO)
    metrics = await live.metrics(events[0].data["stream_id"])
    timings = metrics["upstream_timings"]
    assert len(timings) >= 2, metrics  # a tool call, then the resumed turn
    first, resumed = timings[0], timings[1]
    # The first turn's whole prompt came from the cache: only the model's call and the
    # tool result (up to five places, hundreds of tokens) are read anew.
    assert resumed["cache_n"] >= first["prompt_n"] + first["cache_n"], timings
    assert len(metrics["turn_ttft_ms"]) == len(timings)


async def test_seeded_runs_emit_no_malformed_frame(live: Live) -> None:
    for seed in (1, 2, 3):
        body = {**DEMO, "sampling": {"seed": seed, "temperature": 0.8}}
        events = await live.stream(body)
        errors = [e.data for e in events if e.event == "error"]
        assert errors == [], (seed, errors)
        ends = [e.data for e in events if e.event in ("json.end", "result.end")]
        assert all(not end["degraded"] for end in ends), (seed, ends)
