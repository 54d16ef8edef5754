"""`make bench` on a fresh clone: every bench module imports in the project's venv, and the
machine record each report starts with (package versions among it) can be made. The
bench's own dependencies are the `bench` extra (pyproject.toml), part of `dev`."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_each_bench_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


def test_the_gateway_bench_records_the_machine() -> None:
    from bench.gateway import machine

    lines = "\n".join(machine())
    assert "sse-starlette" in lines and "httpx" in lines


def test_the_bench_extra_is_part_of_dev() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    dev = {Requirement(r).name for r in extras["dev"]}
    assert {Requirement(r).name for r in extras["bench"]} <= dev
