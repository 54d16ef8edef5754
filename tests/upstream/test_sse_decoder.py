"""UpstreamSSEDecoder: a table of streams, each fed whole, byte by byte and at random splits.

Cases follow the usual malformed-upstream-SSE faults and the WPT EventSource
``format-*`` vectors (BOM, CR/LF, comments, NUL, fields). The invariant, as in h11's fuzzer:
any input either decodes to the same events however it is chunked, or raises the same
``UpstreamError``, never anything else.
"""

from __future__ import annotations

import itertools
import time
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream import sse_decoder
from toolforge.upstream.sse_decoder import MAX_LINE_BYTES, SSEMessage, UpstreamSSEDecoder

M = SSEMessage
CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" hello"},"finish_reason":null}]}\n\n'
)

# name -> (stream bytes, expected events)
OK_CASES: dict[str, tuple[bytes, list[SSEMessage]]] = {
    "one event": (b"data: hello\n\n", [M("hello")]),
    "data without space": (b"data:hello\n\n", [M("hello")]),
    "only one space dropped": (b"data:  hello\n\n", [M(" hello")]),
    "multi-line data": (b"data: a\ndata: b\ndata:\n\n", [M("a\nb\n")]),
    "CRLF": (b"data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", [M("a\nb"), M("c")]),
    "CR only": (b"data: a\rdata: b\r\rdata: c\r\r", [M("a\nb"), M("c")]),
    "mixed line ends": (b"data: a\r\ndata: b\rdata: c\n\r\n", [M("a\nb\nc")]),
    "comments": (b": ping\n\n:\ndata: x\n: mid-event\n\n", [M("x")]),
    "BOM at start dropped": (b"\xef\xbb\xbfdata: x\n\n", [M("x")]),
    "second BOM is text": (b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\ndata: y\n\n", [M("y")]),
    "BOM later is text": (b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [M("a")]),
    "NUL inside data": (b"data: a\x00b\n\n", [M("a\x00b")]),
    "NUL in id ignored": (
        b"id: 1\ndata: a\n\nid: x\x00y\ndata: b\n\n",
        [M("a", id="1"), M("b", id="1")],
    ),
    "unknown fields ignored": (b"foo: bar\nDATA: no\ndata: x\nx-y:z\n\n", [M("x")]),
    "field without colon": (b"data\n\ndata\ndata\n\n", [M(""), M("\n")]),
    "event id retry": (
        b"event: delta\nid: 7\nretry: 1500\ndata: x\n\n",
        [M("x", event="delta", id="7", retry=1500)],
    ),
    "id persists, event and retry do not": (
        b"event: e\nid: 1\nretry: 5\ndata: a\n\ndata: b\n\n",
        [M("a", event="e", id="1", retry=5), M("b", id="1")],
    ),
    "bad retry ignored": (b"retry: soon\ndata: x\n\n", [M("x")]),
    "blank lines alone dispatch nothing": (b"\n\n\r\n\r\r", []),
    "unterminated last event discarded": (b"data: a\n\ndata: b\n", [M("a")]),
    "unterminated last line discarded": (b"data: a\n\ndata: b", [M("a")]),
    "CR at the very end is a line end": (b"data: x\r\r", [M("x")]),
    "multibyte characters": ("data: héllo ⟦ 😀 \u2028\n\n".encode(), [M("héllo ⟦ 😀 \u2028")]),
    "escaped newlines in JSON stay": (b'data: {"a":"x\\n\\ny"}\n\n', [M('{"a":"x\\n\\ny"}')]),
    "openai chunk and DONE": (CHUNK + b"data: [DONE]\n\n", [M(CHUNK[6:-2].decode()), M("[DONE]")]),
    "line of exactly the limit": (
        b"data:" + b"x" * (MAX_LINE_BYTES - 5) + b"\n\n",
        [M("x" * (MAX_LINE_BYTES - 5))],
    ),
}

PROTOCOL = ErrorCode.UPSTREAM_PROTOCOL
ERROR_CASES: dict[str, bytes] = {
    "invalid start byte": b"data: a\n\ndata: \xff\n\n",
    "invalid continuation": b"data: \xe2\x28\xa1\n\n",
    "encoded surrogate": b"data: \xed\xa0\x80\n\n",
    "overlong encoding": b"data: \xc0\xaf\n\n",
    "truncated character at end": b"data: a\n\ndata: \xe2\x9f",
    "line over the limit": b"data:" + b"x" * (MAX_LINE_BYTES - 4) + b"\n\n",
    "unterminated line over the limit": b"data: a\n\n" + b"y" * (MAX_LINE_BYTES + 1),
}

BIG = ("line of exactly the limit", "line over the limit", "unterminated line over the limit")


def run(chunks: list[bytes]) -> list[SSEMessage] | UpstreamError:
    decoder = UpstreamSSEDecoder()
    out: list[SSEMessage] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except UpstreamError as exc:
        return exc
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize("name", list(OK_CASES))
def test_ok_whole_and_byte_by_byte(name: str) -> None:
    data, expected = OK_CASES[name]
    assert run([data]) == expected
    if name not in BIG:
        assert run(byte_by_byte(data)) == expected
    assert run(split_at(data, [1, len(data) // 2, len(data) - 1])) == expected


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_whole_and_byte_by_byte(name: str) -> None:
    data = ERROR_CASES[name]
    error = run([data])
    assert isinstance(error, UpstreamError)
    assert error.code is PROTOCOL
    if name not in BIG:
        assert run(byte_by_byte(data)) == error
    assert run(split_at(data, [3, len(data) // 2, len(data) - 2])) == error


@pytest.mark.parametrize("name", [n for n in OK_CASES if n not in BIG])
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
@settings(max_examples=40, deadline=None)
def test_ok_random_splits(name: str, cuts: list[int]) -> None:
    data, expected = OK_CASES[name]
    assert run(split_at(data, [c for c in cuts if c <= len(data)])) == expected


@pytest.mark.parametrize("name", [n for n in ERROR_CASES if n not in BIG])
@given(cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8))
@settings(max_examples=40, deadline=None)
def test_errors_random_splits(name: str, cuts: list[int]) -> None:
    data = ERROR_CASES[name]
    assert run(split_at(data, [c for c in cuts if c <= len(data)])) == run([data])


STREAM_ALPHABET = st.sampled_from(
    [b"data:", b"data: ", b"event: e", b"id: 1", b"retry: 9", b":c", b"x", b"\n", b"\r",
     b"\r\n", b"\xef\xbb\xbf", "é😀".encode(), b"\xe2", b"\x9f", b"\xff", b"\x00", b" "]
)  # fmt: skip


@given(parts=st.lists(STREAM_ALPHABET, max_size=40), cuts=st.lists(st.integers(0, 200)))
@settings(max_examples=300, deadline=None)
def test_fuzz_any_bytes_parse_or_raise_ours_and_split_invariant(
    parts: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(parts)
    # Small limits, so the fuzzer also meets them and their order against UTF-8 faults.
    with mock.patch.multiple(sse_decoder, MAX_LINE_BYTES=16, MAX_EVENT_CHARS=24):
        whole = run([data])  # raises nothing but UpstreamError: run() catches only that
        assert run(split_at(data, [c for c in cuts if c <= len(data)])) == whole
        assert run(byte_by_byte(data)) == whole


def test_small_limits_apply_byte_by_byte() -> None:
    with mock.patch.multiple(sse_decoder, MAX_LINE_BYTES=8, MAX_EVENT_CHARS=12):
        assert run(byte_by_byte(b"data:123\n\n")) == [M("123")]
        line = run(byte_by_byte(b"data:1234\n\n"))
        assert isinstance(line, UpstreamError)
        assert "line longer than 8 bytes" in line.message
        assert run([b"data:1\r\ndata:2\r\n\r\n"]) == [M("1\n2")]
        event = run(byte_by_byte(b"data:1\ndata:2\ndata:3\n\n"))
        assert isinstance(event, UpstreamError)
        assert "event longer than 12 chars" in event.message


def test_errors_are_sticky() -> None:
    decoder = UpstreamSSEDecoder()
    with pytest.raises(UpstreamError) as first:
        decoder.feed(b"data: \xff\n\n")
    assert "invalid UTF-8" in first.value.message
    with pytest.raises(UpstreamError) as again:
        decoder.feed(b"data: fine\n\n")
    assert again.value is first.value
    with pytest.raises(UpstreamError):
        decoder.close()


def test_empty_feed_is_a_no_op() -> None:
    decoder = UpstreamSSEDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(b"data: x\n") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\n") == [M("x")]


def test_long_line_fed_in_small_pieces_is_linear() -> None:
    data = b"data: " + b"x" * 300_000 + b"\n\n"
    start = time.perf_counter()
    assert run([data[i : i + 3] for i in range(0, len(data), 3)]) == [M("x" * 300_000)]
    assert time.perf_counter() - start < 2.0  # quadratic buffering would take minutes


def test_cost_per_event() -> None:
    """A loose bound that catches regressions of an order of magnitude, not a benchmark."""
    decoder = UpstreamSSEDecoder()
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        decoder.feed(CHUNK)
    per_event_us = (time.perf_counter() - start) / n * 1e6
    assert per_event_us < 40, per_event_us


def test_whole_data_events_take_the_fast_path_and_keep_the_last_id() -> None:
    decoder = UpstreamSSEDecoder()
    assert decoder.feed(b"id: 7\nevent: e\ndata: a\n\n") == [M("a", event="e", id="7")]
    # From here on whole data-only events never reach the general (line by line) decoder.
    with mock.patch.object(decoder, "_sse", None):
        assert decoder.feed(CHUNK + b"data:b\n\n") == [
            M(CHUNK[6:-2].decode(), id="7"),
            M("b", id="7"),
        ]
    assert decoder.feed(b"data: c\n") == []  # half an event: the general path again
    assert decoder.feed(b"\ndata: d\n\n") == [M("c", id="7"), M("d", id="7")]
