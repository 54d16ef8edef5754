"""The streaming JSON validator: a case table (JSONTestSuite-style y_/n_ documents) fed
whole, char by char and at random splits; properties against orjson as the reference;
adversarial inputs that must fail fast with our own errors."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any, TypeVar

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.errors import ErrorCode, JSONError, ToolForgeError

SYNTAX = ErrorCode.JSON_SYNTAX
INCOMPLETE = ErrorCode.JSON_INCOMPLETE
TRAILING = ErrorCode.JSON_TRAILING_DATA
DEEP = ErrorCode.JSON_TOO_DEEP
LARGE = ErrorCode.JSON_TOO_LARGE
RANGE = ErrorCode.JSON_NUMBER_OUT_OF_RANGE
UNICODE = ErrorCode.JSON_INVALID_UNICODE

OK = "ok"
Outcome = tuple[str, Any]  # ("ok", value) or (code, offset)
T = TypeVar("T", str, bytes)

# -- helpers ------------------------------------------------------------------------------


def split(text: T, points: Iterable[int]) -> list[T]:
    """``text`` (str or bytes) cut at ``points``."""
    cuts: list[int] = sorted({p for p in points if 0 < p < len(text)})
    return [text[a:b] for a, b in pairwise([0, *cuts, len(text)])]


def run(chunks: Iterable[str], **kwargs: Any) -> Outcome:
    v = StreamingJSONValidator(**kwargs)
    try:
        for chunk in chunks:
            v.feed(chunk)
        return OK, v.close()
    except JSONError as exc:
        return str(exc.code), exc.offset


def run_bytes(chunks: Iterable[bytes], **kwargs: Any) -> Outcome:
    v = StreamingJSONValidator(**kwargs)
    try:
        for chunk in chunks:
            v.feed_bytes(chunk)
        return OK, v.close()
    except JSONError as exc:
        return str(exc.code), exc.offset


def depth_of(value: object) -> int:
    """Container nesting depth, without recursion."""
    best, todo = 0, [(value, 0)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, dict | list):
            d += 1
            best = max(best, d)
            todo.extend((child, d) for child in (node.values() if isinstance(node, dict) else node))
    return best


def reference_accepts(text: str, max_depth: int = 16) -> bool:
    """Strict reference: orjson parses it, it nests at most max_depth deep, every integer
    fits 64 bits (orjson would turn bigger ones into floats), and it is not empty."""
    if not text.strip(" \t\n\r"):
        return False
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    if depth_of(value) > max_depth:
        return False
    in_range = True

    def parse_int(s: str) -> int:
        nonlocal in_range
        if len(s) > 21 or not -(2**63) <= int(s) <= 2**64 - 1:
            in_range = False
        return 0

    json.loads(text, parse_int=parse_int)
    return in_range


# -- the case table -----------------------------------------------------------------------

D = 16  # the default max_depth
VALID: list[str] = [
    "{}",
    "[]",
    "0",
    "-0",
    "1",
    "-1",
    "123456789",
    "1.5",
    "-0.0",
    "-1.5e10",
    "1E+2",
    "1e-2",
    "0e0",
    "0.1e-999999",  # underflows to 0.0: fine
    "2.5E-400",
    "1.7976931348623157e308",
    "18446744073709551615",  # 2**64 - 1
    "-9223372036854775808",  # -2**63
    '""',
    '"x"',
    "true",
    "false",
    "null",
    " \t\n\r[ 1 ,\t2 ,\n3\r] \n",
    ' { "a" : [ true , false , null ] , "b" : { } } ',
    '{"a":{"b":[{"c":null}]}}',
    "[[[]],[[],[]]]",
    '{"":""}',
    '{"a":1,"a":2}',  # duplicate names: RFC 8259 §4 allows them; the last wins
    "[1,[2,[3,[4]]]]",
    '"\\u27E6\\u27e7"',
    '"\\ud83d\\ude00"',  # a surrogate pair
    '"\\uDBFF\\uDFFF"',
    '"\\"\\\\\\/\\b\\f\\n\\r\\t"',
    '"\\u0000"',
    '"é😀⟦ \u2028"',
    '"\x7f"',  # DEL is not a control character in JSON
    '{"k": "a\\nb", "n": -12.5e-3, "t": true, "l": [1, 2, {"x": null}]}',
    "[" * D + "]" * D,  # exactly max_depth
    '{"a":' * D + "1" + "}" * D,
    "[-0, 0.0, 1e1, 1E-1, 123.456e+7]",
]

INVALID: list[tuple[str, ErrorCode, int]] = [
    # incomplete
    ("", INCOMPLETE, 0),
    ("   ", INCOMPLETE, 3),
    ("[", INCOMPLETE, 1),
    ('{"a":1', INCOMPLETE, 6),
    ('{"a"', INCOMPLETE, 4),
    ('"abc', INCOMPLETE, 4),
    ("tru", INCOMPLETE, 3),
    ("-", INCOMPLETE, 1),
    ("1.", INCOMPLETE, 2),
    ("1e", INCOMPLETE, 2),
    ("1e+", INCOMPLETE, 3),
    ('"\\u12', INCOMPLETE, 5),
    ('"\\', INCOMPLETE, 2),
    ("[1", INCOMPLETE, 2),
    # structure
    ("[1,]", SYNTAX, 3),
    ('{"a":1,}', SYNTAX, 7),
    ("[,1]", SYNTAX, 1),
    ("[1 2]", SYNTAX, 3),
    ("[1,,2]", SYNTAX, 3),
    ('{"a" 1}', SYNTAX, 5),
    ('{"a"::1}', SYNTAX, 5),
    ('{"a":}', SYNTAX, 5),
    ("{a:1}", SYNTAX, 1),
    ("{'a':1}", SYNTAX, 1),
    ("['a']", SYNTAX, 1),
    ('{"a":1 "b":2}', SYNTAX, 7),
    ("[1}", SYNTAX, 2),
    ('{"a":1]', SYNTAX, 6),
    ("{1:2}", SYNTAX, 1),
    ("]", SYNTAX, 0),
    (":", SYNTAX, 0),
    # literals and non-finite numbers
    ("NaN", SYNTAX, 0),
    ("Infinity", SYNTAX, 0),
    ("-Infinity", SYNTAX, 1),
    ("[nan]", SYNTAX, 2),
    ("True", SYNTAX, 0),
    ("trux", SYNTAX, 3),
    ("nul1", SYNTAX, 3),
    # numbers
    ("01", SYNTAX, 1),
    ("-01", SYNTAX, 2),
    ("[00]", SYNTAX, 2),
    ("[1.]", SYNTAX, 3),
    (".5", SYNTAX, 0),
    ("+1", SYNTAX, 0),
    ("1.e3", SYNTAX, 2),
    ("1e+-3", SYNTAX, 3),
    ("--1", SYNTAX, 1),
    ("[0x10]", SYNTAX, 2),
    ("0x10", TRAILING, 1),
    ("1-2", TRAILING, 1),
    ("[1.5.3]", SYNTAX, 4),
    ("1E400", RANGE, 0),
    ("-1e400", RANGE, 0),
    ("[1, 18446744073709551616]", RANGE, 4),
    ("-9223372036854775809", RANGE, 0),
    ("1" + "0" * 310 + ".5", RANGE, 0),
    # strings
    ('"a\x00b"', SYNTAX, 2),
    ('"\t"', SYNTAX, 1),
    ('"\n"', SYNTAX, 1),
    ('"\x1f"', SYNTAX, 1),
    ('"\\x41"', SYNTAX, 2),
    ('"\\\'"', SYNTAX, 2),
    ('"\\U0041"', SYNTAX, 2),
    ('"\\u12G4"', SYNTAX, 5),
    # unicode
    ('"\\ud800"', UNICODE, 7),
    ('"\\udc00"', UNICODE, 1),
    ('"\\ud800\\u0041"', UNICODE, 7),
    ('"\\ud800\\n"', UNICODE, 8),
    ('"\\ud800x"', UNICODE, 7),
    ('"\\udbff\\udbff"', UNICODE, 7),
    ('"a\ud800"', UNICODE, 2),  # a raw surrogate: bad decoding upstream
    ("\udc00", UNICODE, 0),
    ('"\\\ud800"', UNICODE, 2),
    ("t\udc00", UNICODE, 1),
    ("[1\ud800]", UNICODE, 2),
    # whitespace is space, tab, LF, CR only
    ("\u00a01", SYNTAX, 0),
    ("\x0c1", SYNTAX, 0),
    ("\ufeff1", SYNTAX, 0),
    # trailing data and comments
    ("[1] x", TRAILING, 4),
    ("{}{}", TRAILING, 2),
    ("1 2", TRAILING, 2),
    ('"a""b"', TRAILING, 3),
    ("truefalse", TRAILING, 4),
    ("[1] // c", TRAILING, 4),
    ("/* c */ 1", SYNTAX, 0),
    ("[1, /* c */ 2]", SYNTAX, 4),
    # depth: the (max_depth + 1)-th container fails at its bracket
    ("[" * (D + 1) + "]" * (D + 1), DEEP, D),
    ('{"a":' * (D + 1) + "1" + "}" * (D + 1), DEEP, 5 * D),
]

# Cases with their own limits: (doc, kwargs, expected).
LIMITED: list[tuple[str, dict[str, int], Outcome]] = [
    ('"abcdefghijkl"', {"max_bytes": 10}, (LARGE, 10)),
    ('"abcdefgh"', {"max_bytes": 10}, (OK, "abcdefgh")),  # exactly the limit
    ('"éééé"', {"max_bytes": 8}, (LARGE, 4)),  # bytes 1,3,5,7,9: the 4th é crosses
    ('"ééé"', {"max_bytes": 8}, (OK, "ééé")),
    ("[1,]xxxxxxxx", {"max_bytes": 5}, (SYNTAX, 3)),  # an earlier error wins
    ("[[1]]", {"max_depth": 1}, (DEEP, 1)),
    ("[1]", {"max_depth": 1}, (OK, [1])),
    ("1", {"max_depth": 0}, (OK, 1)),
    ("[]", {"max_depth": 0}, (DEEP, 0)),
]

ALL_CASES: list[tuple[str, dict[str, int], Outcome]] = [
    *((doc, {}, (OK, orjson.loads(doc))) for doc in VALID),
    *((doc, {}, (str(code), offset)) for doc, code, offset in INVALID),
    *((doc, kw, (str(out[0]), out[1])) for doc, kw, out in LIMITED),
]


def test_the_table_is_broad() -> None:
    assert len(ALL_CASES) >= 60


@pytest.mark.parametrize(("doc", "kwargs", "expected"), ALL_CASES, ids=repr)
def test_case_whole_and_char_by_char(doc: str, kwargs: dict[str, int], expected: Outcome) -> None:
    assert run([doc], **kwargs) == expected
    assert run(list(doc), **kwargs) == expected
    if expected[0] == OK:  # the reference agrees with the table
        assert reference_accepts(doc, kwargs.get("max_depth", D))


@pytest.mark.parametrize(("doc", "kwargs", "expected"), ALL_CASES, ids=repr)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_case_random_splits(
    doc: str, kwargs: dict[str, int], expected: Outcome, data: st.DataObject
) -> None:
    points = data.draw(st.lists(st.integers(0, len(doc)), max_size=8))
    assert run(split(doc, points), **kwargs) == expected


@pytest.mark.parametrize(("doc", "kwargs", "expected"), ALL_CASES, ids=repr)
def test_case_as_bytes_split_everywhere(
    doc: str, kwargs: dict[str, int], expected: Outcome
) -> None:
    if any("\ud800" <= c <= "\udfff" for c in doc):
        return  # raw surrogates cannot be encoded; they only exist in str
    raw = doc.encode()
    for cut in range(len(raw) + 1):
        assert run_bytes([raw[:cut], raw[cut:]], **kwargs) == expected


# -- properties ---------------------------------------------------------------------------

JSON = json_values(
    max_leaves=12,
    integers=st.integers(-(2**63), 2**64 - 1),
    text=st.text(max_size=8),
    keys=st.text(max_size=4),
    max_list_size=4,
    max_dict_size=4,
)
whitespace = st.text(alphabet=" \t\n\r", max_size=2)


@st.composite
def documents(draw: st.DrawFn) -> tuple[object, str]:
    """A JSON value and a text for it, with random whitespace between all tokens."""
    value = draw(JSON)
    ascii_only = draw(st.booleans())
    out: list[str] = []
    # An explicit stack of things to write, so nothing here recurses either.
    todo: list[object] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, _Raw):
            out.append(item.text)
        elif isinstance(item, list):
            parts: list[object] = [_Raw("[")]
            for i, child in enumerate(item):
                parts += [_Raw(draw(whitespace) + ("," if i else "")), child]
            parts.append(_Raw(draw(whitespace) + "]"))
            todo.extend(reversed(parts))
        elif isinstance(item, dict):
            parts = [_Raw("{")]
            for i, (k, child) in enumerate(item.items()):
                key = json.dumps(k, ensure_ascii=ascii_only)
                sep = draw(whitespace) + ":" + draw(whitespace)
                parts += [_Raw(draw(whitespace) + ("," if i else "") + key + sep), child]
            parts.append(_Raw(draw(whitespace) + "}"))
            todo.extend(reversed(parts))
        else:
            out.append(draw(whitespace) + json.dumps(item, ensure_ascii=ascii_only))
    return value, draw(whitespace) + "".join(out) + draw(whitespace)


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


@settings(max_examples=150, deadline=None)
@given(doc=documents(), data=st.data())
def test_valid_documents_are_accepted_at_any_split(
    doc: tuple[object, str], data: st.DataObject
) -> None:
    value, text = doc
    points = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    kwargs = {"max_depth": 64}
    assert run([text], **kwargs) == (OK, orjson.loads(text))
    assert run(split(text, points), **kwargs) == (OK, orjson.loads(text))
    assert orjson.loads(text) == value
    raw = text.encode()
    byte_points = data.draw(st.lists(st.integers(0, len(raw)), max_size=10))
    assert run_bytes(split(raw, byte_points), **kwargs) == (OK, value)


RAW_SURROGATES = ["\ud800", "\udfff", "\udbff\udc00"]  # from bad decoding; never valid
SNIPPETS = [
    *RAW_SURROGATES,
    *"{}[]:,\"\\ \t\n0123456789.eE+-tfnulsax/'é😀",
    "\x00",
    "\x1f",
    "\u00a0",
    "\\u",
    "\\ud800",
    "\\udc00",
    "\\ud83d\\ude00",
    "1e400",
    "99999999999999999999",
    "[[[[[[[[[[[[[[[[[",
    "true",
    "null",
    "NaN",
]


@st.composite
def mutants(draw: st.DrawFn) -> str:
    _, text = draw(documents())
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["drop", "dup", "swap", "insert"]))
        if op == "insert" or not text:
            text = text[:i] + draw(st.sampled_from(SNIPPETS)) + text[i:]
        elif op == "drop":
            text = text[: max(i - 1, 0)] + text[i:]
        elif op == "dup":
            j = min(i, len(text) - 1)
            text = text[:j] + text[j] + text[j:]
        else:
            j = min(i, len(text) - 2)
            if j >= 0:
                text = text[:j] + text[j + 1] + text[j] + text[j + 2 :]
    return text


def assert_matches_reference(text: str, points: Sequence[int]) -> None:
    whole = run([text])
    assert run(split(text, points)) == whole
    if reference_accepts(text):
        assert whole == (OK, orjson.loads(text))
    else:
        assert whole[0] != OK, f"accepted {text!r}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutants(), data=st.data())
def test_mutants_accepted_exactly_when_the_strict_reference_accepts(
    text: str, data: st.DataObject
) -> None:
    assert_matches_reference(text, data.draw(st.lists(st.integers(0, len(text)), max_size=6)))


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(st.sampled_from(SNIPPETS), max_size=30).map("".join),
    data=st.data(),
)
def test_json_shaped_noise_matches_the_reference(text: str, data: st.DataObject) -> None:
    assert_matches_reference(text, data.draw(st.lists(st.integers(0, len(text)), max_size=6)))


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.characters() | st.sampled_from(RAW_SURROGATES)).map("".join), data=st.data()
)
def test_arbitrary_text_returns_or_raises_json_error(text: str, data: st.DataObject) -> None:
    # run() lets anything but JSONError escape and fail the test.
    whole = run([text])
    v = StreamingJSONValidator()
    try:
        v.feed(text)
        v.close()
    except JSONError as exc:  # the message must survive the trip into an SSE error frame
        orjson.dumps(exc.to_dict())
    assert run(split(text, data.draw(st.lists(st.integers(0, len(text)), max_size=6)))) == whole


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=40), data=st.data())
def test_arbitrary_bytes_return_or_raise_json_error(raw: bytes, data: st.DataObject) -> None:
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=6))
    assert run_bytes(split(raw, points)) == run_bytes([raw])


# -- feed_bytes ---------------------------------------------------------------------------


def test_multibyte_characters_split_across_byte_chunks() -> None:
    raw = '{"k": "é😀⟦"}'.encode()
    assert run_bytes([bytes([b]) for b in raw]) == (OK, {"k": "é😀⟦"})
    v = StreamingJSONValidator()
    v.feed_bytes(raw[:11])  # ends inside 😀 (bytes 9-12)
    assert v.size == 9  # pending bytes are not consumed yet
    v.feed_bytes(raw[11:])
    assert v.size == len(raw)
    assert v.close() == {"k": "é😀⟦"}


@pytest.mark.parametrize(
    ("raw", "offset"),
    [
        (b'"\xff"', 1),
        (b'"ab\xc3(', 3),  # a lead byte without its continuation
        (b'"\xc0\xaf"', 1),  # overlong
        (b'"\xed\xa0\x80"', 1),  # an encoded surrogate
        (b'"\xf4\x90\x80\x80"', 1),  # beyond U+10FFFF
        (b'"a\xe2\x82', 2),  # ends inside a character
        (b"\x80", 0),
    ],
)
def test_invalid_utf8_is_invalid_unicode(raw: bytes, offset: int) -> None:
    assert run_bytes([raw]) == (UNICODE, offset)
    assert run_bytes([bytes([b]) for b in raw]) == (UNICODE, offset)


def test_a_syntax_error_before_bad_utf8_wins() -> None:
    assert run_bytes([b'[1,]"\xff"']) == (SYNTAX, 3)


# -- adversarial --------------------------------------------------------------------------


def test_100k_open_brackets_are_too_deep_not_a_recursion_error() -> None:
    doc = "[" * 100_000
    assert run([doc]) == (DEEP, 16)
    assert run(split(doc, range(0, len(doc), 4))) == (DEEP, 16)
    assert run([doc], max_depth=1024) == (DEEP, 1024)
    assert run(["{" * 100_000]) == (SYNTAX, 1)  # a key must come first


@pytest.mark.parametrize("fill", ["a", "é", "😀"])
def test_a_10mb_string_is_too_large_fast(fill: str) -> None:
    doc = '"' + fill * 10_000_000 + '"'
    raw = doc.encode()
    start = time.perf_counter()
    code, offset = run([doc])
    assert code == LARGE
    assert 1 + (offset - 1) * len(fill.encode()) <= 65536 < 1 + offset * len(fill.encode())
    assert run_bytes([raw]) == (code, offset)
    assert run_bytes([raw[:3], raw[3:]]) == (code, offset)
    assert time.perf_counter() - start < 1.0


def test_a_100k_digit_number_fails_with_our_errors() -> None:
    digits = "1" * 100_000
    assert run([digits]) == (LARGE, 65536)
    assert run(split(digits, range(0, len(digits), 4))) == (LARGE, 65536)
    big = {"max_bytes": 1 << 20}
    assert run([digits], **big) == (RANGE, 0)
    assert run([f"[{digits}]"], **big) == (RANGE, 1)
    assert run(split(digits, range(0, len(digits), 4)), **big) == (RANGE, 0)
    assert run(["1" + "0" * 100_000 + ".5"], **big) == (RANGE, 0)
    assert run(["1e" + "9" * 100_000], **big) == (RANGE, 0)
    assert run(["1e-" + "9" * 100_000], **big) == (OK, 0.0)
    assert run(["0." + "1" * 100_000], **big) == (OK, orjson.loads("0." + "1" * 100_000))


def test_errors_are_sticky() -> None:
    v = StreamingJSONValidator(frame_id="f1")
    v.feed('{"a": ')
    with pytest.raises(JSONError) as first:
        v.feed("]")
    assert first.value.code == SYNTAX
    assert first.value.offset == 6
    assert first.value.frame_id == "f1"
    assert first.value.to_dict()["frame_id"] == "f1"
    for again in (lambda: v.feed("1}"), lambda: v.feed(""), lambda: v.feed_bytes(b"1"), v.close):
        with pytest.raises(JSONError) as later:
            again()
        assert later.value is first.value


def test_close_errors_are_sticky_and_the_validator_is_spent_after_close() -> None:
    v = StreamingJSONValidator()
    v.feed("[1")
    with pytest.raises(JSONError) as first:
        v.close()
    with pytest.raises(JSONError) as again:
        v.feed("]")
    assert again.value is first.value
    done = StreamingJSONValidator()
    done.feed("[1]")
    assert done.close() == [1]
    with pytest.raises(ToolForgeError) as spent:
        done.feed(" ")
    assert spent.value.code == ErrorCode.INTERNAL
    assert not isinstance(spent.value, JSONError)


def test_bad_limits_are_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        StreamingJSONValidator(max_depth=2000)  # beyond orjson's own nesting limit
    with pytest.raises(ValueError, match="max_bytes"):
        StreamingJSONValidator(max_bytes=-1)


# -- complete / depth / size while streaming ----------------------------------------------


def states(text: str, make: Callable[[], StreamingJSONValidator]) -> list[tuple[int, bool]]:
    v = make()
    out = []
    for c in text:
        v.feed(c)
        out.append((v.depth, v.complete))
    return out


def test_depth_and_complete_as_values_stream_in() -> None:
    text = '{"a": [1, {"b": 2}], "c": 3} '
    seen = states(text, StreamingJSONValidator)
    by_char = dict(zip(range(len(text)), seen, strict=True))
    assert by_char[0] == (1, False)  # {
    assert by_char[text.index("[")] == (2, False)
    assert by_char[text.index("{", 1)] == (3, False)
    assert by_char[text.index("}")] == (2, False)
    assert by_char[text.index("]")] == (1, False)
    assert by_char[len(text) - 2] == (0, True)  # the final }
    assert by_char[len(text) - 1] == (0, True)
    assert [c for _, c in seen].index(True) == len(text) - 2


def test_a_top_level_number_is_complete_only_once_something_ends_it() -> None:
    v = StreamingJSONValidator()
    v.feed("12")
    assert not v.complete
    v.feed("3")
    assert not v.complete
    v.feed(" ")
    assert v.complete
    assert v.close() == 123
    v = StreamingJSONValidator()
    v.feed("-4.5")
    assert not v.complete
    assert v.close() == -4.5
    v = StreamingJSONValidator()
    v.feed("true")
    assert v.complete  # a literal has its own end


def test_size_counts_utf8_bytes() -> None:
    v = StreamingJSONValidator()
    v.feed('"é')
    v.feed('😀"')
    assert v.size == len('"é😀"'.encode())
    assert v.complete
    assert v.depth == 0
