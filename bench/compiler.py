"""The per-turn compiler: what compiling a workflow's state into one turn's constraint costs.

Run with ``python -m bench.compiler`` (``make bench`` runs it too). Target
(docs/workflows.md): at most 1 ms per turn for a workflow of 20 tools.

The workflow has 20 tools of six arguments each (an identifier, a number, a date, a time,
a plain string, an optional string), four required steps in order, one terminal tool with an
argument-matched prerequisite, and every argument under the default provenance. A run
holds the user's message and 8 successful calls whose results carry values of every kind;
every other timed turn follows one more successful call (so half the turns narrow anew,
half find the run unchanged), and a new run starts every 24 turns (20 calls held at most,
what a workflow of ``max_iterations`` 10 makes). Each turn is timed as the engine asks
for it, in three parts:

- ``compile``: the policy's hints (:meth:`WorkflowPolicy.hints`: the narrowing by provenance
  and argument-matched prerequisites, then the legal tools);
- ``gbnf``: constrained mode's grammar of the turn from those hints
  (:meth:`FrameGrammar.next_turn`), the part llama-server receives;
- ``json_schema``: the same constraint as one JSON Schema (Ollama's ``format``,
  ``response_format``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench._results import load_average, write_section
from toolforge.core.compiler import compile_turn
from toolforge.core.gbnf import FrameGrammar
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow

HEADING = "## Per-turn compiler (bench/compiler.py)"
TOOLS = 20
_RUN_TURNS = 24  # turns of one run: 8 calls held at its start, 20 at its end


def _schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "record_id": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"},
            "count": {"type": "integer", "minimum": 1, "maximum": 100},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "note": {"type": "string", "maxLength": 200},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["record_id", "count", "day", "at", "note"],
        "additionalProperties": False,
        "title": f"tool_{i}",
    }


def _setup() -> tuple[WorkflowPolicy, FrameGrammar, dict[str, dict[str, Any]]]:
    names = [f"tool_{i}" for i in range(TOOLS)]
    schemas = {name: _schema(i) for i, name in enumerate(names)}
    workflow = parse_workflow(
        {
            "name": "bench",
            "tools": names,
            "required_steps": names[:4],
            "terminal_tools": [names[-1]],
            "prerequisites": {
                names[-1]: [{"tool": names[0], "match_arg": "record_id", "result_key": "id"}]
            },
            "max_iterations": 100,
        },
        known_tools=names,
    )
    policy = WorkflowPolicy(workflow, schemas=schemas)
    text = "Reorder 12 of R-100 and R-200 on 2026-12-03 at 19:30, then 4 more on 4.12.2026."
    policy.begin_turn([{"role": "user", "content": text}])
    for i in range(8):
        args = {"record_id": f"R-{i}00", "count": i + 1, "day": "2026-12-03", "at": "19:30"}
        data = {"id": f"R-{i}01", "count": 3 * i + 1, "day": "2026-12-04", "note": "ok"}
        policy.record(names[i % 5], args, {"ok": True, "data": data})
        policy.end_batch()
    grammar = FrameGrammar(tools=schemas, result=("Reply", {"type": "object"}), max_tokens=256)
    return policy, grammar, schemas


def measure(turns: int, clock: str = "cpu") -> dict[str, float]:
    """p50/p99 of each part over ``turns``, in ms of ``clock``: ``cpu``, the compiling
    thread's own CPU time (what a turn costs; another process's load does not add to it),
    or ``wall``."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    policy, grammar, schemas = _setup()
    timings: dict[str, list[float]] = {"compile": [], "gbnf": [], "json_schema": []}
    names = list(schemas)
    for turn in range(turns):
        if turn % _RUN_TURNS == 0 and turn:  # a new run: a workflow's calls are bounded
            policy, grammar, schemas = _setup()
        if turn % 2 == 0:  # every other turn follows a new successful call (untimed)
            i = 8 + (turn % _RUN_TURNS) // 2
            args = {"record_id": f"R-{i}00", "count": 1 + i % 50, "day": "2026-12-03"}
            data = {"id": f"R-{i}01", "count": 1 + (3 * i) % 90, "note": "ok"}
            policy.begin_turn([])
            policy.record(names[4 + i % 15], args, {"ok": True, "data": data})
            policy.end_batch()
        start = now()
        hints = policy.hints()
        mid = now()
        grammar.next_turn(
            {"t1"},
            narrowed=hints.narrowed,
            allow_result=hints.allow_result,
            free_text=hints.free_text,
        )
        end = now()
        constraint = compile_turn(
            policy._workflow,  # the policy's own definition, for the JSON rendering
            dict(hints.narrowed),
            schemas,
            succeeded=(),
        )
        constraint.json_schema()
        after = now()
        timings["compile"].append((mid - start) * 1e3)
        timings["gbnf"].append((end - mid) * 1e3)
        timings["json_schema"].append((after - end) * 1e3)
    out: dict[str, float] = {}
    for part, values in timings.items():
        ordered = sorted(values)
        out[f"{part}_p50"] = statistics.median(ordered)
        out[f"{part}_p99"] = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="the compiling thread's CPU time (default) or the wall clock",
    )
    args = parser.parse_args()
    measure(20)  # warm: the argument schemas' checks compile once per process
    result = measure(args.turns, args.clock)
    total = result["compile_p50"] + result["gbnf_p50"]
    lines = [
        "",
        f"`python -m bench.compiler --turns {args.turns} --clock {args.clock}`, load average "
        f"{load_average()} at the start. A workflow of {TOOLS} tools (six arguments each, "
        "default provenance, 8 to 20 calls held), each turn compiled "
        "as the engine asks for it; "
        + (
            "times are the compiling thread's CPU time (what a turn costs: the machine's "
            "other load does not add to it)."
            if args.clock == "cpu"
            else "times are wall-clock."
        ),
        "",
        "| part | p50 ms | p99 ms |",
        "|---|---|---|",
        *(
            f"| {part} | {result[f'{part}_p50']:.3f} | {result[f'{part}_p99']:.3f} |"
            for part in ("compile", "gbnf", "json_schema")
        ),
        "",
        f"Compile + GBNF p50: **{total:.3f} ms** per turn (target: at most 1 ms).",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section(HEADING, lines)


if __name__ == "__main__":
    main()
