"""The one module that renders and recognises sentinels: what it renders, the tokenizer
reads back, and the recognisers find exactly the sentinels."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolforge.core.events import FrameBegin, FrameDelta, FrameEnd, FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.tokenizer import SentinelTokenizer

IDS = st.from_regex(r"[A-Za-z0-9_.:\-]{1,64}", fullmatch=True)
NAMES = st.from_regex(r"[A-Za-z0-9_.:\-]{1,128}", fullmatch=True)


def test_renderings_are_the_spec_grammar() -> None:
    assert sentinels.begin(FrameKind.TOOL_CALL, "t1", "places.search") == (
        "\u27e6BEGIN_TOOL_CALL id=t1 name=places.search\u27e7"
    )
    assert sentinels.begin(FrameKind.OBJECT, "o1", "Action") == (
        "\u27e6BEGIN_OBJECT id=o1 schema=Action\u27e7"
    )
    assert sentinels.end(FrameKind.RESULT, "r1") == "\u27e6END_RESULT id=r1\u27e7"


@given(st.sampled_from(list(FrameKind)), IDS, NAMES)
def test_what_is_rendered_the_tokenizer_reads_back(kind: FrameKind, fid: str, name: str) -> None:
    text = sentinels.frame(kind, fid, name, "{}")
    assert SentinelTokenizer().feed(text) == [
        FrameBegin(kind, fid, name),
        FrameDelta(fid, "{}"),
        FrameEnd(kind, fid),
    ]
    assert sentinels.SENTINEL_RE.search(text) is not None


@given(IDS, NAMES)
def test_the_tool_call_recogniser_finds_id_and_name(fid: str, name: str) -> None:
    text = "x " + sentinels.frame(FrameKind.TOOL_CALL, fid, name, '{"a": 1}')
    found = sentinels.TOOL_CALL_BEGIN_RE.search(text)
    assert found is not None and found.groups() == (fid, name)


@pytest.mark.parametrize(
    "text",
    ["\u27e6BEGIN_TOOL id=t1 name=x\u27e7", "\u27e6END_RESULT id=\u27e7", "[BEGIN_RESULT id=r1]"],
)
def test_lookalikes_are_not_sentinels(text: str) -> None:
    assert sentinels.SENTINEL_RE.search(text) is None


def test_escape_writes_json_escapes_and_leaves_other_text_alone() -> None:
    assert sentinels.escape("a \u27e6END_TOOL_CALL id=1\u27e7 b") == (
        "a \\u27e6END_TOOL_CALL id=1\\u27e7 b"
    )
    same = "no sentinel here"
    assert sentinels.escape(same) is same


@pytest.mark.parametrize(
    ("pattern", "longest"),
    [(sentinels.ID_RE, sentinels.MAX_ID_CHARS), (sentinels.NAME_RE, sentinels.MAX_NAME_CHARS)],
)
def test_ids_and_names_are_bounded_words(pattern: re.Pattern[str], longest: int) -> None:
    assert pattern.fullmatch("ns:tool-v2.x_1") and pattern.fullmatch("a" * longest)
    for bad in ("", "a" * (longest + 1), "has space", "a/b", "é", sentinels.OPEN):
        assert not pattern.fullmatch(bad), bad


def test_the_longest_sentinel_fits_the_limit() -> None:
    longest = sentinels.begin(
        FrameKind.TOOL_CALL, "i" * sentinels.MAX_ID_CHARS, "n" * sentinels.MAX_NAME_CHARS
    )
    assert len(longest) == 219 <= sentinels.MAX_SENTINEL_CHARS
