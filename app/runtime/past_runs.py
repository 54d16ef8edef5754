"""Past runs, read back from the artifacts (SPEC §2: ``GET /v1/runs``, ``GET /v1/runs/{id}``),
for the web UI's list and replay.

The artifacts directory is written by :mod:`toolforge.runtime.artifacts`; this module only
reads it, and reads it defensively, because a URL names what is read:

* **The stream id is validated** by the same rule that wrote it
  (:meth:`ArtifactStore.run`: one plain path component, never ``.`` or ``..``), and the
  run's directory must resolve inside ``runs/``: a symlink planted there cannot point the
  reader at the rest of the disk. Files are opened with ``O_NOFOLLOW``.
* **Reads are bounded**: a run's files are read up to :data:`MAX_RUN_BYTES` in all (a
  long run's ``frames.ndjson`` is cut at a line boundary and marked ``truncated``), and
  the list reads only the small files of at most ``limit`` runs.
* **A torn or foreign file is not an error**: a run being written (files appear one by
  one, each atomically) or a file that is not JSON reads as ``null``; the list skips
  entries that are not run directories.
* **Blocking I/O runs in** ``asyncio.to_thread``, off the event loop that serves streams.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.artifacts import ArtifactStore

__all__ = ["MAX_LIST", "MAX_RUN_BYTES", "PastRuns"]

MAX_RUN_BYTES: Final = 16 * 1024 * 1024
"""At most this much of one run is read for a replay: thousands of frames, far below memory."""
MAX_LIST: Final = 500
"""The most runs one ``GET /v1/runs`` lists (the UI shows 50)."""
_MAX_SMALL_FILE: Final = 2 * 1024 * 1024  # prompt/result/metrics of one run, for the list
_INPUT_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class PastRuns:
    """The runs under an :class:`ArtifactStore`'s ``runs/`` directory."""

    store: ArtifactStore

    async def newest(self, limit: int = 50) -> list[dict[str, Any]]:
        """Summaries of the newest ``limit`` runs, newest first."""
        return await asyncio.to_thread(self._list, max(0, min(limit, MAX_LIST)))

    async def get(self, stream_id: str) -> dict[str, Any]:
        """One run's frames and files; ``RequestError`` 404 when there is no such run."""
        return await asyncio.to_thread(self._get, stream_id)

    # -- in a worker thread -------------------------------------------------------------

    def _root(self) -> Path | None:
        runs = self.store.runs
        return runs.resolve() if runs.is_dir() else None

    def _list(self, limit: int) -> list[dict[str, Any]]:
        root = self._root()
        if root is None:
            return []
        found: list[tuple[float, str]] = []
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    self.store.run(entry.name)  # the writer's own rule for a stream id
                    # metrics.json is written last: its time is when the run ended.
                    ended = os.stat(os.path.join(entry.path, "metrics.json")).st_mtime
                except (RequestError, OSError):
                    continue  # not a run, or one still being written
                found.append((ended, entry.name))
        found.sort(reverse=True)
        return [self._summary(root / name, name, ended) for ended, name in found[:limit]]

    def _summary(self, directory: Path, stream_id: str, ended: float) -> dict[str, Any]:
        prompt = _read_json(directory / "prompt.json", _MAX_SMALL_FILE)
        result = _read_json(directory / "result.json", _MAX_SMALL_FILE)
        metrics = _read_json(directory / "metrics.json", _MAX_SMALL_FILE)
        return {
            "stream_id": stream_id,
            "ended_at": datetime.fromtimestamp(ended, UTC).isoformat(timespec="seconds"),
            "reason": _field(result, "reason"),
            "model": _field(prompt, "model"),
            "mode": _field(prompt, "mode"),
            "input": _first_user_input(prompt),
            "frames": _field(metrics, "frames"),
            "duration_ms": _field(metrics, "duration_ms"),
            "owner": _field(prompt, "owner"),  # the API key's name (SPEC §11), or None
        }

    def _get(self, stream_id: str) -> dict[str, Any]:
        directory = self.store.run(stream_id).directory  # validates the id (400)
        root = self._root()
        missing = RequestError(
            ErrorCode.NOT_FOUND,
            f"no run {stream_id!r} in the artifacts (GET /v1/runs lists them)",
            http_status=404,
        )
        if root is None or directory.is_symlink() or not directory.is_dir():
            raise missing
        if not directory.resolve().is_relative_to(root):
            raise missing
        budget = MAX_RUN_BYTES
        frames, truncated, used = _read_frames(directory / "frames.ndjson", budget)
        budget -= used
        out: dict[str, Any] = {"stream_id": stream_id, "frames": frames, "truncated": truncated}
        for name in ("prompt", "result", "tool_logs", "metrics"):
            out[name] = _read_json(directory / f"{name}.json", max(budget, 0))
        return out


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


def _read_bytes(path: Path, limit: int) -> tuple[bytes, bool] | None:
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


def _read_json(path: Path, limit: int) -> Any:
    read = _read_bytes(path, limit)
    if read is None or read[1]:
        return None  # missing, unreadable, or over the budget
    try:
        return orjson.loads(read[0])
    except orjson.JSONDecodeError:
        return None


def _read_frames(path: Path, limit: int) -> tuple[list[Any], bool, int]:
    """frames.ndjson as a list, cut at the last whole line within ``limit``."""
    read = _read_bytes(path, limit)
    if read is None:
        return [], False, 0
    data, more = read
    if more:
        data = data[: data.rfind(b"\n") + 1]
    frames: list[Any] = []
    for line in data.splitlines():
        try:
            frames.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            more = True  # a line we cannot read: say the replay is not whole
    return frames, more, len(data)
