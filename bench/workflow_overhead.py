"""Workflow overhead: the runner's own CPU per model turn, the model and the tools excluded.

Run with ``python -m bench.workflow_overhead``. The turn engine (``Conversation.flow``) is
driven with no event loop and no I/O, as ``tests/core/test_engine.py`` drives it: each
turn is one delta holding a tool call, each tool answers at once. The same two-turn
conversation (a search, then a booking) runs

What a workflow adds per turn is measured directly: the policy's calls for the two turns
of ``book_a_table`` (steps, the argument-matched prerequisite, budgets, hints, the done
summary), and in constrained mode the turn's grammar with the workflow's hints (the
booking's ``place_id`` narrowed to the searched ids) against the plain grammar. For
scale, the whole workflow turn driven through the engine. Each figure is the median of
``--repeats`` batches of ``--rounds``, after a warm-up, in microseconds of the process's
CPU time (``time.process_time``, so a shared machine's load does not count) per turn.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from typing import Any

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.engine import (
    MODEL_END,
    CallModel,
    ConstrainedMode,
    Conversation,
    ConversationConfig,
    Emit,
    Finish,
    Mode,
    ReadModel,
    RefuseTool,
    RunTool,
    SentinelMode,
    StopModel,
    ToolOutcome,
)
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar, next_turn_ids
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import ToolResult
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow
from toolforge.tools import default_registry

__all__ = ["main", "measure"]

SCHEMAS = {spec.name: spec.input_schema for spec in default_registry()}
WORKFLOW = parse_workflow(
    {
        "name": "book_a_table",
        "tools": ["places.search", "bookings.create"],
        "required_steps": ["places.search"],
        "terminal_tools": ["bookings.create"],
        "prerequisites": {
            "bookings.create": [
                {"tool": "places.search", "match_arg": "place_id", "result_key": "id"}
            ]
        },
    },
    known_tools=list(SCHEMAS),
)
TURNS = [
    sentinels.frame(FrameKind.TOOL_CALL, "t1", "places.search", '{"query": "pizza"}'),
    sentinels.frame(
        FrameKind.TOOL_CALL,
        "t2",
        "bookings.create",
        '{"place_id": "trattoria-roma", "time": "20:00", "party_size": 2}',
    ),
    "Booked.",  # the plain stream's last turn; a workflow ends at the booking
]
FOUND: dict[str, object] = {
    "places": [{"id": "trattoria-roma"}, *({"id": f"place-{i}"} for i in range(4))]
}
REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "book"}], max_tokens=256)


def _grammar() -> FrameGrammar:
    return FrameGrammar(
        tools=SCHEMAS, result=("AssistantReply", {"type": "object"}), max_tokens=256
    )


def _conversation(mode: Mode, workflow: bool) -> Conversation:
    policy = WorkflowPolicy(WORKFLOW, schemas=SCHEMAS) if workflow else None
    return Conversation(
        ConversationConfig(stream_id="s", request=REQUEST, mode=mode, workflow=policy)
    )


def _drive(conversation: Conversation) -> int:
    """One conversation, every action answered at once; the turns it took."""
    flow = conversation.flow()
    turns = iter(TURNS)
    action: Any = next(flow)
    pending: list[UpstreamDelta] = []
    while True:
        kind = type(action)
        result: Any = None
        if kind is CallModel:
            pending = [UpstreamDelta(text=next(turns))]
            result = (pending.pop(), 0.0)
        elif kind is ReadModel:
            result = (pending.pop(), 0.0) if pending else MODEL_END
        elif kind is StopModel:
            result = ()
        elif kind is RunTool:
            data = FOUND if action.name == "places.search" else {"booking_id": "b1"}
            frame = ToolResult(
                id=action.id,
                name=action.name,
                ok=True,
                result=data,
                duration_ms=0.0,
                attempts=1,
                cached=False,
                performance_warning=False,
            )
            result = ToolOutcome(frame, {"ok": True, "data": data, "warnings": [], "errors": []})
        elif kind is Finish:
            return conversation.stats.turns
        elif kind not in (Emit, RefuseTool):
            raise TypeError(action)
        action = flow.send(result)


def _policy_turns() -> None:
    """The policy's own work for the two turns of the workflow (search, then booking)."""
    policy = WorkflowPolicy(WORKFLOW, schemas=SCHEMAS)
    for name, args, data in (
        ("places.search", {"query": "pizza"}, FOUND),
        ("bookings.create", {"place_id": "trattoria-roma"}, {"booking_id": "b1"}),
    ):
        policy.begin_turn()
        policy.prepare([])
        policy.hints()
        policy.check_call(name, args)
        policy.record(name, args, {"ok": True, "data": data})
        policy.end_batch()
    policy.summary()


def _grammar_turns(grammar: FrameGrammar, narrowed: bool) -> None:
    """The two turns' grammars, as constrained mode builds them, with or without the
    workflow's hints."""
    policy = WorkflowPolicy(WORKFLOW, schemas=SCHEMAS)
    ids = next_turn_ids(())
    for name, args in (("places.search", {"query": "pizza"}),):
        hints = policy.hints()
        if narrowed:
            grammar.for_turn(ids, narrowed=hints.narrowed, allow_result=False, free_text=False)
        else:
            grammar.for_turn(ids)
        policy.record(name, args, {"ok": True, "data": FOUND})
    hints = policy.hints()
    if narrowed:
        grammar.for_turn(ids, narrowed=hints.narrowed, allow_result=False, free_text=False)
    else:
        grammar.for_turn(ids)


def _timed(fn: Any, rounds: int, repeats: int, per: int) -> float:
    """Median µs per ``per`` units of ``fn()`` over ``repeats`` batches of ``rounds``."""
    for _ in range(3):
        fn()
    samples = []
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.process_time()  # CPU time: the machine may be shared
            for _ in range(rounds):
                fn()
            samples.append((time.process_time() - started) / (rounds * per) * 1e6)
    finally:
        gc.enable()
    return statistics.median(samples)


def measure(rounds: int, repeats: int) -> dict[str, float]:
    """µs per model turn: the policy's work, the narrowed grammar against the plain one,
    and the whole engine-driven workflow turn (sentinel and constrained) for scale."""
    grammar = _grammar()
    out = {
        "policy": _timed(_policy_turns, rounds, repeats, 2),
        "grammar_plain": _timed(lambda: _grammar_turns(grammar, False), rounds, repeats, 2),
        "grammar_narrowed": _timed(lambda: _grammar_turns(grammar, True), rounds, repeats, 2),
        "engine_sentinel": _timed(
            lambda: _drive(_conversation(SentinelMode(), True)), rounds, repeats, 2
        ),
        "engine_constrained": _timed(
            lambda: _drive(_conversation(ConstrainedMode(grammar), True)), rounds, repeats, 2
        ),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"### Workflow overhead per model turn ({time.strftime('%Y-%m-%d')})")
    print()
    print(
        f"`python -m bench.workflow_overhead --rounds {args.rounds} --repeats {args.repeats}` "
        f"on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()} "
        "(median of the batches; µs of this process's CPU time per model turn, the model and "
        "tools excluded)."
    )
    print()
    r = measure(args.rounds, args.repeats)
    print("| per model turn | µs |")
    print("|---|---|")
    print(f"| the policy's own work (steps, prerequisites, budgets, hints) | {r['policy']:.1f} |")
    print(
        f"| constrained: the turn's grammar, narrowed ({r['grammar_narrowed']:.0f}) minus "
        f"plain ({r['grammar_plain']:.0f}) | {r['grammar_narrowed'] - r['grammar_plain']:+.1f} |"
    )
    sentinel = r["engine_sentinel"]
    print(f"| for scale: a whole workflow turn, sentinel, engine-driven | {sentinel:.1f} |")
    print(
        f"| for scale: a whole workflow turn, constrained, engine-driven | "
        f"{r['engine_constrained']:.1f} |"
    )


if __name__ == "__main__":
    main()
