"""The cost of one context compaction (docs/context.md) at 2k, 8k and 32k tokens of history.

Run with ``python -m bench.compaction`` (also part of ``make bench``). A history shaped as
the turn engine builds it (the system prompt, the user's message, then iterations of a
sentinel tool call and its result, every fourth with a retry nudge) is grown to about
2,048, 8,192 and 32,768 tokens (characters / 4). For each size, one compaction is timed
end to end as the engine runs it (:func:`toolforge.core.context.compact`: the measure of
the whole history, each phase's copy, and each copy's measure), with the characters / 4
counter, so the figure is the gateway's own CPU. The trigger is set so that every phase
runs (the worst case: tiered to phase 3), and, apart, so that phase 1 is enough, and for
the sliding window. Best of several repeats (the least disturbed by the rest of the
machine). llama-server's ``/tokenize`` adds one loopback HTTP call per measure (up to four
per compaction) on top of this; the model's time to re-read the compacted prompt (the
prompt cache is lost from the first changed message) is not the gateway's and is left out.
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import UTC, datetime

import orjson

from bench._results import load_average, write_section
from toolforge.core.context import (
    ContextPolicy,
    SlidingWindowCompact,
    TieredCompact,
    estimate_tokens,
    run_compaction,
)
from toolforge.core.events import FrameKind
from toolforge.core.messages import Message, MessageType, message
from toolforge.core.prompt import render_tool_result
from toolforge.core.protocol import sentinels

__all__ = ["history_of", "main"]

SIZES = (2_048, 8_192, 32_768)
HEADING = "## Context compaction (bench/compaction.py)"


def history_of(tokens: int) -> list[Message]:
    """A history of about ``tokens`` tokens (characters / 4, with each message's overhead)."""
    out = [
        message(
            "system", "You are a careful agent that calls tools. " * 40, MessageType.SYSTEM_PROMPT
        ),
        message(
            "user",
            "Find an Italian place near the station and book it for two.",
            MessageType.USER_INPUT,
        ),
    ]
    step = 0
    while estimate_tokens(out) < tokens:
        step += 1
        if step % 4 == 0:
            out.append(
                message("assistant", "I will look it up.", MessageType.TEXT_RESPONSE, step=step)
            )
            out.append(
                message("user", "Write a tool call now.", MessageType.RETRY_NUDGE, step=step)
            )
        body = orjson.dumps({"query": f"italian {step}"}).decode()
        call = sentinels.frame(FrameKind.TOOL_CALL, f"c{step}", "places.search", body)
        out.append(
            message("assistant", call, MessageType.TOOL_CALL, step=step, tools=("places.search",))
        )
        places = [{"id": f"p{step}-{i}", "name": f"Trattoria {i}", "rating": 4.2} for i in range(8)]
        envelope = {
            "ok": True,
            "data": {"count": 8, "places": places},
            "warnings": [],
            "errors": [],
        }
        result = render_tool_result(f"c{step}", "places.search", envelope)
        out.append(message("user", result, MessageType.TOOL_RESULT, step=step))
    return out


def _best_us(policy: ContextPolicy, history: list[Message], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run_compaction(policy, history)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    rows: list[str] = []
    for size in SIZES:
        history = history_of(size)
        tokens = estimate_tokens(history)
        tiered = TieredCompact(keep_recent=2)
        worst = ContextPolicy(tiered, 10**9, "manual", threshold=1e-9)  # every phase runs
        done = run_compaction(worst, history)
        assert done is not None and done.phase == 3
        # just under the whole history: phase 1 alone is enough
        enough = ContextPolicy(tiered, done.tokens_before, "manual", threshold=0.999)
        phase1 = run_compaction(enough, history)
        assert phase1 is not None and phase1.phase == 1
        sliding = ContextPolicy(SlidingWindowCompact(2), 10**9, "manual", threshold=1e-9)
        us_worst = _best_us(worst, history, args.repeats)
        us_phase1 = _best_us(enough, history, args.repeats)
        us_sliding = _best_us(sliding, history, args.repeats)
        rows.append(
            f"| {size:,} | {tokens:,} | {len(history)} | {us_phase1:,.0f} | {us_worst:,.0f} "
            f"| {done.tokens_after:,} | {us_sliding:,.0f} |"
        )
        print(rows[-1])

    lines = [
        "",
        f"Command: `.venv/bin/python -m bench.compaction` — {platform.python_implementation()} "
        f"{platform.python_version()}, {datetime.now(UTC):%Y-%m-%d}, load {load_average()}.",
        "One compaction as the engine runs it (measure, each phase's copy, each copy's "
        "measure) with the characters / 4 counter; keep_recent 2; best of "
        f"{args.repeats}. History: the engine's shape (sentinel calls, 8-place results, a "
        "retry nudge every fourth iteration).",
        "",
        "| target tokens | history tokens | messages | tiered, phase 1 enough µs "
        "| tiered, all 3 phases µs | tokens after phase 3 | sliding µs |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "What it means: compaction is pure text manipulation, linear in the history (the "
        "µs per 1k tokens stay flat from 2k to 32k): a few milliseconds of gateway CPU at "
        "32k tokens at worst, paid only on a turn that crosses the threshold. The real "
        "cost is the model's: the compacted prompt differs from the cached one after the "
        "first user message, so llama-server re-reads it "
        "(at CPU prompt speeds, seconds for thousands of tokens) — which is why compaction "
        "waits for the threshold (docs/context.md). With llama-server's `/tokenize` each "
        "measure is also one loopback request (up to 4 per compaction).",
    ]
    if not args.no_write:
        write_section(HEADING, lines)
    print(orjson.dumps({"rows": rows}).decode())


if __name__ == "__main__":
    main()
