"""Every conformance case, one test each, run by the product runner
(``toolforge.eval.conformance``).

A case is a JSON file in ``cases/`` (format: docs/conformance.md); adding one needs no
code. A test fails with the runner's own messages: which invariant or expectation broke.
Cases documenting a known gateway bug are reported as xfail until the bug is fixed (then
they fail, asking for ``known_bug`` to be dropped); cases that need a real model server
are marked ``real`` and run against the local llama-server (or TOOLFORGE_REAL_UPSTREAM).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from toolforge.eval.conformance import (
    CATEGORIES,
    DEFAULT_CASES_DIR,
    Case,
    CaseResult,
    RealUpstream,
    load_cases,
    run_case,
)

CASES = load_cases(DEFAULT_CASES_DIR)
SCRIPTED = [c for c in CASES if not c.real]
REAL = [c for c in CASES if c.real]


def _verdict(result: CaseResult) -> None:
    if result.status == "known_bug":
        pytest.xfail(f"known gateway bug: {result.note}")
    if result.status != "passed":
        pytest.fail(f"{result.status}:\n" + "\n".join(result.failures), pytrace=False)


def test_every_case_file_loads_and_is_named_after_its_file() -> None:
    broken = {c.name: c.error for c in CASES if c.error is not None}
    assert not broken
    for case in CASES:
        assert case.path is not None and case.path.stem == case.name
        assert case.description and case.category in CATEGORIES


def test_the_suite_covers_every_category() -> None:
    counts = Counter(c.category for c in CASES)
    assert len(CASES) >= 100
    assert {c: counts[c] for c in CATEGORIES if counts[c] < 8} == {}
    assert 3 <= len(REAL) <= 8  # the real-model subset: determinism on llama-server


@pytest.mark.parametrize("case", SCRIPTED, ids=[c.name for c in SCRIPTED])
async def test_case(case: Case, tmp_path: Path) -> None:
    _verdict(await run_case(case, workdir=tmp_path))


@pytest.mark.real
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.timeout(c.timeout_s + 60)) for c in REAL],
    ids=[c.name for c in REAL],
)
async def test_real_case(case: Case, tmp_path: Path, real_upstream: RealUpstream | None) -> None:
    # The fixture gives TOOLFORGE_REAL_UPSTREAM or the local llama-server: never None here.
    assert real_upstream is not None
    _verdict(await run_case(case, real_upstream=real_upstream, workdir=tmp_path))
