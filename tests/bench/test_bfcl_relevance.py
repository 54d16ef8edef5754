"""bench.bfcl_relevance: BFCL's irrelevance category, where the right reply is no call."""

from __future__ import annotations

import time

import httpx

from bench.bfcl import data_dir, request_body
from bench.bfcl_relevance import CASES, ask, declined, load_irrelevance, report
from tests.bench.test_bfcl import completion, reply
from toolforge.eval.scripted_upstream import ScriptedUpstream


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


async def test_ask_records_a_call_a_decline_and_a_failure_over_http() -> None:
    # The irrelevant case has no possible answer: a call is recorded as it came, not judged
    # against one (that crashed the first run of this bench).
    case = load_irrelevance(data_dir())[0]
    called = reply(("determine_body_mass_index", {"weight": 10, "height": 5}))
    scripts = [
        {"end": "status", "status": 200, "body": completion(called)},
        {"end": "status", "status": 200, "body": completion({"content": "25 m2"}, "stop")},
        {"end": "status", "status": 500, "body": '{"error": {"message": "boom"}}'},
    ]
    async with ScriptedUpstream(scripts) as up, httpx.AsyncClient(timeout=10) as client:
        url = f"{up.base_url}/chat/completions"
        got = [await ask(client, url, case, "m") for _ in scripts]
    assert up.requests[0].json == request_body(case, "m")
    assert [declined(r) for r in got] == [False, True, False]
    assert [r["accurate"] for r in got] == [False, True, False]  # this category's verdict
    assert got[0]["tool_calls"] == called["tool_calls"] and got[1]["content"] == "25 m2"
    assert got[2]["status"] == 500 and "boom" in str(got[2]["error"])
