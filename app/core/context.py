"""Context budget and compaction (docs/context.md). No I/O.

Theory of operation
-------------------
Before each model call that continues a conversation (the turn after a tool result), the
engine measures the prompt — :func:`compact` yields :class:`CountTokens` and is sent back
the number of tokens of its text (llama-server's ``/tokenize`` when the runtime has it,
characters / 4 otherwise: :func:`chars_per_token`) — and compares it with the budget. At
or under ``threshold × budget`` (0.75) nothing happens. Over it, the policy's strategy
offers compacted *copies* of the history, one per phase, each cutting more than the last;
the first that is under the threshold is taken (or else the last one that cut anything;
a phase that cuts nothing more is not reported as reached). The history then *is*
the compacted one: later turns grow from it, and compaction fires again only when they
cross the threshold again.

Why only over the threshold: compaction rewrites the middle of the prompt, so the model
server's prompt cache (llama-server's ``cache_prompt``, which reuses the longest common
prefix) is lost from the first changed message on, and the next turn re-reads everything
after it. Under the threshold the history only grows at its end, and every resumed turn
reuses the cache. The summary (the step hint) goes at the end of the first user message,
so the system prompt's cache survives even a compaction.

Strategies (``compaction`` of a workflow, ``CONTEXT_COMPACTION`` for ``/v1/stream``):

* :class:`NoCompact` — never. Over the budget the stream ends with
  ``CONTEXT_BUDGET_EXCEEDED``.
* :class:`SlidingWindowCompact` — the opening messages (system prompt, the user's first
  message) and the last ``keep_recent`` iterations; older ones go, and the step hint
  (``[Steps completed: …]``) is appended to the user's first message (phase 1).
* :class:`TieredCompact` — three phases (docs/context.md), each over the previous one's output,
  touching only iterations older than the last ``keep_recent``:

  1. nudges dropped; tool results longer than 200 characters truncated to 200;
  2. tool results replaced by a one-line stub (not removed: an OpenAI ``tool`` message
     answers its call's id, and every template wants the roles to alternate);
  3. reasoning and failed text attempts dropped: only the tool-call skeleton is left,
     and the step hint is the checkpoint.

An *iteration* is the messages one model turn made (its call and the results and nudges
that followed it): they share ``MessageMeta.step``. The opening messages — up to and
including the first user message — are never cut, nor the last ``keep_recent``
iterations. Control flow (which steps are done) is not in the history at all: a workflow
tracks it outside (docs/context.md), so compaction cannot undo a completed step.

Messages that compaction leaves side by side with the same role (a nudge's reply after
its nudge went) are merged into one, so the roles still alternate.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Protocol

import orjson

from toolforge.core.messages import (
    Message,
    MessageMeta,
    MessageType,
    as_messages,
    first_user_index,
)
from toolforge.errors import ErrorCode, ToolForgeError

__all__ = [
    "DEFAULT_THRESHOLD",
    "MESSAGE_OVERHEAD_TOKENS",
    "TRUNCATE_CHARS",
    "BudgetSource",
    "CompactStrategy",
    "Compaction",
    "ContextBudgetExceeded",
    "ContextPolicy",
    "CountTokens",
    "NoCompact",
    "SlidingWindowCompact",
    "StrategyName",
    "TieredCompact",
    "chars_per_token",
    "compact",
    "count_text",
    "estimate_tokens",
    "run_compaction",
    "steps_hint",
    "strategy_named",
    "workflow_context",
]

DEFAULT_THRESHOLD: Final = 0.75
"""Compact when the prompt is over this share of the budget (docs/context.md): the rest is room
for the reply."""

MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Tokens a chat template adds per message (role markers, separators): counted on top of
the text, whichever way the text is counted."""

TRUNCATE_CHARS: Final = 200
"""Tiered phase 1 keeps this many characters of an old tool result (docs/context.md)."""

_STUB: Final = "[result dropped to fit the context]"
_HINT_MARK: Final = "\n\n[Steps completed:"

StrategyName = Literal["tiered", "sliding", "none"]
BudgetSource = Literal["server_manager", "manual", "upstream", "workflow"]
"""Where a context budget came from (``stream.begin.budget_source``): the gateway's own
decision for the model server it manages; ``CTX_BUDGET_TOKENS`` for a remote upstream;
the remote upstream's own report (llama-server ``/props`` n_ctx, Ollama's ``num_ctx``);
or the workflow's ``budget_tokens``."""


class ContextBudgetExceeded(ToolForgeError):
    """The prompt is over the budget and nothing is left to compact (docs/context.md)."""

    def __init__(self, tokens: int, budget_tokens: int, strategy: str, phase: int) -> None:
        what = "after compaction" if phase else f"and the strategy {strategy!r} compacts nothing"
        super().__init__(
            ErrorCode.CONTEXT_BUDGET_EXCEEDED,
            f"the prompt is {tokens:,} tokens, over the context budget of {budget_tokens:,} "
            f"{what}; shorten the input or the tool results, choose a stronger compaction "
            "(tiered), or give the model server more context",
            details=[
                {"path": "tokens", "message": str(tokens)},
                {"path": "budget_tokens", "message": str(budget_tokens)},
                {"path": "strategy", "message": strategy},
                {"path": "phase", "message": str(phase)},
            ],
        )
        self.tokens = tokens
        self.budget_tokens = budget_tokens


@dataclass(frozen=True, slots=True)
class CountTokens:
    """Engine action: the number of tokens of ``text`` (the driver counts: llama-server's
    ``/tokenize``, or :func:`chars_per_token`). Answered with an ``int``."""

    text: str


# -- counting -------------------------------------------------------------------------------


def chars_per_token(text: str) -> int:
    """The fallback count: characters / 4, rounded up."""
    return (len(text) + 3) // 4


def _text_of(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    text = content if isinstance(content, str) else ""
    calls = item.get("tool_calls")
    if calls:
        text += orjson.dumps(calls, default=dict).decode()
    return text


def count_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text whose tokens measure ``messages`` (contents and tool calls)."""
    return "\n".join(_text_of(m) for m in messages)


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """characters / 4 of each message, plus :data:`MESSAGE_OVERHEAD_TOKENS` each."""
    return sum(chars_per_token(_text_of(m)) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def steps_hint(messages: Sequence[Message]) -> str:
    """``[Steps completed: a, b]`` from the tool calls in ``messages`` (in order, once each);
    ``""`` when there are none."""
    names: dict[str, None] = {}
    for item in messages:
        if item.meta.type is MessageType.TOOL_CALL:
            names.update(dict.fromkeys(n for n in item.meta.tools if n))
    return f"[Steps completed: {', '.join(names)}]" if names else ""


# -- strategies -----------------------------------------------------------------------------


class CompactStrategy(Protocol):
    """A compaction strategy: compacted copies of a history, phase by phase."""

    @property
    def name(self) -> StrategyName: ...

    def phases(
        self, messages: Sequence[Message], *, step_hint: str = ""
    ) -> Iterator[tuple[int, list[Message]]]:
        """``(phase, history)`` for each phase, each cutting at least as much as the last;
        none at all when there is nothing to cut. Never mutates ``messages``."""
        ...


@dataclass(frozen=True, slots=True)
class _Window:
    """Which messages may be cut: not the opening ones, not the recent iterations.

    Kept by identity: a message a phase rewrites (truncated, merged) is a new object, and
    only messages that may be cut are ever rewritten."""

    opening: int  # messages[:opening] are never cut
    keep: frozenset[int]  # id() of the messages never cut (opening and recent)
    first: frozenset[int]  # id() of the opening messages

    @classmethod
    def of(cls, messages: Sequence[Message], keep_recent: int) -> _Window:
        opening = max(first_user_index(messages), 0) + 1 if messages else 0
        later = messages[opening:]
        iterations = _iterations(later)
        recent = set(list(dict.fromkeys(iterations))[-keep_recent:]) if keep_recent > 0 else set()
        first = {id(m) for m in messages[:opening]}
        keep = first | {id(m) for m, it in zip(later, iterations, strict=True) if it in recent}
        return cls(opening, frozenset(keep), frozenset(first))

    def old(self, item: Message) -> bool:
        return id(item) not in self.keep


def _iterations(messages: Sequence[Message]) -> list[int]:
    """Each message's iteration: its ``step``, stamped by the engine (turns count from 1).
    Messages a request brought without one (an earlier conversation: a multi-turn
    ``messages``, the Python runner's ``initial_messages``) are iterations too, numbered
    below 1: each assistant message starts one, and what follows it belongs to it."""
    out: list[int] = []
    earlier = 0
    for item in messages:
        if item.meta.step is not None:
            out.append(item.meta.step)
            continue
        if item.role == "assistant":
            earlier -= 1
        out.append(earlier)
    return out


_EXPENDABLE: Final = (MessageType.TEXT_RESPONSE, MessageType.REASONING)


def _merge_adjacent(messages: list[Message], window: _Window) -> list[Message]:
    """Neighbours of the same role, both text alone, that compaction made neighbours: the
    old one is merged into the one before it (or, before a recent message, an expendable
    old one goes), so the roles alternate again without touching what is never cut."""
    out: list[Message] = []
    first = set(window.first)
    for item in messages:
        last = out[-1] if out else None
        if last is None or last.role != item.role or not (last.plain and item.plain):
            out.append(item)
        elif window.old(item) and (window.old(last) or id(last) in first):
            joined = "\n\n".join(t for t in (last.content, item.content) if t)
            tools = last.meta.tools + item.meta.tools
            # The merged message is what the more durable of the two is: a tool call
            # absorbs the failed attempt before it, not the other way round.
            keeps = item if last.meta.type in _EXPENDABLE and id(last) not in first else last
            merged = last.with_content(joined, replace(keeps.meta, tools=tools))
            if id(last) in first:
                first.add(id(merged))
            out[-1] = merged
        elif window.old(last) and id(last) not in first and last.meta.type in _EXPENDABLE:
            out[-1] = item
        else:
            out.append(item)
    return out


def _with_hint(messages: list[Message], opening: int, hint: str) -> list[Message]:
    """The step hint appended to the user's first message (the end of the opening
    messages: the system prompt's cached prefix is untouched)."""
    if not hint or opening == 0:
        return messages
    first = messages[opening - 1]
    text = first.content
    if text.endswith(hint):
        return messages
    # A later compaction's hint replaces the earlier one's (it lists every step anyway).
    earlier = text.rfind(_HINT_MARK)
    if earlier >= 0 and "\n" not in text[earlier + len(_HINT_MARK) :]:
        text = text[:earlier]
    out = list(messages)
    out[opening - 1] = first.with_content(f"{text}\n\n{hint}")
    return out


def _is_result(item: Message) -> bool:
    meta = item.meta
    return meta.type is MessageType.TOOL_RESULT or (
        meta.type is MessageType.SUMMARY and meta.original_type is MessageType.TOOL_RESULT
    )


@dataclass(frozen=True, slots=True)
class NoCompact:
    """Never compacts (VRAM to spare, or short conversations)."""

    name: StrategyName = "none"

    def phases(
        self, messages: Sequence[Message], *, step_hint: str = ""
    ) -> Iterator[tuple[int, list[Message]]]:
        return iter(())


@dataclass(frozen=True, slots=True)
class SlidingWindowCompact:
    """The opening messages and the last ``keep_recent`` iterations; the step hint for
    the rest."""

    keep_recent: int = 2
    name: StrategyName = "sliding"

    def phases(
        self, messages: Sequence[Message], *, step_hint: str = ""
    ) -> Iterator[tuple[int, list[Message]]]:
        window = _Window.of(messages, self.keep_recent)
        dropped = [m for m in messages if window.old(m)]
        if not dropped:
            return
        kept = [m for m in messages if not window.old(m)]
        hint = step_hint or steps_hint(dropped)
        # Hinted first: the first user message is rewritten, so the window's ids follow it.
        hinted = _with_hint(kept, window.opening, hint)
        window = _Window.of(hinted, self.keep_recent)
        yield 1, _merge_adjacent(hinted, window)


@dataclass(frozen=True, slots=True)
class TieredCompact:
    """The three phases of docs/context.md (see the module docstring)."""

    keep_recent: int = 2
    truncate_chars: int = TRUNCATE_CHARS
    name: StrategyName = "tiered"

    def phases(
        self, messages: Sequence[Message], *, step_hint: str = ""
    ) -> Iterator[tuple[int, list[Message]]]:
        window = _Window.of(messages, self.keep_recent)
        last = list(messages)
        if any(window.old(m) for m in messages):
            for number, current in self._older(messages, window, step_hint):
                last = current
                yield number, current
        # Phase 4, the last resort: the run would otherwise end over its budget. The
        # recent iterations' long tool results keep their head and their tail (a log's
        # first and last lines), shorter each time, until the prompt fits.
        for keep in _LAST_RESORT_CHARS:
            cut = [
                _middle_cut(m, keep)
                if m.meta.type is MessageType.TOOL_RESULT and id(m) not in window.first
                else m
                for m in last
            ]
            if any(a is not b for a, b in zip(cut, last, strict=True)):
                yield 4, cut

    def _older(
        self, messages: Sequence[Message], window: _Window, step_hint: str
    ) -> Iterator[tuple[int, list[Message]]]:
        """Phases 1 to 3, over the older iterations only."""
        # Phase 1: nudges go, long tool results are truncated.
        phase1: list[Message] = []
        for item in messages:
            if not window.old(item):
                phase1.append(item)
            elif item.meta.type in (MessageType.STEP_NUDGE, MessageType.RETRY_NUDGE):
                continue
            elif item.meta.type is MessageType.TOOL_RESULT:
                phase1.append(self._truncated(item))
            else:
                phase1.append(item)
        current = _merge_adjacent(phase1, window)
        yield 1, current
        # Phase 2: tool results are a stub.
        phase2 = [_stub(m) if window.old(m) and _is_result(m) else m for m in current]
        yield 2, phase2
        # Phase 3: reasoning and failed attempts go; the step hint is the checkpoint.
        phase3 = [m for m in phase2 if not (window.old(m) and m.meta.type in _EXPENDABLE)]
        merged = _merge_adjacent(phase3, window)
        hinted = _with_hint(merged, window.opening, step_hint or steps_hint(phase2))
        # The hint is worth its tokens only where it does not make this phase the larger:
        # the calls themselves survive every phase, so the steps stay visible anyway.
        yield 3, hinted if estimate_tokens(hinted) <= estimate_tokens(phase2) else merged

    def _truncated(self, item: Message) -> Message:
        text = item.content
        marker = f" [truncated: {{}} of {len(text):,} characters removed]"
        keep = self.truncate_chars
        removed = len(text) - keep
        if removed <= len(marker) + 8:  # not worth it: the marker would eat the saving
            return item
        meta = MessageMeta(
            MessageType.SUMMARY, item.meta.step, item.meta.tools, MessageType.TOOL_RESULT
        )
        return item.with_content(text[:keep] + marker.format(f"{removed:,}"), meta)


LAST_RESORT_PHASE: Final = 4
"""Tiered's phase that cuts into the recent iterations: only when the prompt would
otherwise stay over the budget itself (not merely over the threshold)."""

_LAST_RESORT_CHARS: Final = (4000, 2000, 1000, 400)
"""Tiered phase 4 keeps this many characters of a recent tool result, head and tail, each
try shorter than the last (docs/context.md)."""


def _middle_cut(item: Message, keep: int) -> Message:
    """``item``'s text with its middle cut out, ``keep`` characters left (half at each
    end) and a marker saying how many went; ``item`` itself when that saves nothing."""
    text = item.content
    marker = f" [… {{}} of {len(text):,} characters removed …] "
    removed = len(text) - keep
    if removed <= len(marker) + 8:
        return item
    head = keep // 2
    meta = MessageMeta(
        MessageType.SUMMARY, item.meta.step, item.meta.tools, MessageType.TOOL_RESULT
    )
    cut = text[:head] + marker.format(f"{removed:,}") + text[len(text) - (keep - head) :]
    return item.with_content(cut, meta)


def _stub(item: Message) -> Message:
    if len(item.content) <= len(_STUB):
        return item
    meta = MessageMeta(
        MessageType.SUMMARY, item.meta.step, item.meta.tools, MessageType.TOOL_RESULT
    )
    return item.with_content(_STUB, meta)


def strategy_named(name: str, keep_recent: int = 2) -> CompactStrategy:
    """The strategy for a name of docs/context.md (``tiered``, ``sliding``, ``none``)."""
    if name == "tiered":
        return TieredCompact(keep_recent)
    if name == "sliding":
        return SlidingWindowCompact(keep_recent)
    if name == "none":
        return NoCompact()
    raise ValueError(f"unknown compaction strategy {name!r}: use tiered, sliding or none")


# -- the manager ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How one conversation keeps within its context (``ConversationConfig.context``).

    ``budget_tokens``: the model's context for this conversation; ``source`` where it came
    from (``stream.begin``). ``threshold``: compaction starts over this share of it.
    """

    strategy: CompactStrategy
    budget_tokens: int
    source: BudgetSource
    threshold: float = DEFAULT_THRESHOLD

    @property
    def trigger_tokens(self) -> int:
        return int(self.budget_tokens * self.threshold)


@dataclass(frozen=True, slots=True)
class Compaction:
    """One compaction: the history after it, and the numbers of ``context.compacted``."""

    messages: list[Message]
    phase: int
    tokens_before: int
    tokens_after: int
    budget_tokens: int
    messages_before: int
    messages_after: int

    def to_dict(self) -> dict[str, int]:
        return {
            "phase": self.phase,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "budget_tokens": self.budget_tokens,
            "messages_before": self.messages_before,
            "messages_after": self.messages_after,
        }


Measure = Generator[CountTokens, int, int]


def _measure(messages: Sequence[Mapping[str, Any]]) -> Measure:
    counted: int = yield CountTokens(count_text(messages))
    return counted + MESSAGE_OVERHEAD_TOKENS * len(messages)


def compact(
    policy: ContextPolicy, messages: Sequence[Mapping[str, Any]], *, step_hint: str = ""
) -> Generator[CountTokens, int, Compaction | None]:
    """Measure ``messages`` and compact them if they are over the threshold.

    Returns ``None`` when they are not (nothing changes: the prompt cache holds), else the
    :class:`Compaction`. Raises :class:`ContextBudgetExceeded` when the result is still over
    the *budget* itself.
    """
    before = yield from _measure(messages)
    trigger = policy.trigger_tokens
    if before <= trigger:
        return None
    history = as_messages(messages)
    phase, best, after = 0, history, before
    for number, candidate in policy.strategy.phases(history, step_hint=step_hint):
        if number >= LAST_RESORT_PHASE and after <= policy.budget_tokens:
            break  # it fits the budget: the recent iterations stay whole
        tokens = yield from _measure(candidate)
        if tokens < after:  # a phase that cuts nothing more is not reported as reached
            phase, best, after = number, candidate, tokens
        if after <= trigger:
            break
    if after > policy.budget_tokens:
        raise ContextBudgetExceeded(after, policy.budget_tokens, policy.strategy.name, phase)
    if phase == 0:  # nothing to cut, but it still fits: go on as is
        return None
    return Compaction(best, phase, before, after, policy.budget_tokens, len(messages), len(best))


def run_compaction(
    policy: ContextPolicy,
    messages: Sequence[Mapping[str, Any]],
    *,
    step_hint: str = "",
    count: Any = chars_per_token,
) -> Compaction | None:
    """:func:`compact` driven with a synchronous counter (tests, the benchmark, a Python
    caller without a tokenizer)."""
    flow = compact(policy, messages, step_hint=step_hint)
    try:
        action = next(flow)
        while True:
            action = flow.send(count(action.text))
    except StopIteration as stop:
        result: Compaction | None = stop.value
        return result


def workflow_context(
    base: ContextPolicy | None,
    *,
    strategy: StrategyName | str,
    keep_recent: int,
    budget_tokens: int | None,
) -> ContextPolicy | None:
    """The context policy of a workflow run: the workflow's own ``compaction`` and
    ``keep_recent`` over ``base``, the gateway's budget (the managed server's, the manual
    one, the upstream's report), or over the workflow's ``budget_tokens``.

    The workflow's budget is taken when it is the smaller (source ``workflow``): a
    workflow may ask to stay well inside the model's context, never to go past it, since
    the server would cut the prompt itself. ``None``: no budget from either, nothing is
    measured."""
    threshold = base.threshold if base is not None else DEFAULT_THRESHOLD
    source: BudgetSource
    if budget_tokens is not None and (base is None or budget_tokens <= base.budget_tokens):
        tokens, source = budget_tokens, "workflow"
    elif base is not None:
        tokens, source = base.budget_tokens, base.source
    else:
        return None
    return ContextPolicy(strategy_named(strategy, keep_recent), tokens, source, threshold)
