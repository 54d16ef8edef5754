"""The eval's live path on the embedded llama-server: one scenario × 2 runs through
`toolforge eval`, so the real path (the managed server, a gateway per run, the frames read
back) keeps working. It asserts that every run is recorded and reported, not the model's
score (SmolLM2-135M's is what docs/eval.md measures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from toolforge.runtime.local_backend import LocalBackend

pytestmark = pytest.mark.real


@pytest.mark.timeout(900)
def test_two_live_runs_are_recorded_and_reported(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolforge.cli",
            "eval",
            "--backend",
            "embedded",
            "--scenario",
            "basic_2step",
            "--runs",
            "2",
            "--mode",
            "constrained",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [orjson.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in sorted(runs, key=lambda r: r["run"])] == [0, 1]
    for r in runs:
        assert r["model"] == "SmolLM2-135M-Instruct" and r["mode"] == "constrained"
        assert r["iterations"] >= 1 and r["latency_s"] > 0
        assert r["prompt_tokens"] > 0  # the real upstream's usage came back
        assert r["error_code"] != "RUN_TIMEOUT"
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["cells"][0]["runs"] == 2
    assert "SmolLM2-135M-Instruct" in (out / "report.md").read_text()
