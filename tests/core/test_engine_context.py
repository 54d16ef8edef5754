"""The turn engine with a context budget (docs/context.md): it measures the prompt before each turn
that continues the conversation, compacts over the threshold (a context.compacted frame),
and ends with CONTEXT_BUDGET_EXCEEDED when nothing fits. Driven without an event loop."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.core.test_engine import (
    MODE_IDS,
    MODES,
    Script,
    call,
    conversation,
    deltas,
    drive,
    reply,
)
from toolforge.core.chat import UpstreamDelta
from toolforge.core.context import (
    ContextPolicy,
    CountTokens,
    NoCompact,
    SlidingWindowCompact,
    TieredCompact,
    chars_per_token,
)
from toolforge.core.engine import CallModel, Conversation, Mode, NativeMode, SentinelMode
from toolforge.core.messages import Message, MessageType
from toolforge.core.native_tools import ToolCallDelta

LONG = "x" * 4000  # the first user message: big, never cut


class Counting(Conversation):
    """Answers the engine's CountTokens itself (characters / 4) and keeps what it counted."""

    counted: list[str]

    def flow(self) -> Generator[Any, Any, None]:
        self.counted = []
        inner = super().flow()
        action = next(inner)
        while True:
            if isinstance(action, CountTokens):
                self.counted.append(action.text)
                action = inner.send(chars_per_token(action.text))
                continue
            result = yield action
            try:
                action = inner.send(result)
            except StopIteration:
                return


def _counting(mode: Mode, policy: ContextPolicy | None, **config: Any) -> Counting:
    base = conversation(
        mode, messages=[{"role": "user", "content": "hi"}], context=policy, **config
    )
    return Counting(base.config)


def _tool_turn(mode: Mode, index: int) -> list[UpstreamDelta]:
    if isinstance(mode, NativeMode):
        piece = ToolCallDelta(0, f"c{index}", "places__search", '{"query": "pizza"}')
        return [
            UpstreamDelta("", tool_calls=(piece,)),
            UpstreamDelta("", finish_reason="tool_calls"),
        ]
    return deltas(call(f"t{index}"))


def _script(mode: Mode, calls: int) -> Script:
    return Script([*(_tool_turn(mode, i) for i in range(1, calls + 1)), deltas(reply())])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_each_continuation_is_measured_and_no_compaction_under_the_threshold(mode: Mode) -> None:
    engine = _counting(mode, ContextPolicy(TieredCompact(), 100_000, "manual"))
    run = drive(engine, _script(mode, 3))
    assert len(engine.counted) == 3  # one per turn after a tool result, none before the first
    assert "context.compacted" not in run.events
    begin = run.frames[0].data
    assert begin["budget_tokens"] == 100_000 and begin["budget_source"] == "manual"
    assert run.finish.reason == "stop"


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_over_the_threshold_the_history_is_compacted(mode: Mode) -> None:
    # 5 calls, keep_recent 1: the prompt grows by a call and a result each turn; with a
    # budget this small the older results are cut, and the later requests show it
    budget = 250 if isinstance(mode, NativeMode) else 400  # native's messages are shorter
    engine = _counting(mode, ContextPolicy(TieredCompact(keep_recent=1), budget, "workflow"))
    run = drive(engine, _script(mode, 5))
    compacted = [f.data for f in run.frames if f.event == "context.compacted"]
    assert compacted and all(c["tokens_after"] <= c["tokens_before"] for c in compacted)
    assert engine.stats.compactions == compacted
    assert run.finish.reason == "stop"
    last = run.kinds(CallModel)[-1].request.messages
    assert all(isinstance(m, Message) for m in last[1:])
    results = [m for m in last if m.meta.original_type is MessageType.TOOL_RESULT]
    assert results, "the old results were not compacted"
    steps = [m.meta.step for m in last if m.meta.type is MessageType.TOOL_CALL]
    assert steps == sorted(steps) and steps[-1] == 5


def test_over_the_budget_with_nothing_to_cut_ends_the_stream() -> None:
    engine = _counting(NativeMode(), ContextPolicy(NoCompact(), 20, "manual"))
    run = drive(engine, _script(NativeMode(), 2))
    assert run.events[-1] == "error"
    assert run.frames[-1].data["code"] == "CONTEXT_BUDGET_EXCEEDED"
    assert run.finish.reason == "error"
    assert len(run.kinds(CallModel)) == 1  # the over-budget prompt never went out


def test_a_long_first_prompt_is_measured_only_when_asked() -> None:
    messages = [{"role": "user", "content": LONG}]
    policy = ContextPolicy(TieredCompact(), 600, "workflow")
    plain = Counting(conversation(messages=messages, context=policy).config)
    drive(plain, Script([deltas(reply())]))
    assert plain.counted == []
    asked = Counting(conversation(messages=messages, context=policy, fit_first_turn=True).config)
    run = drive(asked, Script([deltas(reply())]))
    assert len(asked.counted) == 1
    assert run.frames[-1].data["code"] == "CONTEXT_BUDGET_EXCEEDED"


@pytest.mark.parametrize("given", [True, False])
def test_the_step_hint_survives_a_sliding_window(given: bool) -> None:
    """The dropped iterations' steps stay in the summary: the caller's hint (a workflow's
    step tracker) when given, else the tools whose calls succeeded."""
    hint = "[Steps completed: search, pick]"
    engine = _counting(
        SentinelMode(),
        ContextPolicy(SlidingWindowCompact(keep_recent=1), 400, "workflow"),
        step_hint=(lambda: hint) if given else None,
    )
    run = drive(engine, _script(SentinelMode(), 6))
    assert "context.compacted" in run.events
    first_user = run.kinds(CallModel)[-1].request.messages[0]["content"]
    assert first_user.startswith("hi")
    assert (hint if given else "[Steps completed: places.search]") in first_user
    assert run.finish.reason == "stop"
