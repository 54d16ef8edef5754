"""``GET /v1/runs`` and ``GET /v1/runs/{stream_id}``: past runs from the artifacts
(docs/protocol.md), read defensively (the URL names what is read), and ``GET /`` with its web UI's
files."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.api.conftest import HarnessFactory, frames, sentinel_reply
from toolforge.api import web
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime import past_runs


async def test_runs_are_listed_newest_first_and_replay_frame_for_frame(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply("first")]), Script.from_tokens(["second"])]
    )
    first = await gw.stream({"input": "the first question"})
    await gw.settle()
    second = await gw.stream({"input": "x" * 300})
    await gw.settle()
    ids = [e[0].data["stream_id"] for e in (first, second)]

    listed = (await gw.client.get(f"{gw.url}/v1/runs")).json()["runs"]
    assert [r["stream_id"] for r in listed] == ids[::-1]
    newest, oldest = listed
    assert oldest["input"] == "the first question" and oldest["reason"] == "stop"
    assert oldest["ended_at"] <= newest["ended_at"] and oldest["ended_at"].endswith("+00:00")
    assert newest["input"] == "x" * 200 + "…"
    assert newest["frames"] == len(frames(second)) and newest["mode"] == "sentinel"
    assert isinstance(newest["duration_ms"], float)
    one = (await gw.client.get(f"{gw.url}/v1/runs", params={"limit": 1})).json()["runs"]
    assert [r["stream_id"] for r in one] == ids[1:]

    run = (await gw.client.get(f"{gw.url}/v1/runs/{ids[0]}")).json()
    assert [(f["id"], f["event"], f["data"]) for f in run["frames"]] == [
        (int(e.id), e.event, e.data) for e in frames(first)
    ]
    assert run["truncated"] is False
    assert run["result"]["results"][0]["value"]["answer"] == "first"
    assert run["metrics"]["frames"] == len(run["frames"])
    assert run["prompt"]["messages"][-1] == {"role": "user", "content": "the first question"}
    assert isinstance(run["tool_logs"], list)


async def test_bad_ids_unknown_runs_and_escapes(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    gw = await make_gateway()
    runs = gw.artifacts / "runs"
    runs.mkdir(parents=True)
    # A planted symlink to a directory outside runs/ that looks like a run.
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("frames.ndjson", "metrics.json", "prompt.json", "result.json"):
        (outside / name).write_text('{"secret": 1}\n')
    (runs / "s_link").symlink_to(outside, target_is_directory=True)
    # A run still being written (no metrics.json yet), and a stray file.
    (runs / "s_torn").mkdir()
    (runs / "s_torn" / "frames.ndjson").write_text("")
    (runs / "notes.txt").write_text("hi")

    assert (await gw.client.get(f"{gw.url}/v1/runs")).json() == {"runs": []}
    for stream_id, status in [
        ("s_link", 404),
        ("s_unknown", 404),
        ("-starts-with-a-dash", 400),
        ("s..x", 400),
        ("a%2F..%2F..%2Fetc", 404),
    ]:
        response = await gw.client.get(f"{gw.url}/v1/runs/{stream_id}")
        assert response.status_code == status, stream_id
        assert "secret" not in response.text
    body = (await gw.client.get(f"{gw.url}/v1/runs/s_unknown")).json()
    assert body["error"]["code"] == "NOT_FOUND" and "GET /v1/runs" in body["error"]["message"]
    assert (await gw.client.get(f"{gw.url}/v1/runs", params={"limit": 0})).status_code == 422


async def test_a_long_run_is_cut_at_a_frame_boundary(
    make_gateway: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await make_gateway([Script.from_tokens([f"chunk {i} " for i in range(50)])])
    events = frames(await gw.stream({"input": "long"}))
    await gw.settle()
    stream_id = events[0].data["stream_id"]
    size = (gw.artifacts / "runs" / stream_id / "frames.ndjson").stat().st_size
    monkeypatch.setattr(past_runs, "MAX_RUN_BYTES", size // 2)
    run = (await gw.client.get(f"{gw.url}/v1/runs/{stream_id}")).json()
    assert run["truncated"] is True
    assert 0 < len(run["frames"]) < len(events)
    assert [f["id"] for f in run["frames"]] == list(range(1, len(run["frames"]) + 1))
    assert run["metrics"] is None  # over the budget: not read, not half-read


async def test_the_web_ui_page(
    make_gateway: HarnessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await make_gateway()
    if not (web.SDK_DIR / "index.js").is_file():
        pytest.fail(f"{web.SDK_DIR} is not built: run `make ts-build`", pytrace=False)
    page = await gw.client.get(f"{gw.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self' 'sha256-" in policy
    assert "unsafe-inline" not in policy
    for path in ("/ui/app.js", "/ui/timeline.js", "/ui/style.css", "/sdk/index.js"):
        response = await gw.client.get(f"{gw.url}{path}")
        assert response.status_code == 200, path
    vendor = await gw.client.get(f"{gw.url}/sdk/vendor/eventsource-parser.js")
    assert "createParser" in vendor.text
    for escape in ("/ui/../pyproject.toml", "/ui/%2e%2e/pyproject.toml", "/sdk/../package.json"):
        response = await gw.client.get(f"{gw.url}{escape}")
        assert response.status_code == 404, escape
        assert "toolforge" not in response.text

    monkeypatch.setattr(web, "SDK_DIR", Path("/nonexistent/dist"))
    missing = await gw.client.get(f"{gw.url}/")
    assert missing.status_code == 503 and "make ts-build" in missing.text
    assert orjson.loads((await gw.client.get(f"{gw.url}/healthz")).content) == {"status": "ok"}
