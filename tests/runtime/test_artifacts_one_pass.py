"""A run's artifacts written in one pass: a hidden directory, five files, one rename.

The contract (docs/protocol.md, artifacts): the five files, redacted, never torn; here, on
top, a reader never finds a run's directory without all five, a rerun replaces each file
whole, and nothing hidden is left behind, whatever happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from toolforge.runtime import artifacts as artifacts_module
from toolforge.runtime.artifacts import ARTIFACT_FILES, ArtifactStore

SAMPLE: dict[str, object] = {
    "frames": [{"id": 1, "event": "done", "data": {"reason": "stop"}}],
    "prompt": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "result": {"reason": "stop"},
    "tool_logs": [],
    "metrics": {"frames": 1, "duration_ms": 1.0},
}


def hidden(runs: Path) -> list[str]:
    return [name for name in os.listdir(runs) if name.startswith(".") and name != ".index.ndjson"]


async def test_the_run_directory_appears_only_with_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    directory = store.runs / "s1"
    seen: list[bool] = []
    create = artifacts_module.create_file

    def watched(path: Path, data: bytes) -> None:
        seen.append(directory.exists())  # while any file is being written
        create(path, data)

    monkeypatch.setattr(artifacts_module, "create_file", watched)
    written = await store.run("s1").write(**SAMPLE)  # type: ignore[arg-type]
    assert seen == [False] * len(ARTIFACT_FILES)
    assert written == directory
    assert sorted(os.listdir(directory)) == sorted(ARTIFACT_FILES)
    assert hidden(store.runs) == []
    listed = store.index.newest(10)
    assert [e["stream_id"] for e in listed] == ["s1"]


async def test_a_new_run_is_one_directory_five_files_and_one_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    await store.run("s0").write(**SAMPLE)  # type: ignore[arg-type]  # runs/ exists now
    calls: list[str] = []
    for name in ("mkdir", "rename", "replace", "open"):
        real = getattr(os, name)

        def counted(*args: object, _real: object = real, _name: str = name, **kw: object) -> object:
            calls.append(_name)
            return _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(os, name, counted)
    await store.run("s1").write(**SAMPLE)  # type: ignore[arg-type]
    monkeypatch.undo()
    # The index's append opens its file once more.
    assert sorted(calls) == sorted(["mkdir", "rename", *["open"] * 6])


async def test_a_rerun_replaces_each_file_whole(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    directory = await store.run("s1").write(**SAMPLE)  # type: ignore[arg-type]
    before = {name: (directory / name).stat().st_ino for name in ARTIFACT_FILES}
    again = {**SAMPLE, "result": {"reason": "again"}}
    await store.run("s1").write(**again)  # type: ignore[arg-type]
    assert json.loads((directory / "result.json").read_text()) == {"reason": "again"}
    assert sorted(os.listdir(directory)) == sorted(ARTIFACT_FILES)
    for name in ARTIFACT_FILES:  # moved over the old file, never rewritten in place
        assert (directory / name).stat().st_ino != before[name]
    assert hidden(store.runs) == []


async def test_a_failed_write_leaves_nothing_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    create = artifacts_module.create_file

    def full(path: str | Path, data: bytes) -> None:
        if Path(path).name == "tool_logs.json":
            raise OSError(28, "No space left on device")
        create(path, data)

    monkeypatch.setattr(artifacts_module, "create_file", full)
    with pytest.raises(OSError, match="No space"):
        await store.run("s1").write(**SAMPLE)  # type: ignore[arg-type]
    # Every other file was attempted and is in place; nothing hidden is left.
    names = set(os.listdir(store.runs / "s1"))
    assert names == set(ARTIFACT_FILES) - {"tool_logs.json"}
    assert hidden(store.runs) == []


async def test_runs_removed_by_hand_are_made_again(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    await store.run("s1").write(**SAMPLE)  # type: ignore[arg-type]
    for path in sorted(store.runs.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    store.runs.rmdir()
    directory = await store.run("s2").write(**SAMPLE)  # type: ignore[arg-type]
    assert sorted(os.listdir(directory)) == sorted(ARTIFACT_FILES)


def test_start_up_removes_what_a_dead_writer_left(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.runs.mkdir(parents=True)
    stale = store.runs / ".s1.0123456789ab.tmp"
    fresh = store.runs / ".s2.0123456789ab.tmp"  # another replica's write in progress
    for pending in (stale, fresh):
        pending.mkdir()
        (pending / "frames.ndjson").write_text("{}\n")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    store.prune(reconcile=True)
    assert not stale.exists()
    assert fresh.exists()
    assert store.index.newest(10) == []  # neither is a run


async def test_one_writer_thread_writes_every_run_then_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(artifacts_module, "_WRITER_LINGER_S", 0.05)
    store = ArtifactStore(tmp_path)
    threads: set[str] = set()
    create = artifacts_module.create_file

    def noted(path: Path, data: bytes) -> None:
        threads.add(threading.current_thread().name)
        create(path, data)

    monkeypatch.setattr(artifacts_module, "create_file", noted)
    ids = [f"s{i}" for i in range(40)]
    await asyncio.gather(*(store.run(i).write(**SAMPLE) for i in ids))  # type: ignore[arg-type]
    assert threads == {"artifacts-writer"}
    assert sorted(e["stream_id"] for e in store.index.newest(100)) == sorted(ids)
    for _ in range(100):  # it lingers 50 ms, then ends: an idle app holds no thread
        if not any(t.name == "artifacts-writer" for t in threading.enumerate()):
            break
        await asyncio.sleep(0.02)
    assert not any(t.name == "artifacts-writer" for t in threading.enumerate())
    # ... and the next run starts it again.
    await store.run("again").write(**SAMPLE)  # type: ignore[arg-type]
    assert (store.runs / "again" / "metrics.json").exists()


async def test_a_cancelled_caller_still_gets_its_run_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore(tmp_path)
    gate = threading.Event()
    create = artifacts_module.create_file

    def held(path: Path, data: bytes) -> None:
        gate.wait(5)
        create(path, data)

    monkeypatch.setattr(artifacts_module, "create_file", held)
    task = asyncio.create_task(store.run("s1").write(**SAMPLE))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    for _ in range(250):
        if store.index.newest(1):
            break
        await asyncio.sleep(0.02)
    assert sorted(os.listdir(store.runs / "s1")) == sorted(ARTIFACT_FILES)


async def test_a_write_that_fails_raises_in_the_caller(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(OSError):
        await ArtifactStore(tmp_path).run("s1").write(**SAMPLE)  # type: ignore[arg-type]
