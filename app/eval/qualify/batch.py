"""A batch of eval runs: every (scenario, ablation, run) not yet in ``results.jsonl``, run
with bounded concurrency, each result appended the moment it is known, with a live
progress line on stderr (runs done, ETA, the score so far).

The run itself is a function handed in (:data:`RunFn`): the live one drives the workflow
runner against a backend (:mod:`toolforge.eval.qualify.live`), the offline tests hand in
the same one over a scripted model.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from toolforge.eval.qualify.ablation import Ablation
from toolforge.eval.qualify.metrics import RunResult
from toolforge.eval.qualify.results import ResultsFile
from toolforge.eval.qualify.scenario import Scenario

__all__ = ["Job", "Progress", "RunFn", "plan_jobs", "run_batch"]


@dataclass(frozen=True, slots=True)
class Job:
    scenario: Scenario
    model: str
    mode: str
    ablation: Ablation
    run: int
    seed: int

    def key(self) -> tuple[str, str, str, str, int]:
        return (self.scenario.name, self.model, self.mode, self.ablation.name, self.run)


RunFn = Callable[[Job], Awaitable[RunResult]]


def plan_jobs(
    scenarios: Sequence[Scenario],
    *,
    model: str,
    modes: Sequence[str],
    ablations: Sequence[Ablation],
    runs: int,
    seed: int,
    done: set[tuple[str, str, str, str, int]],
) -> list[Job]:
    """Every job of the batch not already in ``done``, interleaved by run index, so a batch
    cut short has a few runs of every cell rather than all runs of the first cells."""
    jobs = [
        Job(s, model, mode, a, run, seed + run)
        for run in range(runs)
        for s in scenarios
        for mode in modes
        for a in ablations
    ]
    return [j for j in jobs if j.key() not in done]


@dataclass
class Progress:
    """The live line: ``[####....] 12/40  score 58%  ETA 3m10s  basic_2step``."""

    total: int
    out: TextIO = field(default_factory=lambda: sys.stderr)
    done: int = 0
    correct: int = 0
    started: float = field(default_factory=time.monotonic)
    live: bool = field(init=False)

    def __post_init__(self) -> None:
        self.live = self.out.isatty()

    def update(self, result: RunResult) -> None:
        self.done += 1
        self.correct += result.correct
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}  "
            f"score {100 * self.correct / self.done:.0f}%  ETA {int(eta) // 60}m"
            f"{int(eta) % 60:02d}s  {result.scenario} {'ok' if result.correct else 'FAIL'}"
        )
        if self.live:
            self.out.write("\r\x1b[2K" + line)
            if self.done == self.total:
                self.out.write("\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()


async def run_batch(
    jobs: Sequence[Job],
    run: RunFn,
    results: ResultsFile,
    *,
    concurrency: int = 1,
    progress: Progress | None = None,
) -> list[RunResult]:
    """Run ``jobs`` at most ``concurrency`` at a time; append each result as it comes.

    An exception with a true ``fatal`` attribute (a setup error: every run would fail the
    same way) stops the batch: nothing new starts, the runs in flight finish and are kept,
    then it is raised. Any other exception is a bug and propagates at once."""
    results.repair_tail()
    gate = asyncio.Semaphore(max(1, concurrency))
    out: list[RunResult] = []
    fatal: list[Exception] = []

    async def one(job: Job) -> None:
        async with gate:
            if fatal:
                return  # the batch is stopping: start nothing new
            try:
                result = await run(job)
            except Exception as exc:
                if not getattr(exc, "fatal", False):
                    raise
                fatal.append(exc)
                return
        results.append([result])
        out.append(result)
        if progress is not None:
            progress.update(result)

    async with asyncio.TaskGroup() as tg:
        for job in jobs:
            tg.create_task(one(job))
    if fatal:
        raise fatal[0]  # the runs in flight finished and were kept
    return out
