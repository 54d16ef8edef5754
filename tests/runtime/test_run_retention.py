"""Artifact retention and the runs index: the oldest runs go beyond the age and size
limits, the rest stay listable, and the list never reads the runs themselves."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from toolforge.runtime import run_index
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.past_runs import PastRuns
from toolforge.runtime.run_index import INDEX_NAME


async def write_run(store: ArtifactStore, stream_id: str, *, text: str = "hi") -> None:
    await store.run(stream_id).write(
        frames=[{"id": 1, "event": "text.delta", "data": {"chunk": text}}],
        prompt={"model": "m", "mode": "sentinel", "messages": [{"role": "user", "content": text}]},
        result={"reason": "stop"},
        tool_logs=[],
        metrics={"frames": 1, "duration_ms": 1.0},
    )


def on_disk(root: Path) -> set[str]:
    runs = root / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()


def index_lines(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (root / "runs" / INDEX_NAME).read_bytes().splitlines()]


async def listed(store: ArtifactStore, limit: int = 50) -> list[str]:
    return [run["stream_id"] for run in await PastRuns(store).newest(limit)]


async def test_the_size_limit_removes_the_oldest_runs_as_runs_are_written(
    tmp_path: Path,
) -> None:
    probe = ArtifactStore(tmp_path / "probe")
    await write_run(probe, "s_probe", text="x" * 2000)
    size = index_lines(tmp_path / "probe")[0]["bytes"]
    store = ArtifactStore(tmp_path, max_bytes=4 * size + size // 2)
    ids = [f"s_{i:02d}" for i in range(12)]
    for stream_id in ids:
        await write_run(store, stream_id, text="x" * 2000)
    # Swept in the writer's thread after the writes: four runs fit, the newest four stay.
    assert on_disk(tmp_path) == set(ids[-4:])
    assert await listed(store) == ids[-4:][::-1]
    assert sum(e["bytes"] for e in index_lines(tmp_path)) <= store.max_bytes
    total = sum(
        f.stat().st_size for d in (tmp_path / "runs").iterdir() if d.is_dir() for f in d.iterdir()
    )
    assert total <= store.max_bytes


async def test_the_age_limit_removes_runs_older_than_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_age_s=3600)
    for stream_id in ("s_a", "s_b", "s_c", "s_d"):
        await write_run(store, stream_id)
    ended = {e["stream_id"]: e["ended"] for e in index_lines(tmp_path)}
    assert store.prune() == []  # nothing is an hour old yet
    # An hour after s_b ended: s_a and s_b are past the age, s_c and s_d are not.
    assert ended["s_a"] < ended["s_b"] < ended["s_c"] < ended["s_d"]
    removed = store.prune(now=3600 + (ended["s_b"] + ended["s_c"]) / 2)
    assert removed == ["s_a", "s_b"]
    assert {"s_a", "s_b"}.isdisjoint(on_disk(tmp_path))
    assert {"s_c", "s_d"} <= on_disk(tmp_path)
    assert set(await listed(store)) == on_disk(tmp_path)


async def test_start_up_reconciles_and_prunes_runs_written_before_the_index(
    tmp_path: Path,
) -> None:
    old = ArtifactStore(tmp_path)  # an older gateway: no limits
    for stream_id in ("s_old1", "s_old2", "s_new"):
        await write_run(old, stream_id)
    (tmp_path / "runs" / INDEX_NAME).unlink()  # as an older gateway left it: no index
    for stream_id in ("s_old1", "s_old2"):  # ended in 2001
        os.utime(tmp_path / "runs" / stream_id / "metrics.json", (1e9, 1e9))
    store = ArtifactStore(tmp_path, max_age_s=86_400)
    assert sorted(store.prune(reconcile=True)) == ["s_old1", "s_old2"]
    assert on_disk(tmp_path) == {"s_new"}
    assert await listed(store) == ["s_new"]


async def test_the_list_is_read_from_the_index_not_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    for stream_id in ("s_1", "s_2", "s_3"):
        await write_run(store, stream_id, text=f"question {stream_id}")
    # The run's own files spoiled: the list still shows what the index holds.
    for name in ("prompt.json", "result.json", "metrics.json"):
        (tmp_path / "runs" / "s_2" / name).write_text("{not json")

    def no_reading(*_: object) -> object:
        raise AssertionError("the list read a run's files")

    monkeypatch.setattr(run_index, "read_json", no_reading)
    runs = await PastRuns(store).newest(50)
    assert [r["stream_id"] for r in runs] == ["s_3", "s_2", "s_1"]
    middle = runs[1]
    assert middle["input"] == "question s_2" and middle["model"] == "m"
    assert middle["reason"] == "stop" and middle["frames"] == 1


async def test_a_missing_or_corrupt_index_is_rebuilt_from_the_runs(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    for stream_id in ("s_1", "s_2"):
        await write_run(store, stream_id)
    index = tmp_path / "runs" / INDEX_NAME
    index.unlink()
    assert sorted(await listed(store)) == ["s_1", "s_2"]
    assert index.is_file()
    index.write_bytes(index.read_bytes() + b'{"stream_id": 5}\n')  # a line that is no summary
    assert sorted(await listed(store)) == ["s_1", "s_2"]
    assert b'"stream_id": 5' not in index.read_bytes()  # rebuilt, not trusted
    # A torn last line (an append in progress) is skipped, not a reason to rebuild.
    index.write_bytes(index.read_bytes() + b'{"stream_id":"s_3","en')
    assert sorted(await listed(store)) == ["s_1", "s_2"]
    assert index.read_bytes().endswith(b'"en')


async def test_an_index_line_cannot_point_retention_outside_runs(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    store = ArtifactStore(tmp_path / "artifacts", max_age_s=1)
    await write_run(store, "s_1")
    index = tmp_path / "artifacts" / "runs" / INDEX_NAME
    planted = {"stream_id": "../../precious", "ended": 0, "bytes": 1}
    index.write_bytes(index.read_bytes() + orjson.dumps(planted) + b"\n")
    store.prune(now=time.time() + 10)
    assert (outside / "keep.txt").read_text() == "keep"
    assert on_disk(tmp_path / "artifacts") == set()  # s_1 itself was past the age


async def test_a_key_sees_only_its_runs_from_the_index(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    for i in range(6):
        await store.run(f"s_{i}").write(
            frames=[],
            prompt={"owner": "alice" if i % 2 else "bob", "messages": []},
            result={},
            tool_logs=[],
            metrics={},
        )
    alice = await PastRuns(store).newest(2, owner="alice")
    assert [r["stream_id"] for r in alice] == ["s_5", "s_3"]
