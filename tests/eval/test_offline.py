"""The offline eval: scripted models through a real gateway on loopback (the same path as a
live run). Every scenario's ideal path scores; each ablation really turns its guardrail off,
proven by a scripted model that needs it."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from toolforge.eval.qualify.ablation import preset
from toolforge.eval.qualify.batch import Job, plan_jobs, run_batch
from toolforge.eval.qualify.catalog import ALL_SCENARIOS, CORE, by_name
from toolforge.eval.qualify.live import make_run
from toolforge.eval.qualify.metrics import RunResult, aggregate
from toolforge.eval.qualify.results import ResultsFile


async def run(model: str, scenario: str, ablation: str, mode: str = "sentinel") -> RunResult:
    async with make_run(f"scripted:{model}", None) as go:
        return await go(Job(by_name(scenario), model, mode, preset(ablation), 0, 42))


@pytest.mark.parametrize("mode", ["sentinel", "native"])
async def test_the_perfect_model_scores_every_core_scenario(mode: str, tmp_path: Path) -> None:
    results = ResultsFile(tmp_path / "results.jsonl")
    jobs = plan_jobs(
        CORE,
        model="perfect",
        modes=[mode],
        ablations=[preset("reforged")],
        runs=1,
        seed=1,
        done=set(),
    )
    async with make_run("scripted:perfect", None) as go:
        await run_batch(jobs, go, results, concurrency=2)
    cells = aggregate(results.read())
    assert len(cells) == len(CORE)
    failed = {c.scenario: c.errors for c in cells if c.score != 1.0}
    assert not failed
    assert all(c.efficiency == 1.0 for c in cells)  # the ideal path, nothing wasted


@pytest.mark.parametrize("scenario", [s.name for s in ALL_SCENARIOS if s not in CORE], ids=str)
async def test_the_perfect_model_scores_the_other_scenarios(scenario: str) -> None:
    result = await run("perfect", scenario, "reforged")
    assert result.correct, (result.error_code, result.error_message)


@pytest.mark.parametrize(
    ("scenario", "phase"),
    [
        ("compaction_stress", 1),
        ("phase2_compaction", 2),
        ("compaction_chain_p1", 1),
        ("compaction_chain_p2", 2),
        ("compaction_chain_p3", 2),  # the perfect model writes no text for phase 3 to drop
    ],
)
@pytest.mark.parametrize("mode", ["sentinel", "native"])
async def test_the_compaction_scenarios_compact_at_their_budgets(
    scenario: str, phase: int, mode: str
) -> None:
    """Each scenario's budget reaches the gateway (the workflow's budget_tokens) and needs
    the phase it was picked for. Without compaction nothing is cut: a phase-1 budget is
    crossed at its threshold (75 %) but not beyond, and the run goes on as is; a tighter
    one ends over its budget."""
    result = await run("perfect", scenario, "reforged", mode)
    assert result.correct, (result.error_code, result.error_message)
    assert max(int(p) for p in result.compactions) == phase, result.compactions
    bare = await run("perfect", scenario, "no_compact", mode)
    assert not bare.compactions
    if phase == 1:
        assert bare.correct, (bare.error_code, bare.error_message)
    else:
        assert bare.error_code == "CONTEXT_BUDGET_EXCEEDED"


@pytest.mark.parametrize(
    ("model", "ablation", "failure"),
    [
        ("needs_rescue", "no_rescue", "RETRIES_EXHAUSTED"),
        ("needs_nudge", "no_nudge", "RETRIES_EXHAUSTED"),
        ("needs_recovery", "no_recovery", "TOOL_ERRORS_EXHAUSTED"),
        ("needs_steps", "no_steps", None),  # the premature terminal call runs: wrong answer
    ],
)
async def test_each_ablation_turns_its_guardrail_off(
    model: str, ablation: str, failure: str | None
) -> None:
    helped = await run(model, "sequential_3step", "reforged")
    assert helped.correct, (helped.error_code, helped.error_message)
    alone = await run(model, "sequential_3step", ablation)
    assert not alone.correct
    assert alone.error_code == failure
    if model == "needs_rescue":
        assert helped.rescues == 1 and alone.rescues == 0
    if model == "needs_steps":
        assert helped.nudges == {"step:1": 1}
        assert alone.completed and alone.terminal == "close_ticket"  # ran, with made-up args
    bare = await run(model, "sequential_3step", "bare")
    assert not bare.correct


async def test_no_grammar_asks_for_sentinel_frames_without_a_grammar() -> None:
    result = await run("perfect", "basic_2step", "no_grammar", mode="constrained")
    assert result.correct and result.config["mode_sent"] == "sentinel"


def test_the_cli_runs_resumes_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    argv = [
        sys.executable,
        "-m",
        "toolforge.cli",
        "eval",
        "--backend",
        "scripted:perfect",
        "--scenario",
        "basic_2step",
        "error_recovery",
        "--runs",
        "2",
        "--out",
        str(out),
    ]
    first = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "basic_2step" in first.stdout and "100%" in first.stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4
    again = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert again.returncode == 0 and "4 runs already done" in again.stderr
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["totals"]["scripted:perfect | auto | reforged"]["score"] == 1.0
    assert summary["provenance"]["backend"] == "scripted:perfect"
    assert (out / "report.md").read_text().startswith("# ToolForge eval")
    assert "eval-data" in (out / "report.html").read_text()


def test_a_refused_request_stops_the_cli_with_a_message(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "eval", "--backend", "scripted:nobody"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "no scripted model 'nobody'" in done.stderr


class _Stalled(http.server.BaseHTTPRequestHandler):
    """An upstream that lists a model and never answers a completion."""

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "stalled", "object": "model"}]}'
        self.send_response(200 if self.path.endswith("/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    posts = 0
    release = threading.Event()

    def do_POST(self) -> None:
        type(self).posts += 1
        self.release.wait(30)

    def log_message(self, *_: object) -> None:
        pass


def test_sigterm_stops_the_cli_and_records_no_run_it_cut_off(tmp_path: Path) -> None:
    # A stopped eval (Ctrl-C, `timeout`, a container stopping) must not write the runs in
    # flight as failures: a resume would count them as done.
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stalled)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    out = tmp_path / "eval"
    url = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    argv = [sys.executable, "-m", "toolforge.cli", "eval", "--backend", url]
    argv += ["--model", "stalled", "--mode", "native", "--scenario", "basic_2step"]
    argv += ["--runs", "2", "--concurrency", "2", "--out", str(out)]
    # Started as a shell's background job is (`cmd &`): SIGINT ignored. SIGTERM must not
    # depend on it.
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while not _Stalled.posts and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _Stalled.posts, "the runs never reached the upstream"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        # Release the stalled handlers and close the listening socket here: a handler
        # thread that outlived the test held the last reference to the server, and its
        # socket was reported unclosed in whichever test ran next.
        _Stalled.release.set()
        upstream.shutdown()
        upstream.server_close()
    assert proc.returncode != 0
    assert b"stopped" in err
    results = out / "results.jsonl"
    assert not results.exists() or results.read_text() == ""
