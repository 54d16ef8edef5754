"""The conformance suite: data-driven cases run against live gateways, and the matrix.

Cases are JSON files (``tests/conformance/cases/``; format in :mod:`.case` and
``docs/conformance.md``). For each, the runner (:mod:`.runner`) starts a scripted
upstream (or uses a real model server) and a real gateway on loopback, drives the client
(:mod:`.client`: read, stall, cancel, disconnect, resume, replay, approve, repeat),
checks the protocol invariants and the case's expectations (:mod:`.checks`), and returns
a :class:`CaseResult`. :mod:`.matrix` writes the category × case matrix as JSON,
Markdown and HTML. ``toolforge conformance`` (``app/cli.py``) does all of it.

    from toolforge.eval.conformance import load_cases, run_cases, summary_line, write_matrix
    results = asyncio.run(run_cases(load_cases()))
    write_matrix(results, Path("artifacts/conformance"))
    print(summary_line(results))
"""

from toolforge.eval.conformance.case import (
    CATEGORIES,
    DEFAULT_CASES_DIR,
    Case,
    load_cases,
    parse_case,
)
from toolforge.eval.conformance.matrix import notes, summary_line, write_matrix
from toolforge.eval.conformance.runner import CaseResult, RealUpstream, run_case, run_cases

__all__ = [
    "CATEGORIES",
    "DEFAULT_CASES_DIR",
    "Case",
    "CaseResult",
    "RealUpstream",
    "load_cases",
    "notes",
    "parse_case",
    "run_case",
    "run_cases",
    "summary_line",
    "write_matrix",
]
