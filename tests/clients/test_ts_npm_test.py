"""``npm test`` in clients/ts works on its own, as a TypeScript developer runs it: with no
``TOOLFORGE_URL``, ``test/run.mjs`` builds the SDK, starts the repository's gateway in
front of the scripted model (``python -m tests.clients.serve``), runs every test file
against it and stops it; nothing is left running. A gateway that cannot be started is a
clear message, not a stack of failed tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TS_DIR = Path(__file__).resolve().parents[2] / "clients" / "ts"


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None or not (TS_DIR / "node_modules").is_dir():
        pytest.fail("npm or clients/ts/node_modules is missing: run `make test`", pytrace=False)
    return npm


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFORGE_")}
    return {**env, "TOOLFORGE_PYTHON": sys.executable, **extra}


def _gateways() -> set[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if "tests.clients.serve" in line}


@pytest.mark.timeout(240)
def test_npm_test_starts_its_own_gateway_and_passes() -> None:
    before = _gateways()
    done = subprocess.run(
        [_npm(), "test"], cwd=TS_DIR, env=_env(), capture_output=True, text=True, timeout=220
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "npm test: a gateway at http://127.0.0.1:" in report
    assert "# fail 0" in report and "# skipped 0" in report and "# pass 0" not in report
    assert _gateways() <= before, "npm test left its gateway running"


def test_npm_test_without_a_gateway_to_start_says_what_to_do(tmp_path: Path) -> None:
    done = subprocess.run(
        ["node", "test/run.mjs"],
        cwd=TS_DIR,
        env=_env(TOOLFORGE_PYTHON=str(tmp_path / "no-python")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no Python environment at" in done.stderr and "make install" in done.stderr
    assert "# tests" not in done.stdout  # no test ran against nothing
