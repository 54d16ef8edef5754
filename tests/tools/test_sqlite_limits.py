"""sqlite.query under attack: huge values, native-pointer functions and endless rows end in
typed tool errors, with memory bounded, through the executor as the model would call it."""

from __future__ import annotations

import resource
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from toolforge.runtime.executor import ToolExecutor, ToolResult
from toolforge.settings import Settings
from toolforge.tools import load_packs
from toolforge.tools.agent import ALLOWED_FUNCTIONS


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO items (name) VALUES (?)", [(f"item{i}",) for i in range(50)])
    conn.close()
    return path


def executor(db: Path, **extra: Any) -> ToolExecutor:
    settings = Settings(tool_packs="agent", sqlite_path=db, **extra)
    return ToolExecutor(load_packs(settings))


async def query(ex: ToolExecutor, sql: str) -> ToolResult:
    return await ex.run("sqlite.query", {"sql": sql}, call_id="c1")


def error_of(result: ToolResult) -> dict[str, Any]:
    assert not result.ok, result.envelope
    error = result.envelope.errors[0]
    assert isinstance(error, dict)
    return error


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT randomblob(50000000)",
        "SELECT zeroblob(50000000)",
        "SELECT length(hex(randomblob(600000)))",  # the hex doubles it past the limit
        "SELECT replace(hex(zeroblob(400000)), '0', 'ab')",
    ],
)
async def test_a_huge_value_is_refused_before_it_is_built(db: Path, sql: str) -> None:
    before = peak_rss_mib()
    error = error_of(await query(executor(db), sql))
    assert error["code"] == "TOOL_OUTPUT_TOO_LARGE", error
    assert "SQLITE_MAX_VALUE_BYTES" in error["message"]
    # 50 MB asked for (600 MB once hexed and encoded, unbounded); a few MiB of slack for
    # the interpreter's own growth.
    assert peak_rss_mib() - before < 16


async def test_printf_past_the_limit_builds_nothing(db: Path) -> None:
    before = peak_rss_mib()
    result = await query(executor(db), "SELECT printf('%.*c', 50000000, 'x')")
    # SQLite's printf answers NULL rather than an error once past the length limit.
    assert result.envelope.data["rows"] == [[None]]  # type: ignore[index]
    assert peak_rss_mib() - before < 16


async def test_the_value_limit_is_a_setting(db: Path) -> None:
    small = executor(db, sqlite_max_value_bytes=64 * 1024)
    assert error_of(await query(small, "SELECT length(randomblob(100000))"))["code"] == (
        "TOOL_OUTPUT_TOO_LARGE"
    )
    ok = await query(executor(db), "SELECT length(randomblob(100000))")
    assert ok.ok and ok.envelope.data["rows"] == [[100000]]  # type: ignore[index]


@pytest.mark.parametrize(
    ("sql", "function"),
    [
        ("SELECT hex(fts3_tokenizer('simple'))", "fts3_tokenizer"),
        ("SELECT fts3_tokenizer('simple', x'0000000000000000')", "fts3_tokenizer"),
        ("SELECT load_extension('/tmp/evil.so')", "load_extension"),
        ("SELECT sqlite_compileoption_get(0)", "sqlite_compileoption_get"),
        ("SELECT name FROM items WHERE upper(name) = 'X' OR Fts3_Tokenizer('simple')", None),
    ],
)
async def test_functions_outside_the_allowlist_are_refused(
    db: Path, sql: str, function: str | None
) -> None:
    error = error_of(await query(executor(db), sql))
    assert error["code"] == "TOOL_ARGS_INVALID", error
    assert f"{function or 'fts3_tokenizer'}()" in error["message"]
    assert "does not allow" in error["message"]


async def test_ordinary_functions_still_work(db: Path) -> None:
    result = await query(
        executor(db),
        "SELECT upper(name), length(name), count(*) OVER (), json_object('id', id), "
        "date('2026-01-02'), coalesce(NULL, 1) FROM items WHERE id = 1",
    )
    assert result.ok, result.envelope
    assert result.envelope.data["rows"] == [  # type: ignore[index]
        ["ITEM0", 5, 1, '{"id":1}', "2026-01-02", 1]
    ]
    assert {"fts3_tokenizer", "load_extension"}.isdisjoint(ALLOWED_FUNCTIONS)


async def test_ten_thousand_wide_rows_stop_at_the_byte_cap(db: Path) -> None:
    ex = executor(db, sqlite_max_rows=10_000, sqlite_max_result_bytes=8 * 1024)
    sql = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 10000) "
        "SELECT i, printf('%0200d', i) FROM n"
    )
    error = error_of(await query(ex, sql))
    assert error["code"] == "TOOL_OUTPUT_TOO_LARGE", error
    assert "SQLITE_MAX_RESULT_BYTES" in error["message"] and "8192 bytes" in error["message"]
    rows = int(error["message"].split(" after ")[1].split()[0])
    assert 30 < rows < 45  # ~210 bytes a row: stopped at the cap, not at 10,000


async def test_an_endless_query_stops_at_the_byte_cap_not_the_clock(db: Path) -> None:
    # No LIMIT at all: only the byte count stops it (the deadline is far away).
    ex = executor(db, sqlite_max_rows=10_000, tool_timeout_ms=60_000)
    sql = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
        "SELECT i, zeroblob(1000) FROM n"
    )
    error = error_of(await query(ex, sql))
    assert error["code"] == "TOOL_OUTPUT_TOO_LARGE", error


async def test_rows_under_the_cap_come_back_whole(db: Path) -> None:
    result = await query(executor(db, sqlite_max_rows=100), "SELECT id, name FROM items")
    assert result.ok
    data = result.envelope.data
    assert isinstance(data, dict)
    assert data["row_count"] == 50 and data["truncated"] is False
