"""The workflow registry (docs/workflows.md): definitions read from a folder at start-up, JSON or
YAML; a bad file stops the start with WORKFLOW_INVALID naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.workflows import bundled_workflows_dir, load_workflows

TOOLS = ["places.search", "bookings.create"]
GOOD = '{"name": "a", "tools": ["places.search"], "terminal_tools": ["places.search"]}'


def test_the_bundled_workflows_load_against_the_demo_tools() -> None:
    found = load_workflows(bundled_workflows_dir(), known_tools=TOOLS)
    assert {"book_a_table", "search_then_book", "find_and_answer"} <= set(found)
    assert found["find_and_answer"].uses_respond


def test_json_and_yaml_files_load(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(
        "name: b\ntools: [places.search, bookings.create]\nterminal_tools: [bookings.create]\n"
    )
    (tmp_path / "notes.txt").write_text("not a workflow")
    assert set(load_workflows(tmp_path, known_tools=TOOLS)) == {"a", "b"}


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"a.json": "{nope"}, "a.json: not valid JSON"),
        ({"a.yaml": "name: [unclosed"}, "a.yaml: not valid YAML"),
        ({"a.json": GOOD, "b.json": GOOD}, "the name 'a' is taken"),
        ({"a.json": GOOD.replace("places.search", "nope.tool")}, "'nope.tool' does not exist"),
    ],
)
def test_a_bad_file_stops_the_start_naming_it(
    tmp_path: Path, files: dict[str, str], says: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(RequestError) as caught:
        load_workflows(tmp_path, known_tools=TOOLS)
    assert caught.value.code is ErrorCode.WORKFLOW_INVALID
    assert says in caught.value.message


def test_unavailable_tools_are_skipped_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(GOOD)
    assert load_workflows(tmp_path, known_tools=["other"], skip_unavailable=True) == {}
    with pytest.raises(RequestError, match="does not exist"):
        load_workflows(tmp_path, known_tools=["other"])
    with pytest.raises(RequestError, match="not a folder"):
        load_workflows(tmp_path / "missing", known_tools=TOOLS)
