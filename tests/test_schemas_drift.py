"""The exported schemas in ``schemas/`` (tools and frames) match what the code generates."""

from __future__ import annotations

from pathlib import Path

import orjson

from toolforge.core.protocol.frames import EVENTS
from toolforge.core.protocol.schema import frame_schema, stream_event_definitions
from toolforge.tools import default_registry
from toolforge.tools.export_schemas import REGENERATE, SCHEMAS_DIR, check, main, render, write


def test_committed_schemas_match_the_code() -> None:
    problems = check()
    assert not problems, f"schemas/ is stale ({'; '.join(problems)}): run `{REGENERATE}` and commit"


def test_each_tool_file_is_the_tools_input_schema() -> None:
    files = render()
    for spec in default_registry():
        assert orjson.loads(files[f"tools/{spec.name}.json"]) == spec.input_schema
        assert (SCHEMAS_DIR / "tools" / f"{spec.name}.json").is_file()


def test_each_frame_file_is_the_typed_frames_schema() -> None:
    files = render()
    for event, cls in EVENTS.items():
        assert orjson.loads(files[f"frames/{event}.json"]) == frame_schema(cls)
    combined = orjson.loads(files["frames/frames.json"])
    assert combined["$defs"] == stream_event_definitions()
    assert {name for name in files if name.startswith("frames/")} == {
        *(f"frames/{event}.json" for event in EVENTS),
        "frames/frames.json",
    }


def test_drift_missing_and_stale_files_are_detected(tmp_path: Path) -> None:
    assert check(tmp_path) == [f"{name}: missing" for name in render()]
    assert len(write(tmp_path)) == len(render()) and check(tmp_path) == []
    assert write(tmp_path) == []  # nothing to rewrite
    (tmp_path / "tools" / "places.search.json").write_text("{}\n")
    (tmp_path / "tools" / "old.tool.json").write_text("{}\n")
    (tmp_path / "frames" / "old.event.json").write_text("{}\n")
    assert check(tmp_path) == [
        "tools/places.search.json: differs from the code that generates it",
        "tools/old.tool.json: nothing generates it (stale)",
        "frames/old.event.json: nothing generates it (stale)",
    ]
    assert main(["--check", "--dir", str(tmp_path)]) == 1
    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    assert not (tmp_path / "tools" / "old.tool.json").exists()
    assert not (tmp_path / "frames" / "old.event.json").exists()
