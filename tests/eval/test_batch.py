"""Batches: jobs interleave by run, a killed batch resumes with only the missing runs, a
setup error stops the batch, and a run's frames become its RunResult."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from toolforge.eval.qualify.ablation import preset
from toolforge.eval.qualify.batch import Job, Progress, plan_jobs, run_batch
from toolforge.eval.qualify.catalog import by_name
from toolforge.eval.qualify.live import EvalSetupError, read_run
from toolforge.eval.qualify.metrics import RunResult
from toolforge.eval.qualify.results import ResultsFile

SCENARIOS = [by_name("basic_2step"), by_name("error_recovery")]


def jobs(done: set[Any] | None = None, runs: int = 3) -> list[Job]:
    return plan_jobs(
        SCENARIOS,
        model="m",
        modes=["sentinel"],
        ablations=[preset("reforged"), preset("bare")],
        runs=runs,
        seed=100,
        done=done or set(),
    )


def result_for(job: Job, correct: bool = True) -> RunResult:
    return RunResult(
        scenario=job.scenario.name,
        model=job.model,
        mode=job.mode,
        ablation=job.ablation.name,
        run=job.run,
        completed=correct,
        correct=correct,
        iterations=2,
        ideal_iterations=2,
        tool_calls=2,
        latency_s=0.01,
        config={"seed": job.seed},
    )


def test_jobs_interleave_by_run_and_carry_their_seed() -> None:
    planned = jobs()
    assert len(planned) == 2 * 2 * 3
    assert [j.run for j in planned[:4]] == [0, 0, 0, 0]
    assert {j.seed for j in planned if j.run == 2} == {102}


async def test_a_killed_batch_resumes_with_only_the_missing_runs(tmp_path: Path) -> None:
    results = ResultsFile(tmp_path / "results.jsonl")
    ran: list[tuple[str, int]] = []
    gate, hanging = asyncio.Event(), asyncio.Event()

    async def run(job: Job) -> RunResult:
        ran.append((job.scenario.name, job.run))
        if len(ran) > 5:
            hanging.set()
            await gate.wait()  # the 6th run hangs until the batch is killed
        return result_for(job)

    task = asyncio.create_task(run_batch(jobs(), run, results, concurrency=1))
    await hanging.wait()
    task.cancel()  # a kill mid-run
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(results.read()) == 5

    second: list[Job] = []

    async def run_again(job: Job) -> RunResult:
        second.append(job)
        return result_for(job)

    remaining = jobs(results.done())
    assert len(remaining) == 12 - 5
    await run_batch(remaining, run_again, results, concurrency=3)
    keys = [r.key() for r in results.read()]
    assert len(keys) == 12 and len(set(keys)) == 12
    assert not {j.key() for j in second} & {r.key() for r in results.read()[:5]}


async def test_a_setup_error_stops_the_batch_and_keeps_what_finished(tmp_path: Path) -> None:
    results = ResultsFile(tmp_path / "results.jsonl")
    started = 0

    async def run(job: Job) -> RunResult:
        nonlocal started
        started += 1
        if started == 3:
            raise EvalSetupError("POST /v1/stream answered 422: bad workflow")
        return result_for(job)

    with pytest.raises(EvalSetupError, match="422"):
        await run_batch(jobs(), run, results, concurrency=1)
    assert len(results.read()) == 2 and started == 3  # nothing new started after it


async def test_a_bug_in_a_run_propagates(tmp_path: Path) -> None:
    async def run(job: Job) -> RunResult:
        raise RuntimeError("bug")

    with pytest.raises(ExceptionGroup):
        await run_batch(jobs(), run, ResultsFile(tmp_path / "r.jsonl"))


async def test_progress_prints_a_line_per_run_when_not_a_tty(tmp_path: Path) -> None:
    out = io.StringIO()
    planned = jobs(runs=1)
    progress = Progress(len(planned), out=out)

    async def run(job: Job) -> RunResult:
        return result_for(job, correct=job.ablation.name == "reforged")

    await run_batch(planned, run, ResultsFile(tmp_path / "r.jsonl"), progress=progress)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[-1].startswith("[########################] 4/4  score 50%")
    assert "\r" not in out.getvalue()


def job(name: str = "basic_2step", ablation: str = "reforged") -> Job:
    return Job(by_name(name), "m", "sentinel", preset(ablation), 0, 42)


def frames_for(calls: list[tuple[str, dict[str, Any], bool]], **done: Any) -> list[Any]:
    events: list[tuple[str, Any]] = [("stream.begin", {"stream_id": "s"})]
    for i, (name, args, ok) in enumerate(calls):
        events.append(("tool.call", {"id": f"c{i}", "name": name, "args": args}))
        events.append(("tool.result", {"id": f"c{i}", "name": name, "ok": ok}))
    events.append(("done", {"reason": "complete", "usage": done.get("usage", {}), **done}))
    return events


def test_read_run_grades_the_terminal_call() -> None:
    events = frames_for(
        [
            ("get_weather", {"city": "Madrid"}, True),
            ("report_weather", {"city": "Madrid", "condition": "sunny", "temp_c": 24}, True),
        ],
        usage={"prompt_tokens": 300, "completion_tokens": 40},
        workflow={"iterations": 2},
    )
    r = read_run(job(), events, 1.25, config={})
    assert r.completed and r.correct and r.terminal == "report_weather"
    assert (r.iterations, r.tool_calls, r.prompt_tokens, r.completion_tokens) == (2, 2, 300, 40)


def test_read_run_counts_guardrail_frames_and_errors() -> None:
    events = [
        ("tool.call", {"id": "a", "name": "report_weather", "args": {"city": "x"}}),
        ("tool.result", {"id": "a", "name": "report_weather", "ok": False}),
        ("step.nudge", {"kind": "step", "tier": 1, "message": "m", "call_id": "a"}),
        ("step.nudge", {"kind": "step", "tier": 2, "message": "m", "call_id": None}),
        ("step.nudge", {"kind": "retry", "tier": 1, "message": "m", "call_id": None}),
        (
            "tool.call",
            {"id": "b", "name": "get_weather", "args": {"city": "Madrid"}, "rescued": True},
        ),
        ("tool.result", {"id": "b", "name": "get_weather", "ok": True}),
        ("context.compacted", {"phase": 1}),
        ("context.compacted", {"phase": 2}),
        ("json.end", {"repaired": True, "degraded": False}),
        ("error", {"code": "STEP_ENFORCEMENT_EXHAUSTED", "message": "tiers spent"}),
        ("done", {"reason": "error", "usage": {}, "workflow": {"iterations": 5}}),
    ]
    r = read_run(job(), events, 2.0, config={})
    assert not r.completed and not r.correct  # the failed terminal call does not count
    assert r.nudges == {"retry:1": 1, "step:1": 1, "step:2": 1} and r.retries == 1
    assert r.rescues == 1 and r.tool_errors == 1 and r.repaired == 1
    assert r.compactions == {"1": 1, "2": 1}
    assert r.error_code == "STEP_ENFORCEMENT_EXHAUSTED" and r.error_message == "tiers spent"
    assert r.iterations == 5


def test_a_wrong_terminal_argument_completes_but_is_not_correct() -> None:
    events = frames_for(
        [("report_weather", {"city": "Paris", "condition": "x", "temp_c": 1}, True)]
    )
    r = read_run(job(), events, 1.0, config={})
    assert r.completed and not r.correct
