"""frames.ndjson from a frame log's bytes: the same file, byte for byte, as the frames'
records redacted and encoded one by one, and every secret still redacted."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import orjson
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.strategies import LOOKALIKE_TEXT, json_values
from toolforge.core.protocol.frames import TextDelta, encode_frame
from toolforge.core.redact import REDACTED, remember_secrets
from toolforge.runtime.artifacts import ArtifactStore, EncodedFrames, RunArtifacts
from toolforge.runtime.frame_log import FrameLog

EVENTS = ["text.delta", "tool.call", "tool.result", "done", "json.delta", "stream.begin"]


def records(frames: list[tuple[str, object]], degraded: frozenset[int]) -> list[dict[str, object]]:
    """What the frames' records were before: id, event, data and ``degraded``."""
    out: list[dict[str, object]] = []
    for seq, (event, data) in enumerate(frames, start=1):
        record: dict[str, object] = {"id": seq, "event": event, "data": data}
        if seq in degraded:
            record["degraded"] = True
        out.append(record)
    return out


def encoded(frames: list[tuple[str, object]]) -> bytes:
    return b"".join(
        encode_frame(seq, SimpleNamespace(event=event, data=data))  # type: ignore[arg-type]
        for seq, (event, data) in enumerate(frames, start=1)
    )


def both(run: RunArtifacts, frames: list[tuple[str, object]], degraded: frozenset[int]) -> None:
    fast = run._encoded_lines(EncodedFrames(encoded(frames), degraded))
    slow = b"".join(run._line(record) + b"\n" for record in records(frames, degraded))
    assert fast == slow


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(EVENTS),
            st.one_of(
                st.fixed_dictionaries({"chunk": LOOKALIKE_TEXT}),
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(["t", "u"]),
                        "args": st.dictionaries(
                            st.one_of(LOOKALIKE_TEXT, st.sampled_from(["pin", "PIN", "ssn"])),
                            LOOKALIKE_TEXT,
                            max_size=3,
                        ),
                    }
                ),
                json_values(
                    max_leaves=8,
                    integers=st.integers(-(2**63), 2**63 - 1),
                    text=LOOKALIKE_TEXT,
                    keys=LOOKALIKE_TEXT,
                ),
            ),
        ),
        max_size=8,
    ),
    st.frozensets(st.integers(1, 8)),
    st.sampled_from([(), ("ssn",), ("my-field", "data")]),
)
def test_the_file_is_the_same_byte_for_byte(
    tmp_path: Path,
    frames: list[tuple[str, object]],
    degraded: frozenset[int],
    keys: tuple[str, ...],
) -> None:
    try:
        encoded(frames)
    except orjson.JSONEncodeError:  # a lone surrogate: encode_frame never wrote one
        assume(False)
    store = ArtifactStore(tmp_path, redact_keys=keys, tool_redact_keys={"t": ["pin"]})
    both(store.run("s1"), frames, degraded)


def test_a_real_streams_frames_are_the_same_byte_for_byte(tmp_path: Path) -> None:
    log = FrameLog(max_pending=1000)
    for chunk in ["Hello", " world", ", my key is sk-abcdef123456", " \u017fecret", '\n"q"']:
        log.append(TextDelta(chunk))
    frames = [(event, data) for event, data in _events(log.encoded())]
    both(ArtifactStore(tmp_path).run("s1"), frames, frozenset({2}))


def _events(blocks: bytes) -> list[tuple[str, object]]:
    from toolforge.runtime.frame_log import decode_events

    return list(decode_events(part + b"\n\n" for part in blocks.split(b"\n\n")[:-1]))


async def test_secrets_in_encoded_frames_are_redacted_in_the_file(tmp_path: Path) -> None:
    remember_secrets(["upstream-key-0a1b2c3d"])
    frames: list[tuple[str, object]] = [
        ("stream.begin", {"stream_id": "s1", "model": "m"}),
        ("text.delta", {"chunk": "plain words"}),
        ("text.delta", {"chunk": "use sk-abcdef123456 now"}),
        ("text.delta", {"chunk": "the key upstream-key-0a1b2c3d leaked"}),
        ("tool.call", {"id": "c1", "name": "t", "args": {"pin": "1234", "q": "x"}}),
        ("json.delta", {"id": "j1", "chunk": '{"SSN": "123-45-6789"}'}),
        ("done", {"reason": "stop", "ssn": "123-45-6789"}),
    ]
    store = ArtifactStore(tmp_path, redact_keys=["ssn"], tool_redact_keys={"t": ["pin"]})
    directory = await store.run("s1").write(
        frames=EncodedFrames(encoded(frames), frozenset({2})),
        prompt={},
        result={},
        tool_logs=[],
        metrics={},
    )
    text = (directory / "frames.ndjson").read_text()
    for secret in ("sk-abcdef123456", "upstream-key-0a1b2c3d", "1234", '"123-45-6789"'):
        assert secret not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[1] == {
        "id": 2,
        "event": "text.delta",
        "data": {"chunk": "plain words"},
        "degraded": True,
    }
    assert lines[2]["data"] == {"chunk": f"use {REDACTED} now"}
    assert lines[4]["data"]["args"] == {"pin": REDACTED, "q": "x"}
    assert lines[6]["data"] == {"reason": "stop", "ssn": REDACTED}
    assert [line["id"] for line in lines] == list(range(1, 8))


def test_a_block_that_is_not_json_is_kept_as_its_redacted_text(tmp_path: Path) -> None:
    blocks = (
        encode_frame(1, TextDelta("fine"))
        + b"id: 2\nevent: text.delta\ndata: {broken sk-abcdef123456\n\n"
        + b'id: 3\nevent: bad"name\ndata: {}\n\n'
    )
    run = ArtifactStore(tmp_path).run("s1")
    lines = [json.loads(line) for line in run._encoded_lines(EncodedFrames(blocks)).splitlines()]
    assert lines[0] == {"id": 1, "event": "text.delta", "data": {"chunk": "fine"}}
    assert lines[1] == {"id": 2, "event": "text.delta", "data": f"{{broken {REDACTED}"}
    assert lines[2] == {"id": 3, "event": 'bad"name', "data": {}}  # the name escaped
