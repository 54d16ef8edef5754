"""JSON Schema regular expressions (``pattern``, ``patternProperties``) and ``format``:
compiled once, run without backtracking, and turned into example strings.

A caller's schema carries its own regexes, and the model writes the strings they are run
on: both sides of the match are untrusted. Python's ``re`` backtracks, so ``^(a+)+$``
against 26 ``a``s and a ``!`` holds the event loop for seconds. Every pattern the gateway
runs therefore goes through :func:`compile_pattern`:

- **RE2** (``google-re2``) first: a linear-time engine. It runs every pattern made of
  literals, classes, groups, alternation and quantifiers, which is what schemas use
  (ids, codes, dates, times). The pattern is ECMA-262 text (JSON Schema's dialect); the
  few escapes RE2 spells differently (``\\uXXXX``, ``\\cX``, ``[^]``) are rewritten first.
- **Bounded backtracking** for what RE2 cannot run by design, lookarounds and
  back-references: the ``regex`` module, whose matcher takes a timeout. Each run gets
  :data:`RUN_TIMEOUT_S`, and one value's validation at most :data:`MAX_RUNS` runs
  (:func:`pattern_budget`), so a value, however many strings it holds, cannot spend more
  than their product. A run out of time or out of runs counts as a mismatch, reported
  as such.
- Anything neither engine parses is not a regular expression: the schema is refused.

Search semantics: a JSON Schema pattern matches anywhere in the string unless anchored
(``[a-z]+`` accepts ``"ABCd"``), so every check is a ``search``.

:func:`example` builds a short string a pattern accepts (for the fallback values of
OBJECT/RESULT frames), from the pattern's parsed form: Python's own regex parser
(``re._parser``) reads ECMA-262's syntax well enough for that, and every example is
checked with the engine above before it is used, so a wrong guess is only a missed
example, never a wrong value.

``format``: :data:`FORMAT_PATTERNS` spells the common formats as patterns, which the
grammar (``toolforge.core.gbnf``) enforces while decoding and :data:`FORMAT_EXAMPLES`
gives valid values for; :func:`format_checker` asserts them after decoding.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import re2
import regex
from jsonschema import Draft202012Validator, FormatChecker

__all__ = [
    "FORMAT_EXAMPLES",
    "FORMAT_PATTERNS",
    "MAX_RUNS",
    "RUN_TIMEOUT_S",
    "Pattern",
    "PatternError",
    "compile_pattern",
    "example",
    "format_checker",
    "is_pattern",
    "pattern_budget",
]

# A backtracking run (lookarounds, back-references) gets this long; a value's runs, this
# many. Counted, not clocked (this module reads no clock): a value's backtracking costs at
# most MAX_RUNS * RUN_TIMEOUT_S (64 ms) of matching, whatever it holds. A legitimate match
# of a tool argument takes microseconds.
RUN_TIMEOUT_S: Final = 0.001
MAX_RUNS: Final = 64
# RE2's memory for one compiled program: 8 MiB holds every real-world pattern we have
# met (the SchemaStore corpus); a pattern that needs more is run by the bounded engine.
_RE2_MAX_MEM: Final = 8 << 20
_PATTERN_CACHE: Final = 2048
_MAX_PATTERN_CHARS: Final = 4096


class PatternError(ValueError):
    """Not a regular expression either engine can read."""


class _Runs:
    """The backtracking runs left to one value's validation."""

    __slots__ = ("left", "starved")

    def __init__(self, runs: int) -> None:
        self.left = runs
        self.starved = False


_budget: contextvars.ContextVar[_Runs | None] = contextvars.ContextVar(
    "toolforge_pattern_runs", default=None
)


@contextlib.contextmanager
def pattern_budget(runs: int = MAX_RUNS) -> Iterator[None]:
    """Within this block, backtracking patterns run at most ``runs`` times, in all
    (nested blocks share the outermost budget). Linear (RE2) runs are not counted: their
    cost is bounded by the text's length."""
    if _budget.get() is not None:
        yield
        return
    token = _budget.set(_Runs(runs))
    try:
        yield
    finally:
        _budget.reset(token)


@dataclass(frozen=True, slots=True, eq=False)
class Pattern:
    """A compiled JSON Schema pattern. ``linear``: RE2 runs it (no backtracking)."""

    source: str
    linear: bool
    _compiled: Any

    def search(self, text: str) -> bool:
        """Whether ``text`` contains a match. A backtracking run out of time or out of
        runs counts as no match (:meth:`starved` then says so)."""
        if self.linear:
            return self._compiled.search(text) is not None
        runs = _budget.get()
        if runs is not None:
            if runs.left <= 0:
                runs.starved = True
                return False
            runs.left -= 1
        try:
            return self._compiled.search(text, timeout=RUN_TIMEOUT_S) is not None
        except TimeoutError:
            if runs is not None:
                runs.starved = True
            return False

    def starved(self) -> bool:
        """Whether a failed :meth:`search` in this budget ran out of time or runs (for the
        error message)."""
        runs = _budget.get()
        return not self.linear and runs is not None and runs.starved


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # refusals are ours to report, not absl's stderr
    options.max_mem = _RE2_MAX_MEM
    return options


_RE2_OPTIONS: Final = _re2_options()

# ECMA-262 escapes that RE2 spells differently (or not at all).
_ECMA_ESCAPE: Final = re.compile(
    r"\\(?:u\{([0-9A-Fa-f]{1,6})\}|u([0-9A-Fa-f]{4})|c([A-Za-z])|(.))"  # escapes
    r"|(\[\^\])|(\[\])",  # [^] (any character) and [] (none)
    re.S,
)


def _to_re2(source: str) -> str:
    """ECMA-262 pattern text in RE2's syntax (what differs only; RE2 rejects the rest)."""

    def swap(m: re.Match[str]) -> str:
        hex_digits = m[1] or m[2]
        if hex_digits:
            return f"\\x{{{hex_digits}}}"
        if m[3]:
            return f"\\x{{{ord(m[3].upper()) - 64:02x}}}"
        if m[5]:
            return r"[\x{0}-\x{10FFFF}]"  # [^]: any character, newlines included
        if m[6]:
            return r"[^\x{0}-\x{10FFFF}]"  # []: no character
        return m[0]

    return _ECMA_ESCAPE.sub(swap, source)


@functools.lru_cache(maxsize=_PATTERN_CACHE)
def compile_pattern(source: str) -> Pattern:
    """``source`` compiled (cached). Raises :class:`PatternError` when neither engine
    reads it, naming what is wrong."""
    if len(source) > _MAX_PATTERN_CHARS:
        raise PatternError(f"{len(source)} characters, over the {_MAX_PATTERN_CHARS} limit")
    try:
        return Pattern(source, True, re2.compile(_to_re2(source), _RE2_OPTIONS))
    except re2.error:
        pass
    try:
        # ASCII: ECMA-262's \d, \w and \b are ASCII-only, as RE2's are.
        compiled = regex.compile(source, regex.VERSION0 | regex.ASCII)
    except (regex.error, OverflowError, RecursionError) as exc:
        raise PatternError(f"not a regular expression: {exc}") from None
    return Pattern(source, False, compiled)


# --- examples -------------------------------------------------------------------------

_PARSER: Final[Any] = getattr(re, "_parser", None)
_CONSTANTS: Final[Any] = getattr(re, "_constants", None)
_EXAMPLE_CHARS: Final = "a0A_-. x"
# Each unbounded repeat adds at most this many copies while padding up to minLength.
_MAX_PAD: Final = 64


def example(source: str, *, min_length: int = 0, max_length: int | None = None) -> str | None:
    """A short string that ``source`` accepts (searched, as JSON Schema does), within the
    length bounds; None when none was found. Every answer is checked by the engine."""
    try:
        pattern = compile_pattern(source)
    except PatternError:
        return None
    for text in _guesses(source, min_length):
        if len(text) < min_length or (max_length is not None and len(text) > max_length):
            continue
        with pattern_budget():
            if pattern.search(text):
                return text
    return None


def _guesses(source: str, min_length: int) -> Iterator[str]:
    if _PARSER is None:  # pragma: no cover - CPython always has it
        return
    try:
        tree = _PARSER.parse(source)
    except (re.error, RecursionError, OverflowError, ValueError):
        return
    builder = _Builder()
    try:
        shortest = builder.build(tree)
    except (_NoExample, RecursionError):
        return
    yield shortest
    if len(shortest) < min_length:
        # Grow the unbounded repeats, or pad (an unanchored pattern matches inside).
        builder = _Builder(grow=min_length - len(shortest))
        with contextlib.suppress(_NoExample, RecursionError):
            yield builder.build(tree)
        yield shortest + "a" * (min_length - len(shortest))
        yield "a" * (min_length - len(shortest)) + shortest


class _NoExample(Exception):
    pass


class _Builder:
    """The shortest string of a parsed pattern, or, with ``grow``, one that repeats its
    open-ended parts ``grow`` more times (to reach a minLength)."""

    def __init__(self, grow: int = 0) -> None:
        self._grow = grow
        self._groups: dict[int, str] = {}

    def build(self, tree: Any) -> str:
        return "".join(self._node(op, av) for op, av in tree)

    def _node(self, op: Any, av: Any) -> str:
        c = _CONSTANTS
        if op is c.LITERAL:
            return chr(av)
        if op is c.NOT_LITERAL:
            return next(ch for ch in _EXAMPLE_CHARS if ord(ch) != av)
        if op is c.ANY:
            return "a"
        if op is c.IN:
            return self._class(av)
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = av
            once = self.build(sub)
            count = lo
            if self._grow and (hi is c.MAXREPEAT or hi > lo) and once:
                extra = min(_MAX_PAD, -(-self._grow // len(once)))
                if hi is not c.MAXREPEAT:
                    extra = min(extra, hi - lo)
                count += extra
                self._grow = max(0, self._grow - extra * len(once))
            return str(once * count)
        if op is c.SUBPATTERN:
            group, _add, _del, sub = av
            text = self.build(sub)
            if group is not None:
                self._groups[group] = text
            return text
        if op is c.BRANCH:
            options = [self.build(branch) for branch in av[1]]
            return str(min(options, key=len))
        if op is c.GROUPREF:
            return self._groups.get(av, "")
        if op in (c.AT, c.ASSERT, c.ASSERT_NOT):
            return ""  # anchors and lookarounds take no characters (checked afterwards)
        if op is c.CATEGORY:
            return _category(av)
        raise _NoExample

    def _class(self, items: Any) -> str:
        c = _CONSTANTS
        negate = bool(items) and items[0][0] is c.NEGATE
        if not negate:
            op, av = items[0]
            if op is c.LITERAL:
                return chr(av)
            if op is c.RANGE:
                return chr(av[0])
            if op is c.CATEGORY:
                return _category(av)
            raise _NoExample
        banned: list[tuple[int, int]] = []
        for op, av in items[1:]:
            if op is c.LITERAL:
                banned.append((av, av))
            elif op is c.RANGE:
                banned.append(av)
            elif op is c.CATEGORY:
                code = ord(_category(av))
                banned.append((code, code))  # approximate; the engine check decides
        for ch in _EXAMPLE_CHARS:
            if not any(lo <= ord(ch) <= hi for lo, hi in banned):
                return ch
        raise _NoExample


def _category(code: Any) -> str:
    name = str(code).upper()
    if "NOT_DIGIT" in name or "NOT_SPACE" in name:
        return "a"
    if "NOT_WORD" in name:
        return "-"
    if "DIGIT" in name:
        return "0"
    if "SPACE" in name:
        return " "
    return "a"


# --- formats --------------------------------------------------------------------------

# The formats the gateway knows, as patterns (ECMA-262, anchored): the grammar enforces
# these while decoding; validation asserts the format itself afterwards (format_checker).
_DATE: Final = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_HOUR_MINUTE: Final = r"([01][0-9]|2[0-3]):[0-5][0-9]"
_TIME: Final = rf"{_HOUR_MINUTE}:([0-5][0-9]|60)(\.[0-9]{{1,9}})?(Z|[+-]{_HOUR_MINUTE})"
_OCTET: Final = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL: Final = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
FORMAT_PATTERNS: Final = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "email": r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}$",
    "uuid": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "uri": r"^[a-z][a-z0-9+.-]{0,31}:[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]+$",
    "hostname": rf"^{_LABEL}(\.{_LABEL})*$",
}
# A valid value of each format, for the fallbacks of OBJECT/RESULT frames.
FORMAT_EXAMPLES: Final = {
    "date": "2000-01-01",
    "time": "00:00:00Z",
    "date-time": "2000-01-01T00:00:00Z",
    "duration": "P1D",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "/",
    "iri-reference": "/",
    "uri-template": "/",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "json-pointer": "",
    "relative-json-pointer": "0",
    "regex": "",
}


# RFC 5321's mailbox: a dot-atom or quoted local part; a domain or an address literal.
_ATOM: Final = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL: Final = rf'^({_ATOM}(\.{_ATOM})*|"([^"\\]|\\.)*")$'
_DOMAIN: Final = rf"^{_LABEL}(\.{_LABEL})*$"


def _is_email(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    local, at, domain = instance.rpartition("@")
    if not at or not compile_pattern(_LOCAL).search(local):
        return False
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        try:
            if literal.startswith("IPv6:"):
                ipaddress.IPv6Address(literal[5:])
            else:
                ipaddress.IPv4Address(literal)
        except ValueError:
            return False
        return True
    return compile_pattern(_DOMAIN).search(domain)


def is_pattern(instance: object) -> bool:
    """``format: regex``: a string is a pattern :func:`compile_pattern` reads (raises
    :class:`PatternError` naming why not)."""
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


@functools.lru_cache(maxsize=1)
def format_checker() -> FormatChecker:
    """jsonschema's Draft 2020-12 checkers (their libraries come with
    ``jsonschema[format-nongpl]``), with ``regex`` read by :func:`compile_pattern`, so a
    ``format: regex`` string is an ECMA-262 pattern this module can run."""
    checker = FormatChecker(())
    # The instance's own table: FormatChecker's class-wide one holds every draft's
    # checkers under one name each (its "time" is Draft 3's, which refuses offsets).
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)

    checker.checks("email")(_is_email)
    checker.checks("regex", raises=PatternError)(is_pattern)

    return checker
