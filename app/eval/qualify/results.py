"""``results.jsonl``: one line per finished run, appended as it finishes, so a killed batch
loses at most the runs in flight and resumes where it stopped.

Each line is written whole with one ``write`` and flushed to disk; a line cut short by a kill
(no trailing newline, or not JSON) is dropped on reading and that run is done again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import orjson

from toolforge.eval.qualify.metrics import RunResult

__all__ = ["ResultsFile"]


class ResultsFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[RunResult]:
        """Every complete line, in order; a torn last line is ignored."""
        if not self.path.exists():
            return []
        out: list[RunResult] = []
        raw = self.path.read_bytes()
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            try:
                out.append(RunResult.from_dict(orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError):
                continue  # a line a kill cut short: the run is done again
        return out

    def done(self) -> set[tuple[str, str, str, str, int]]:
        return {r.key() for r in self.read()}

    def repair_tail(self) -> None:
        """Drop a torn last line left by a kill, so the next append starts a new line."""
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            keep = raw[: raw.rfind(b"\n") + 1]
            self.path.write_bytes(keep)

    def append(self, results: Iterable[RunResult]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = b"".join(orjson.dumps(r.to_dict()) + b"\n" for r in results)
        with self.path.open("ab") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
