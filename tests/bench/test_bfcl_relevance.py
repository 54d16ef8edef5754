"""bench.bfcl_relevance: BFCL's irrelevance category, where the right reply is no call."""

from __future__ import annotations

import time

from bench.bfcl import data_dir
from bench.bfcl_relevance import CASES, declined, load_irrelevance, report


def test_the_loader_finds_every_irrelevance_case_with_its_function() -> None:
    cases = load_irrelevance(data_dir())
    assert len(cases) == CASES == 240
    first = cases[0]
    assert first.id == "irrelevance_0" and first.answer == {}
    assert first.messages[0]["role"] == "user" and "triangle" in first.messages[0]["content"]
    assert first.function["name"] == "determine_body_mass_index"


def _line(*, status: int = 200, calls: object = None, error: str = "") -> dict[str, object]:
    return {"id": "irrelevance_0", "status": status, "tool_calls": calls, "error": error}


def test_a_reply_declines_only_with_a_200_and_no_call() -> None:
    assert declined(_line())
    assert declined(_line(calls=[]))
    assert not declined(_line(calls=[{"function": {"name": "f", "arguments": "{}"}}]))
    assert not declined(_line(status=502))  # an error is no answer
    assert not declined(_line(error="ReadTimeout: "))


def test_the_report_counts_what_was_declined_and_why_not() -> None:
    lines = [_line(), _line(), _line(calls=[{}]), _line(status=422)]
    text = "\n".join(report(lines, "abc1234", "--stride 8", "1.00 / 1.00 / 1.00", time.monotonic()))
    assert "**2/4 (50%)**" in text
    assert "Not declined: called 1, HTTP 422 1" in text
    assert "`python -m bench.bfcl_relevance --stride 8` at `abc1234`" in text
