"""The task store: documents, tasks with their embeddings, and relationships, in SQLite.

One file, made by ``toolforge index`` (or :meth:`TaskStore.index`). Embeddings are
L2-normalised float32 vectors stored as BLOBs, so cosine similarity is a dot product; a
search loads the matrix once per store and keeps it (1,000 × 384 floats is 1.5 MB) until
the next index. Tasks without an embedding (``status = 'pending'``) are never returned by
a search, but their documents still are by the context tool (docs/tools.md).

SQLite calls are synchronous and short; the tools run them in a worker thread.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from toolforge.tools.task_analysis.corpus import Document

__all__ = ["RELATIONSHIP_TYPES", "Embedder", "Relationship", "TaskRow", "TaskStore"]

RELATIONSHIP_TYPES: Final = ("prerequisite", "blocks", "related")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, content TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, text TEXT NOT NULL, done INTEGER NOT NULL,
    status TEXT NOT NULL, embedding BLOB
);
CREATE INDEX IF NOT EXISTS tasks_document ON tasks(document_id);
CREATE TABLE IF NOT EXISTS relationships (
    source TEXT NOT NULL, target TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('prerequisite', 'blocks', 'related')),
    confidence REAL NOT NULL, origin TEXT NOT NULL,
    PRIMARY KEY (source, target, type)
);
CREATE INDEX IF NOT EXISTS relationships_target ON relationships(target);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class Embedder(Protocol):
    """Text to L2-normalised vectors; ``query`` and ``passage`` may differ (e5 prefixes)."""

    name: str

    def query(self, text: str) -> np.ndarray[Any, Any]: ...

    def passages(self, texts: Sequence[str]) -> np.ndarray[Any, Any]: ...


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    document_id: str
    position: int
    text: str
    done: bool


@dataclass(frozen=True, slots=True)
class Relationship:
    source: str
    target: str
    type: str
    confidence: float
    origin: str

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "target": self.target,
            "type": self.type,
            "confidence": self.confidence,
            "origin": self.origin,
        }


class TaskStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._matrix: tuple[list[str], np.ndarray[Any, Any]] | None = None
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.execute("PRAGMA foreign_keys = ON")
        return db

    # -- writing ---------------------------------------------------------------------------
    def index(
        self, docs: Iterable[Document], embedder: Embedder, *, batch: int = 64
    ) -> tuple[int, int]:
        """Store ``docs`` (replacing documents of the same id) with their tasks' embeddings.
        Returns (documents, tasks)."""
        docs = list(docs)
        rows: list[tuple[str, str, int, str, int]] = [
            (t.id, d.id, t.position, t.text, int(t.done)) for d in docs for t in d.tasks
        ]
        vectors: list[np.ndarray[Any, Any]] = []
        for start in range(0, len(rows), batch):
            chunk = [r[3] for r in rows[start : start + batch]]
            vectors.append(np.asarray(embedder.passages(chunk), dtype=np.float32))
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
        with self._lock, self._connect() as db:
            for d in docs:
                db.execute("DELETE FROM documents WHERE id = ?", (d.id,))
                db.execute(
                    "INSERT INTO documents(id, title, content) VALUES (?, ?, ?)",
                    (d.id, d.title, d.content),
                )
            db.executemany(
                "INSERT OR REPLACE INTO tasks(id, document_id, position, text, done, status, "
                "embedding) VALUES (?, ?, ?, ?, ?, 'embedded', ?)",
                [(*r, matrix[i].tobytes()) for i, r in enumerate(rows)],
            )
            db.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('embedder', ?)", (embedder.name,)
            )
            self._matrix = None
        return len(docs), len(rows)

    def add_relationships(self, rels: Iterable[Relationship]) -> None:
        with self._connect() as db:
            db.executemany(
                "INSERT OR REPLACE INTO relationships VALUES (?, ?, ?, ?, ?)",
                [(r.source, r.target, r.type, r.confidence, r.origin) for r in rels],
            )

    def delete_document(self, doc_id: str) -> None:
        with self._lock, self._connect() as db:
            db.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
            self._matrix = None

    # -- reading ---------------------------------------------------------------------------
    def embedder_name(self) -> str | None:
        with self._connect() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
        return None if row is None else str(row[0])

    def counts(self) -> tuple[int, int]:
        with self._connect() as db:
            docs = db.execute("SELECT count(*) FROM documents").fetchone()[0]
            tasks = db.execute("SELECT count(*) FROM tasks").fetchone()[0]
        return int(docs), int(tasks)

    def _vectors(self) -> tuple[list[str], np.ndarray[Any, Any]]:
        with self._lock:
            if self._matrix is None:
                with self._connect() as db:
                    rows = db.execute(
                        "SELECT id, embedding FROM tasks WHERE status = 'embedded' "
                        "AND embedding IS NOT NULL ORDER BY id"
                    ).fetchall()
                ids = [r[0] for r in rows]
                matrix = (
                    np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
                    if rows
                    else np.zeros((0, 1), np.float32)
                )
                self._matrix = (ids, matrix)
            return self._matrix

    def search(
        self, vector: np.ndarray[Any, Any], *, top_k: int, threshold: float
    ) -> list[tuple[str, float]]:
        """The ``top_k`` most similar tasks with similarity ≥ ``threshold``, best first."""
        ids, matrix = self._vectors()
        if not ids:
            return []
        scores = matrix @ vector.astype(np.float32)
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [(ids[i], float(scores[i])) for i in order if scores[i] >= threshold]

    def vectors_of(self, task_ids: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
        ids, matrix = self._vectors()
        where = {tid: i for i, tid in enumerate(ids)}
        return {t: matrix[where[t]] for t in task_ids if t in where}

    def tasks(self, task_ids: Sequence[str]) -> list[TaskRow]:
        """The tasks that exist, in the order asked."""
        with self._connect() as db:
            marks = ",".join("?" * len(task_ids))
            rows = db.execute(
                f"SELECT id, document_id, position, text, done FROM tasks WHERE id IN ({marks})",
                list(task_ids),
            ).fetchall()
        found = {r[0]: TaskRow(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows}
        return [found[t] for t in task_ids if t in found]

    def document(self, doc_id: str) -> tuple[str, str, list[TaskRow]] | None:
        """(title, content, tasks) of a document, or None when it does not exist (any more)."""
        with self._connect() as db:
            row = db.execute(
                "SELECT title, content FROM documents WHERE id = ?", (doc_id,)
            ).fetchone()
            if row is None:
                return None
            tasks = db.execute(
                "SELECT id, document_id, position, text, done FROM tasks WHERE document_id = ? "
                "ORDER BY position",
                (doc_id,),
            ).fetchall()
        return row[0], row[1], [TaskRow(t[0], t[1], t[2], t[3], bool(t[4])) for t in tasks]

    def relationships(self, task_id: str, type_: str = "all") -> list[Relationship]:
        """Edges touching ``task_id`` (as source or target), of one type or all."""
        sql = "SELECT source, target, type, confidence, origin FROM relationships WHERE "
        sql += "(source = ? OR target = ?)"
        params: list[str] = [task_id, task_id]
        if type_ != "all":
            sql += " AND type = ?"
            params.append(type_)
        with self._connect() as db:
            rows = db.execute(sql + " ORDER BY type, source, target", params).fetchall()
        return [Relationship(r[0], r[1], r[2], float(r[3]), r[4]) for r in rows]
