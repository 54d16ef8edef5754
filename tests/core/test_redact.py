"""Redaction (docs/protocol.md): tables for the rules, invariants for totality and exactness."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterator, Mapping

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.strategies import LOOKALIKE_TEXT, json_values
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.redact import (
    _PATTERN,  # the prefilter is checked against the bare pattern
    REDACTED,
    SENSITIVE_KEYS,
    _remembered,
    _replace,
    lines_redaction_may_change,
    normalize_key,
    redact,
    redact_serialisable,
    redact_text,
    remember_secrets,
)

# --------------------------------------------------------------------------- by key


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "API_KEY",
        "apikey",
        "ApiKey",
        "api-key",
        "authorization",
        "Authorization",
        "password",
        "secret",
        "token",
        "access_token",
        "Access-Token",
        "x-api-key",
        "X-API-Key",
        "x_api_key",
        "cookie",
        "Set-Cookie",
        " token ",
    ],
)
def test_secret_keys_are_redacted_whatever_their_spelling(key: str) -> None:
    assert redact({key: "hunter2", "other": "kept"}) == {key: REDACTED, "other": "kept"}


@pytest.mark.parametrize(
    "key", ["max_tokens", "prompt_tokens", "tokens", "token_count", "secretary", "passwords"]
)
def test_names_match_whole_never_as_substrings(key: str) -> None:
    assert redact({key: 12}) == {key: 12}


def test_a_secret_key_hides_any_value_but_none() -> None:
    value = {"token": {"nested": [1, 2]}, "password": 1234, "secret": None, "cookie": ""}
    assert redact(value) == {
        "token": REDACTED,
        "password": REDACTED,
        "secret": None,
        "cookie": REDACTED,
    }


def test_extra_keys_add_a_tools_redaction_list() -> None:
    value = {"ssn": "123-45-6789", "card-number": "4111", "name": "Ada"}
    assert redact(value, extra_keys=["SSN", "card_number"]) == {
        "ssn": REDACTED,
        "card-number": REDACTED,
        "name": "Ada",
    }
    assert redact(value) == value  # per call, not global


def test_secret_keys_are_found_at_any_depth() -> None:
    value = {"a": [{"b": ({"authorization": "Basic Zm9v"},)}]}
    assert redact(value) == {"a": [{"b": ({"authorization": REDACTED},)}]}


# --------------------------------------------------------------------------- by shape


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-abc123 here", f"key {REDACTED} here"),
        ("sk-proj-Ab_cD-12345678", REDACTED),
        ("sk_live_abcdef", REDACTED),
        ("GROQ=gsk_0123456789abcdefABCDEF", f"GROQ={REDACTED}"),
        ("Authorization: Bearer eyJ.abc-def_ghi==", f"Authorization: Bearer {REDACTED}"),
        ("Bearer x", f"Bearer {REDACTED}"),
        ("BEARER x, next", f"BEARER {REDACTED}, next"),
        ("bearer abcdefghijklmnop0123", f"bearer {REDACTED}"),
        ("https://h/p?api_key=abc&x=1", f"https://h/p?api_key={REDACTED}&x=1"),
        ("PASSWORD = hunter2 ok", f"PASSWORD = {REDACTED} ok"),
        ("Settings(token='abc', n=1)", f"Settings(token='{REDACTED}', n=1)"),
        ("authorization=Bearer abc", f"authorization={REDACTED}"),
        ('{"Password": "a\\"b", "n": 1}', f'{{"Password": "{REDACTED}", "n": 1}}'),
        ('{"x-api-key":"truncated', f'{{"x-api-key":"{REDACTED}'),
        ('["sk-abcdefgh", 1]', f'["{REDACTED}", 1]'),
    ],
)
def test_secret_shapes_in_text_are_replaced(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "task-list and risk-free and disk_sk_usage",  # "sk-" inside words
        "sk-abc",  # too short to be a key
        "the bearer of bad news",
        "max_tokens=5 tokens=3",
        "token: 12 password: see docs",  # prose, not an assignment
        sentinels.begin(FrameKind.OBJECT, "a1", "Any"),
        "\ud800 lone surrogate",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_strings_anywhere_are_redacted_keys_included() -> None:
    value = {"note": ["use sk-abcdef1"], "sk-abcdef2": 1, 3: b"Bearer xyz"}
    assert redact(value) == {
        "note": [f"use {REDACTED}"],
        REDACTED: 1,
        3: f"Bearer {REDACTED}".encode(),
    }


def test_bytes_keep_their_type_and_non_utf8_content() -> None:
    data = b"\xff\xfe sk-abcdef1 \x00"
    assert redact(data) == b"\xff\xfe " + REDACTED.encode() + b" \x00"
    assert redact(bytearray(b"plain")) == bytearray(b"plain")
    assert type(redact(bytearray(b"sk-abcdef1"))) is bytearray


# --------------------------------------------------------------------------- copying


def test_it_is_a_deep_copy_preserving_container_types() -> None:
    inner = [1, 2]
    value = {"l": inner, "t": (inner, "x"), "s": {1, "a"}, "f": frozenset({2})}
    out = redact(value)
    assert out == value
    assert isinstance(out, dict)
    assert out["l"] is not inner
    assert type(out["t"]) is tuple and type(out["s"]) is set and type(out["f"]) is frozenset
    out["l"].append(3)
    assert inner == [1, 2]


def test_shared_references_stay_shared_and_cycles_end() -> None:
    shared = {"k": "v"}
    out = redact([shared, shared])
    assert isinstance(out, list)
    assert out[0] is out[1]
    loop: list[object] = []
    loop.append(loop)
    copy = redact(loop)
    assert isinstance(copy, list) and copy[0] is copy and copy is not loop
    through_tuple: list[object] = []
    through_tuple.append((through_tuple,))
    copy = redact(through_tuple)
    assert isinstance(copy, list) and isinstance(copy[0], tuple) and copy[0][0] is copy
    # Only a tuple reached again inside itself cannot be linked to its copy.
    tup: tuple[list[object]] = ([],)
    tup[0].append(tup)
    assert redact(tup) == (["[CIRCULAR]"],)


def test_scalars_come_back_unchanged() -> None:
    when = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    ident = uuid.uuid4()
    values = [None, True, 0, -1, 2**80, 1.5, math.inf, when, when.date(), ident]
    assert redact(values) == values


def test_other_objects_become_their_redacted_text() -> None:
    class Config:
        def __str__(self) -> str:
            return "Config(api_key=sk-abcdef1)"

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    # An unquoted value runs to whitespace or a delimiter, ")" included: better to eat a
    # parenthesis than to leak the tail of a password that contains one.
    assert redact([Config(), Broken()]) == [f"Config(api_key={REDACTED}", "<unprintable Broken>"]


def test_mappings_other_than_dict_are_copied_as_dicts() -> None:
    class Headers(Mapping[str, str]):
        def __init__(self) -> None:
            self._d = {"Authorization": "Bearer abc", "Accept": "*/*"}

        def __getitem__(self, key: str) -> str:
            return self._d[key]

        def __iter__(self) -> Iterator[str]:
            return iter(self._d)

        def __len__(self) -> int:
            return len(self._d)

    assert redact(Headers()) == {"Authorization": REDACTED, "Accept": "*/*"}


@pytest.mark.parametrize("kind", ["list", "dict", "tuple"])
def test_ten_thousand_deep_nesting_is_fine(kind: str) -> None:
    depth = 10_000
    value: object = "sk-abcdef1"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value} if kind == "dict" else (value,)
    out = redact(value)
    # Walk down iteratively: == and repr would recurse.
    for _ in range(depth):
        if kind == "dict":
            assert isinstance(out, dict)
            out = out["k"]
        else:
            assert isinstance(out, list if kind == "list" else tuple) and len(out) == 1
            out = out[0]
    assert out == REDACTED


def test_sensitive_keys_are_stored_normalised() -> None:
    assert all(normalize_key(k) == k for k in SENSITIVE_KEYS)


# --------------------------------------------------------------------------- properties

# Text that cannot form a secret shape by itself or with a neighbour: no "s", "k", "b",
# "g", "r" (so no "sk-", "bearer", "token", "secret", ...), no "=", '"', "-" or "_".
SAFE_ALPHABET = "acdefhijlmnopqtuvwxyzACDEFHIJLMNOPQTUVWXYZ0123456789 .,:;!?()"
safe_text = st.text(SAFE_ALPHABET, max_size=12)
key_body = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=8)


@st.composite
def secret(draw: st.DrawFn) -> tuple[str, str]:
    """A secret as it appears in text, and what redaction must turn it into."""
    body = draw(key_body)
    kind = draw(st.sampled_from(["sk-", "sk_", "gsk_", "sk-proj-", "Bearer "]))
    if kind == "Bearer ":
        return f"Bearer {body}", f"Bearer {REDACTED}"
    return f"{kind}{body}", REDACTED


@st.composite
def text_with_secrets(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """(text, expected redaction, the secrets in it): safe text and secrets, spaced."""
    parts = draw(st.lists(st.one_of(safe_text.map(lambda t: (t, t, "")), secret()), max_size=5))
    plain: list[str] = []
    want: list[str] = []
    secrets: list[str] = []
    for part in parts:
        raw, expected = part[0], part[1]
        plain.append(raw)
        want.append(expected)
        if raw != expected:
            secrets.append(raw)
    return " ".join(plain), " ".join(want), secrets


Triple = tuple[object, object, list[str]]


def leaves() -> st.SearchStrategy[Triple]:
    scalars: st.SearchStrategy[object] = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), safe_text
    )
    same: st.SearchStrategy[Triple] = scalars.map(lambda v: (v, v, []))
    secret_key = st.tuples(st.sampled_from(sorted(SENSITIVE_KEYS)), key_body)
    return st.one_of(
        same,
        text_with_secrets(),
        # A secret under a secret key: the whole value goes, whatever it is.
        # "#" appears in no other generated text, so the check below cannot match by chance.
        secret_key.map(lambda kv: ({kv[0]: f"#{kv[1]}"}, {kv[0]: REDACTED}, [f"#{kv[1]}"])),
    )


def containers(children: st.SearchStrategy[Triple]) -> st.SearchStrategy[Triple]:
    def as_list(items: list[Triple]) -> Triple:
        return [i[0] for i in items], [i[1] for i in items], [s for i in items for s in i[2]]

    def as_tuple(items: list[Triple]) -> Triple:
        v, e, s = as_list(items)
        assert isinstance(v, list) and isinstance(e, list)
        return tuple(v), tuple(e), s

    def as_dict(items: dict[str, Triple]) -> Triple:
        return (
            {k: i[0] for k, i in items.items()},
            {k: i[1] for k, i in items.items()},
            [s for i in items.values() for s in i[2]],
        )

    return st.one_of(
        st.lists(children, max_size=4).map(as_list),
        st.lists(children, max_size=4).map(as_tuple),
        st.dictionaries(st.text(SAFE_ALPHABET, max_size=6), children, max_size=4).map(as_dict),
    )


documents = st.recursive(leaves(), containers, max_leaves=20)


@given(documents)
def test_redaction_removes_every_secret_and_changes_nothing_else(doc: Triple) -> None:
    value, expected, secrets = doc
    out = redact(value)
    assert out == expected
    rendered = repr(out)
    for s in secrets:
        assert s not in rendered


json_like = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(),
        st.binary(),
    ),
    lambda children: st.one_of(
        st.lists(children),
        st.lists(children).map(tuple),
        st.dictionaries(st.text(), children),
    ),
    max_leaves=30,
)


@given(json_like)
def test_redaction_is_total_and_idempotent(value: object) -> None:
    once = redact(value)
    twice = redact(once)
    assert repr(twice) == repr(once)  # repr, because NaN != NaN


key_names = st.sampled_from(["token", "API-Key", "max_tokens", "name", "Password", "k"])


@given(json_values(max_leaves=30, floats=st.floats(), keys=st.one_of(key_names, st.text())))
def test_redact_serialisable_matches_redact_on_plain_data(value: object) -> None:
    assert repr(redact_serialisable(value, extra_keys=["k"])) == repr(
        redact(value, extra_keys=["k"])
    )


def test_a_key_seen_before_a_secret_is_remembered_is_redacted_after() -> None:
    secret = "kq-key-secret-5d1e0b"
    value = {f"x-{secret}": 1, "plain": {"x": 2}}
    assert secret in str(redact_serialisable(value))  # its key's text kept from here on
    remember_secrets([secret])
    again = redact_serialisable(value)
    assert secret not in str(again) and f"x-{REDACTED}" in str(again)
    assert again == redact(value)


def test_redact_serialisable_falls_back_for_everything_else() -> None:
    deep: list[object] = ["sk-" + "a" * 30]
    for _ in range(200):  # deeper than the direct walk goes
        deep = [deep]
    loop: list[object] = []
    loop.append(loop)
    for value in (deep, loop, {"t": ("sk-" + "b" * 30,)}, {1: {"token": "x"}}, {b"k"}):
        assert repr(redact_serialisable(value)) == repr(redact(value))


fragments = st.sampled_from(
    [
        "sk-",
        "sk_",
        "g",
        "Bearer ",
        "bearer ",
        "toKen",
        "to\u212aen",
        "api_key",
        "PASSWD",
        '"',
        "=",
        ":",
        " ",
        "abcdefgh12345678",
        "-",
        "\u017f",
        "\ud800",
        "\n",
    ]
)


@given(st.lists(fragments, max_size=12).map("".join))
def test_the_prefilter_never_skips_a_match(text: str) -> None:
    assert redact_text(text) == _PATTERN.sub(_replace, text)


@given(st.text())
def test_redact_text_is_total_and_idempotent(text: str) -> None:
    once = redact_text(text)
    assert redact_text(once) == once


# ------------------------------------------------- lines redaction leaves as they are

_EXTRA_KEYS = st.sampled_from([(), ("ssn",), ("my-field",), ("data",), ("ssn", "id")])


@given(
    st.lists(
        json_values(
            max_leaves=12,
            integers=st.integers(-(2**63), 2**63 - 1),
            text=LOOKALIKE_TEXT,
            keys=st.one_of(LOOKALIKE_TEXT, st.sampled_from(sorted(SENSITIVE_KEYS))),
        ),
        min_size=1,
        max_size=6,
    ),
    _EXTRA_KEYS,
)
def test_a_line_not_named_is_one_redaction_leaves_as_it_is(
    values: list[object], extra: tuple[str, ...]
) -> None:
    try:
        lines = [orjson.dumps({"id": i, "data": v}).decode() for i, v in enumerate(values)]
    except orjson.JSONEncodeError:  # a lone surrogate: no frame can hold one
        assume(False)
    suspect = lines_redaction_may_change("\n".join(lines), extra)
    if suspect is None:  # only when a remembered secret is spelled with an escape
        assert _remembered.json_escaped
        return
    for i, line in enumerate(lines):
        redacted = orjson.dumps(redact_serialisable(orjson.loads(line), extra_keys=extra))
        if i not in suspect:
            assert redacted.decode() == line


def test_lines_with_secrets_are_named_and_plain_ones_are_not() -> None:
    remember_secrets(["remembered-value-7f3a9c"])
    lines = [
        '{"text":"hello world"}',
        '{"text":"my key is sk-abcdef123456"}',
        '{"Api-Key":1}',
        '{"text":"a remembered-value-7f3a9c here"}',
        '{"s-s-n":"x","S_s_N ":"y"}',  # neither normalises to "ssn"
        '{" SSN ":"123"}',
        '{"text":"an @ sign"}',
        '{"usage":{"max_tokens":3}}',  # not a secret, but "token" is a trigger: named
    ]
    assert lines_redaction_may_change("\n".join(lines), ("ssn",)) == {1, 2, 3, 5, 6, 7}


def test_keys_or_secrets_json_would_escape_rule_nothing_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = '{"text":"plain"}'
    assert lines_redaction_may_change(text) == frozenset()
    assert lines_redaction_may_change(text, ("stra\u00dfe",)) is None  # not ASCII
    assert lines_redaction_may_change(text, ('a"b',)) is None  # spelled a\"b in JSON
    # A remembered secret with a quote in it is spelled differently inside JSON text.
    monkeypatch.setattr(_remembered, "json_escaped", True)
    monkeypatch.setattr(_remembered, "pattern", __import__("re").compile('pa"ss'))
    assert lines_redaction_may_change(text) is None
