"""The SSE block codec reads back exactly what ``encode_frame`` wrote, whatever the text
holds (newlines, blank lines, ``data:`` look-alikes, control characters, any Unicode)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from toolforge.core.protocol.frames import Done, DoneMetrics, Error, TextDelta, encode_frame
from toolforge.core.protocol.sse_blocks import END, event_data, split_blocks
from toolforge.errors import ErrorCode

TRICKY = ["plain", "two\n\nlines", "data: fake\n\nid: 9", "\r\n\r", "\x00\x1f\u2028", "é😀"]


def _frames(chunks: list[str]) -> list[bytes]:
    out = [encode_frame(i, TextDelta(chunk=c)) for i, c in enumerate(chunks, 1)]
    error = Error(code=ErrorCode.STREAM_LOST, message="gone\n\nfor good", retryable=True)
    out.append(encode_frame(len(out) + 1, error))
    metrics: DoneMetrics = {"ttft_ms": None, "duration_ms": 0.0, "tokens_per_s": None, "frames": 1}
    out.append(encode_frame(len(out) + 1, Done(reason="error", usage={}, metrics=metrics)))
    return out


@given(st.lists(st.text(min_size=1), min_size=1, max_size=8))
def test_a_run_of_blocks_splits_back_into_its_frames(chunks: list[str]) -> None:
    blocks = _frames(chunks)
    assert split_blocks(b"".join(blocks)) == blocks
    for seq, block in enumerate(blocks, 1):
        assert block.startswith(b"id: %d\n" % seq)
        _, data = event_data(block)
        assert data.endswith(END) and b"\n" not in data[: -len(END)]  # one whole line
    # A batch split on the blank line, as the proxy's encoder reads one: bare JSON.
    events = [event_data(b) for b in b"".join(blocks).split(END) if b]
    assert all(data == orjson.dumps(orjson.loads(data)) for _, data in events)
    assert [e for e, _ in events[: len(chunks)]] == [b"text.delta"] * len(chunks)
    assert [orjson.loads(d)["chunk"] for _, d in events[: len(chunks)]] == chunks
    assert [e for e, _ in events[-2:]] == [b"error", b"done"]


def test_the_tricky_texts_stay_inside_their_block() -> None:
    blocks = _frames(TRICKY)
    whole = b"".join(blocks)
    assert len(split_blocks(whole)) == len(TRICKY) + 2
    assert [orjson.loads(event_data(b)[1]).get("chunk") for b in blocks[: len(TRICKY)]] == TRICKY


def test_a_partial_block_at_the_end_is_never_read_as_a_frame() -> None:
    blocks = _frames(["a", "b"])
    whole = b"".join(blocks)
    assert split_blocks(whole[:-1]) == blocks[:-1]
    assert split_blocks(b"") == []
