"""Past runs, read back from the artifacts (docs/protocol.md: ``GET /v1/runs``, ``GET
/v1/runs/{id}``), for the web UI's list and replay.

The artifacts directory is written by :mod:`toolforge.runtime.artifacts`; this module only
reads it, and reads it defensively, because a URL names what is read:

* **The stream id is validated** by the same rule that wrote it
  (:meth:`ArtifactStore.run`: one plain path component, never ``.`` or ``..``), and the
  run's directory must resolve inside ``runs/``: a symlink planted there cannot point the
  reader at the rest of the disk. Files are opened with ``O_NOFOLLOW``.
* **Reads are bounded**: a run's files are read up to :data:`MAX_RUN_BYTES` in all (a
  long run's ``frames.ndjson`` is cut at a line boundary and marked ``truncated``), and
  the list reads no run at all: it reads the index's last lines
  (:mod:`toolforge.runtime.run_index`), rebuilt from the runs when it is missing or
  corrupt.
* **A torn or foreign file is not an error**: a run being written (files appear one by
  one, each atomically) or a file that is not JSON reads as ``null``; the list skips
  entries that are not run directories.
* **Blocking I/O runs in** ``asyncio.to_thread``, off the event loop that serves streams.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.run_index import read_bytes, read_json

__all__ = ["MAX_LIST", "MAX_RUN_BYTES", "PastRuns"]

MAX_RUN_BYTES: Final = 16 * 1024 * 1024
"""At most this much of one run is read for a replay: thousands of frames, far below memory."""
MAX_LIST: Final = 500
"""The most runs one ``GET /v1/runs`` lists (the UI shows 50)."""


@dataclass(frozen=True, slots=True)
class PastRuns:
    """The runs under an :class:`ArtifactStore`'s ``runs/`` directory."""

    store: ArtifactStore

    async def newest(self, limit: int = 50, *, owner: str | None = None) -> list[dict[str, Any]]:
        """Summaries of the newest ``limit`` runs, newest first; with ``owner``, only the
        runs of that API key."""
        return await asyncio.to_thread(self._list, max(0, min(limit, MAX_LIST)), owner)

    async def get(self, stream_id: str) -> dict[str, Any]:
        """One run's frames and files; ``RequestError`` 404 when there is no such run."""
        return await asyncio.to_thread(self._get, stream_id)

    # -- in a worker thread -------------------------------------------------------------

    def _root(self) -> Path | None:
        runs = self.store.runs
        return runs.resolve() if runs.is_dir() else None

    def _list(self, limit: int, owner: str | None) -> list[dict[str, Any]]:
        return [_listed(entry) for entry in self.store.index.newest(limit, owner=owner)]

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
            out[name] = read_json(directory / f"{name}.json", max(budget, 0))
        return out


def _listed(entry: dict[str, Any]) -> dict[str, Any]:
    """An index line as ``GET /v1/runs`` shows it."""
    return {
        "stream_id": entry["stream_id"],
        "ended_at": datetime.fromtimestamp(entry["ended"], UTC).isoformat(timespec="seconds"),
        "reason": entry.get("reason"),
        "model": entry.get("model"),
        "mode": entry.get("mode"),
        "input": entry.get("input"),
        "frames": entry.get("frames"),
        "duration_ms": entry.get("duration_ms"),
        "owner": entry.get("owner"),  # the API key's name, or None
    }


def _read_frames(path: Path, limit: int) -> tuple[list[Any], bool, int]:
    """frames.ndjson as a list, cut at the last whole line within ``limit``."""
    read = read_bytes(path, limit)
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
