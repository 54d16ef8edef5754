"""Context compaction (docs/context.md): the strategies' properties, and the manager's decisions."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolforge.core.context import (
    LAST_RESORT_PHASE,
    MESSAGE_OVERHEAD_TOKENS,
    ContextBudgetExceeded,
    ContextPolicy,
    CountTokens,
    NoCompact,
    SlidingWindowCompact,
    TieredCompact,
    chars_per_token,
    compact,
    count_text,
    estimate_tokens,
    run_compaction,
    strategy_named,
)
from toolforge.core.messages import (
    Message,
    MessageMeta,
    MessageType,
    as_messages,
    message,
    wire_messages,
)
from toolforge.errors import ErrorCode

SYSTEM = "You are a careful agent. " * 10
FIRST = "Find a place in Paris and book it for two."
TOOLS = ("places.search", "places.book", "weather.get", "calc.add")


def _call(step: int, name: str, native: bool) -> list[Message]:
    if native:
        return [
            message(
                "assistant",
                "",
                MessageType.TOOL_CALL,
                step=step,
                tools=(name,),
                tool_calls=[
                    {
                        "id": f"call_{step}",
                        "type": "function",
                        "function": {"name": name, "arguments": '{"q":"x"}'},
                    }
                ],
            )
        ]
    text = f"⟦BEGIN_TOOL_CALL id=t{step} name={name}⟧{{}}⟦END_TOOL_CALL id=t{step}⟧"
    return [message("assistant", text, MessageType.TOOL_CALL, step=step, tools=(name,))]


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Histories as the engine builds them: the opening messages, then iterations of a
    tool call and its result(s), or a failed attempt and its nudge."""
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(message("system", SYSTEM, MessageType.SYSTEM_PROMPT))
    out.append(message("user", FIRST, MessageType.USER_INPUT))
    for step in range(1, draw(st.integers(0, 9)) + 1):
        kind = draw(st.sampled_from(["sentinel", "native", "nudge"]))
        result_text = draw(st.text(alphabet="abcdefgh {}:,", min_size=0, max_size=900))
        if kind == "nudge":
            out.append(message("assistant", "I think", MessageType.TEXT_RESPONSE, step=step))
            nudge = draw(st.sampled_from([MessageType.RETRY_NUDGE, MessageType.STEP_NUDGE]))
            out.append(message("user", "Call a tool now.", nudge, step=step))
            continue
        name = draw(st.sampled_from(TOOLS))
        native = kind == "native"
        out += _call(step, name, native)
        if native:
            out.append(
                message(
                    "tool",
                    result_text,
                    MessageType.TOOL_RESULT,
                    step=step,
                    tools=(name,),
                    tool_call_id=f"call_{step}",
                )
            )
        else:
            out.append(
                message("user", f"Result: {result_text}", MessageType.TOOL_RESULT, step=step)
            )
    return out


STRATEGIES = st.sampled_from(["tiered", "sliding"])


def _phases(
    name: str, keep: int, history: list[Message], hint: str = "", *, last_resort: bool = True
) -> list[list[Message]]:
    return [
        m
        for n, m in strategy_named(name, keep).phases(history, step_hint=hint)
        if last_resort or n < LAST_RESORT_PHASE
    ]


def _opening(history: list[Message]) -> int:
    return next(i for i, m in enumerate(history) if m.role == "user") + 1


def _recent(history: list[Message], keep: int) -> list[Message]:
    opening = _opening(history)
    steps = list(dict.fromkeys(m.meta.step for m in history[opening:]))
    recent = set(steps[-keep:]) if keep else set()
    return [m for m in history[opening:] if m.meta.step in recent]


@settings(max_examples=300, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4))
def test_the_system_prompt_and_the_first_user_message_are_never_cut(
    history: list[Message], name: str, keep: int
) -> None:
    for phase in _phases(name, keep, history):
        if history[0].role == "system":
            assert phase[0].role == "system" and phase[0].content == SYSTEM
        first = next(m for m in phase if m.role == "user")
        assert first.content.startswith(FIRST)
        assert first.meta.type is MessageType.USER_INPUT


@settings(max_examples=300, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4))
def test_the_last_keep_recent_iterations_stay_intact(
    history: list[Message], name: str, keep: int
) -> None:
    recent = _recent(history, keep)
    for phase in _phases(name, keep, history, last_resort=False):
        tail = phase[len(phase) - len(recent) :] if recent else []
        assert [(dict(m), m.meta) for m in tail] == [(dict(m), m.meta) for m in recent]


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(0, 4), st.integers(300, 9000))
def test_the_last_resort_keeps_a_recent_results_head_and_tail_only(
    history: list[Message], keep: int, size: int
) -> None:
    # Phase 4 (only over the budget itself) cuts the middle of the recent iterations'
    # long tool results; everything else in them stays as it was.
    long_text = "".join(f"line {i}\n" for i in range(size // 7))
    history = [
        m.with_content(long_text, m.meta) if m.meta.type is MessageType.TOOL_RESULT else m
        for m in history
    ]
    recent = _recent(history, keep)
    for number, phase in TieredCompact(keep).phases(history):
        if number < LAST_RESORT_PHASE:
            continue
        tail = phase[len(phase) - len(recent) :] if recent else []
        for before, after in zip(recent, tail, strict=True):
            if before.meta.type is not MessageType.TOOL_RESULT:
                assert (dict(after), after.meta) == (dict(before), before.meta)
                continue
            head, _, rest = after.content.partition(" [… ")
            assert before.content.startswith(head)
            assert before.content.endswith(rest.split(" characters removed …] ", 1)[-1])
            assert len(after.content) <= len(before.content)


@settings(max_examples=300, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4))
def test_phases_never_increase_tokens(history: list[Message], name: str, keep: int) -> None:
    tokens = estimate_tokens(history)
    for phase in _phases(name, keep, history):
        after = estimate_tokens(phase)
        assert after <= tokens
        tokens = after


@settings(max_examples=300, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4), st.booleans())
def test_step_completion_survives_any_compaction(
    history: list[Message], name: str, keep: int, tracked: bool
) -> None:
    """Every tool called is still visible: a call that survives, or the step hint."""
    called = list(
        dict.fromkeys(
            n for m in history if m.meta.type is MessageType.TOOL_CALL for n in m.meta.tools
        )
    )
    hint = f"[Steps completed: {', '.join(called)}]" if tracked and called else ""
    for phase in _phases(name, keep, history, hint):
        calls = {n for m in phase if m.meta.type is MessageType.TOOL_CALL for n in m.meta.tools}
        text = next(m for m in phase if m.role == "user").content
        for tool in called:
            assert tool in calls or tool in text


@settings(max_examples=200, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4))
def test_roles_still_alternate_where_they_did(history: list[Message], name: str, keep: int) -> None:
    def pairs(ms: list[Message]) -> int:
        return sum(1 for a, b in itertools.pairwise(ms) if a.role == b.role and a.plain and b.plain)

    for phase in _phases(name, keep, history):
        assert pairs(phase) <= pairs(history)


@settings(max_examples=200, deadline=None)
@given(histories(), STRATEGIES, st.integers(0, 4))
def test_compaction_never_mutates_its_input(history: list[Message], name: str, keep: int) -> None:
    before = [(dict(m), m.meta) for m in history]
    _phases(name, keep, history)
    assert [(dict(m), m.meta) for m in history] == before


# -- the phases, one by one ------------------------------------------------------------------


def _long_history(iterations: int = 6, result_chars: int = 1200) -> list[Message]:
    out = [
        message("system", SYSTEM, MessageType.SYSTEM_PROMPT),
        message("user", FIRST, MessageType.USER_INPUT),
    ]
    for step in range(1, iterations + 1):
        out.append(message("assistant", "Let me think.", MessageType.TEXT_RESPONSE, step=step))
        out.append(message("user", "That was no tool call.", MessageType.RETRY_NUDGE, step=step))
        out += _call(step, TOOLS[step % 2], native=True)
        out.append(
            message(
                "tool",
                "x" * result_chars,
                MessageType.TOOL_RESULT,
                step=step,
                tool_call_id=f"call_{step}",
            )
        )
    return out


def test_tiered_phase_1_drops_nudges_and_truncates_old_results() -> None:
    history = _long_history()
    phase1 = next(iter(TieredCompact(keep_recent=2).phases(history)))[1]
    old = [m for m in phase1 if m.meta.step in (1, 2, 3, 4)]
    assert not [m for m in old if m.meta.type is MessageType.RETRY_NUDGE]
    results = [m for m in old if m.role == "tool"]
    assert len(results) == 4
    assert all(
        m.content.startswith("x" * 200) and "truncated: 1,000 of 1,200" in m.content
        for m in results
    )
    assert all(m.meta.original_type is MessageType.TOOL_RESULT for m in results)
    recent = [m for m in phase1 if m.meta.step in (5, 6)]
    assert len([m for m in recent if m.meta.type is MessageType.RETRY_NUDGE]) == 2


def test_tiered_phase_2_stubs_old_results_and_phase_3_keeps_the_skeleton() -> None:
    history = _long_history()
    _, phase2, phase3 = (m for n, m in TieredCompact(keep_recent=1).phases(history) if n < 4)
    old2 = [m for m in phase2 if m.meta.step in (1, 2, 3, 4, 5)]
    assert all(m.content == "[result dropped to fit the context]" for m in old2 if m.role == "tool")
    # every call still has its answer (OpenAI and Anthropic both require one)
    ids = [c["id"] for m in phase2 for c in m.get("tool_calls") or ()]
    assert ids == [m["tool_call_id"] for m in phase2 if m.role == "tool"]
    old3 = [m for m in phase3 if m.meta.step in (1, 2, 3, 4, 5)]
    assert {m.meta.type for m in old3} == {MessageType.TOOL_CALL, MessageType.SUMMARY}
    assert "[Steps completed: places.book, places.search]" in phase3[1].content


def test_sliding_keeps_the_last_iterations_and_the_hint() -> None:
    history = _long_history()
    (phase, kept), *_ = SlidingWindowCompact(keep_recent=2).phases(history)
    assert phase == 1
    assert {m.meta.step for m in kept[2:]} == {5, 6}
    assert kept[1].content.endswith("[Steps completed: places.book, places.search]")


def test_nothing_to_cut_offers_no_phase() -> None:
    history = _long_history(iterations=2)
    # Nothing old to cut: only the last resort (the recent results' middle) is left.
    assert {n for n, _ in TieredCompact(keep_recent=2).phases(history)} == {4}
    short = _long_history(iterations=2, result_chars=300)
    assert list(TieredCompact(keep_recent=2).phases(short)) == []
    assert list(SlidingWindowCompact(keep_recent=2).phases(history)) == []
    assert list(NoCompact().phases(history)) == []


# -- the manager -------------------------------------------------------------------------------


def _measured(history: list[Message]) -> int:
    """What the manager measures with the chars/4 counter: the whole text, plus each
    message's overhead."""
    return chars_per_token(count_text(history)) + MESSAGE_OVERHEAD_TOKENS * len(history)


def _policy(strategy: Any, budget: int, threshold: float = 0.75) -> ContextPolicy:
    return ContextPolicy(strategy, budget, "manual", threshold)


def test_under_the_threshold_nothing_changes() -> None:
    history = _long_history()
    tokens = estimate_tokens(history)
    assert run_compaction(_policy(TieredCompact(), int(tokens / 0.75) + 10), history) is None


@pytest.mark.parametrize("want", [1, 2, 3])
def test_each_phase_runs_only_when_the_last_was_not_enough(want: int) -> None:
    history = _long_history()
    phases = [_measured(m) for _, m in TieredCompact(keep_recent=1).phases(history)]
    # a trigger just above phase `want`'s size and below the one before it
    trigger = phases[want - 1] + 1
    budget = int(trigger / 0.75) + 1
    done = run_compaction(_policy(TieredCompact(keep_recent=1), budget), history)
    assert done is not None
    assert done.phase == want
    assert done.tokens_after == phases[want - 1] <= done.budget_tokens
    assert done.tokens_before == _measured(history)
    assert done.messages_before == len(history) and done.messages_after == len(done.messages)


def test_over_the_budget_with_nothing_left_to_cut_is_an_error() -> None:
    history = _long_history()
    with pytest.raises(ContextBudgetExceeded) as caught:
        run_compaction(_policy(NoCompact(), 600), history)
    assert caught.value.code is ErrorCode.CONTEXT_BUDGET_EXCEEDED
    assert caught.value.budget_tokens == 600
    with pytest.raises(ContextBudgetExceeded):
        run_compaction(_policy(TieredCompact(), 200), history)


def test_over_the_threshold_but_within_the_budget_goes_on_as_is() -> None:
    history = _long_history(iterations=2)
    tokens = estimate_tokens(history)
    assert run_compaction(_policy(TieredCompact(), tokens + 1), history) is None


def test_the_last_resort_cuts_a_recent_result_only_over_the_budget() -> None:
    # A log of 9,000 characters in the last iteration, which phases 1 to 3 never touch:
    # over the budget itself, its middle goes (its first and last lines stay) and the run
    # goes on; within the budget (over the threshold only), it stays whole.
    log = "".join(f"2026-11-07 07:{i % 60:02d} INFO worker heartbeat ok\n" for i in range(200))
    log += "2026-11-07 07:17:07 ERROR payment E-4417 timeout"
    history = [
        *_long_history(iterations=1, result_chars=10),
        *_call(2, "fetch_log", native=True),
        message("tool", log, MessageType.TOOL_RESULT, step=2, tool_call_id="call_2"),
    ]
    tokens = estimate_tokens(history)
    done = run_compaction(_policy(TieredCompact(keep_recent=1), tokens // 3), history)
    assert done is not None and done.phase == LAST_RESORT_PHASE
    assert done.tokens_after <= tokens // 3
    cut = done.messages[-1].content
    assert cut.startswith("2026-11-07 07:00 INFO") and cut.endswith("E-4417 timeout")
    assert "characters removed" in cut
    within = run_compaction(_policy(TieredCompact(keep_recent=1), tokens + 10), history)
    assert within is None or all(
        m.content == log for m in within.messages if m.meta.step == 2 and m.role == "tool"
    )


def test_the_manager_asks_the_driver_to_count() -> None:
    """Sans-IO: each measure is a CountTokens action; the answer is the text's tokens."""
    history = _long_history()
    flow = compact(_policy(TieredCompact(), 10_000), history)
    action = next(flow)
    assert isinstance(action, CountTokens)
    assert "x" * 1200 in action.text
    with pytest.raises(StopIteration) as stop:
        flow.send(10)  # a tiny count: under the threshold
    assert stop.value.value is None


def test_plain_mappings_are_classified() -> None:
    history = as_messages(
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
            {"role": "tool", "content": "r", "tool_call_id": "1"},
        ]
    )
    assert [m.meta.type for m in history] == [
        MessageType.SYSTEM_PROMPT,
        MessageType.USER_INPUT,
        MessageType.TEXT_RESPONSE,
        MessageType.TOOL_CALL,
        MessageType.TOOL_RESULT,
    ]
    assert history[3].meta.tools == ("f",)


def test_metadata_is_not_part_of_the_wire_form() -> None:
    item = message("user", "hi", MessageType.STEP_NUDGE, step=3)
    assert item == {"role": "user", "content": "hi"}
    assert dict(item) == {"role": "user", "content": "hi"}
    wire = wire_messages([{"role": "system", "content": "s"}, item])
    assert orjson.loads(orjson.dumps(wire)) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
    ]
    plain = [{"role": "user", "content": "x"}]
    assert wire_messages(plain) is plain
    assert item.meta == MessageMeta(MessageType.STEP_NUDGE, 3)


def test_a_later_hint_replaces_the_earlier_one() -> None:
    history = _long_history()
    (_, once), *_ = SlidingWindowCompact(keep_recent=4).phases(
        history, step_hint="[Steps completed: a]"
    )
    more = [*once, *_long_history(iterations=9)[len(_long_history(iterations=6)) :]]
    (_, twice), *_ = SlidingWindowCompact(keep_recent=2).phases(
        more, step_hint="[Steps completed: a, b]"
    )
    assert twice[1].content == f"{FIRST}\n\n[Steps completed: a, b]"
