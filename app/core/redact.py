"""Secret redaction for logs and artifacts (docs/protocol.md: "secrets redacted everywhere").

Two rules, applied to any JSON-like value:

* **By key.** A mapping entry whose key is a known secret name (``api_key``,
  ``authorization``, ``password``, ...) or one of the caller's ``extra_keys`` (a tool's
  redaction list, docs/tools.md) has its whole value replaced by ``"[REDACTED]"``, whatever
  its type: a nested object under ``token`` is as secret as a string. Keys compare
  case-insensitively with ``-`` and ``_`` treated alike, so ``X-Api-Key``, ``x_api_key``
  and ``X-API-KEY`` are one name. Names match whole, never as substrings: ``max_tokens``
  and ``prompt_tokens`` are usage figures, not secrets.
* **By shape.** Any string (values *and* keys, free text included) has OpenAI/Groq/Stripe
  style keys (``sk-…``, ``sk_…``, ``gsk_…``), ``Bearer …`` credentials,
  ``api_key=…``-style assignments (query strings, env dumps), a URL's ``user:pass@``
  and a ``?key=…`` query parameter replaced in place.
* **By value.** The secrets this gateway is configured with (the upstream's API key, the
  credentials in a configured URL, the API keys clients present) have no shape to
  recognise: a 401 that repeats the key it was sent repeats it verbatim. The app factory
  hands them to :func:`remember_secrets` at start-up; from then on every one of them is
  replaced wherever it occurs, before the shape rules run. The set only grows (several apps
  in one process, as in tests, each keep theirs redacted).

Redaction is *total*: it never raises, whatever it is given, because it runs inside the
logging pipeline and the artifact writer, where an exception would turn a diagnostic into
an outage. That is why the walk is iterative (a 10,000-deep document must not hit the
recursion limit), why repeated or cyclic references are memoised rather than followed
forever, and why values that are not JSON-like are turned into their redacted ``str()``:
a secret must not slip out later through an object's ``repr``.

Redaction is idempotent (``redact(redact(x)) == redact(x)``), and a value with no secrets
comes back equal to what went in (as a fresh copy: containers are never shared with the
input, so callers may mutate either side).

This module is sans-IO (``app/core``): stdlib only, no logging, clock or OS access.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import quote, unquote, urlsplit, urlunsplit

__all__ = [
    "MIN_SECRET_CHARS",
    "REDACTED",
    "SENSITIVE_KEYS",
    "lines_redaction_may_change",
    "normalize_key",
    "public_url",
    "redact",
    "redact_serialisable",
    "redact_text",
    "remember_secrets",
    "remembered_generation",
    "url_credentials",
]

REDACTED: Final = "[REDACTED]"
"""What every secret is replaced with."""

SENSITIVE_KEYS: Final = frozenset(
    {
        "access_token",
        "api_key",
        "apikey",
        "authorization",
        "client_secret",
        "cookie",
        "password",
        "proxy_authorization",
        "refresh_token",
        "secret",
        "set_cookie",
        "token",
        "x_api_key",
    }
)
"""Key names (normalised by :func:`normalize_key`) whose values are always secret.

The list of docs/security.md plus the obvious siblings (``set-cookie``, ``proxy-authorization``,
``refresh_token``, ``client_secret``) that carry the same credentials under another name.
"""

# Characters that may sit right before a key for it to count as one: a key glued to a word
# ("task-list" contains "sk-list", "disk_sk_x" contains "sk_x") is an identifier, not a key.
_NOT_WORD_BEFORE = r"(?<![A-Za-z0-9_\-])"
# sk-… (OpenAI, incl. sk-proj-…), sk_… (Stripe-style, named in docs/protocol.md), gsk_… (Groq).
# Four characters minimum so "sk-" in prose survives; the body is OpenAI's alphabet.
_API_KEY = rf"{_NOT_WORD_BEFORE}(?:sk-|sk_|gsk_)[A-Za-z0-9_\-]{{4,}}"
# RFC 6750 b64token after the scheme; the scheme word is kept so a reader can still see
# which kind of credential was there. "Bearer"/"BEARER" take any token, but a lowercase
# "bearer" needs a token-like run of 16+ characters: "the bearer of bad news" is prose.
_B64TOKEN = r"[A-Za-z0-9\-._~+/]"
_BEARER = (
    rf"{_NOT_WORD_BEFORE}"
    rf"(?:(?:Bearer|BEARER)[ \t]+{_B64TOKEN}+|bearer[ \t]+{_B64TOKEN}{{16,}})=*"
)
# The secret key names as they appear in text, "-" and "_" alike ("passwd" too).
_NAMES = "|".join(
    # Longest first (then by name): a fixed order in which no name shadows a longer one.
    sorted(
        (k.replace("_", "[-_]") for k in (*SENSITIVE_KEYS, "passwd")), key=lambda k: (-len(k), k)
    )
)
# name=value: ?api_key=… in URLs, TOKEN=… in env dumps, api_key='…' in a repr. Only "=",
# not ":", so that prose like "token: 12" is left alone...
_ASSIGNMENT = rf"{_NOT_WORD_BEFORE}(?i:{_NAMES})[ \t]*=[ \t]*['\"]?"
# ...except in JSON text, where a quoted secret name before ":" is unambiguous. The value
# runs to the closing quote, or to the end of a truncated document.
_JSON_MEMBER = rf"\"(?i:{_NAMES})\"[ \t\r\n]*:[ \t\r\n]*\""
# A URL's userinfo (RFC 3986 §3.2.1: "user:password@" before the host). It runs to the
# first "@" before any "/", "?", "#" or space, so a path's "@" (a mailto, a scope) is left.
_USERINFO = r"(?<=://)[^/?#\s@\"'<>]+@"
# "?key=…" / "&key=…": Google-style API keys in a query string. Only after "?" or "&":
# "key" alone is too common a word to redact as an assignment in prose or JSON.
_QUERY_KEY = r"(?<=[?&])(?i:key|sig|signature)="
_PATTERN: Final = re.compile(
    rf"(?P<key>{_API_KEY})"
    rf"|(?P<bearer>{_BEARER})"
    rf"|(?P<assign>{_ASSIGNMENT})(?:(?i:bearer|basic)[ \t]+)?[^\s&,;\"'<>]+"
    rf"|(?P<member>{_JSON_MEMBER})(?:[^\"\\]|\\.)*"
    rf"|(?P<userinfo>{_USERINFO})"
    rf"|(?P<query>{_QUERY_KEY})[^\s&#,;\"'<>]+"
)

# A substring of every possible match, case-folded: what redact_text checks before the
# regex. casefold() covers what the regex's IGNORECASE matches (the Kelvin sign is a "k").
_TRIGGERS: Final = (
    "sk-",
    "sk_",
    "bearer",
    "api",
    "token",
    "secret",
    "passw",  # password, passwd
    "cookie",
    "authorization",
    "@",  # a URL's userinfo
    "key=",  # ?key=…
    "sig=",
    "signature=",
)

# Scalars that cannot carry a secret and that serialisers (orjson) handle natively: kept
# as they are rather than turned into strings.
_OPAQUE_SAFE = (bool, int, float, type(None), _dt.datetime, _dt.date, _dt.time, uuid.UUID)


def _replace(match: re.Match[str]) -> str:
    if match.group("key") is not None:
        return REDACTED
    if match.group("userinfo") is not None:
        return f"{REDACTED}@"
    if match.group("query") is not None:
        return f"{match.group('query')}{REDACTED}"
    if match.group("bearer") is not None:
        scheme = match.group("bearer").split(None, 1)[0]
        return f"{scheme} {REDACTED}"
    prefix = match.group("assign")
    if prefix is None:
        prefix = match.group("member")
    return f"{prefix}{REDACTED}"


def redact_text(s: str) -> str:
    """Return ``s`` with every configured secret (:func:`remember_secrets`), API key,
    Bearer credential, URL credential and ``secret=…`` replaced.

    For free text: log messages, error strings, tool output, model text, raw JSON bodies
    (``"password": "…"``). Only :data:`SENSITIVE_KEYS` are recognised as names in text;
    a tool's extra keys apply to mapping keys in :func:`redact`. Linear time in
    ``len(s)``; never raises on any ``str`` (lone surrogates included).
    """
    if not s:
        return s
    remembered = _remembered.pattern
    if remembered is not None and remembered.search(s) is not None:
        s = remembered.sub(REDACTED, s)
    # Most text holds no secret: a few substring scans (C speed) on the case-folded text
    # rule that out far faster than running the regex over every position.
    folded = s.casefold()
    for trigger in _TRIGGERS:  # a plain loop: any() over a generator costs more here
        if trigger in folded:
            return _PATTERN.sub(_replace, s)
    return s


MIN_SECRET_CHARS: Final = 8
"""Configured secrets shorter than this are not replaced by value: a four-letter password
would turn every occurrence of a common word into ``[REDACTED]``. Such a value is still
redacted where it has a shape (a URL's userinfo, ``password=…``)."""


class _Remembered:
    """The configured secret values, as one alternation (longest first, so a secret that
    contains another is replaced whole)."""

    __slots__ = ("generation", "json_escaped", "pattern", "values")

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.generation = 0  # one more each time the set of values grows
        # A value that JSON text would spell differently (a quote, a backslash, a control
        # character): searching encoded JSON for it proves nothing.
        self.json_escaped = False

    def add(self, values: Iterable[str | None]) -> None:
        fresh = set(self.values)
        for value in values:
            if not isinstance(value, str):
                continue
            value = value.strip()
            # A value inside the replacement itself would make redaction grow each pass.
            if len(value) < MIN_SECRET_CHARS or value in REDACTED:
                continue
            fresh.add(value)
            encoded = quote(value, safe="")  # as it appears in a URL or a form body
            if encoded != value:
                fresh.add(encoded)
        if fresh == self.values:
            return
        ordered = sorted(fresh, key=lambda v: (-len(v), v))
        pattern = re.compile("|".join(re.escape(v) for v in ordered))
        json_escaped = any(_JSON_ESCAPED.search(v) is not None for v in fresh)
        # The flag before the pattern (a reader in the artifact writer's thread that sees
        # the new pattern sees the flag that goes with it; it only ever turns on), both
        # before the new generation.
        self.json_escaped = json_escaped
        self.pattern = pattern
        self.values = fresh
        self.generation += 1


# What orjson writes as an escape inside a JSON string: everything else is spelled as is.
_JSON_ESCAPED: Final = re.compile(r'["\\\x00-\x1f]')

_remembered: Final = _Remembered()


def remember_secrets(values: Iterable[str | None]) -> None:
    """Redact each of ``values`` (exact substrings) wherever :func:`redact_text`,
    :func:`redact` and :func:`redact_serialisable` run, from now on, in this process.

    Called by the app factory with the secrets it is configured with. ``None`` and values
    shorter than :data:`MIN_SECRET_CHARS` are skipped; a value's percent-encoded form is
    remembered with it. Remembering only adds: what was remembered stays remembered.
    """
    _remembered.add(values)


def remembered_generation() -> int:
    """Changes whenever :func:`remember_secrets` adds a value: a copy redacted under an
    older generation may still hold a secret remembered since."""
    return _remembered.generation


def url_credentials(url: str | None) -> list[str]:
    """The user name and password a URL carries (``scheme://user:pass@host``), decoded:
    what :func:`remember_secrets` is given for a configured URL."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.username, parts.password]
    except ValueError:  # a malformed URL: nothing to take from it
        return []
    return [unquote(v) for v in found if v]


# Query parameters whose value is a credential in the URLs people configure (Google's
# "key", Azure SAS "sig", presigned "signature", OAuth's tokens, ...).
_SECRET_PARAMS: Final = frozenset(
    {*SENSITIVE_KEYS, "key", "sig", "signature", "auth", "pass", "passwd", "pwd"}
)


def public_url(url: str | None) -> str | None:
    """``url`` as the gateway may show it (``/readyz``, ``/v1/servers``, error messages,
    logs): any ``user:pass@`` removed and secret-looking query parameters' values replaced
    by :data:`REDACTED`. Never raises; a URL it cannot parse comes back through
    :func:`redact_text` instead."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        query = "&".join(
            f"{name}={REDACTED}" if normalize_key(unquote(name)) in _SECRET_PARAMS and sep else pair
            for pair in parts.query.split("&")
            if pair
            for name, sep, _ in (pair.partition("="),)
        )
        cleaned = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return redact_text(url)
    return redact_text(cleaned)


@functools.lru_cache(maxsize=4096)
def normalize_key(key: str) -> str:
    """The form in which key names are compared: case-folded, ``-`` read as ``_``."""
    # Cached: documents repeat their keys ("type", "properties", ...) over and over.
    return key.strip().lower().replace("-", "_")


def _redact_bytes(data: bytes | bytearray) -> bytes | bytearray:
    # Latin-1 maps every byte to one code point and back, so the ASCII patterns find keys
    # inside any byte string (UTF-8 or not) and everything else round-trips untouched.
    text = bytes(data).decode("latin-1")
    cleaned = redact_text(text)
    if cleaned == text:
        return type(data)(data)
    out = cleaned.encode("latin-1")
    return bytearray(out) if isinstance(data, bytearray) else out


def _redact_opaque(value: object) -> object:
    # Anything else is reduced to its redacted text, so that a later default=str in a
    # serialiser cannot reveal what this pass did not look into.
    try:
        text = str(value)
    except Exception:  # a broken __str__ must not break redaction
        return f"<unprintable {type(value).__name__}>"
    return redact_text(text)


# id(source container) -> (source, its copy). The source is held so that its id cannot be
# reused by another object during the walk (a Mapping may build its values on the fly).
_Memo = dict[int, tuple[object, object]]
# Where a copy goes: a list index or a dict key of the output under construction.
_Target = list[object] | dict[object, object]
# One step of the walk: copy ``source`` into ``target[slot]``...
_Visit = tuple[object, _Target, object]


class _Finish:
    """...or, post-order, turn a finished scratch list into a tuple, set or frozenset."""

    __slots__ = ("kind", "memo_key", "scratch", "slot", "target")

    def __init__(
        self, kind: type, scratch: list[object], memo_key: int, target: _Target, slot: object
    ) -> None:
        self.kind = kind
        self.scratch = scratch
        self.memo_key = memo_key
        self.target = target
        self.slot = slot

    def run(self, memo: _Memo) -> None:
        done: object
        try:
            done = self.kind(self.scratch)
        except TypeError:  # an unhashable member: impossible for real sets, but be total
            done = tuple(self.scratch)
        memo[self.memo_key] = (memo[self.memo_key][0], done)
        _store(self.target, self.slot, done)


_IN_PROGRESS: Final = object()


def _store(target: _Target, slot: object, value: object) -> None:
    if isinstance(target, list):
        assert isinstance(slot, int)
        target[slot] = value
    else:
        target[slot] = value


def redact(value: object, *, extra_keys: Iterable[str] = ()) -> object:
    """Return a deep copy of ``value`` with every secret replaced by ``"[REDACTED]"``.

    ``extra_keys`` adds key names to :data:`SENSITIVE_KEYS` for this call (a tool's
    redaction list). Mappings come back as ``dict``, lists as ``list``, tuples, sets and
    frozensets as their own type; strings and bytes through :func:`redact_text`; bools,
    numbers, ``None``, dates and UUIDs as they are; anything else as its redacted
    ``str()``. A ``None`` under a secret key stays ``None``: that a credential was absent
    is not a secret, and it is what one debugs. String keys are redacted like any string;
    should two keys become equal that way, the later entry wins.
    """
    try:
        extra = {normalize_key(k) for k in extra_keys if isinstance(k, str)}
    except Exception:  # a broken iterable of extra keys must not stop redaction
        extra = set()
    sensitive = SENSITIVE_KEYS | extra
    # An explicit LIFO work list instead of recursion, so depth costs heap, not stack.
    # ``memo`` maps id(source container) to its copy, as copy.deepcopy does: shared
    # references stay shared and cycles end. Only a tuple or set reached again while its
    # own members are still being copied (a cycle through an immutable container) cannot
    # be linked to its copy; it becomes "[CIRCULAR]".
    root: list[object] = [None]
    memo: _Memo = {}
    work: list[_Visit | _Finish] = [(value, root, 0)]
    while work:
        item = work.pop()
        if isinstance(item, _Finish):
            item.run(memo)
        else:
            _visit(*item, sensitive=sensitive, memo=memo, work=work)
    return root[0]


def redact_serialisable(value: object, *, extra_keys: Iterable[str] = ()) -> object:
    """:func:`redact` for a value about to be serialised (the artifact writer).

    Plain JSON data (dicts with string keys, lists, strings, numbers) of modest depth
    takes a direct walk at about a third of the general walk's cost per node; the one
    difference is that shared references come back as separate copies, which is the
    same thing once serialised. Anything else goes to :func:`redact`. Never raises.
    """
    try:
        if type(extra_keys) is tuple:  # the artifact writer's: once per tuple, not per frame
            sensitive = _sensitive_keys(extra_keys)
        else:
            sensitive = _sensitive_union(extra_keys)
        return _redact_plain(value, sensitive, _PLAIN_DEPTH)
    except _NotPlain:
        return redact(value, extra_keys=extra_keys)
    except Exception:  # a broken iterable of extra keys: the general walk copes
        return redact(value, extra_keys=extra_keys)


def lines_redaction_may_change(
    text: str, extra_keys: tuple[str, ...] = ()
) -> frozenset[int] | None:
    """Which lines of ``text`` :func:`redact_serialisable` might change, read without
    parsing them: ``text`` is lines of compact JSON as orjson writes it, one value a line
    (``\\n`` between them; inside a value orjson escapes every control character).

    Returns the indices of the lines that hold a possible secret, or ``None`` when the text
    cannot be ruled on this way (a key in ``extra_keys``, or a remembered secret, that JSON
    would spell with an escape or that is not ASCII): then treat every line as one to
    redact. Every other line, parsed and redacted, comes back equal to what it was: the
    artifact writer keeps such lines as they are, and redacts the rest value by value.

    Why the check suffices: every shape :func:`redact_text` replaces contains one of
    ``_TRIGGERS`` in its case-folded text, and each trigger is spelled in JSON as it is in
    the string (letters, digits, ``-``, ``_``, ``=`` and ``@`` are never escaped), so a line
    without one in its case-folded text holds no such shape, in a key or a value. A key
    :func:`normalize_key` would match (case-folded, ``-`` as ``_``, stripped) appears in the
    line's lowered text with ``-`` as ``_``; an ASCII name with no character JSON escapes
    is spelled the same inside the line, whatever surrounds it. A remembered secret with no
    such character is found by searching the line itself. Erring costs only speed: a line
    named here that holds no secret is redacted to the same value.
    """
    keys = _sensitive_keys(extra_keys)
    remembered = _remembered.pattern
    if remembered is not None and _remembered.json_escaped:
        return None
    for key in keys:
        if not key.isascii() or _JSON_ESCAPED.search(key) is not None:
            return None
    # Neither casefold() nor lower() makes or removes a "\n": line i of the folded or
    # lowered text is line i of ``text``.
    dirty = _lines_with(_TRIGGERS, text.casefold())
    dirty |= _lines_with(keys, text.lower().replace("-", "_"))
    if remembered is not None:
        for match in remembered.finditer(text):
            dirty.add(text.count("\n", 0, match.start()))
    return frozenset(dirty)


def _lines_with(needles: Iterable[str], text: str) -> set[int]:
    """The indices of the lines of ``text`` that hold any of ``needles``."""
    present = [needle for needle in needles if needle in text]
    if not present:
        return set()
    return {i for i, line in enumerate(text.split("\n")) if any(n in line for n in present)}


# How many distinct mapping keys :class:`_KeyTexts` keeps (past it, each is redacted anew).
_KEYS_REMEMBERED: Final = 4096


class _KeyTexts:
    """Mapping keys as :func:`redact_text` returns them, kept while the remembered secrets
    stay the same (their generation): every run's documents repeat the same few dozen
    keys ("event", "data", "chunk", ...), and each one cost a full scan per occurrence."""

    __slots__ = ("generation", "texts")

    def __init__(self) -> None:
        self.generation = 0
        self.texts: dict[str, str] = {}

    def redact(self, key: str) -> str:
        generation = _remembered.generation  # set after the pattern: a match sees it
        if generation != self.generation:
            self.texts = {}
            self.generation = generation
        texts = self.texts
        found = texts.get(key)
        if found is None:
            found = redact_text(key)
            if len(texts) < _KEYS_REMEMBERED:
                texts[key] = found
        return found


_key_texts: Final = _KeyTexts()


def _sensitive_union(extra_keys: Iterable[str]) -> frozenset[str]:
    """:data:`SENSITIVE_KEYS` and ``extra_keys``, as :func:`normalize_key` compares them."""
    return SENSITIVE_KEYS | {normalize_key(k) for k in extra_keys if isinstance(k, str)}


@functools.lru_cache(maxsize=256)
def _sensitive_keys(extra_keys: tuple[str, ...]) -> frozenset[str]:
    """:func:`_sensitive_union` of a tuple (immutable, so the set can be kept): an artifact
    store passes the same few tuples for every frame of every run."""
    return _sensitive_union(extra_keys)


class _NotPlain(Exception):
    """The value is not plain JSON data (or is nested deeper than the direct walk goes)."""


# Well within the recursion limit; deeper documents take the iterative walk below.
_PLAIN_DEPTH: Final = 64
_PLAIN_SCALARS: Final = (bool, int, float, type(None))


def _redact_plain(value: object, sensitive: frozenset[str], depth: int) -> object:
    """:func:`redact` for dicts with ``str`` keys, lists, strings and numbers only.

    The same result as the general walk for such values, at a fraction of its cost per
    node (it needs no memo: plain data without cycles shares nothing that matters once
    serialised). Raises :class:`_NotPlain` on anything else, a cycle included (it runs
    out of ``depth``), so :func:`redact` can start over with the general walk.
    """
    kind = type(value)
    if kind is str:
        return redact_text(value)  # type: ignore[arg-type]
    if kind in _PLAIN_SCALARS:
        return value
    if depth <= 0:
        raise _NotPlain
    if kind is dict:
        out: dict[object, object] = {}
        for key, child in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise _NotPlain
            if normalize_key(key) in sensitive:
                out[_key_texts.redact(key)] = None if child is None else REDACTED
            else:
                out[_key_texts.redact(key)] = _redact_plain(child, sensitive, depth - 1)
        return out
    if kind is list:
        return [_redact_plain(child, sensitive, depth - 1) for child in value]  # type: ignore[attr-defined]
    raise _NotPlain


def _visit(
    source: object,
    target: _Target,
    slot: object,
    *,
    sensitive: frozenset[str],
    memo: _Memo,
    work: list[_Visit | _Finish],
) -> None:
    """Store a leaf's copy now, or a container's and schedule its members."""
    if isinstance(source, str):
        _store(target, slot, redact_text(source))
        return
    if isinstance(source, _OPAQUE_SAFE):
        _store(target, slot, source)
        return
    if isinstance(source, bytes | bytearray):
        _store(target, slot, _redact_bytes(source))
        return
    seen = memo.get(id(source))
    if seen is not None:
        copied = seen[1]
        _store(target, slot, "[CIRCULAR]" if copied is _IN_PROGRESS else copied)
        return
    if isinstance(source, Mapping):
        try:
            items = list(source.items())
        except Exception:  # a Mapping whose items() fails is just an opaque object
            _store(target, slot, _redact_opaque(source))
            return
        out: dict[object, object] = {}
        memo[id(source)] = (source, out)
        _store(target, slot, out)
        members: list[_Visit] = []
        for key, child in items:
            new_key = redact_text(key) if isinstance(key, str) else key
            if isinstance(key, str) and normalize_key(key) in sensitive:
                out[new_key] = None if child is None else REDACTED
            else:
                out[new_key] = None  # reserves the slot, so key order is kept
                members.append((child, out, new_key))
        # Reversed onto the LIFO, so members are copied in order (a later key wins).
        work.extend(reversed(members))
        return
    if isinstance(source, list):
        copy: list[object] = [None] * len(source)
        memo[id(source)] = (source, copy)
        _store(target, slot, copy)
        work.extend((source[i], copy, i) for i in range(len(source) - 1, -1, -1))
        return
    if isinstance(source, tuple | set | frozenset):
        elements = list(source)
        scratch: list[object] = [None] * len(elements)
        memo[id(source)] = (source, _IN_PROGRESS)
        kind: type = (
            tuple
            if isinstance(source, tuple)
            else frozenset
            if isinstance(source, frozenset)
            else set
        )
        # The _Finish goes on the stack below the members, so it runs after all of them.
        work.append(_Finish(kind, scratch, id(source), target, slot))
        work.extend((elements[i], scratch, i) for i in range(len(elements) - 1, -1, -1))
        return
    _store(target, slot, _redact_opaque(source))
