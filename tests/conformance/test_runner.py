"""The conformance runner itself: failures are reported (not raised), the matrix files are
written and agree with each other, ``toolforge conformance`` prints the summary line and
exits 1 on a failure, and cases that need a real model server are never counted as passed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from toolforge.cli import main
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.conformance import (
    RealUpstream,
    load_cases,
    notes,
    run_case,
    run_cases,
    summary_line,
    write_matrix,
)
from toolforge.eval.conformance.case import parse_case
from toolforge.eval.scripted_upstream import ScriptedUpstream

GOOD: dict[str, Any] = {
    "name": "good",
    "category": "valid_json",
    "description": "A plain answer.",
    "upstream": [[{"result": {"value": {"answer": "ok"}}, "chunks": 4}]],
    "expect": {"done_reason": "stop", "frames": [{"event": "result.end",
                                                  "data": {"value": {"answer": "ok"}}}]},
}  # fmt: skip
BAD: dict[str, Any] = {
    **GOOD,
    "name": "bad",
    "description": "Expects what cannot come.",
    "expect": {"done_reason": "length", "count": {"tool.call": 1}},
}
REAL: dict[str, Any] = {
    "name": "needs_a_model",
    "category": "determinism",
    "description": "Runs on a real model only.",
    "upstream": "real",
}


def write_cases(folder: Path, *cases: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (folder / f"{case['name']}.json").write_bytes(orjson.dumps(case))
    return folder


async def test_a_failing_case_is_reported_with_messages_and_frames(tmp_path: Path) -> None:
    result = await run_case(parse_case(BAD), workdir=tmp_path)
    assert result.status == "failed" and not result.passed
    assert "done.reason is 'stop', expected 'length'" in result.failures
    assert "0 tool.call frames, expected 1" in result.failures
    assert result.frames[0]["event"] == "stream.begin"
    assert result.frames[-1]["event"] == "done"
    good = await run_case(parse_case(GOOD), workdir=tmp_path / "good")
    assert good.status == "passed" and good.failures == [] and good.schema_failures == 0


async def test_the_matrix_files_agree_and_hold_the_failures_frames(tmp_path: Path) -> None:
    cases = load_cases(write_cases(tmp_path / "cases", GOOD, BAD, REAL))
    results = await run_cases(cases)
    out = tmp_path / "out"
    (out / "failures").mkdir(parents=True)
    (out / "failures" / "stale.ndjson").write_text("{}\n")  # from an earlier run
    write_matrix(results, out)

    doc = orjson.loads((out / "matrix.json").read_bytes())
    assert doc["summary"]["line"] == "1 passed, 1 failed" == summary_line(results)
    assert {k: doc["summary"][k] for k in ("cases", "passed", "failed", "not_run")} == {
        "cases": 3, "passed": 1, "failed": 1, "not_run": 1,
    }  # fmt: skip
    assert doc["categories"]["valid_json"]["failed"] == 1
    assert doc["categories"]["determinism"]["not_run"] == 1
    by_name = {c["name"]: c for c in doc["cases"]}
    assert by_name["bad"]["failures"] and by_name["good"]["status"] == "passed"

    assert sorted(p.name for p in (out / "failures").iterdir()) == ["bad.ndjson"]
    written = [orjson.loads(x) for x in (out / "failures" / "bad.ndjson").read_bytes().split()]
    assert written == next(r.frames for r in results if r.name == "bad")

    markdown = (out / "matrix.md").read_text()
    assert "**1 passed, 1 failed**" in markdown and "| `bad` | ❌ failed |" in markdown
    page = (out / "matrix.html").read_text()
    assert "<!doctype html>" in page and "bad" in page and "needs_a_model" in page
    assert not re.search(r"https?://|<script|<link|src=", page)  # self-contained


async def test_a_real_case_without_a_model_is_not_run_never_passed() -> None:
    result = await run_case(parse_case(REAL))
    assert result.status == "not_run" and not result.passed and result.frames == []
    assert summary_line([result]) == "0 passed, 0 failed"
    assert notes([result])[0].startswith("1 not run")


async def test_a_real_case_runs_against_the_server_it_is_given() -> None:
    # Any OpenAI-compatible server will do to exercise the path: here a scripted one.
    begin = sentinels.begin(FrameKind.RESULT, "r1", "AssistantReply")
    reply = [{"text": begin + '{"answer": "hi"}'},
             {"text": sentinels.end(FrameKind.RESULT, "r1")}, {"finish": "stop"}]  # fmt: skip
    case = parse_case({**REAL, "client": {"mode": "repeat", "times": 2},
                       "expect": {"done_reason": "stop"}})  # fmt: skip
    async with ScriptedUpstream([reply, reply]) as server:
        result = await run_case(case, real_upstream=RealUpstream(server.base_url, "tiny"))
        assert [r.json["model"] for r in server.requests] == ["tiny", "tiny"]
    assert result.status == "passed", result.failures
    assert result.frames[-2]["data"]["value"] == {"answer": "hi"}


async def test_a_broken_case_file_fails_alone(tmp_path: Path) -> None:
    folder = write_cases(tmp_path, GOOD)
    (folder / "typo.json").write_bytes(orjson.dumps({**GOOD, "name": "typo", "expcet": {}}))
    (folder / "notjson.json").write_text("{")
    results = {r.name: r for r in await run_cases(load_cases(folder))}
    assert results["good"].passed
    assert results["typo"].status == "failed"
    assert "unknown case keys: ['expcet']" in results["typo"].failures[0]
    assert results["notjson"].failures[0].startswith("case file: JSONDecodeError")


async def test_known_bugs_are_their_own_status_until_fixed(tmp_path: Path) -> None:
    still = await run_case(parse_case({**BAD, "known_bug": "the bug"}), workdir=tmp_path)
    assert still.status == "known_bug" and still.note == "the bug"
    fixed = await run_case(parse_case({**GOOD, "known_bug": "the bug"}), workdir=tmp_path / "f")
    assert fixed.status == "failed"
    assert "drop known_bug" in fixed.failures[0]


async def test_unknown_settings_and_timeouts_are_failures(tmp_path: Path) -> None:
    typo = await run_case(parse_case({**GOOD, "settings": {"queue_max_frame": 1}}))
    assert typo.status == "failed" and "unknown settings" in typo.failures[0]
    slow = {**GOOD, "timeout_s": 0.5, "upstream": [{"end": "hang"}],
            "settings": {"first_byte_s": 30}}  # fmt: skip
    result = await run_case(parse_case(slow), workdir=tmp_path)
    assert "the case did not finish within 0.5 s" in result.failures


def test_cli_prints_the_summary_and_exits_1_on_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_cases(tmp_path / "cases", GOOD, BAD, REAL)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["conformance", "--cases", str(folder), "--out", str(out)])
    assert exited.value.code == 1
    printed = capsys.readouterr().out.splitlines()
    assert "1 passed, 1 failed" in printed
    assert any(line.startswith("1 not run") for line in printed)
    assert any(line.startswith("FAILED valid_json/bad") for line in printed)
    assert (out / "matrix.json").is_file() and (out / "failures" / "bad.ndjson").is_file()

    with pytest.raises(SystemExit) as exited:
        main(["conformance", "--cases", str(folder), "--out", str(out), "-k", "good",
              "--keep-runs"])  # fmt: skip
    assert exited.value.code == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out.splitlines()
    assert not (out / "failures").exists()  # the failures of the earlier run are gone
    (trace,) = (p for p in (out / "traces" / "good" / "runs").iterdir() if p.is_dir())
    assert (trace / "frames.ndjson").is_file() and (trace / "metrics.json").is_file()


def test_cli_with_no_matching_case_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["conformance", "--cases", str(write_cases(tmp_path, GOOD)), "-k", "nothing"])
    assert exited.value.code == 1
    assert "no conformance cases" in capsys.readouterr().err
