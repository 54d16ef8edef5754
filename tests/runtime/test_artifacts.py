"""Per-stream artifacts (docs/protocol.md): five files, redacted, atomic, inside ``root``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from toolforge.core.redact import REDACTED
from toolforge.errors import RequestError
from toolforge.runtime.artifacts import ARTIFACT_FILES, ArtifactStore

FRAMES: list[dict[str, object]] = [
    {"id": 1, "event": "stream.begin", "data": {"stream_id": "s1", "model": "m"}},
    {"id": 2, "event": "text.delta", "data": {"chunk": "hello sk-abcdef123 world"}},
    {"id": 3, "event": "tool.call", "data": {"id": "c1", "name": "t", "args": {"api_key": "k"}}},
    {"id": 4, "event": "done", "data": {"reason": "stop", "usage": {"max_tokens": 384}}},
]


async def write_sample(root: Path, stream_id: str = "s1", **extra: object) -> Path:
    artifacts = ArtifactStore(root, redact_keys=["ssn"]).run(stream_id)
    arguments: dict[str, object] = {
        "frames": FRAMES,
        "prompt": {"messages": [{"role": "user", "content": "my key is gsk_abcdef123456"}]},
        "result": {"value": {"ssn": "123-45-6789", "name": "Ada"}},
        "tool_logs": [{"call_id": "c1", "args": {"Authorization": "Bearer abc"}}],
        "metrics": {"ttft_ms": 12.5, "tokens": 42},
    }
    arguments.update(extra)
    return await artifacts.write(**arguments)  # type: ignore[arg-type]


async def test_all_five_files_exist_and_parse(tmp_path: Path) -> None:
    directory = await write_sample(tmp_path)
    assert directory == tmp_path / "runs" / "s1"
    assert sorted(p.name for p in directory.iterdir()) == sorted(ARTIFACT_FILES)
    for name in ARTIFACT_FILES:
        text = (directory / name).read_text(encoding="utf-8")
        if name.endswith(".ndjson"):
            [json.loads(line) for line in text.splitlines()]
        else:
            json.loads(text)
    assert json.loads((directory / "metrics.json").read_text()) == {"ttft_ms": 12.5, "tokens": 42}


async def test_frames_are_one_compact_line_each_in_order(tmp_path: Path) -> None:
    directory = await write_sample(tmp_path)
    raw = (directory / "frames.ndjson").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2, 3, 4]
    assert all(", " not in line and ": " not in line for line in lines[:1])  # compact
    assert json.loads(lines[3]) == FRAMES[3]  # usage figures are not secrets


async def test_secrets_are_redacted_in_every_file(tmp_path: Path) -> None:
    directory = await write_sample(tmp_path)
    everything = "".join((directory / name).read_text() for name in ARTIFACT_FILES)
    for secret in ("sk-abcdef123", "gsk_abcdef123456", "123-45-6789", "Bearer abc", '"k"'):
        assert secret not in everything
    assert REDACTED in everything
    result = json.loads((directory / "result.json").read_text())
    assert result == {"value": {"ssn": REDACTED, "name": "Ada"}}  # the tool's own key
    frames = [json.loads(line) for line in (directory / "frames.ndjson").read_text().splitlines()]
    assert frames[1]["data"]["chunk"] == f"hello {REDACTED} world"
    assert frames[2]["data"]["args"] == {"api_key": REDACTED}


async def test_writes_are_atomic_and_leave_no_temp_files(tmp_path: Path) -> None:
    directory = await write_sample(tmp_path)
    first = (directory / "result.json").stat().st_ino
    await write_sample(tmp_path, result={"value": "second"})
    assert sorted(p.name for p in directory.iterdir()) == sorted(ARTIFACT_FILES)
    assert json.loads((directory / "result.json").read_text()) == {"value": "second"}
    assert (directory / "result.json").stat().st_ino != first  # replaced, not rewritten
    mode = stat.S_IMODE((directory / "prompt.json").stat().st_mode)
    assert mode == 0o600


async def test_odd_values_never_cost_a_file(tmp_path: Path) -> None:
    class Opaque:
        def __str__(self) -> str:
            return "Opaque(token='abc')"

    deep: object = 1
    for _ in range(10_000):
        deep = [deep]
    directory = await write_sample(
        tmp_path,
        frames=[{"id": 1, "big": 2**70}, {"id": 2, "deep": deep}, {"id": 3, "s": "\ud800"}],
        prompt=Opaque(),
        result={1: "int key", ("t", 2): "tuple key", "nan": float("nan")},
        tool_logs=deep,
        metrics={"started": Path("/x"), "set": {1}},
    )
    assert sorted(p.name for p in directory.iterdir()) == sorted(ARTIFACT_FILES)
    frames = [json.loads(line) for line in (directory / "frames.ndjson").read_text().splitlines()]
    assert frames[0] == {"id": 1, "big": 2**70}
    assert "truncated" in json.dumps(frames[1])  # cut at depth 200, not dropped
    assert frames[2] == {"id": 3, "s": "\ufffd"}  # strict JSON: no lone surrogates
    assert json.loads((directory / "prompt.json").read_text()) == f"Opaque(token='{REDACTED}')"
    result = json.loads((directory / "result.json").read_text())
    assert result == {"1": "int key", "('t', 2)": "tuple key", "nan": None}
    assert "truncated" in (directory / "tool_logs.json").read_text()
    assert json.loads((directory / "metrics.json").read_text()) == {"started": "/x", "set": [1]}


async def test_the_caller_may_keep_appending_frames(tmp_path: Path) -> None:
    frames: list[dict[str, object]] = [{"id": 1}]
    pending = (
        ArtifactStore(tmp_path)
        .run("s2")
        .write(frames=frames, prompt=None, result=None, tool_logs=[], metrics={})
    )
    directory = await pending
    frames.append({"id": 2})
    assert (directory / "frames.ndjson").read_text() == '{"id":1}\n'


@pytest.mark.parametrize(
    "stream_id",
    ["", ".", "..", "../x", "a/b", "a\\b", "/abs", "a..b", ".hidden", "a\x00b", "x" * 129, "é"],
)
def test_ids_that_could_escape_root_are_refused(tmp_path: Path, stream_id: str) -> None:
    with pytest.raises(RequestError) as info:
        ArtifactStore(tmp_path).run(stream_id)
    assert info.value.http_status == 400
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("stream_id", ["s1", "str_01HZX3", "a.b-c_d", "x" * 128])
def test_ordinary_ids_are_accepted(tmp_path: Path, stream_id: str) -> None:
    assert ArtifactStore(tmp_path).run(stream_id).directory == tmp_path / "runs" / stream_id


async def test_a_file_system_failure_is_raised_after_trying_every_file(tmp_path: Path) -> None:
    directory = tmp_path / "runs" / "s3"
    directory.mkdir(parents=True)
    (directory / "result.json").mkdir()  # os.replace cannot put a file over a directory
    (directory / "result.json" / "keep").write_text("")
    with pytest.raises(OSError):
        await write_sample(tmp_path, "s3")
    names = {p.name for p in directory.iterdir()}
    assert names == set(ARTIFACT_FILES)  # the others were written, no temp file left
    assert not any(n.startswith(".") for n in os.listdir(directory))
