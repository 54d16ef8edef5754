"""``GET /metrics`` after a scripted stream: content negotiation (OpenMetrics from the
Accept header) and the values the stream left: model and mode labels, prompt and
completion tokens from the upstream's usage, the tool-latency histogram, the queue
depth gauges (docs/protocol.md, docs/tools.md)."""

from __future__ import annotations

import asyncio

import orjson
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import open_raw_stream
from toolforge.eval.scripted_upstream import Script

SEARCH = {"query": "pizza"}


def _call() -> str:
    return sentinels.frame(
        FrameKind.TOOL_CALL, "t1", "places.search", orjson.dumps(SEARCH).decode()
    )


def _samples(families: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families  # type: ignore[attr-defined]
        for s in family.samples
    }


async def test_metrics_after_a_scripted_stream(make_gateway: HarnessFactory) -> None:
    first = Script.from_tokens([_call()], usage={"prompt_tokens": 300, "completion_tokens": 12})
    second = Script.from_tokens(
        [sentinel_reply("Roma.")], usage={"prompt_tokens": 340, "completion_tokens": 9}
    )
    gw = await make_gateway([first, second], model_id="scripted-model")
    events = await gw.stream({"input": "Find pizza", "profile": "demo"})
    assert_well_formed(events)

    plain = await gw.client.get(f"{gw.url}/metrics")
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"# EOF" not in plain.content

    accept = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"
    om = await gw.client.get(f"{gw.url}/metrics", headers={"Accept": accept})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    strict = _samples(openmetrics_families(om.text))  # raises on anything not OpenMetrics
    assert strict[("toolforge_tool_calls_total", (("name", "places.search"), ("outcome", "ok")))]

    values = _samples(text_string_to_metric_families(plain.text))
    done = next(e.data for e in events if e.event == "done")
    begin = next(e.data for e in events if e.event == "stream.begin")
    labels = (("mode", begin["mode"]), ("model", "scripted-model"))
    outcome = tuple(sorted((*labels, ("outcome", done["reason"]))))
    assert values[("toolforge_streams_total", outcome)] == 1
    # Tokens as the upstream reported them: what the done frame's usage says. (The first
    # turn stops at the tool call's END, before its usage chunk.)
    assert values[("toolforge_prompt_tokens_total", labels)] == done["usage"]["prompt_tokens"]
    assert values[("toolforge_tokens_total", labels)] == done["usage"]["completion_tokens"]
    assert done["usage"]["prompt_tokens"] >= 340
    assert values[("toolforge_ttft_seconds_count", labels)] == 1
    tool = (("name", "places.search"),)
    assert values[("toolforge_tool_duration_seconds_count", tool)] == 1
    assert 0 < values[("toolforge_tool_duration_seconds_sum", tool)] < 5
    assert values[("toolforge_tool_queue_depth", ())] == 0
    assert values[("toolforge_frame_queue_depth", ())] == 0  # the stream has ended


async def test_the_frame_queue_gauge_shows_a_stalled_client(make_gateway: HarnessFactory) -> None:
    # As test_faults' slow client: 10 KB frames, a queue of 8, a client that stops reading.
    script = Script.from_tokens(["x" * 10_000] * 2000)  # far more than socket buffers hold
    gw = await make_gateway([script], queue_max_frames=8)
    reader, writer = await open_raw_stream(gw, {"input": "x"}, rcvbuf=4096)
    await reader.readuntil(b"event: stream.begin")
    await asyncio.sleep(0.5)  # the client stalls; the queue fills and the model pauses

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return _samples(text_string_to_metric_families(plain.text))

    plain = await gw.client.get(f"{gw.url}/metrics")
    stalled = scrape()
    assert 1 <= stalled[("toolforge_frame_queue_depth", ())] <= 8
    assert stalled[("toolforge_streams_active", ())] == 1
    while b"event: done" not in (chunk := await reader.read(1 << 16)) and chunk:
        pass
    writer.close()
    await gw.settle()
    plain = await gw.client.get(f"{gw.url}/metrics")
    drained = scrape()
    assert drained[("toolforge_frame_queue_depth", ())] == 0
    assert drained[("toolforge_queue_paused_seconds_total", ())] > 0
