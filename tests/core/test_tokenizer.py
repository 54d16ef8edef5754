"""The sentinel tokenizer: case tables fed whole, char by char and at random splits, plus
properties (chunking invariance, round trip, minimal hold-back, only our own errors)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.core.events import (
    Event,
    FrameBegin,
    FrameDelta,
    FrameEnd,
    FrameKind,
    Text,
    Violation,
)
from toolforge.core.protocol.sentinels import CLOSE, MAX_SENTINEL_CHARS, OPEN, begin, end
from toolforge.core.tokenizer import SentinelTokenizer
from toolforge.errors import ErrorCode, SentinelError

LB, RB = OPEN, CLOSE  # for the lookalikes and broken sentinels written by hand below
OBJ, TOOL, RES = FrameKind.OBJECT, FrameKind.TOOL_CALL, FrameKind.RESULT


# -- helpers ------------------------------------------------------------------------------


def normalize(events: Iterable[Event]) -> list[Event]:
    """Merge adjacent text / same-frame deltas: chunking may split them, nothing else."""
    out: list[Event] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, Text) and isinstance(last, Text):
            out[-1] = Text(last.text + ev.text)
        elif isinstance(ev, FrameDelta) and isinstance(last, FrameDelta) and last.id == ev.id:
            out[-1] = FrameDelta(ev.id, last.chunk + ev.chunk)
        else:
            out.append(ev)
    return out


def run(chunks: Iterable[str], **kwargs: Any) -> list[Event]:
    tok = SentinelTokenizer(**kwargs)
    events: list[Event] = []
    for chunk in chunks:
        events += tok.feed(chunk)
        if tok.failed:
            return normalize(events)
    events += tok.close()
    return normalize(events)


def split(text: str, points: Sequence[int]) -> list[str]:
    cuts = sorted({p for p in points if 0 < p < len(text)})
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds)]


def three_ways(text: str, **kwargs: Any) -> list[Event]:
    """Run whole and char by char; both must agree. Returns the events."""
    whole = run([text], **kwargs)
    by_char = run(list(text), **kwargs)
    assert by_char == whole, "char-by-char feeding changed the events"
    return whole


def V(code: ErrorCode, frame_id: str | None) -> tuple[ErrorCode, str | None]:
    return (code, frame_id)


def shape(events: list[Event]) -> list[object]:
    """Events with violations reduced to (code, frame_id), for readable expectations."""
    return [
        (ev.error.code, ev.error.frame_id) if isinstance(ev, Violation) else ev for ev in events
    ]


# -- the case table ----------------------------------------------------------------------

B_O1 = begin(OBJ, "o1", "Action")
E_O1 = end(OBJ, "o1")

CASES: list[tuple[str, str, list[object]]] = [
    ("empty", "", []),
    ("plain text", "hello world", [Text("hello world")]),
    (
        "object frame between text",
        f"a{B_O1}" + '{"x":1}' + f"{E_O1}b",
        [
            Text("a"),
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"x":1}'),
            FrameEnd(OBJ, "o1"),
            Text("b"),
        ],
    ),
    (
        "tool call with a dotted name",
        begin(TOOL, "t1", "places.search") + '{"query":"pizza"}' + end(TOOL, "t1"),
        [
            FrameBegin(TOOL, "t1", "places.search"),
            FrameDelta("t1", '{"query":"pizza"}'),
            FrameEnd(TOOL, "t1"),
        ],
    ),
    (
        "result frame",
        begin(RES, "r1", "AssistantReply") + '{"answer":"ok"}' + end(RES, "r1"),
        [
            FrameBegin(RES, "r1", "AssistantReply"),
            FrameDelta("r1", '{"answer":"ok"}'),
            FrameEnd(RES, "r1"),
        ],
    ),
    ("empty frame", B_O1 + E_O1, [FrameBegin(OBJ, "o1", "Action"), FrameEnd(OBJ, "o1")]),
    (
        "two frames in a row",
        B_O1 + "[]" + E_O1 + begin(TOOL, "t2", "x") + "{}" + end(TOOL, "t2"),
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", "[]"),
            FrameEnd(OBJ, "o1"),
            FrameBegin(TOOL, "t2", "x"),
            FrameDelta("t2", "{}"),
            FrameEnd(TOOL, "t2"),
        ],
    ),
    (
        "sentinel inside a JSON string is content",
        B_O1 + '{"s":"' + E_O1 + '"}' + E_O1,
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"s":"' + E_O1 + '"}'),
            FrameEnd(OBJ, "o1"),
        ],
    ),
    (
        "escaped quote keeps the string open",
        B_O1 + '{"s":"a\\"' + E_O1 + '"}' + E_O1,
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"s":"a\\"' + E_O1 + '"}'),
            FrameEnd(OBJ, "o1"),
        ],
    ),
    (
        "escaped backslash closes the string",
        B_O1 + '{"s":"a\\\\"}' + E_O1,
        [FrameBegin(OBJ, "o1", "Action"), FrameDelta("o1", '{"s":"a\\\\"}'), FrameEnd(OBJ, "o1")],
    ),
    (
        "nested BEGIN inside a string is content",
        B_O1 + '["' + begin(TOOL, "t", "x") + '"]' + E_O1,
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '["' + begin(TOOL, "t", "x") + '"]'),
            FrameEnd(OBJ, "o1"),
        ],
    ),
    (
        "unicode escapes are plain content",
        B_O1 + '{"s":"\\u27E6END_OBJECT id=o1\\u27E7"}' + E_O1,
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"s":"\\u27E6END_OBJECT id=o1\\u27E7"}'),
            FrameEnd(OBJ, "o1"),
        ],
    ),
    (
        "emoji and combining text pass through",
        "héllo 👩‍💻 " + B_O1 + '{"e":"👍🏽"}' + E_O1 + " ✓",
        [
            Text("héllo 👩‍💻 "),
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"e":"👍🏽"}'),
            FrameEnd(OBJ, "o1"),
            Text(" ✓"),
        ],
    ),
    # Lookalikes: a run that goes wrong before ⟦BEGIN_ / ⟦END_ is plain text.
    ("lone open bracket", f"a{LB}b", [Text(f"a{LB}b")]),
    ("lone open bracket at the end", f"a{LB}", [Text(f"a{LB}")]),
    ("lone close bracket", f"a{RB}b", [Text(f"a{RB}b")]),
    ("empty brackets", f"{LB}{RB}", [Text(f"{LB}{RB}")]),
    ("partial keyword at the end", f"x{LB}BEGIN", [Text(f"x{LB}BEGIN")]),
    ("BEGINNING", f"{LB}BEGINNING{RB}", [Text(f"{LB}BEGINNING{RB}")]),
    ("ENDING", f"{LB}ENDING{RB}", [Text(f"{LB}ENDING{RB}")]),
    (
        "lowercase",
        f"{LB}begin_object id=a schema=S{RB}",
        [Text(f"{LB}begin_object id=a schema=S{RB}")],
    ),
    ("space after the bracket", f"{LB} BEGIN_OBJECT{RB}", [Text(f"{LB} BEGIN_OBJECT{RB}")]),
    (
        "doubled open bracket before a real sentinel",
        LB + B_O1 + "1" + E_O1,
        [Text(LB), FrameBegin(OBJ, "o1", "Action"), FrameDelta("o1", "1"), FrameEnd(OBJ, "o1")],
    ),
    (
        "lookalike inside a body is body content",
        B_O1 + f"[1]{LB}x{LB}EN" + E_O1,
        [FrameBegin(OBJ, "o1", "Action"), FrameDelta("o1", f"[1]{LB}x{LB}EN"), FrameEnd(OBJ, "o1")],
    ),
    # Violations: typed, with the offending frame id, after everything before them.
    ("END without BEGIN", "hi " + E_O1, [Text("hi "), V(ErrorCode.END_WITHOUT_BEGIN, "o1")]),
    (
        "END id mismatch",
        B_O1 + "{}" + end(OBJ, "o2"),
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", "{}"),
            V(ErrorCode.END_ID_MISMATCH, "o1"),
        ],
    ),
    (
        "END kind mismatch",
        B_O1 + "{}" + end(TOOL, "o1"),
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", "{}"),
            V(ErrorCode.END_KIND_MISMATCH, "o1"),
        ],
    ),
    (
        "nested BEGIN",
        B_O1 + "{" + begin(TOOL, "t1", "x"),
        [FrameBegin(OBJ, "o1", "Action"), FrameDelta("o1", "{"), V(ErrorCode.NESTED_BEGIN, "o1")],
    ),
    (
        "duplicate id",
        B_O1 + "1" + E_O1 + begin(TOOL, "o1", "x"),
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", "1"),
            FrameEnd(OBJ, "o1"),
            V(ErrorCode.DUPLICATE_FRAME_ID, "o1"),
        ],
    ),
    (
        "unknown frame kind",
        f"{LB}BEGIN_FOO id=f1 schema=S{RB}",
        [V(ErrorCode.UNKNOWN_FRAME_KIND, "f1")],
    ),
    ("unknown END kind", f"{LB}END_THING id=f1{RB}", [V(ErrorCode.UNKNOWN_FRAME_KIND, "f1")]),
    ("empty kind", f"{LB}BEGIN_ id=a{RB}", [V(ErrorCode.UNKNOWN_FRAME_KIND, "a")]),
    ("missing schema", f"{LB}BEGIN_OBJECT id=a{RB}", [V(ErrorCode.MALFORMED_SENTINEL, "a")]),
    (
        "name on an object",
        f"{LB}BEGIN_OBJECT id=a name=S{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    (
        "schema on a tool",
        f"{LB}BEGIN_TOOL_CALL id=a schema=S{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    (
        "attributes swapped",
        f"{LB}BEGIN_OBJECT schema=S id=a{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    (
        "extra attribute",
        f"{LB}BEGIN_OBJECT id=a schema=S x=1{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    (
        "double space",
        f"{LB}BEGIN_OBJECT id=a  schema=S{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    ("trailing space", f"{LB}END_OBJECT id=a {RB}", [V(ErrorCode.MALFORMED_SENTINEL, "a")]),
    ("empty id", f"{LB}END_OBJECT id={RB}", [V(ErrorCode.MALFORMED_SENTINEL, None)]),
    (
        "bad id characters",
        f"{LB}BEGIN_OBJECT id=a/b schema=S{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a/b")],
    ),
    (
        "id too long",
        f"{LB}END_OBJECT id={'a' * 65}{RB}",
        [V(ErrorCode.MALFORMED_SENTINEL, "a" * 65)],
    ),
    (
        "bad schema name",
        f'{LB}BEGIN_OBJECT id=a schema=S"{RB}',
        [V(ErrorCode.MALFORMED_SENTINEL, "a")],
    ),
    ("no attributes", f"{LB}END_OBJECT{RB}", [V(ErrorCode.MALFORMED_SENTINEL, None)]),
    (
        "newline inside a sentinel",
        f"{LB}BEGIN_OBJECT id=a\n",
        [V(ErrorCode.MALFORMED_SENTINEL, None)],
    ),
    (
        "open bracket inside a sentinel",
        f"{LB}END_OBJECT {LB}",
        [V(ErrorCode.MALFORMED_SENTINEL, None)],
    ),
    (
        "sentinel too long",
        f"{LB}BEGIN_OBJECT id=a schema=" + "S" * MAX_SENTINEL_CHARS,
        [V(ErrorCode.MALFORMED_SENTINEL, None)],
    ),
    (
        "stream ends inside a sentinel",
        f"ok {LB}END_OBJ",
        [Text("ok "), V(ErrorCode.MALFORMED_SENTINEL, None)],
    ),
    (
        "stream ends inside a frame",
        B_O1 + '{"a":',
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"a":'),
            V(ErrorCode.FRAME_UNCLOSED, "o1"),
        ],
    ),
    (
        "stream ends inside an END sentinel",
        B_O1 + "1" + E_O1[:-3],
        [FrameBegin(OBJ, "o1", "Action"), FrameDelta("o1", "1"), V(ErrorCode.FRAME_UNCLOSED, "o1")],
    ),
    (
        "stream ends on a held lookalike inside a frame",
        B_O1 + f"1{LB}EN",
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", f"1{LB}EN"),
            V(ErrorCode.FRAME_UNCLOSED, "o1"),
        ],
    ),
    (
        "an unterminated string swallows the END",
        B_O1 + '{"a":"b' + E_O1,
        [
            FrameBegin(OBJ, "o1", "Action"),
            FrameDelta("o1", '{"a":"b' + E_O1),
            V(ErrorCode.FRAME_UNCLOSED, "o1"),
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_case_table_whole_and_char_by_char(text: str, expected: list[object]) -> None:
    assert shape(three_ways(text)) == expected


@pytest.mark.parametrize("text", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_case_table_every_two_chunk_split(text: str) -> None:
    # vLLM's tool-parser suite checks every two-chunk split; so do we.
    whole = run([text])
    for i in range(1, len(text)):
        assert run([text[:i], text[i:]]) == whole, f"split at {i}"


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_case_table_random_splits(data: st.DataObject) -> None:
    _, text, _ = data.draw(st.sampled_from(CASES))
    points = data.draw(st.lists(st.integers(0, max(len(text), 1)), max_size=12))
    assert run(split(text, points)) == run([text])


# -- limits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected_delta"),
    [("0123456789", "0123456789"), ("01234567890", "0123456789"), ('"ééééééé"', '"éééé')],
)
def test_frame_size_limit_cuts_at_the_limit(body: str, expected_delta: str) -> None:
    events = shape(three_ways(B_O1 + body + E_O1, max_frame_bytes=10))
    assert events[0] == FrameBegin(OBJ, "o1", "Action")
    assert events[1] == FrameDelta("o1", expected_delta)
    fits = len(body.encode()) <= 10
    assert events[2:] == ([FrameEnd(OBJ, "o1")] if fits else [V(ErrorCode.FRAME_TOO_LARGE, "o1")])


def test_default_frame_limit_is_64_kib() -> None:
    body = '"' + "a" * (64 * 1024 - 2) + '"'
    assert shape(run([B_O1, body, E_O1]))[-1] == FrameEnd(OBJ, "o1")
    over = shape(run([B_O1, body + " ", E_O1]))
    assert over[-1] == V(ErrorCode.FRAME_TOO_LARGE, "o1")


def test_megabytes_of_text_with_no_newline_stream_through() -> None:
    tok = SentinelTokenizer()
    chunk = "x" * 65536
    for _ in range(32):  # 2 MiB of free text: emitted as it comes, never accumulated
        assert tok.feed(chunk) == [Text(chunk)]
    assert tok.close() == []


# -- stickiness and lifecycle -------------------------------------------------------------


def test_errors_are_sticky() -> None:
    tok = SentinelTokenizer()
    events = tok.feed("a" + E_O1 + "b")
    assert isinstance(events[-1], Violation)
    err = events[-1].error
    assert err.code is ErrorCode.END_WITHOUT_BEGIN
    assert err.to_dict()["frame_id"] == "o1"
    with pytest.raises(SentinelError) as again:
        tok.feed("more")
    assert again.value is err
    with pytest.raises(SentinelError):
        tok.close()


def test_feed_after_close_is_a_programming_error() -> None:
    tok = SentinelTokenizer()
    tok.close()
    with pytest.raises(RuntimeError):
        tok.feed("x")


def test_open_frame_id() -> None:
    tok = SentinelTokenizer()
    assert tok.open_frame_id is None
    tok.feed(B_O1 + "{")
    assert tok.open_frame_id == "o1"
    tok.feed("}" + E_O1)
    assert tok.open_frame_id is None


# -- the hold-back rule --------------------------------------------------------------------


def test_holds_back_only_a_possible_sentinel() -> None:
    tok = SentinelTokenizer()
    assert tok.feed(f"abc{LB}BEG") == [Text("abc")]
    assert tok.feed("x") == [Text(f"{LB}BEGx")]
    assert tok.feed(f"{LB}") == []
    assert tok.feed(f"{LB}") == [Text(LB)]  # the first ⟦ can no longer be a sentinel
    assert tok.feed("BEGIN_OBJECT id=o schema=S") == []  # committed: sentinel or error
    assert tok.feed(f"{RB}") == [FrameBegin(OBJ, "o", "S")]


def test_body_inside_a_string_is_never_held() -> None:
    tok = SentinelTokenizer()
    tok.feed(B_O1)
    assert tok.feed(f'{{"a":"{LB}END_OBJ') == [FrameDelta("o1", f'{{"a":"{LB}END_OBJ')]
    assert tok.feed(f'"}}{LB}END') == [FrameDelta("o1", '"}')]
    assert tok.feed("_OBJECT id=o1" + RB) == [FrameEnd(OBJ, "o1")]


_HOLDABLE = (LB + "BEGIN_", LB + "END_")


def _expected_held(fed: str) -> str:
    """The longest suffix of ``fed`` that could still become a commit prefix."""
    for start in range(max(0, len(fed) - 7), len(fed)):
        suffix = fed[start:]
        if suffix.startswith(LB) and any(p.startswith(suffix) and p != suffix for p in _HOLDABLE):
            return suffix
    return ""


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=f"{LB}{RB}BEGINDO_ x", max_size=40))
def test_text_emitted_at_once_except_the_possible_sentinel(text: str) -> None:
    tok = SentinelTokenizer()
    emitted = ""
    for i, ch in enumerate(text):
        events = tok.feed(ch)
        if tok.failed or any(not isinstance(e, Text) for e in events):
            return  # a committed sentinel: covered by the case table
        emitted += "".join(e.text for e in events if isinstance(e, Text))
        fed = text[: i + 1]
        if fed.endswith(_HOLDABLE) or LB + "BEGIN_" in fed or LB + "END_" in fed:
            return
        assert emitted + _expected_held(fed) == fed


# -- properties over generated streams -----------------------------------------------------

_json_value = json_values(
    max_leaves=8,
    integers=st.integers(-(10**6), 10**6),
    floats=None,
    text=st.text(alphabet=st.sampled_from(list('ab "\\' + LB + RB + "⟦END_OBJECT id=é👍\n"))),
    keys=st.text(max_size=3),
    max_list_size=3,
    max_dict_size=3,
)
_free_text = st.text(
    alphabet=st.sampled_from(list('ab \n"\\{}' + LB + RB + "BEGIN_ENDOX")), max_size=12
)
_ids = st.from_regex(r"[a-z][a-z0-9]{0,3}", fullmatch=True)


@st.composite
def valid_streams(draw: st.DrawFn) -> str:
    import json

    parts: list[str] = []
    used: set[str] = set()
    for _ in range(draw(st.integers(0, 4))):
        text = draw(_free_text)
        # Free text must not itself commit to a sentinel, or the stream is not valid.
        if LB + "BEGIN_" in text or LB + "END_" in text:
            text = text.replace(LB, "[")
        parts.append(text)
        fid = draw(_ids.filter(lambda i: i not in used))
        used.add(fid)
        kind = draw(st.sampled_from(list(FrameKind)))
        body = json.dumps(draw(_json_value), ensure_ascii=False)
        parts.append(begin(kind, fid, "Name.x") + body + end(kind, fid))
    tail = draw(_free_text)
    parts.append(tail.replace(LB, "["))
    return "".join(parts)


def reconstruct(events: list[Event]) -> str:
    out = []
    kinds: dict[str, FrameKind] = {}
    for ev in events:
        if isinstance(ev, Text):
            out.append(ev.text)
        elif isinstance(ev, FrameBegin):
            kinds[ev.id] = ev.kind
            out.append(begin(ev.kind, ev.id, ev.name))
        elif isinstance(ev, FrameDelta):
            out.append(ev.chunk)
        elif isinstance(ev, FrameEnd):
            out.append(end(ev.kind, ev.id))
        else:
            raise AssertionError(f"unexpected violation {ev}")
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(stream=valid_streams(), data=st.data())
def test_valid_streams_round_trip_under_any_chunking(stream: str, data: st.DataObject) -> None:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    events = run(split(stream, points))
    assert reconstruct(events) == stream
    assert events == run([stream])


@settings(max_examples=300, deadline=None)
@given(
    noise=st.text(
        alphabet=st.sampled_from(list(f'{LB}{RB}BEGIN_ENDOBJECTTOOLRESULT id=sch"\\{{}}:\n')),
        max_size=80,
    ),
    data=st.data(),
)
def test_arbitrary_text_gives_events_or_our_error_and_is_chunk_invariant(
    noise: str, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(noise)), max_size=20))
    whole = run([noise])
    assert run(split(noise, points)) == whole
    assert run(list(noise)) == whole
    assert all(isinstance(ev, Violation) for ev in whole[-1:]) or not any(
        isinstance(ev, Violation) for ev in whole
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(), max_size=10))
def test_any_unicode_never_raises_anything_but_sentinel_error(chunks: list[str]) -> None:
    tok = SentinelTokenizer()
    try:
        for chunk in chunks:
            tok.feed(chunk)
        tok.close()
    except SentinelError:
        pass
