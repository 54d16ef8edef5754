"""Context budget and measuring on the real llama-server (docs/context.md): the managed server's
budget is the stream's (``budget_source: server_manager``), and prompts are measured with
its own ``/tokenize``."""

from __future__ import annotations

import pytest

from tests.integration.conftest import DEMO, Live
from toolforge.upstream.llama_server import LlamaServerUpstream


async def test_tokenize_counts_with_the_models_tokenizer(live: Live) -> None:
    upstream = live.gateway.upstream
    assert isinstance(upstream, LlamaServerUpstream)
    short = await upstream.tokenize("Hello")
    long = await upstream.tokenize("Hello, world. " * 50)
    assert 1 <= short < long
    # a real tokenizer, not characters / 4: 700 characters of repeated words are far fewer
    assert long < len("Hello, world. " * 50) // 2


@pytest.mark.timeout(300)
async def test_a_demo_stream_is_measured_by_tokenize_against_the_managed_budget(
    live: Live,
) -> None:
    # the demo, kept short: one tool call, a short answer (a shared CPU is slow)
    events = await live.stream({**DEMO, "max_tool_calls": 1, "sampling": {"max_tokens": 96}})
    begin = events[0].data
    assert begin["budget_tokens"] == 4096 and begin["budget_source"] == "server_manager"
    assert events[-1].event == "done"
    metrics = await live.metrics(begin["stream_id"])
    context = metrics["context"]
    assert context["budget_source"] == "server_manager" and context["strategy"] == "tiered"
    calls = [e for e in events if e.event == "tool.result"]
    # one measure per turn that continues after a tool result, each by /tokenize
    assert context["token_counts"] == len(calls)
    if calls:
        assert context["token_counting"] == "llama-server /tokenize"
