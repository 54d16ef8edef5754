"""The reasoning splitter: a case table fed whole, char by char and split anywhere, plus
properties (any chunking gives split_reasoning's answer; only a possible tag is held)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolforge.core.reasoning import ReasoningSplitter, split_reasoning


def run(chunks: Iterable[str], *, starts_in_reasoning: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning)
    reasoning: list[str] = []
    content: list[str] = []
    for chunk in chunks:
        r, c = splitter.feed(chunk)
        reasoning.append(r)
        content.append(c)
    r, c = splitter.close()
    return "".join([*reasoning, r]), "".join([*content, c])


def split(text: str, points: Sequence[int]) -> list[str]:
    cuts = sorted({p for p in points if 0 < p < len(text)})
    return [text[a:b] for a, b in pairwise([0, *cuts, len(text)])]


# (id, text, starts_in_reasoning, (reasoning, content))
CASES: list[tuple[str, str, bool, tuple[str, str]]] = [
    ("think-block", "<think>plan</think>\n\nAnswer", False, ("plan", "Answer")),
    ("whitespace-before-tag", "  \n<think>plan</think>Answer", False, ("plan", "Answer")),
    ("thinking-tag", "<thinking>plan</thinking>\nAnswer", False, ("plan", "Answer")),
    ("closing-matches-opening", "<thinking>a</think>b</thinking>c", False, ("a</think>b", "c")),
    ("no-tags", "Answer only", False, ("", "Answer only")),
    ("leading-whitespace-kept", "  Answer", False, ("", "  Answer")),
    ("close-without-open", "Answer </think> more", False, ("", "Answer </think> more")),
    ("close-at-start-no-flag", "</think>x", False, ("", "</think>x")),
    ("implicit-open", "plan</think>\nAnswer", True, ("plan", "Answer")),
    ("implicit-open-thinking", "plan</thinking>Answer", True, ("plan", "Answer")),
    ("implicit-open-tag-anyway", " <think>plan</think>Answer", True, ("plan", "Answer")),
    ("implicit-never-closed", "no close at all", True, ("no close at all", "")),
    ("implicit-empty-reasoning", "</think>\n\nAnswer", True, ("", "Answer")),
    ("implicit-leading-newlines", "\n\n</think>x", True, ("\n\n", "x")),
    ("unclosed", "<think>unclosed", False, ("unclosed", "")),
    ("unclosed-partial-close", "<think>a</thi", False, ("a</thi", "")),
    (
        "later-block-is-content",
        "<think>a</think>b<think>c</think>",
        False,
        ("a", "b<think>c</think>"),
    ),
    ("nested-open-is-reasoning", "<think>a<think>b</think>c", False, ("a<think>b", "c")),
    ("empty-block", "<think></think>\n\nx", False, ("", "x")),
    ("reasoning-only", "<think>a</think>\n\n", False, ("a", "")),
    ("crlf-after-close", "<think>\nplan\n</think>\r\n\r\nAnswer", False, ("\nplan\n", "Answer")),
    ("only-newlines-stripped", "<think>a</think>  \nb", False, ("a", "  \nb")),
    ("partial-open-at-end", "<thi", False, ("", "<thi")),
    ("partial-open-implicit", "<thi", True, ("<thi", "")),
    ("lookalike-open", "<thinker>x", False, ("", "<thinker>x")),
    ("lookalike-close", "<think>a</thinker>b", False, ("a</thinker>b", "")),
    ("upper-case-is-content", "<THINK>a</THINK>b", False, ("", "<THINK>a</THINK>b")),
    ("lt-in-reasoning", "<think>a < b <</think>c", False, ("a < b <", "c")),
    ("empty", "", False, ("", "")),
    ("whitespace-only", "   ", False, ("", "   ")),
    ("whitespace-only-implicit", " \n", True, (" \n", "")),
    ("unicode", "<think>é👍</think>\nñ", False, ("é👍", "ñ")),
]
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("text", "flag", "expected"), [c[1:] for c in CASES], ids=IDS)
def test_case_table_whole_and_char_by_char(
    text: str, flag: bool, expected: tuple[str, str]
) -> None:
    assert split_reasoning(text, starts_in_reasoning=flag) == expected
    assert run([text], starts_in_reasoning=flag) == expected
    assert run(list(text), starts_in_reasoning=flag) == expected


@pytest.mark.parametrize(("text", "flag", "expected"), [c[1:] for c in CASES], ids=IDS)
def test_case_table_every_split_position(text: str, flag: bool, expected: tuple[str, str]) -> None:
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]], starts_in_reasoning=flag) == expected, i
        for j in range(i, len(text) + 1):
            chunks = [text[:i], text[i:j], text[j:]]
            assert run(chunks, starts_in_reasoning=flag) == expected, (i, j)


_PIECES = st.sampled_from(
    [
        *("<think>", "</think>", "<thinking>", "</thinking>", "<", ">", "/", "think", "ing"),
        *("\n", "\r\n", " ", "a", "é", "<th", "</th", "k>"),
    ]
)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=16), flag=st.booleans(), data=st.data())
def test_any_chunking_gives_split_reasoning(
    pieces: list[str], flag: bool, data: st.DataObject
) -> None:
    text = "".join(pieces)
    whole = split_reasoning(text, starts_in_reasoning=flag)
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert run(split(text, points), starts_in_reasoning=flag) == whole
    assert run(list(text), starts_in_reasoning=flag) == whole


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.booleans())
def test_any_text_never_raises_and_loses_only_tags_and_newlines(text: str, flag: bool) -> None:
    reasoning, content = split_reasoning(text, starts_in_reasoning=flag)
    assert len(reasoning) + len(content) <= len(text)
    if "<" not in text and not flag:
        assert (reasoning, content) == ("", text)


def _longest_partial_close(text: str) -> int:
    """The length of the longest end of ``text`` that begins "</think>" but is not it."""
    ends = range(1, min(len(text), len("</think>") - 1) + 1)
    return max((n for n in ends if "</think>".startswith(text[-n:])), default=0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab </>thinkg\n")), max_size=40))
def test_only_a_possible_closing_tag_is_held_back(body: str) -> None:
    """Reasoning is released the moment it cannot be part of ``</think>``, never later."""
    body = body.split("</think>")[0]
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>") == ("", "")
    released = ""
    for i, char in enumerate(body, start=1):
        reasoning, content = splitter.feed(char)
        released += reasoning
        assert content == ""
        so_far = body[:i]
        assert released == so_far[: len(so_far) - _longest_partial_close(so_far)]
    assert splitter.close() == (body[len(released) :], "")


def test_a_chunk_without_a_tag_character_is_released_whole() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>") == ("", "")
    chunk = "a long token"
    reasoning, _ = splitter.feed(chunk)
    assert reasoning is chunk  # the fast path: no copy
    assert splitter.feed("</think>\n") == ("", "")
    content = "answer"
    assert splitter.feed(content)[1] is content


def test_whitespace_before_a_possible_tag_waits_for_the_tag() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("\n ") == ("", "")
    assert splitter.feed("<thi") == ("", "")
    assert splitter.feed("s is html") == ("", "\n <this is html")
    assert splitter.close() == ("", "")


def test_used_after_close_is_a_programming_error() -> None:
    splitter = ReasoningSplitter()
    splitter.close()
    with pytest.raises(RuntimeError):
        splitter.feed("x")
    with pytest.raises(RuntimeError):
        splitter.close()
