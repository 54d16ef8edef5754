"""Eval arithmetic, the JSONL that resumes, and the reports made from it."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from toolforge.eval.qualify.ablation import PRESETS, preset
from toolforge.eval.qualify.metrics import (
    ALL_SCENARIOS,
    RunResult,
    aggregate,
    percentile,
    wilson,
)
from toolforge.eval.qualify.report import (
    chart_data,
    render_html,
    render_markdown,
    render_table,
    summary,
)
from toolforge.eval.qualify.results import ResultsFile


def run(scenario: str = "s", *, n: int = 0, ablation: str = "reforged", **kw: Any) -> RunResult:
    base: dict[str, Any] = {
        "scenario": scenario,
        "model": "m",
        "mode": "sentinel",
        "ablation": ablation,
        "run": n,
        "completed": True,
        "correct": True,
        "iterations": 2,
        "ideal_iterations": 2,
        "tool_calls": 2,
        "latency_s": 1.0,
    }
    base.update(kw)
    return RunResult(**base)


def test_wilson_matches_the_textbook_values() -> None:
    low, high = wilson(8, 10)
    assert math.isclose(low, 0.4902, abs_tol=1e-4) and math.isclose(high, 0.9433, abs_tol=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(11, 10)


def test_percentile_is_nearest_rank() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == 5.0
    assert percentile(values, 0) == 1.0
    assert percentile([], 50) == 0.0


def test_cell_metrics_arithmetic() -> None:
    runs = [
        run(n=0, iterations=2, tool_calls=2, latency_s=1.0, prompt_tokens=100),
        run(n=1, correct=False, iterations=4, tool_calls=5, latency_s=3.0, prompt_tokens=300),
        run(
            n=2,
            completed=False,
            correct=False,
            iterations=10,
            tool_calls=9,
            latency_s=9.0,
            error_code="MAX_ITERATIONS",
            nudges={"1": 1, "2": 1},
            compactions={"1": 2},
            rescues=1,
        ),
        run(n=3, iterations=3, tool_calls=3, latency_s=2.0, nudges={"1": 1}, rescues=2),
    ]
    [c] = aggregate(runs)
    assert (c.runs, c.correct, c.completed) == (4, 2, 3)
    assert c.score == 0.5 and c.completeness == 0.75
    assert c.accuracy == pytest.approx(2 / 3)
    assert c.efficiency == pytest.approx((2 / 2 + 2 / 3) / 2)  # the correct runs
    assert c.wasted_calls == pytest.approx((0 + 3 + 7 + 1) / 4)
    assert (c.latency_p50, c.latency_p95) == (2.0, 9.0)
    assert c.prompt_tokens == 100.0
    assert c.nudges == {"1": 2, "2": 1} and c.compactions == {"1": 2}
    assert c.rescues == 3 and c.errors == {"MAX_ITERATIONS": 1}
    assert (c.score_low, c.score_high) == wilson(2, 4)


def test_no_completed_run_means_no_accuracy_or_efficiency() -> None:
    [c] = aggregate([run(completed=False, correct=False)])
    assert c.accuracy is None and c.efficiency is None and c.score == 0.0


def test_a_run_recorded_twice_counts_once() -> None:
    cells = aggregate([run(n=0, correct=False), run(n=0, correct=True), run(n=1)])
    assert cells[0].runs == 2 and cells[0].correct == 2


def test_cells_are_split_by_every_key() -> None:
    cells = aggregate([run("a"), run("b"), run("a", ablation="bare"), run("a", mode="native")])
    assert [c.key for c in cells] == [
        ("a", "m", "native", "reforged"),
        ("a", "m", "sentinel", "bare"),
        ("a", "m", "sentinel", "reforged"),
        ("b", "m", "sentinel", "reforged"),
    ]


def test_results_resume_after_a_torn_line(tmp_path: Path) -> None:
    f = ResultsFile(tmp_path / "results.jsonl")
    f.append([run(n=0), run(n=1)])
    # A kill in the middle of a write: half a line, no newline.
    with f.path.open("ab") as fh:
        fh.write(b'{"scenario": "s", "model": "m", "mo')
    assert [r.run for r in f.read()] == [0, 1]
    assert f.done() == {
        ("s", "m", "sentinel", "reforged", 0),
        ("s", "m", "sentinel", "reforged", 1),
    }
    f.repair_tail()
    f.append([run(n=2)])
    assert [r.run for r in f.read()] == [0, 1, 2]
    assert all(line for line in f.path.read_text().split("\n")[:-1])


def test_ablations_turn_their_feature_off() -> None:
    wf = {
        "tools": ["a", "b"],
        "required_steps": ["a"],
        "terminal_tools": ["b"],
        "prerequisites": {"b": ["a"]},
    }
    assert preset("reforged").apply(wf) == wf
    assert preset("no_rescue").apply(wf)["rescue"] is False
    assert preset("no_nudge").apply(wf)["max_retries_per_step"] == 0
    steps = preset("no_steps").apply(wf)
    assert steps["required_steps"] == [] and steps["prerequisites"] == {}
    assert preset("no_recovery").apply(wf)["max_tool_errors"] == 0
    assert preset("no_compact").apply(wf)["compaction"] == "none"
    assert preset("no_grammar").mode("constrained") == "sentinel"
    assert preset("no_grammar").mode("native") == "native"
    assert preset("no_provenance").apply(wf)["narrow"] is False
    bare = preset("bare").apply(wf)
    assert bare["rescue"] is False and bare["compaction"] == "none" and bare["narrow"] is False
    assert bare["max_retries_per_step"] == 0 and bare["max_tool_errors"] == 0
    assert set(PRESETS) == {
        "reforged",
        "no_rescue",
        "no_nudge",
        "no_steps",
        "no_recovery",
        "no_compact",
        "no_grammar",
        "no_provenance",
        "bare",
    }
    with pytest.raises(KeyError, match="known"):
        preset("nope")


class _Grab(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.data = ""
        self._in = False
        self.external: list[str] = []
        self.rects = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self._in = tag == "script" and a.get("id") == "eval-data"
        if (tag == "script" and a.get("src")) or (tag == "link" and a.get("href")):
            self.external.append(tag)
        self.rects += tag == "rect"

    def handle_endtag(self, tag: str) -> None:
        self._in = False

    def handle_data(self, data: str) -> None:
        if self._in:
            self.data += data


def test_html_dashboard_data_matches_the_jsonl(tmp_path: Path) -> None:
    f = ResultsFile(tmp_path / "results.jsonl")
    f.append(
        [
            run("a", n=0, latency_s=1.5),
            run("a", n=1, correct=False, latency_s=2.5),
            run("a", n=0, ablation="bare", correct=False, latency_s=0.5),
            run("a", n=1, ablation="bare", correct=False, latency_s=0.7),
            run("b</script><x>", n=0),
        ]
    )
    runs = f.read()
    page = render_html(runs, {"commit": "abc123", "machine": "test"})
    grab = _Grab()
    grab.feed(page)
    assert not grab.external  # self-contained
    data = json.loads(grab.data)
    assert data == json.loads(json.dumps(chart_data(runs)))
    scores = {s["cell"]: s for s in data["scores"]}
    assert scores["a | m | sentinel | reforged"]["score"] == 0.5
    assert scores["a | m | sentinel | bare"]["correct"] == 0
    [delta] = data["deltas"]
    assert delta["ablation"] == "bare" and delta["delta"] == -0.5
    assert data["latencies"]["a | m | sentinel | reforged"] == [1.5, 2.5]
    assert grab.rects >= 3  # score bars and the delta bar were drawn
    assert "abc123" in page and "<x>" not in page


def test_markdown_table_and_summary() -> None:
    runs = [run("a", n=0), run("a", n=0, ablation="no_rescue", correct=False)]
    cells = aggregate(runs)
    md = render_markdown(cells, {"commit": "abc"})
    assert "| a | m | sentinel | reforged | 1 | 100% |" in md
    assert "| a | m | sentinel | no_rescue | -100 pts |" in md
    table = render_table(cells)
    assert table.splitlines()[0].startswith("scenario") and "no_rescue" in table
    s = summary(cells, {"commit": "abc"})
    assert s["totals"]["m | sentinel | reforged"] == {
        "runs": 1,
        "correct": 1,
        "scenarios": 1,
        "score": 1.0,
    }
    assert s["provenance"]["commit"] == "abc"


def test_every_scenario_together_per_model_mode_and_ablation() -> None:
    runs = [
        run("a", n=0),
        run("a", n=1, correct=False),
        run("b", n=0),
        run("b", n=1),
        run("a", n=0, ablation="bare", completed=False, correct=False),
        run("b", n=0, ablation="bare", correct=False),
    ]
    overall = aggregate(runs, overall=True)
    assert [(c.scenario, c.ablation, c.runs, c.correct, c.completed) for c in overall] == [
        (ALL_SCENARIOS, "bare", 2, 0, 1),
        (ALL_SCENARIOS, "reforged", 4, 3, 4),
    ]
    assert overall[1].score_low == wilson(3, 4)[0]
    md = render_markdown(aggregate(runs), {"commit": "abc"}, overall)
    together, per_scenario = md.split("## Per scenario")
    assert f"| {ALL_SCENARIOS} | m | sentinel | reforged | 4 | 75% |" in together
    assert "| a | m | sentinel | reforged | 2 | 50% |" in per_scenario
    assert "## Every scenario together" not in render_markdown(aggregate(runs), {})
