"""The WebSocket's messages read back exactly the frames ``encode_frame`` wrote, whatever
the text holds (newlines, ``data:`` and ``id:`` look-alikes, control characters, any
Unicode): one JSON object per line, its ``data`` the same bytes as the SSE block's."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_sse_blocks import TRICKY, _frames
from toolforge.core.protocol.socket_messages import SUBPROTOCOL, frame_lines, select_subprotocol
from toolforge.core.protocol.sse_blocks import event_data


def _expected(blocks: list[bytes]) -> list[bytes]:
    """Each block as the socket's frame object, built field by field."""
    out = []
    for seq, block in enumerate(blocks, 1):
        event, data = event_data(block)
        out.append(b'{"id":%d,"event":"%s","data":%s}' % (seq, event, data.rstrip(b"\n")))
    return out


@given(st.lists(st.text(min_size=1), min_size=1, max_size=8))
def test_a_batch_becomes_one_frame_object_per_line(chunks: list[str]) -> None:
    blocks = _frames(chunks)
    lines = frame_lines(b"".join(blocks)).split(b"\n")
    assert lines == _expected(blocks)
    for seq, line in enumerate(lines, 1):
        frame = orjson.loads(line)
        assert list(frame) == ["id", "event", "data"] and frame["id"] == seq
    assert [orjson.loads(line)["data"]["chunk"] for line in lines[: len(chunks)]] == chunks


def test_tricky_text_and_a_lone_frame() -> None:
    blocks = _frames(TRICKY)
    assert frame_lines(b"".join(blocks)).split(b"\n") == _expected(blocks)
    # one frame: the same bytes in both framings, no newline
    (lone,) = _expected(blocks[:1])
    assert frame_lines(blocks[0]) == lone


def test_only_the_known_subprotocol_is_selected() -> None:
    assert select_subprotocol([]) is None
    assert select_subprotocol(["graphql-ws", "toolforge.frames"]) is None
    assert select_subprotocol(["graphql-ws", SUBPROTOCOL]) == SUBPROTOCOL
