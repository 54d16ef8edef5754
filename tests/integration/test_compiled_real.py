"""The compiled turn on the real model: three core scenarios that SmolLM2-135M gets right
with the workflow compiled into its grammar (the legal tools, a call rather than text,
each argument held to its provenance) and wrong with the same workflow checked only
after decoding (``no_grammar``: the same policy, nudges and validation, no constraint
while it decodes). One run per cell at a fixed seed, through `toolforge eval`, as a user
would qualify a model. docs/eval.md has the N = 10 measurement these stand for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from toolforge.runtime.local_backend import LocalBackend

pytestmark = pytest.mark.real

# Each turns on a different part of the compiled turn: the steps in order and the result's
# number (basic_2step), the list a failed call's message names (sequential_3step), an
# identifier in the form the tool's error shows (error_recovery).
SCENARIOS = ("basic_2step", "sequential_3step", "error_recovery")


@pytest.mark.timeout(1500)
def test_three_scenarios_pass_compiled_and_fail_without_the_constraint(
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
            *SCENARIOS,
            "--runs",
            "1",
            "--seed",
            "7",
            "--mode",
            "constrained",
            "--ablation",
            "reforged",
            "no_grammar",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=1440,
        # A slow shared CI core is not the model's failure: turns get a minute each.
        env={**os.environ, "FRAME_TIMEOUT_MS": "60000", "LLAMA_NICE": "0"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [orjson.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    got = {(r["scenario"], r["ablation"]): r for r in runs}
    assert len(got) == 2 * len(SCENARIOS)
    for scenario in SCENARIOS:
        compiled, loose = got[(scenario, "reforged")], got[(scenario, "no_grammar")]
        assert compiled["correct"], (scenario, compiled["error_code"], compiled["trace"])
        assert not loose["correct"], (scenario, loose["trace"])
