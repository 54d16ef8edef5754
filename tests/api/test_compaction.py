"""Context compaction over a whole /v1/stream (docs/context.md): a real gateway in front of the
scripted upstream on loopback, a conversation with many tool calls, a budget small enough
that it must compact.

Each case first runs the same script with compaction off and a budget nothing reaches
(``dry``), reads the history the upstream received at each turn, and computes with the
strategy itself what each phase would leave at the turn where it should fire: the budget
is then chosen so that exactly the phase under test is the first one enough. The real
run must compact there, with that phase, and the next request must show it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, Field

from tests.api.conftest import HarnessFactory, assert_well_formed, frames, sentinel_reply
from toolforge.core.context import (
    MESSAGE_OVERHEAD_TOKENS,
    TieredCompact,
    chars_per_token,
    count_text,
)
from toolforge.core.events import FrameKind
from toolforge.core.messages import Message, MessageMeta, MessageType, as_messages
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.eval.scripted_upstream import Script

KEEP_RECENT = 1
THRESHOLD = 0.75


class _DumpArgs(BaseModel):
    size: int = Field(ge=0, le=60_000)


def _registry() -> ToolRegistry:
    async def dump(args: _DumpArgs) -> dict[str, Any]:
        return {"text": "x" * args.size}

    return ToolRegistry(
        [ToolSpec(name="dump", description="Returns text.", args_model=_DumpArgs, fn=dump)]
    )


def _call(index: int, size: int) -> str:
    body = orjson.dumps({"size": size}).decode()
    return "Fetching. " + sentinels.frame(FrameKind.TOOL_CALL, f"c{index}", "dump", body)


def _scripts(sizes: Sequence[int]) -> list[Script]:
    texts = [*(_call(i, s) for i, s in enumerate(sizes)), sentinel_reply()]
    return [Script.from_tokens([text]) for text in texts]


def _measure(messages: Sequence[Mapping[str, Any]]) -> int:
    return chars_per_token(count_text(messages)) + MESSAGE_OVERHEAD_TOKENS * len(messages)


def _history(wire: list[dict[str, Any]], opening: int) -> list[Message]:
    """The engine's history for a recorded request: the opening messages as the request
    brought them, then one iteration (call, result) per turn."""
    out = as_messages(wire[:opening])
    for offset, item in enumerate(wire[opening:]):
        step = offset // 2 + 1
        kind = MessageType.TOOL_CALL if item["role"] == "assistant" else MessageType.TOOL_RESULT
        tools = ("dump",) if kind is MessageType.TOOL_CALL else ()
        out.append(Message(item, MessageMeta(kind, step, tools)))
    return out


def _phase_tokens(history: list[Message]) -> list[int]:
    return [_measure(m) for _, m in TieredCompact(KEEP_RECENT).phases(history)]


async def _dry(
    make_gateway: HarnessFactory, body: dict[str, Any], sizes: Sequence[int]
) -> list[list[dict[str, Any]]]:
    gw = await make_gateway(_scripts(sizes), tools=_registry(), context_compaction="none")
    events = await gw.stream(body)
    assert frames(events)[-1].data["reason"] == "stop"
    return [r.json["messages"] for r in gw.upstream.requests]


def _budget_for(trigger: int) -> int:
    return math.ceil(trigger / THRESHOLD)


async def _compacting_run(
    make_gateway: HarnessFactory, body: dict[str, Any], sizes: Sequence[int], *, want: int, at: int
) -> tuple[list[Any], list[list[dict[str, Any]]], dict[str, Any]]:
    """Run with the budget that makes phase ``want`` the first enough, before turn ``at``."""
    requests = await _dry(make_gateway, body, sizes)
    opening = len(requests[0])
    history = _history(requests[at], opening)
    before = _measure(history)
    phases = _phase_tokens(history)
    earlier = _measure(requests[at - 1])  # the previous check: must stay under the trigger
    low = max(phases[want - 1], earlier)  # the trigger must be at least this
    high = min(before, phases[want - 2] if want > 1 else before) - 1  # and below this
    assert low < high, (want, before, phases, earlier)
    trigger = (low + high) // 2
    budget = _budget_for(trigger)
    assert int(budget * THRESHOLD) <= high
    gw = await make_gateway(
        _scripts(sizes),
        tools=_registry(),
        budget_tokens=budget,
        context_compaction="tiered",
        context_keep_recent=KEEP_RECENT,
    )
    events = await gw.stream(body)
    assert_well_formed(events)
    begin = frames(events)[0].data
    assert begin["budget_tokens"] == budget and begin["budget_source"] == "manual"
    compacted = [e.data for e in frames(events) if e.event == "context.compacted"]
    assert compacted, "no compaction"
    first = compacted[0]
    assert first["phase"] == want
    assert first["tokens_before"] == before
    assert first["tokens_after"] == phases[want - 1] <= int(budget * THRESHOLD)
    assert first["budget_tokens"] == budget
    assert first["messages_before"] == len(history)
    assert frames(events)[-1].data["reason"] == "stop"
    metrics = await gw.metrics(begin["stream_id"])
    context = metrics["context"]
    assert context["token_counting"] == "chars/4"  # an OpenAI-compatible upstream
    assert context["budget_source"] == "manual" and context["strategy"] == "tiered"
    assert context["compactions"] == compacted
    real = [r.json["messages"] for r in gw.upstream.requests]
    assert real[:at] == requests[:at]  # nothing changed before the threshold was crossed
    return compacted, real, metrics


async def test_phase_1_truncates_old_tool_results(make_gateway: HarnessFactory) -> None:
    sizes = [12_000, 12_000]
    _, real, _ = await _compacting_run(make_gateway, {"input": "Dump twice."}, sizes, want=1, at=2)
    sent = real[2]
    old_result = sent[-3]["content"]  # the first call's result, before the recent iteration
    assert "truncated:" in old_result and len(old_result) < 300
    assert len(sent[-1]["content"]) > 12_000  # the recent iteration is whole


async def test_phase_2_stubs_old_tool_results(make_gateway: HarnessFactory) -> None:
    sizes = [600] * 12 + [20_000]
    _, real, _ = await _compacting_run(
        make_gateway, {"input": "Dump a lot.", "max_tool_calls": 20}, sizes, want=2, at=13
    )
    sent = real[13]
    stubs = [m for m in sent if m["content"] == "[result dropped to fit the context]"]
    assert len(stubs) == 12
    assert len(sent[-1]["content"]) > 20_000


async def test_phase_3_drops_old_text_and_keeps_the_steps(make_gateway: HarnessFactory) -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Earlier question."},
            {"role": "assistant", "content": "A long earlier answer. " * 400},
            {"role": "user", "content": "Now dump once."},
        ]
    }
    _, real, _ = await _compacting_run(make_gateway, body, [4_000, 4_000], want=3, at=1)
    sent = real[1]
    assert not any("A long earlier answer" in (m.get("content") or "") for m in sent)
    users = [m for m in sent if m["role"] == "user"]
    # the first user message is whole; the next one is merged into it (roles alternate)
    assert users[0]["content"].startswith("Earlier question.")
    assert "Now dump once." in users[0]["content"]
    roles = [m["role"] for m in sent[1:]]
    assert all(a != b for a, b in itertools.pairwise(roles))


async def test_the_budget_exceeded_ends_the_stream_with_its_code(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        _scripts([8_000]), tools=_registry(), budget_tokens=2_000, context_compaction="none"
    )
    events = await gw.stream({"input": "Dump once."})
    assert_well_formed(events)
    numbered = frames(events)
    assert [e.event for e in numbered[-4:]] == ["tool.call", "tool.result", "error", "done"]
    error = numbered[-2].data
    assert error["code"] == "CONTEXT_BUDGET_EXCEEDED"
    assert "2,000" in error["message"]
    assert numbered[-1].data["reason"] == "error"
    assert len(gw.upstream.requests) == 1  # the over-budget prompt was never sent
    await gw.settle(upstream_closed=False)


async def test_tiered_cuts_the_recent_result_only_as_its_last_resort(
    make_gateway: HarnessFactory,
) -> None:
    # One call whose result alone is over the budget: phases 1 to 3 have nothing older to
    # cut, so phase 4 keeps the recent result's head and tail and the stream goes on;
    # sliding, which has no such phase, still ends with the budget's error.
    gw = await make_gateway(
        _scripts([30_000]),
        tools=_registry(),
        budget_tokens=2_000,
        context_compaction="tiered",
        context_keep_recent=1,
    )
    events = await gw.stream({"input": "Dump once."})
    assert_well_formed(events)
    numbered = frames(events)
    compacted = [e.data for e in numbered if e.event == "context.compacted"]
    assert [c["phase"] for c in compacted] == [4]
    assert compacted[0]["tokens_after"] <= 2_000
    assert numbered[-1].data["reason"] == "stop"
    sent = gw.upstream.requests[1].json["messages"]
    result = sent[-1]["content"]
    assert "characters removed" in result and len(result) < 4_200
    sliding = await make_gateway(
        _scripts([30_000]),
        tools=_registry(),
        budget_tokens=2_000,
        context_compaction="sliding",
        context_keep_recent=1,
    )
    numbered = frames(await sliding.stream({"input": "Dump once."}))
    assert numbered[-2].event == "error"
    assert numbered[-2].data["code"] == "CONTEXT_BUDGET_EXCEEDED"


async def test_under_the_threshold_the_prompt_only_grows(make_gateway: HarnessFactory) -> None:
    """No compaction, no frame: every turn's prompt extends the last (the prompt cache)."""
    gw = await make_gateway(_scripts([100, 100, 100]), tools=_registry(), budget_tokens=100_000)
    events = await gw.stream({"input": "Dump thrice."})
    assert not [e for e in frames(events) if e.event == "context.compacted"]
    sent = [r.json["messages"] for r in gw.upstream.requests]
    for shorter, longer in itertools.pairwise(sent):
        assert longer[: len(shorter)] == shorter
    metrics = await gw.metrics(frames(events)[0].data["stream_id"])
    assert metrics["context"]["compactions"] == []
    assert metrics["context"]["token_counts"] == 3


async def test_no_budget_no_measuring(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(_scripts([100]), tools=_registry())
    events = await gw.stream({"input": "Dump."})
    begin = frames(events)[0].data
    assert begin["budget_tokens"] is None and "budget_source" not in begin
    metrics = await gw.metrics(begin["stream_id"])
    assert metrics["context"] is None


async def test_metadata_never_reaches_the_upstream(make_gateway: HarnessFactory) -> None:
    """The history is Message values in the engine; on the wire, the OpenAI keys alone."""
    gw = await make_gateway(_scripts([100, 100]), tools=_registry(), budget_tokens=100_000)
    await gw.stream({"input": "Dump twice."})
    last = gw.upstream.requests[-1]
    raw = last.body.decode()
    for word in ("meta", "step", "tool_result", "original_type", "MessageType"):
        assert f'"{word}"' not in raw
    for item in last.json["messages"]:
        assert set(item) <= {"role", "content"}


def _tokens(n: int) -> Script:
    return Script(end="status", status=200, body=orjson.dumps({"tokens": list(range(n))}).decode())


async def test_a_remote_llama_server_reports_its_budget_and_counts_the_tokens(
    make_gateway: HarnessFactory,
) -> None:
    """No CTX_BUDGET_TOKENS: the budget is llama-server's own /props n_ctx (source
    "upstream"), and prompts are measured with its /tokenize (metrics.json says so)."""
    props = Script(
        end="status",
        status=200,
        body=orjson.dumps({"default_generation_settings": {"n_ctx": 3000}}).decode(),
    )
    gw = await make_gateway(
        _scripts([100]),
        tools=_registry(),
        routes={"/props": props, "/tokenize": _tokens(2_500)},
        upstream_kind="llama_server",
    )
    events = await gw.stream({"input": "Dump.", "mode": "sentinel"})
    numbered = frames(events)
    begin = numbered[0].data
    assert begin["budget_tokens"] == 3000 and begin["budget_source"] == "upstream"
    # /tokenize says 2,500 tokens (plus the messages' overhead): over 0.75 × 3,000 with
    # nothing old enough to cut, but within the budget, so the stream goes on
    assert not [e for e in numbered if e.event == "context.compacted"]
    assert numbered[-1].data["reason"] == "stop"
    tokenized = [r for r in gw.upstream.all_requests if r.path == "/tokenize"]
    assert len(tokenized) == 1 and "Dump." in tokenized[0].json["content"]
    metrics = await gw.metrics(begin["stream_id"])
    assert metrics["context"]["token_counting"] == "llama-server /tokenize"


async def test_tokenize_failing_falls_back_to_chars(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        _scripts([100]),
        tools=_registry(),
        routes={"/tokenize": Script(end="status", status=404, body="{}")},
        upstream_kind="llama_server",
        budget_tokens=100_000,
    )
    events = await gw.stream({"input": "Dump.", "mode": "sentinel"})
    begin = frames(events)[0].data
    assert begin["budget_source"] == "manual"
    metrics = await gw.metrics(begin["stream_id"])
    assert metrics["context"]["token_counting"].startswith("chars/4 (/tokenize failed")
