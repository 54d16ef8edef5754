"""The index of past runs: one JSON line per written run, ``<root>/runs/.index.ndjson``.

``GET /v1/runs`` lists the newest runs and retention removes the oldest; both read this
file instead of opening every run's ``prompt.json``, ``result.json`` and ``metrics.json``
(a list of 50 from ten thousand runs reads the file's last few KB). Each line is a run's
summary, its end time and its size on disk::

    {"stream_id": "s_…", "ended": 1764236000.5, "bytes": 18211, "reason": "stop",
     "model": "…", "mode": "sentinel", "input": "the first user message, shortened",
     "frames": 12, "duration_ms": 512.3, "owner": null}

Why it is built this way:

* **Appended, never edited in place**: :class:`~toolforge.runtime.artifacts.ArtifactStore`
  appends a line after a run's files are written (``O_APPEND``, one ``write``), under a
  lock shared with retention, which rewrites the file whole (a temp file, then
  ``os.replace``) without the runs it removed. A run written again (the same stream id)
  has two lines; the later wins.
* **The runs are the truth, the index a cache of them.** A missing index is rebuilt from
  the run directories (the slow path: each run's small files are read once), and so is
  one with a line that is not a summary (a torn write, an edit by hand). A last line
  without its newline is an append in progress, skipped, not a corruption. A run whose
  directory is gone is not listed; :meth:`RunIndex.reconcile` (at start-up) adds runs
  the index lacks (written by an older gateway, or by another replica whose append a
  rewrite raced) and drops entries whose runs are gone.
* **Blocking**: every method does file I/O; callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = [
    "INDEX_NAME",
    "RunIndex",
    "create_file",
    "read_bytes",
    "read_json",
    "replace_atomically",
    "summarise",
]

INDEX_NAME: Final = ".index.ndjson"
_INPUT_CHARS: Final = 200
_MAX_SMALL_FILE: Final = 2 * 1024 * 1024  # prompt/result/metrics of one run, when rebuilding
_TAIL_BLOCK: Final = 64 * 1024
# The rule the writer applies to a stream id (artifacts._STREAM_ID), for the rebuild's scan.
_STREAM_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class _Corrupt(Exception):
    """A line of the index is not a run summary: rebuild it."""


def summarise(
    stream_id: str,
    *,
    ended: float,
    size: int,
    prompt: object,
    result: object,
    metrics: object,
) -> dict[str, Any]:
    """A run's index line, from its (redacted) prompt, result and metrics documents."""
    return {
        "stream_id": stream_id,
        "ended": ended,
        "bytes": size,
        "reason": _field(result, "reason"),
        "model": _field(prompt, "model"),
        "mode": _field(prompt, "mode"),
        "input": _first_user_input(prompt),
        "frames": _field(metrics, "frames"),
        "duration_ms": _field(metrics, "duration_ms"),
        "owner": _field(prompt, "owner"),  # the API key's name, or None
    }


@dataclass(slots=True)
class RunIndex:
    """The index file of one ``runs/`` directory (see the module docstring)."""

    runs: Path
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def path(self) -> Path:
        return self.runs / INDEX_NAME

    # -- writing ------------------------------------------------------------------------

    def append(self, entry: Mapping[str, Any]) -> None:
        """Add a written run. The first run of an unindexed directory builds the index
        (its older runs included) instead."""
        line = orjson.dumps(entry) + b"\n"
        with self.lock:
            if not self.path.exists():
                self._rebuild_locked()
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

    def rewrite(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Replace the index with ``entries`` (the caller holds :attr:`lock`)."""
        self.runs.mkdir(parents=True, exist_ok=True)
        replace_atomically(self.path, b"".join(orjson.dumps(e) + b"\n" for e in entries))

    # -- reading ------------------------------------------------------------------------

    def newest(self, limit: int, *, owner: str | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` runs whose directory still exists, newest first; with
        ``owner``, only that API key's runs. Reads the file from its end."""
        if limit <= 0 or not self.runs.is_dir():
            return []
        try:
            return self._newest(limit, owner)
        except (_Corrupt, FileNotFoundError):
            with self.lock:
                self._rebuild_locked()
            return self._newest(limit, owner)

    def entries(self) -> list[dict[str, Any]]:
        """Every indexed run, the latest line per stream id, oldest first (the caller
        holds :attr:`lock`); a missing or corrupt index is rebuilt first."""
        try:
            lines = list(self._lines_forward())
        except (_Corrupt, FileNotFoundError):
            return self._rebuild_locked()
        latest: dict[str, dict[str, Any]] = {}
        for entry in lines:
            latest.pop(entry["stream_id"], None)
            latest[entry["stream_id"]] = entry
        return sorted(latest.values(), key=lambda e: e["ended"])

    def reconcile(self) -> list[dict[str, Any]]:
        """The index made to match the directories (runs it lacks added, runs gone
        dropped), rewritten if that changed it; the caller holds :attr:`lock`."""
        if not self.runs.is_dir():
            return []
        indexed = self.entries()
        on_disk = set(_run_names(self.runs))
        kept = [e for e in indexed if e["stream_id"] in on_disk]
        missing = on_disk - {e["stream_id"] for e in kept}
        added = [s for s in (_summary_from_disk(self.runs, n) for n in missing) if s is not None]
        if len(kept) != len(indexed) or added:
            kept = sorted([*kept, *added], key=lambda e: e["ended"])
            self.rewrite(kept)
        return kept

    def _newest(self, limit: int, owner: str | None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        seen: set[str] = set()
        for entry in self._lines_backward():
            stream_id = entry["stream_id"]
            if stream_id in seen:
                continue  # an older line of a run written again
            seen.add(stream_id)
            if owner is not None and entry.get("owner") != owner:
                continue
            if not (self.runs / stream_id).is_dir():
                continue  # removed since (retention on another replica, by hand)
            found.append(entry)
            if len(found) >= limit:
                break
        # Appends follow the order runs end in; a sort settles concurrent writers.
        found.sort(key=lambda e: e["ended"], reverse=True)
        return found

    def _lines_backward(self) -> Iterator[dict[str, Any]]:
        """The index's complete lines, last first, read in blocks from the end."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            end = os.fstat(fd).st_size
            # A last line without its newline is an append in progress: not yet a line.
            drop_first = end > 0 and os.pread(fd, 1, end - 1) != b"\n"
            rest = b""
            while end > 0:
                start = max(0, end - _TAIL_BLOCK)
                block = os.pread(fd, end - start, start) + rest
                end = start
                lines = block.split(b"\n")
                rest = lines.pop(0) if start > 0 else b""  # a line's head is further back
                for line in reversed(lines):
                    if drop_first:
                        drop_first = False
                    elif line:
                        yield _entry(line)
        finally:
            os.close(fd)

    def _lines_forward(self) -> Iterator[dict[str, Any]]:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # the last line may be an append in progress
        for line in complete.splitlines():
            if line:
                yield _entry(line)

    def _rebuild_locked(self) -> list[dict[str, Any]]:
        """The index from the run directories (the slow path), written and returned."""
        if not self.runs.is_dir():
            return []
        summaries = (_summary_from_disk(self.runs, name) for name in _run_names(self.runs))
        found = sorted((e for e in summaries if e is not None), key=lambda e: e["ended"])
        self.rewrite(found)
        return found


def _entry(line: bytes) -> dict[str, Any]:
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _Corrupt from None
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("stream_id"), str)
        and _STREAM_ID.fullmatch(entry["stream_id"])  # it becomes a path: the writer's rule
        and ".." not in entry["stream_id"]
        and isinstance(entry.get("ended"), int | float)
        and isinstance(entry.get("bytes"), int)
    ):
        raise _Corrupt
    return entry


def _run_names(runs: Path) -> Iterator[str]:
    """The names under ``runs`` that are run directories by the writer's rule."""
    with os.scandir(runs) as found:
        for item in found:
            name = item.name
            if name.startswith(".") or not item.is_dir(follow_symlinks=False):
                continue
            if _STREAM_ID.fullmatch(name) and ".." not in name:
                yield name


def _summary_from_disk(runs: Path, name: str) -> dict[str, Any] | None:
    """A finished run's index line, read from its files; None while it is being written
    (metrics.json, written last, is missing)."""
    directory = runs / name
    size = 0
    ended: float | None = None
    try:
        with os.scandir(directory) as files:
            for item in files:
                if item.is_file(follow_symlinks=False):
                    info = item.stat(follow_symlinks=False)
                    size += info.st_size
                    if item.name == "metrics.json":
                        ended = info.st_mtime
    except OSError:
        return None
    if ended is None:
        return None
    return summarise(
        name,
        ended=ended,
        size=size,
        prompt=read_json(directory / "prompt.json", _MAX_SMALL_FILE),
        result=read_json(directory / "result.json", _MAX_SMALL_FILE),
        metrics=read_json(directory / "metrics.json", _MAX_SMALL_FILE),
    )


def read_bytes(path: Path, limit: int) -> tuple[bytes, bool] | None:
    """Up to ``limit`` bytes of a regular file (no symlinks), and whether there was more."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as file:
            data = file.read(limit + 1)
    except OSError:
        return None
    return data[:limit], len(data) > limit


def read_json(path: Path, limit: int) -> Any:
    """A JSON file of at most ``limit`` bytes, or None (missing, too big, not JSON)."""
    read = read_bytes(path, limit)
    if read is None or read[1]:
        return None
    try:
        return orjson.loads(read[0])
    except orjson.JSONDecodeError:
        return None


def _field(document: object, key: str) -> Any:
    return document.get(key) if isinstance(document, dict) else None


def _first_user_input(prompt: object) -> str | None:
    messages = _field(prompt, "messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content if len(content) <= _INPUT_CHARS else content[:_INPUT_CHARS] + "…"
    return None


def create_file(path: str | Path, data: bytes) -> None:
    """A new owner-only file at ``path`` holding ``data`` (never an existing file or a
    link followed); removed again if it cannot be written whole."""
    # os.open/os.write rather than a file object: O_EXCL and owner-only in half the system
    # calls (no buffered writer: no fstat, ioctl, lseek).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except BaseException:  # leave nothing behind, whatever interrupted us
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def replace_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never half."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    create_file(temp, data)
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
