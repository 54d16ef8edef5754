"""Artifact retention on a running gateway: old runs go at start-up, a size limit holds
while streams are written, and ``GET /v1/runs`` lists what is left, from the index."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.api.conftest import HarnessFactory
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.run_index import INDEX_NAME


def run_dirs(artifacts: Path) -> set[str]:
    runs = artifacts / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()


async def test_start_up_removes_runs_past_the_age_and_lists_the_rest(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    before = ArtifactStore(artifacts)  # what an older gateway left: runs and no index
    for stream_id in ("s_2001a", "s_2001b", "s_recent"):
        await before.run(stream_id).write(
            frames=[], prompt={"messages": []}, result={}, tool_logs=[], metrics={}
        )
    (artifacts / "runs" / INDEX_NAME).unlink()
    for stream_id in ("s_2001a", "s_2001b"):
        os.utime(artifacts / "runs" / stream_id / "metrics.json", (1e9, 1e9))

    gw = await make_gateway([Script.from_tokens(["hello"])], artifacts_max_age_s=86_400)
    async with asyncio.timeout(10):  # the start-up sweep runs in a worker thread
        while run_dirs(artifacts) != {"s_recent"}:  # noqa: ASYNC110 (the disk has no event)
            await asyncio.sleep(0.02)
    listed = (await gw.client.get(f"{gw.url}/v1/runs")).json()["runs"]
    assert [r["stream_id"] for r in listed] == ["s_recent"]

    events = await gw.stream({"input": "a new question"})
    await gw.settle()
    new_id = events[0].data["stream_id"]
    listed = (await gw.client.get(f"{gw.url}/v1/runs")).json()["runs"]
    assert [r["stream_id"] for r in listed] == [new_id, "s_recent"]
    assert listed[0]["input"] == "a new question"


async def test_a_size_limit_holds_while_streams_are_written(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [Script.from_tokens([f"answer number {i} " * 20]) for i in range(8)],
        artifacts_max_bytes=40_000,
    )
    ids = []
    for i in range(8):
        events = await gw.stream({"input": f"question {i}"})
        await gw.settle()
        ids.append(events[0].data["stream_id"])
    kept = run_dirs(gw.artifacts)
    assert 1 < len(kept) < 8  # a run is ~13 KB here
    assert kept == set(ids[-len(kept) :])  # the newest survive, the oldest went first
    total = sum(
        f.stat().st_size
        for d in (gw.artifacts / "runs").iterdir()
        if d.is_dir()
        for f in d.iterdir()
    )
    assert total <= 40_000
    listed = (await gw.client.get(f"{gw.url}/v1/runs")).json()["runs"]
    assert [r["stream_id"] for r in listed] == ids[-len(kept) :][::-1]
    for stream_id in ids[-len(kept) :]:
        assert (await gw.client.get(f"{gw.url}/v1/runs/{stream_id}")).status_code == 200
    assert (await gw.client.get(f"{gw.url}/v1/runs/{ids[0]}")).status_code == 404
