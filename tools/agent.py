"""The local agent pack (``TOOL_PACKS=agent``): ``fs.read``, ``sqlite.query``, ``time.now``.

Tools see only what their settings give them (docs/security.md):

* ``fs.read`` reads UTF-8 text under the roots of ``FS_READ_ROOTS`` and nowhere else. A
  path is relative, its first segment names the root (``docs/guide.md`` is ``guide.md``
  in the root named ``docs``); absolute paths and ``..`` segments are refused before
  anything touches the disk, and the resolved path (every symlink followed) must still
  lie inside the root's own resolved path, so a link pointing out is refused too. Only
  regular files are read (a FIFO or a device could block or never end), opened with
  ``O_NOFOLLOW`` on the final component after the check and verified again by
  ``fstat``. A read returns at most ``FS_READ_MAX_BYTES`` from ``offset``
  (``truncated`` says more follows): a huge file is read in windows, never whole.
* ``sqlite.query`` runs one statement against ``SQLITE_PATH``, opened read-only by the
  SQLite library itself (a ``file:…?mode=ro`` URI), with ``PRAGMA query_only`` and an
  authorizer that refuses ``ATTACH`` (which could open another file read-write) and
  every write: read-only is enforced by SQLite, not guessed by parsing the SQL. At most
  ``SQLITE_MAX_ROWS`` rows come back (``truncated`` says more exist).
  Memory is bounded before the result cap could apply: SQLite's own limits
  (``setlimit``) keep any one string or blob within ``SQLITE_MAX_VALUE_BYTES`` (so
  ``randomblob(50000000)`` fails before it allocates), rows are counted in bytes as they
  are fetched and the query stops with ``TOOL_OUTPUT_TOO_LARGE`` once they pass
  ``SQLITE_MAX_RESULT_BYTES``, and the authorizer lets a statement call only the ordinary
  functions of :data:`ALLOWED_FUNCTIONS` (no ``fts3_tokenizer``, which hands out a native
  pointer, no ``load_extension``).
* ``time.now``: the current time, in UTC or an IANA time zone.

A tool whose setting is unset is not registered (an agent pack without ``FS_READ_ROOTS``
has no ``fs.read``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
import stat
import time
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from toolforge.core.tool_specs import PermanentToolError, ToolSpec
from toolforge.errors import ErrorCode
from toolforge.settings import Settings

__all__ = [
    "ALLOWED_FUNCTIONS",
    "FsReadArgs",
    "ReadRoot",
    "SqliteQueryArgs",
    "TimeNowArgs",
    "fs_read_spec",
    "pack_tools",
    "parse_roots",
    "read_file",
    "run_query",
    "sqlite_query_spec",
    "time_now_spec",
]

_SQL_MAX_CHARS: Final = 8_000
# Statement steps between checks of the deadline: a runaway query is interrupted.
_PROGRESS_STEPS: Final = 10_000


# -- fs.read ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadRoot:
    """One allowlisted directory: the name a path starts with, and its resolved path."""

    name: str
    path: Path


def parse_roots(setting: str) -> list[ReadRoot]:
    """``FS_READ_ROOTS`` (``os.pathsep``-separated ``name=path`` or ``path``) as roots.
    Each must be an existing directory; names must be unique."""
    roots: list[ReadRoot] = []
    for part in setting.split(os.pathsep):
        part = part.strip()
        if not part:
            continue
        name, sep, raw = part.partition("=")
        if not sep:
            name, raw = "", part
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise ValueError(f"FS_READ_ROOTS: {raw!r} is not a directory")
        resolved = path.resolve(strict=True)
        name = name.strip() or resolved.name
        if not name or "/" in name or name in {".", ".."}:
            raise ValueError(f"FS_READ_ROOTS: {part!r} needs a name (name=path)")
        if any(r.name == name for r in roots):
            raise ValueError(f"FS_READ_ROOTS: two roots are named {name!r}")
        roots.append(ReadRoot(name, resolved))
    return roots


class FsReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="fs.read")

    path: str = Field(
        min_length=1,
        max_length=1024,
        description="Relative path whose first segment is a root's name, e.g. 'docs/README.md'.",
    )
    offset: int = Field(default=0, ge=0, description="Byte offset to start reading at.")
    max_bytes: int | None = Field(
        default=None, ge=1, description="Bytes to read at most (default and cap: the limit)."
    )


def _refuse(message: str) -> PermanentToolError:
    return PermanentToolError(message, code=ErrorCode.PATH_NOT_ALLOWED)


def _locate(roots: Sequence[ReadRoot], raw: str) -> tuple[ReadRoot, Path]:
    """The root and the candidate path for ``raw``, refusing what is never allowed,
    lexically, before any file system access."""
    names = ", ".join(r.name for r in roots)
    if "\x00" in raw:
        raise _refuse("the path contains a NUL character")
    if raw.startswith(("/", "\\", "~")) or PurePosixPath(raw).is_absolute() or ":" in raw[:3]:
        raise _refuse(f"absolute paths are not allowed; start with a root name ({names})")
    parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse("'..' is not allowed in a path")
    if not parts:
        raise _refuse(f"name a file under a root ({names})")
    root = next((r for r in roots if r.name == parts[0]), None)
    if root is None:
        raise _refuse(f"no root named {parts[0]!r}; the roots are: {names}")
    return root, root.path.joinpath(*parts[1:])


def read_file(
    roots: Sequence[ReadRoot], raw: str, *, offset: int, max_bytes: int
) -> dict[str, object]:
    """The blocking read behind ``fs.read`` (run in a thread)."""
    root, candidate = _locate(roots, raw)
    try:
        resolved = candidate.resolve(strict=True)
    except FileNotFoundError:
        raise PermanentToolError(f"{raw} does not exist", code=ErrorCode.NOT_FOUND) from None
    except (OSError, RuntimeError) as exc:  # a symlink loop is a RuntimeError on 3.11
        raise _refuse(f"{raw} cannot be resolved ({type(exc).__name__})") from None
    if not resolved.is_relative_to(root.path):
        raise _refuse(f"{raw} resolves outside the root {root.name!r} (a symlink out)")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(resolved, flags)
    except OSError as exc:
        raise _refuse(f"{raw} cannot be opened ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refuse(f"{raw} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        data = fh.read(max_bytes)
    end = offset + len(data)
    return {
        "path": raw,
        "size": info.st_size,
        "offset": offset,
        "bytes": len(data),
        "truncated": end < info.st_size,
        "content": data.decode("utf-8", errors="replace"),
    }


def fs_read_spec(roots: Sequence[ReadRoot], limit: int) -> ToolSpec[FsReadArgs]:
    names = ", ".join(r.name for r in roots)
    bound = tuple(roots)

    async def fs_read(args: FsReadArgs) -> dict[str, object]:
        want = limit if args.max_bytes is None else min(args.max_bytes, limit)
        return await asyncio.to_thread(
            read_file, bound, args.path, offset=args.offset, max_bytes=want
        )

    return ToolSpec(
        name="fs.read",
        description=f"Read a UTF-8 text file under one of these roots: {names}. The path "
        f"starts with the root's name. At most {limit} bytes per call; use offset to read "
        "further when truncated is true.",
        args_model=FsReadArgs,
        fn=fs_read,
        idempotent=True,
        retries=0,
        # File contents stay out of logs and artifacts: only where and how much.
        output_allowlist=frozenset({"path", "size", "offset", "bytes", "truncated"}),
    )


# -- sqlite.query -------------------------------------------------------------------------


class SqliteQueryArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="sqlite.query")

    sql: str = Field(
        min_length=1, max_length=_SQL_MAX_CHARS, description="One read-only SQL statement."
    )
    # Any: SQLite binds strings, numbers and null; a union here would be an anyOf the
    # tool schema subset refuses (docs/tools.md), so the types are checked in run_query.
    params: list[Any] = Field(
        default_factory=list,
        max_length=100,
        description="Values for the ? placeholders (strings, numbers or null).",
    )


_WRITES: Final = frozenset(
    {
        sqlite3.SQLITE_ATTACH,
        sqlite3.SQLITE_DETACH,
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_TEMP_INDEX,
        sqlite3.SQLITE_CREATE_TEMP_TABLE,
        sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
        sqlite3.SQLITE_CREATE_TEMP_VIEW,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_CREATE_VIEW,
        sqlite3.SQLITE_CREATE_VTABLE,
        sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_INDEX,
        sqlite3.SQLITE_DROP_TEMP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_TRIGGER,
        sqlite3.SQLITE_DROP_TEMP_VIEW,
        sqlite3.SQLITE_DROP_TRIGGER,
        sqlite3.SQLITE_DROP_VIEW,
        sqlite3.SQLITE_DROP_VTABLE,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_REINDEX,
        sqlite3.SQLITE_ANALYZE,
        sqlite3.SQLITE_TRANSACTION,
        sqlite3.SQLITE_SAVEPOINT,
    }
)


ALLOWED_FUNCTIONS: Final = frozenset(
    {
        # core scalar functions
        *("abs", "char", "coalesce", "concat", "concat_ws", "format", "glob", "hex"),
        *("ifnull", "iif", "instr", "length", "like", "likelihood", "likely", "lower"),
        *("ltrim", "max", "min", "nullif", "octet_length", "printf", "quote", "random"),
        *("randomblob", "replace", "round", "rtrim", "sign", "substr", "substring"),
        *("trim", "typeof", "unhex", "unicode", "unlikely", "upper", "zeroblob"),
        # aggregates
        *("avg", "count", "group_concat", "string_agg", "sum", "total"),
        # window functions
        *("row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile"),
        *("lag", "lead", "first_value", "last_value", "nth_value"),
        # dates and times
        *("date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff"),
        # math (where SQLite was built with it)
        *("acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling"),
        *("cos", "cosh", "degrees", "exp", "floor", "ln", "log", "log10", "log2", "mod"),
        *("pi", "pow", "power", "radians", "sin", "sinh", "sqrt", "tan", "tanh", "trunc"),
        # JSON (json_each and json_tree are tables, read like any table)
        *("json", "json_array", "json_array_length", "json_extract", "json_insert"),
        *("json_object", "json_patch", "json_quote", "json_remove", "json_replace"),
        *("json_set", "json_type", "json_valid", "json_group_array", "json_group_object"),
    }
)
"""The functions a ``sqlite.query`` statement may call. Anything else is refused by the
authorizer before the statement runs: ``fts3_tokenizer`` (it returns a native pointer and,
with two arguments, installs one), ``load_extension``, ``sqlite_*`` introspection, and any
function an extension or a later SQLite adds. ``randomblob`` and ``zeroblob`` stay, bounded
by ``SQLITE_MAX_VALUE_BYTES`` like every value."""

# Structural caps, far above what a one-statement read needs and far below SQLite's
# defaults (a 1 GB statement, 2000 columns, 500 UNION arms, an expression 1000 deep).
_FIXED_LIMITS: Final = (
    (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * _SQL_MAX_CHARS),  # UTF-8: 4 bytes a char at most
    (sqlite3.SQLITE_LIMIT_COLUMN, 200),
    (sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 100),
    (sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 50),
    (sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 32),
    (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000),
    (sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 100),  # SqliteQueryArgs.params holds 100
    (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
    (sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 1),
)


@dataclass(slots=True)
class _Authorizer:
    """Read-only, named pragmas only, allowlisted functions only; remembers the function
    it refused, so that the error can name it."""

    refused: str | None = None

    def __call__(self, action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action in _WRITES:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and arg1 not in {
            "table_info",
            "table_list",
            "index_list",
        }:
            return sqlite3.SQLITE_DENY  # query_only, journal_mode, writable_schema...: no
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in ALLOWED_FUNCTIONS:
            self.refused = arg2
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


def _cell(value: object) -> object:
    return value.hex() if isinstance(value, bytes) else value


def _cell_bytes(value: object) -> int:
    """About what a cell costs in the JSON result (a little over, never under by much)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) + 2
    if isinstance(value, bytes):
        return 2 * len(value) + 2  # as hex
    if value is None:
        return 4
    return len(repr(value))


def _too_large(message: str) -> PermanentToolError:
    return PermanentToolError(message, code=ErrorCode.TOOL_OUTPUT_TOO_LARGE)


def run_query(
    path: Path,
    sql: str,
    params: Sequence[object],
    *,
    max_rows: int,
    timeout_s: float,
    max_result_bytes: int = 32 * 1024,
    max_value_bytes: int = 1024 * 1024,
) -> dict[str, object]:
    """The blocking query behind ``sqlite.query`` (run in a thread).

    ``max_value_bytes`` is SQLite's own length limit (no string, blob or row larger is
    ever built); ``max_result_bytes`` bounds the rows fetched, counted as they come."""
    for i, value in enumerate(params):
        if not (value is None or isinstance(value, str | int | float)):
            raise PermanentToolError(
                f"params[{i}] is a {type(value).__name__}; bind strings, numbers or null",
                code=ErrorCode.TOOL_ARGS_INVALID,
            )
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=1.0, check_same_thread=False)
    except sqlite3.Error as exc:
        raise PermanentToolError(f"the database cannot be opened: {exc}") from None
    deadline = time.monotonic() + timeout_s
    authorizer = _Authorizer()
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
        for limit, value in _FIXED_LIMITS:
            conn.setlimit(limit, value)
        conn.set_authorizer(authorizer)
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
        try:
            cursor = conn.execute(sql, tuple(params))
            rows: list[tuple[object, ...]] = []
            size = 0
            # Row by row, counted: a query of a million wide rows stops at the cap, with
            # no more than one row past it ever held.
            for row in cursor:
                if len(rows) == max_rows:
                    rows.append(row)  # one more than shown: the answer is truncated
                    break
                size += sum(_cell_bytes(v) for v in row) + 2
                if size > max_result_bytes:
                    raise _too_large(
                        f"the rows come to more than {max_result_bytes} bytes after "
                        f"{len(rows)} of them (SQLITE_MAX_RESULT_BYTES); select fewer "
                        "columns, shorter values (substr) or fewer rows (LIMIT)"
                    )
                rows.append(row)
        except sqlite3.DataError as exc:  # SQLITE_TOOBIG: a value over the length limit
            raise _too_large(
                f"a value would be larger than {max_value_bytes} bytes "
                f"(SQLITE_MAX_VALUE_BYTES): {exc}; ask for less"
            ) from None
        except sqlite3.DatabaseError as exc:
            message = str(exc)
            if authorizer.refused is not None and "not authorized" in message:
                raise PermanentToolError(
                    f"sqlite.query does not allow the function {authorizer.refused}(); "
                    "use ordinary scalar, aggregate, window, date, math or JSON functions",
                    code=ErrorCode.TOOL_ARGS_INVALID,
                ) from None
            if "too big" in message:
                raise _too_large(
                    f"{message}: a value, the statement or the row is over a limit "
                    f"(values: {max_value_bytes} bytes, SQLITE_MAX_VALUE_BYTES)"
                ) from None
            if "not authorized" in message or "readonly" in message or "query_only" in message:
                raise PermanentToolError(
                    f"sqlite.query is read-only: {message}; use SELECT", code=ErrorCode.READ_ONLY
                ) from None
            if "interrupted" in message:
                raise PermanentToolError(
                    f"the query ran past {timeout_s:g} s; narrow it", code=ErrorCode.TOOL_TIMEOUT
                ) from None
            raise PermanentToolError(f"SQL error: {message}") from None
        except sqlite3.Warning as exc:  # e.g. more than one statement
            raise PermanentToolError(f"SQL error: {exc}; send one statement") from None
        columns = [d[0] for d in cursor.description or ()]
        return {
            "columns": columns,
            "rows": [[_cell(v) for v in row] for row in rows[:max_rows]],
            "row_count": min(len(rows), max_rows),
            "truncated": len(rows) > max_rows,
        }
    finally:
        conn.close()


def sqlite_query_spec(
    path: Path,
    max_rows: int,
    timeout_s: float,
    *,
    max_result_bytes: int = 32 * 1024,
    max_value_bytes: int = 1024 * 1024,
) -> ToolSpec[SqliteQueryArgs]:
    async def sqlite_query(args: SqliteQueryArgs) -> dict[str, object]:
        return await asyncio.to_thread(
            run_query,
            path,
            args.sql,
            args.params,
            max_rows=max_rows,
            timeout_s=timeout_s,
            max_result_bytes=max_result_bytes,
            max_value_bytes=max_value_bytes,
        )

    return ToolSpec(
        name="sqlite.query",
        description=f"Run one read-only SQL query (SQLite) on the database {path.name}. "
        f"Returns columns and at most {max_rows} rows ({max_result_bytes} bytes); writes "
        "and unusual functions are refused.",
        args_model=SqliteQueryArgs,
        fn=sqlite_query,
        idempotent=True,
        retries=0,
        # Row values stay out of logs and artifacts: only the shape of the answer.
        output_allowlist=frozenset({"columns", "row_count", "truncated"}),
    )


# -- time.now -----------------------------------------------------------------------------


class TimeNowArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", title="time.now")

    timezone: str = Field(
        default="UTC", max_length=64, description="IANA time zone, e.g. 'Europe/Paris'."
    )


def time_now_spec() -> ToolSpec[TimeNowArgs]:
    async def time_now(args: TimeNowArgs) -> dict[str, object]:
        try:
            zone = zoneinfo.ZoneInfo(args.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise PermanentToolError(
                f"unknown time zone {args.timezone!r}; use an IANA name like 'Europe/Paris'",
                code=ErrorCode.TOOL_ARGS_INVALID,
            ) from None
        now = dt.datetime.now(zone)
        return {
            "iso": now.isoformat(timespec="seconds"),
            "unix": round(now.timestamp(), 3),
            "timezone": args.timezone,
            "weekday": now.strftime("%A"),
        }

    return ToolSpec(
        name="time.now",
        description="The current date and time, in UTC or a given IANA time zone.",
        args_model=TimeNowArgs,
        fn=time_now,
        retries=0,
        output_allowlist=frozenset({"*"}),
    )


def pack_tools(settings: Settings) -> list[ToolSpec[Any]]:
    """``time.now``, plus ``fs.read`` when ``FS_READ_ROOTS`` is set and ``sqlite.query``
    when ``SQLITE_PATH`` is."""
    specs: list[ToolSpec[Any]] = [time_now_spec()]
    if settings.fs_read_roots:
        specs.append(fs_read_spec(parse_roots(settings.fs_read_roots), settings.fs_read_max_bytes))
    if settings.sqlite_path is not None:
        if not settings.sqlite_path.is_file():
            raise ValueError(f"SQLITE_PATH: {settings.sqlite_path} is not a file")
        specs.append(
            sqlite_query_spec(
                settings.sqlite_path,
                settings.sqlite_max_rows,
                settings.tool_timeout_ms / 1000,
                max_result_bytes=settings.sqlite_max_result_bytes,
                max_value_bytes=settings.sqlite_max_value_bytes,
            )
        )
    return specs
