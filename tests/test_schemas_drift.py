"""The exported tool schemas in ``schemas/tools/`` match what the code generates."""

from __future__ import annotations

from pathlib import Path

import orjson

from tools import default_registry
from tools.export_schemas import REGENERATE, SCHEMAS_DIR, check, main, render, write


def test_committed_tool_schemas_match_the_code() -> None:
    problems = check()
    assert not problems, (
        f"schemas/tools/ is stale ({'; '.join(problems)}): run `{REGENERATE}` and commit"
    )


def test_each_file_is_the_tools_input_schema() -> None:
    files = render()
    for spec in default_registry():
        assert orjson.loads(files[f"{spec.name}.json"]) == spec.input_schema
        assert (SCHEMAS_DIR / f"{spec.name}.json").is_file()


def test_drift_missing_and_stale_files_are_detected(tmp_path: Path) -> None:
    assert check(tmp_path) == ["places.search.json: missing", "bookings.create.json: missing"]
    assert len(write(tmp_path)) == 2 and check(tmp_path) == []
    assert write(tmp_path) == []  # nothing to rewrite
    (tmp_path / "places.search.json").write_text("{}\n")
    (tmp_path / "old.tool.json").write_text("{}\n")
    assert check(tmp_path) == [
        "places.search.json: differs from the tool's args model",
        "old.tool.json: no tool of that name (stale)",
    ]
    assert main(["--check", "--dir", str(tmp_path)]) == 1
    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    assert not (tmp_path / "old.tool.json").exists()
