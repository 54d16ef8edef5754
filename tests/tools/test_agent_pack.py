"""The agent pack through the executor: fs.read stays inside its roots, sqlite.query
cannot write, time.now answers; and packs are chosen by TOOL_PACKS."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from toolforge.core.tool_rules import ToolConfigError
from toolforge.runtime.executor import ToolExecutor, ToolResult
from toolforge.settings import Settings
from toolforge.tools import available_packs, load_packs


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "readme.md").write_text("hello, world\n")
    (root / "sub" / "note.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    (root / "out").symlink_to(tmp_path / "secret.txt")
    (root / "outdir").symlink_to(tmp_path)
    (root / "inlink").symlink_to(root / "sub" / "note.txt")
    (root / "big.log").write_bytes(b"x" * 5_000_000)
    os.mkfifo(root / "pipe")
    return root


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
        conn.executemany(
            "INSERT INTO items (name, price) VALUES (?, ?)",
            [(f"item{i}", i * 1.5) for i in range(50)],
        )
    conn.close()
    return path


def executor(tree: Path, db: Path, **extra: Any) -> ToolExecutor:
    settings = Settings(
        tool_packs="agent",
        fs_read_roots=f"docs={tree}",
        fs_read_max_bytes=1024,
        sqlite_path=db,
        sqlite_max_rows=10,
        **extra,
    )
    return ToolExecutor(load_packs(settings))


def snapshot(db: Path, attack: Path) -> tuple[bytes, bool]:
    return db.read_bytes(), attack.exists()


async def run(ex: ToolExecutor, name: str, args: dict[str, Any]) -> ToolResult:
    return await ex.run(name, args, call_id="c1")


def error_of(result: ToolResult) -> dict[str, Any]:
    assert not result.ok, result.envelope
    error = result.envelope.errors[0]
    assert isinstance(error, dict)
    return error


async def test_fs_read_reads_inside_the_root(tree: Path, db: Path) -> None:
    ex = executor(tree, db)
    result = await run(ex, "fs.read", {"path": "docs/readme.md"})
    assert result.ok and result.envelope.data == {
        "path": "docs/readme.md",
        "size": 13,
        "offset": 0,
        "bytes": 13,
        "truncated": False,
        "content": "hello, world\n",
    }
    inner = await run(ex, "fs.read", {"path": "docs/inlink"})  # a link within the root
    assert inner.ok and inner.envelope.data["content"] == "inside"  # type: ignore[index]
    # Logs and artifacts keep where and how much, never the content (the allowlist).
    assert "content" not in result.record.result  # type: ignore[operator]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("docs/../secret.txt", "'..'"),
        ("docs/sub/../../secret.txt", "'..'"),
        ("/etc/passwd", "absolute"),
        (os.path.abspath("/tmp"), "absolute"),
        ("~/x", "absolute"),
        ("docs/out", "outside the root"),
        ("docs/outdir/secret.txt", "outside the root"),
        ("other/readme.md", "no root named"),
        ("docs/pipe", "not a regular file"),
        ("docs", "not a regular file"),
    ],
)
async def test_fs_read_refuses_escapes(tree: Path, db: Path, path: str, why: str) -> None:
    result = await run(executor(tree, db), "fs.read", {"path": path})
    error = error_of(result)
    assert error["code"] == "PATH_NOT_ALLOWED" and why in str(error["message"])
    assert "TOP SECRET" not in str(result.envelope.to_dict())


async def test_fs_read_reads_a_huge_file_in_windows(tree: Path, db: Path) -> None:
    ex = executor(tree, db)
    first = await run(ex, "fs.read", {"path": "docs/big.log"})
    data = first.envelope.data
    assert isinstance(data, dict)
    assert data["bytes"] == 1024 and data["truncated"] is True and data["size"] == 5_000_000
    later = await run(ex, "fs.read", {"path": "docs/big.log", "offset": 4_999_990})
    assert later.envelope.data["bytes"] == 10  # type: ignore[index]
    assert later.envelope.data["truncated"] is False  # type: ignore[index]
    asked = await run(ex, "fs.read", {"path": "docs/big.log", "max_bytes": 10**9})
    assert asked.envelope.data["bytes"] == 1024  # type: ignore[index]  # capped, not raised


async def test_sqlite_query_reads_with_a_row_cap(tree: Path, db: Path) -> None:
    ex = executor(tree, db)
    result = await run(ex, "sqlite.query", {"sql": "SELECT id, name FROM items ORDER BY id"})
    data = result.envelope.data
    assert isinstance(data, dict)
    assert data["columns"] == ["id", "name"] and data["row_count"] == 10
    assert data["truncated"] is True and data["rows"][0] == [1, "item0"]
    bound = await run(
        ex, "sqlite.query", {"sql": "SELECT name FROM items WHERE id = ?", "params": [3]}
    )
    assert bound.envelope.data["rows"] == [["item2"]]  # type: ignore[index]


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO items (name, price) VALUES ('x', 1)",
        "UPDATE items SET price = 0",
        "DELETE FROM items",
        "DROP TABLE items",
        "CREATE TABLE t (x)",
        "PRAGMA query_only = OFF",
        "ATTACH DATABASE 'file:{attack}?mode=rwc' AS x",
        "WITH t AS (SELECT 1) DELETE FROM items",
        "VACUUM",
        "BEGIN IMMEDIATE",
    ],
)
async def test_sqlite_query_refuses_writes(tree: Path, db: Path, sql: str) -> None:
    attack = db.parent / "attack.db"
    before = snapshot(db, attack)
    sql = sql.format(attack=attack)
    result = await run(executor(tree, db), "sqlite.query", {"sql": sql})
    error = error_of(result)
    assert error["code"] in {"READ_ONLY", "TOOL_FAILED"}, error
    assert snapshot(db, attack) == before  # the file unchanged, no attached file created


async def test_sqlite_query_refuses_two_statements(tree: Path, db: Path) -> None:
    result = await run(executor(tree, db), "sqlite.query", {"sql": "SELECT 1; DELETE FROM items"})
    assert "one statement" in str(error_of(result)["message"])


async def test_time_now(tree: Path, db: Path) -> None:
    ex = executor(tree, db)
    result = await run(ex, "time.now", {"timezone": "Europe/Paris"})
    data = result.envelope.data
    assert isinstance(data, dict) and data["timezone"] == "Europe/Paris"
    assert data["iso"].endswith(("+01:00", "+02:00"))
    bad = await run(ex, "time.now", {"timezone": "Mars/Olympus"})
    assert "unknown time zone" in str(error_of(bad)["message"])


def test_packs_are_selected_by_configuration(tree: Path, db: Path) -> None:
    assert {"demo", "agent"} <= set(available_packs())
    assert load_packs(Settings(tool_packs="demo")).names() == ["places.search", "bookings.create"]
    only_time = load_packs(Settings(tool_packs="agent"))
    assert only_time.names() == ["time.now"]  # fs.read and sqlite.query are not configured
    both = load_packs(Settings(tool_packs="demo, agent", fs_read_roots=str(tree), sqlite_path=db))
    assert both.names() == [
        "places.search",
        "bookings.create",
        "time.now",
        "fs.read",
        "sqlite.query",
    ]
    assert {s.source for s in both} == {"pack:demo", "pack:agent"}


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"tool_packs": "demo,nope"}, "unknown pack 'nope'"),
        ({"tool_packs": "agent", "fs_read_roots": "/nonexistent/dir"}, "not a directory"),
        ({"tool_packs": "agent", "sqlite_path": "/nonexistent.db"}, "not a file"),
    ],
)
def test_bad_pack_settings_are_start_up_errors(settings: dict[str, Any], why: str) -> None:
    with pytest.raises(ToolConfigError, match=why):
        load_packs(Settings(**settings))
