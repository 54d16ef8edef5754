"""Incremental, strict RFC 8259 JSON validation for values that arrive in small chunks.

The gateway validates tool-call arguments and OBJECT/RESULT frames as the model streams them
(docs/protocol.md: "a tool runs only after its END sentinel arrived and its arguments parsed
strictly"). :class:`StreamingJSONValidator` checks each chunk as it comes, in one pass over
the input, so a bad token is reported the moment it appears and ``close()`` costs a single
``orjson.loads`` instead of a re-parse per chunk.

Choices where RFC 8259 leaves room (each raises :class:`toolforge.errors.JSONError`):

* Limits (docs/protocol.md): nesting deeper than ``max_depth`` (default 16) is ``JSON_TOO_DEEP``,
  raised at the bracket that opens the ``max_depth + 1``-th container; more than
  ``max_bytes`` UTF-8 bytes (default 64 KiB) is ``JSON_TOO_LARGE``, raised at the first
  character past the limit. ``max_depth`` is capped at 1024, orjson's own nesting limit.
* Numbers (RFC 8259 §6 lets implementations limit range and precision): integers outside
  [-2**63, 2**64 - 1] and numbers that overflow a double to infinity are
  ``JSON_NUMBER_OUT_OF_RANGE``; such values must be sent as strings. orjson would silently
  turn the former into lossy floats and rejects the latter. Underflow to 0.0 is accepted.
* Unicode (RFC 8259 §8.2): an escaped high surrogate must be followed at once by an escaped
  low one; lone surrogates, raw surrogate code points in the input ``str`` (they only come
  from bad decoding) and invalid UTF-8 given to ``feed_bytes`` are ``JSON_INVALID_UNICODE``.
* Everything else is ``JSON_SYNTAX`` (NaN, Infinity, trailing commas, leading zeros,
  ``1.``, ``.5``, ``+1``, raw control characters in strings, bad escapes, comments, single
  quotes), ``JSON_INCOMPLETE`` (input ended inside a value, or was empty) or
  ``JSON_TRAILING_DATA`` (anything but whitespace after the top-level value).

Every error carries the character offset, in the whole input, where it was found, and the
same input gives the same error however it is chunked. One exception to "where it was
found": a number is checked once it ends, so an error inside a number is reported at the
offending character, but only once the number ends (or hits the size limit first).
"""

# Theory of operation
# -------------------
#
# The validator is a sans-IO state machine in the style of h11: ``feed`` advances it over
# a chunk and keeps everything in the instance, so a token may split anywhere. Its state:
#
#   * ``_stack``: one entry per open container, the state to enter after each value in it
#     (NEXT_OBJECT or NEXT_ARRAY); ``_after`` caches the top (DONE when nothing is open).
#   * ``_state``: what may come next. Eight *token* states sit between tokens:
#
#         VALUE            a value (top level, after ':' or after ',' in an array)
#         VALUE_OR_CLOSE   a value or ']' (just after '[')
#         KEY              a string key (after ',' in an object)
#         KEY_OR_CLOSE     a string key or '}' (just after '{')
#         COLON            ':'
#         NEXT_OBJECT      ',' or '}' after a member's value
#         NEXT_ARRAY       ',' or ']' after an element
#         DONE             the top-level value is complete; only whitespace may follow
#
#     and the *lexical* states are inside a token: STRING_VALUE and STRING_KEY (a closing
#     quote leads to ``_after`` or to COLON), ESCAPE (after a backslash), HEX (inside
#     \uXXXX, with the value so far), LOW_BACKSLASH and LOW_U (a high surrogate escape
#     needs an escaped low one next), NUMBER (its text so far) and LITERAL (the rest of
#     true/false/null still expected).
#
# Between tokens, ``_TRANSITIONS[state]`` maps the next character to the next state or
# to an action (open, close, number, literal); a character missing from it is the error,
# so that one table is the grammar. Runs inside a token (string content, number text) are
# consumed by one compiled-regex match, not a Python loop per character, and a chunk that
# lies wholly inside a string (or is all digits inside a number) is accepted by a few
# C-level str checks without entering the loop. A value that ends
# leads to ``_after``. A number has no closing character, so it ends at the first
# character that cannot continue it (left for the next state to judge) or at ``close()``;
# its text is then checked against the number grammar and the range limits. An error is
# stored and re-raised by every later call (sticky, as in h11).
#
# Nothing recurses and the work is O(1) amortised per character, so 100 000 '[' or a
# 10 MB string fail fast with our own error. Chunks are kept and joined once by ``close()``
# for orjson, which builds the value; orjson disagreeing with the validator would be a
# bug here, reported as ``INTERNAL``.

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from typing import Final, NoReturn, cast

import orjson

from toolforge.errors import ErrorCode, JSONError, ToolForgeError

__all__ = ["StreamingJSONValidator"]

# orjson refuses deeper nesting ("depth limit exceeded" at 1025), so max_depth is capped.
_ORJSON_MAX_DEPTH: Final = 1024

# Token states first (``state < _STRING_VALUE`` tests for them, and they index
# _TRANSITIONS), then the two string states, then the rest.
_VALUE: Final = 0
_VALUE_OR_CLOSE: Final = 1
_KEY: Final = 2
_KEY_OR_CLOSE: Final = 3
_COLON: Final = 4
_NEXT_OBJECT: Final = 5
_NEXT_ARRAY: Final = 6
_DONE: Final = 7
_STRING_VALUE: Final = 8
_STRING_KEY: Final = 9
_NUMBER: Final = 10
_LITERAL: Final = 11
_ESCAPE: Final = 12
_HEX: Final = 13
_LOW_BACKSLASH: Final = 14
_LOW_U: Final = 15

# Table entries below 16 are "go to that state"; these are the actions.
_A_NUMBER: Final = 16
_A_OPEN_OBJECT: Final = 17
_A_OPEN_ARRAY: Final = 18
_A_CLOSE: Final = 19
_A_LITERAL: Final = 20
_A_NEWLINE: Final = 21
_A_ERROR: Final = 22


def _row(state: int, moves: dict[str, int]) -> dict[str, int]:
    """One row of the table; whitespace (RFC 8259 §2: space, tab, LF, CR) stays put.

    A newline usually starts a run of indentation, skipped in one regex match.
    """
    return {" ": state, "\t": state, "\r": state, "\n": _A_NEWLINE, **moves}


_VALUE_START: Final = {
    '"': _STRING_VALUE,
    "{": _A_OPEN_OBJECT,
    "[": _A_OPEN_ARRAY,
    **dict.fromkeys("tfn", _A_LITERAL),
    **dict.fromkeys("-0123456789", _A_NUMBER),
}
# The grammar between tokens: _TRANSITIONS[state][char] -> next state or action.
_TRANSITIONS: Final[tuple[dict[str, int], ...]] = (
    _row(_VALUE, _VALUE_START),
    _row(_VALUE_OR_CLOSE, {**_VALUE_START, "]": _A_CLOSE}),
    _row(_KEY, {'"': _STRING_KEY}),
    _row(_KEY_OR_CLOSE, {'"': _STRING_KEY, "}": _A_CLOSE}),
    _row(_COLON, {":": _VALUE}),
    _row(_NEXT_OBJECT, {",": _KEY, "}": _A_CLOSE}),
    _row(_NEXT_ARRAY, {",": _VALUE, "]": _A_CLOSE}),
    _row(_DONE, {}),
)
_EXPECTED: Final = (
    "a value",
    "a value or ']'",
    "a string key",
    "a string key or '}'",
    "':'",
    "',' or '}'",
    "',' or ']'",
    "end of input",
)
_LITERALS: Final = {"t": "true", "f": "false", "n": "null"}
_SIMPLE_ESCAPES: Final = frozenset('"\\/bfnrt')
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")

# A pattern ending in `*` always matches (maybe empty), so its match() is never None.
_RunMatch = Callable[[str, int], re.Match[str]]
# String content up to the next quote, backslash, control character or raw surrogate.
_STRING_RUN: Final = cast(_RunMatch, re.compile('[^"\\\\\x00-\x1f\ud800-\udfff]*').match)
# Characters that can continue a number; the grammar is checked when the number ends.
_NUMBER_RUN: Final = cast(_RunMatch, re.compile(r"[0-9eE.+\-]*").match)
# RFC 8259 §6; group 1 is the fraction, group 2 the exponent.
_NUMBER_PATTERN: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_GRAMMAR: Final = _NUMBER_PATTERN.fullmatch
_WS_RUN: Final = cast(_RunMatch, re.compile("[ \t\n\r]*").match)
_HEX4: Final = re.compile(r"[0-9a-fA-F]{4}").match

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_INF: Final = float("inf")


class StreamingJSONValidator:
    """Validates one strict JSON value fed in chunks; ``close()`` returns the parsed value.

    ``feed``/``feed_bytes`` raise :class:`JSONError` as soon as the input cannot be the
    start of a valid document; the error is sticky. ``close()`` raises ``JSON_INCOMPLETE``
    unless a whole value arrived. Do not switch between ``feed`` and ``feed_bytes`` inside
    a character. After ``close()`` the validator is spent: later calls raise ``INTERNAL``.
    """

    __slots__ = (
        "_after",
        "_ascii_limit",
        "_base",
        "_chunks",
        "_decoder",
        "_error",
        "_esc_start",
        "_extra",
        "_frame_id",
        "_hex_left",
        "_hex_value",
        "_literal",
        "_low",
        "_max_bytes",
        "_max_depth",
        "_number",
        "_number_start",
        "_stack",
        "_state",
        "_string_state",
    )

    def __init__(
        self, *, max_depth: int = 16, max_bytes: int = 64 * 1024, frame_id: str | None = None
    ) -> None:
        if not 0 <= max_depth <= _ORJSON_MAX_DEPTH:
            raise ValueError(f"max_depth must be in [0, {_ORJSON_MAX_DEPTH}], got {max_depth}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._max_depth = max_depth
        self._max_bytes = max_bytes
        self._frame_id = frame_id
        self._error: ToolForgeError | None = None
        self._chunks: list[str] = []
        self._base = 0  # characters consumed before the current chunk
        self._extra = 0  # UTF-8 bytes consumed beyond one per character
        self._ascii_limit = max_bytes  # max_bytes - _extra: the budget in characters
        self._state = _VALUE
        self._stack: list[int] = []
        self._after = _DONE
        self._decoder: codecs.IncrementalDecoder | None = None
        # Token-in-progress state, touched only when a token spans chunks or has escapes.
        self._number: list[str] = []
        self._number_start = 0
        self._literal = ""
        self._string_state = _STRING_VALUE
        self._esc_start = 0
        self._hex_value = 0
        self._hex_left = 0
        self._low = False

    @property
    def complete(self) -> bool:
        """True once the top-level value has closed (a number: once something ends it)."""
        return self._state == _DONE

    @property
    def depth(self) -> int:
        """The number of containers open now."""
        return len(self._stack)

    @property
    def size(self) -> int:
        """UTF-8 bytes consumed so far."""
        return self._base + self._extra

    def feed(self, text: str) -> None:
        """Validate the next chunk of text. Raises :class:`JSONError` (sticky)."""
        if self._error is not None:
            raise self._error
        n = len(text)
        base = self._base
        # Size: ASCII chunks (the usual case; isascii() is O(1)) only move the character
        # count, checked against a character budget; others also add their extra bytes.
        if text.isascii():
            if base + n > self._ascii_limit:
                self._feed_past_limit(text)
        elif not self._take_extra_bytes(text):
            self._feed_past_limit(text)
        self._chunks.append(text)
        state = self._state
        if state >= _STRING_VALUE:  # inside a token: most chunks lie wholly inside one
            if state <= _STRING_KEY:
                # isprintable() is False for control characters and surrogates; the odd
                # printable-looking ones (U+00A0, ...) just take the slow path.
                if text.isprintable() and '"' not in text and "\\" not in text:
                    self._base = base + n
                    return
            elif state == _NUMBER and text.isdigit() and text.isascii():
                self._number.append(text)
                self._base = base + n
                return

        stack = self._stack
        after = self._after
        transitions = _TRANSITIONS
        string_run = _STRING_RUN
        number_run = _NUMBER_RUN
        number_grammar = _NUMBER_GRAMMAR
        ws_run = _WS_RUN
        pos = 0
        while pos < n:
            if state < _STRING_VALUE:  # between tokens
                action = transitions[state].get(text[pos], _A_ERROR)
                if action < 16:
                    state = action
                    pos += 1
                elif action == _A_NUMBER:
                    end = number_run(text, pos).end()
                    if end == n:  # it may go on in the next chunk
                        self._number = [text[pos:]]
                        self._number_start = base + pos
                        state = _NUMBER
                        break
                    # Only malformed, long or exponent numbers need _end_number's checks.
                    if text[pos:end].isdigit():
                        if end - pos > 18 or (text[pos] == "0" and end - pos > 1):
                            self._end_number(text[pos:end], base + pos, final=False)
                    else:
                        m = number_grammar(text, pos, end)
                        if (
                            m is None
                            or m.lastindex == 2
                            or (end - pos > 18 and (m.lastindex is None or end - pos > 300))
                        ):
                            self._end_number(text[pos:end], base + pos, final=False)
                    state = after
                    pos = end
                elif action == _A_NEWLINE:
                    pos = ws_run(text, pos + 1).end()
                elif action == _A_OPEN_OBJECT or action == _A_OPEN_ARRAY:
                    if len(stack) >= self._max_depth:
                        raise self._fail(
                            ErrorCode.JSON_TOO_DEEP,
                            f"nesting deeper than {self._max_depth} containers",
                            pos,
                        )
                    if action == _A_OPEN_OBJECT:
                        after = _NEXT_OBJECT
                        state = _KEY_OR_CLOSE
                    else:
                        after = _NEXT_ARRAY
                        state = _VALUE_OR_CLOSE
                    stack.append(after)
                    pos += 1
                elif action == _A_CLOSE:  # the table only allows the matching bracket
                    stack.pop()
                    state = after = stack[-1] if stack else _DONE
                    pos += 1
                elif action == _A_LITERAL:
                    literal = _LITERALS[text[pos]]
                    if text.startswith(literal, pos):
                        state = after
                        pos += len(literal)
                    else:
                        self._literal = literal
                        state = _LITERAL
                else:
                    self._fail_token(state, text[pos], pos, after)
                continue
            if state <= _STRING_KEY:  # inside a string
                pos = string_run(text, pos).end()
                if pos == n:
                    break
                c = text[pos]
                if c == '"':
                    state = after if state == _STRING_VALUE else _COLON
                elif c == "\\":
                    self._string_state = state
                    self._esc_start = base + pos
                    state = _ESCAPE
                else:
                    self._fail_char(c, pos, f"unescaped control character {c!r} in a string")
                pos += 1
                continue
            c = text[pos]
            if state == _NUMBER:
                end = number_run(text, pos).end()
                self._number.append(text[pos:end])
                if end == n:
                    break
                number = "".join(self._number)
                if not number.isdigit() or len(number) > 18 or number[0] == "0":
                    self._end_number(number, self._number_start, final=False)
                state = after
                pos = end
            elif state == _LITERAL:
                literal = self._literal
                if text.startswith(literal, pos):
                    pos += len(literal)
                    state = after
                    continue
                take = text[pos : pos + len(literal)]
                if not literal.startswith(take):
                    bad = next(i for i, ch in enumerate(take) if ch != literal[i])
                    self._fail_char(
                        take[bad],
                        pos + bad,
                        f"invalid literal: expected {literal[bad]!r}, found {take[bad]!r}"
                        " (only true, false and null)",
                    )
                self._literal = literal[len(take) :]
                break
            elif state == _ESCAPE:
                if c in _SIMPLE_ESCAPES:
                    state = self._string_state
                elif c == "u":
                    state = _HEX
                    self._hex_value = 0
                    self._hex_left = 4
                    self._low = False
                else:
                    self._fail_char(c, pos, f"invalid escape: {c!r} after a backslash")
                pos += 1
            elif state == _HEX:
                if self._hex_left == 4 and _HEX4(text, pos):
                    self._hex_value = int(text[pos : pos + 4], 16)
                    self._hex_left = 0
                    pos += 4
                elif c in _HEX_DIGITS:
                    self._hex_value = self._hex_value * 16 + int(c, 16)
                    self._hex_left -= 1
                    pos += 1
                else:
                    self._fail_char(c, pos, f"invalid hex digit {c!r} in a \\u escape")
                if self._hex_left == 0:
                    state = self._end_unicode_escape()
            else:  # LOW_BACKSLASH, LOW_U: the escaped low half of a surrogate pair
                if c != ("\\" if state == _LOW_BACKSLASH else "u"):
                    raise self._fail(
                        ErrorCode.JSON_INVALID_UNICODE,
                        "a high surrogate escape must be followed by a \\u low surrogate",
                        pos,
                    )
                if state == _LOW_BACKSLASH:
                    state = _LOW_U
                    self._esc_start = base + pos
                else:
                    state = _HEX
                    self._hex_value = 0
                    self._hex_left = 4
                    self._low = True
                pos += 1

        self._state = state
        self._after = after
        self._base = base + n

    def feed_bytes(self, data: bytes) -> None:
        """Validate the next chunk of UTF-8 bytes; a character may split across chunks."""
        if self._error is not None:
            raise self._error
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = codecs.getincrementaldecoder("utf-8")()
        # Past the size limit plus one partial character, TOO_LARGE is certain: don't decode.
        cut = self._max_bytes - self.size + 4
        truncated = len(data) > cut
        if truncated:
            data = data[:cut]
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError as exc:
            # Validate the characters before the bad byte first: an earlier error wins.
            self.feed(exc.object[: exc.start].decode("utf-8"))
            raise self._fail(ErrorCode.JSON_INVALID_UNICODE, "invalid UTF-8", 0) from None
        self.feed(text)
        if truncated:  # feed() must have raised JSON_TOO_LARGE
            raise self._internal("size limit not enforced on truncated bytes")

    def close(self) -> object:
        """End of input: return the value (via ``orjson.loads``) or raise :class:`JSONError`."""
        if self._error is not None:
            raise self._error
        if self._decoder is not None:
            try:
                self._decoder.decode(b"", True)
            except UnicodeDecodeError:
                raise self._fail(
                    ErrorCode.JSON_INVALID_UNICODE, "input ends inside a UTF-8 character", 0
                ) from None
        state = self._state
        if state == _NUMBER:
            self._end_number("".join(self._number), self._number_start, final=True)
            state = self._state = self._after
        if state != _DONE:
            empty = state == _VALUE and not self._stack
            what = "no JSON value" if empty else "input ends inside the JSON value"
            raise self._fail(ErrorCode.JSON_INCOMPLETE, what, 0)
        try:
            value = orjson.loads("".join(self._chunks))
        except orjson.JSONDecodeError as exc:
            raise self._internal(f"orjson rejected what the validator accepted: {exc}") from exc
        self._error = ToolForgeError(
            ErrorCode.INTERNAL, "the JSON validator was used after close()", frame_id=self._frame_id
        )
        return value

    # Slow paths: the size limit, token ends that need checks, and errors.

    def _feed_past_limit(self, text: str) -> NoReturn:
        """Validate the characters that fit (an earlier error wins), then fail."""
        self.feed(text[: _chars_within(text, self._max_bytes - self.size)])
        raise self._fail(ErrorCode.JSON_TOO_LARGE, f"JSON larger than {self._max_bytes} bytes", 0)

    def _take_extra_bytes(self, text: str) -> bool:
        """Count a non-ASCII chunk's extra UTF-8 bytes; False if it would pass the limit."""
        n = len(text)
        budget = self._max_bytes - self._base - self._extra - n
        if budget < 0:  # at least one byte per character: no need to encode 10 MB
            return False
        extra = len(text.encode("utf-8", "surrogatepass")) - n
        if extra > budget:
            return False
        self._extra += extra
        self._ascii_limit -= extra
        return True

    def _end_number(self, s: str, start: int, *, final: bool) -> None:
        """Check a finished number's grammar and range; ``start`` is its offset."""
        m = _NUMBER_GRAMMAR(s)
        if m is None:
            self._fail_number(s, start, final)
        if m.lastindex is None:  # an integer
            if len(s) >= 19 and (len(s) > 21 or not _INT_MIN <= int(s) <= _INT_MAX):
                raise self._out_of_range(s, start)
        elif (m.group(2) is not None or len(s) > 300) and abs(float(s)) == _INF:
            raise self._out_of_range(s, start)

    def _fail_number(self, s: str, start: int, final: bool) -> NoReturn:
        """Walk the number grammar over ``s`` to find the first bad character; raise."""
        n = len(s)
        i = 1 if s[0] == "-" else 0
        complete = False
        if i < n and s[i] == "0":
            i += 1
            if i < n and s[i].isdigit():
                raise self._at(ErrorCode.JSON_SYNTAX, "leading zeros are not allowed", start + i)
            complete = True
        elif i < n and s[i].isdigit():
            while i < n and s[i].isdigit():
                i += 1
            complete = True
        if complete and i < n and s[i] == ".":
            i += 1
            complete = i < n and s[i].isdigit()
            while i < n and s[i].isdigit():
                i += 1
        if complete and i < n and s[i] in "eE":
            i += 1
            if i < n and s[i] in "+-":
                i += 1
            complete = i < n and s[i].isdigit()
            while i < n and s[i].isdigit():
                i += 1
        if complete:  # s[:i] is a number; s[i] can't follow it
            code = ErrorCode.JSON_SYNTAX if self._stack else ErrorCode.JSON_TRAILING_DATA
            raise self._at(code, f"unexpected {s[i]!r} after a number", start + i)
        if i == n and final:
            raise self._at(ErrorCode.JSON_INCOMPLETE, "input ends inside a number", start + i)
        found = f", found {s[i]!r}" if i < n else ""
        raise self._at(ErrorCode.JSON_SYNTAX, f"expected a digit in the number{found}", start + i)

    def _end_unicode_escape(self) -> int:
        """The state after a complete \\uXXXX escape (RFC 8259 §7 surrogate pairs)."""
        v = self._hex_value
        if self._low:
            if not 0xDC00 <= v <= 0xDFFF:
                raise self._at(
                    ErrorCode.JSON_INVALID_UNICODE,
                    "a high surrogate escape must be followed by a low surrogate escape",
                    self._esc_start,
                )
            return self._string_state
        if 0xD800 <= v <= 0xDBFF:
            return _LOW_BACKSLASH
        if 0xDC00 <= v <= 0xDFFF:
            raise self._at(ErrorCode.JSON_INVALID_UNICODE, "lone low surrogate", self._esc_start)
        return self._string_state

    def _fail_char(self, c: str, pos: int, message: str) -> NoReturn:
        """A syntax error at character ``c``, unless it is a raw surrogate (bad decoding)."""
        if "\ud800" <= c <= "\udfff":
            message = f"raw surrogate code point U+{ord(c):04X} (the text was badly decoded)"
            raise self._fail(ErrorCode.JSON_INVALID_UNICODE, message, pos)
        raise self._fail(ErrorCode.JSON_SYNTAX, message, pos)

    def _fail_token(self, state: int, c: str, pos: int, after: int) -> NoReturn:
        if "\ud800" <= c <= "\udfff":
            self._fail_char(c, pos, "")
        elif state == _DONE:
            code, message = ErrorCode.JSON_TRAILING_DATA, f"{c!r} after the top-level value"
        elif (state == _VALUE and c == "]" and after == _NEXT_ARRAY) or (
            state == _KEY and c == "}"
        ):
            code, message = ErrorCode.JSON_SYNTAX, "trailing comma"
        else:
            code, message = ErrorCode.JSON_SYNTAX, f"expected {_EXPECTED[state]}, found {c!r}"
        raise self._fail(code, message, pos)

    def _fail(self, code: ErrorCode, message: str, pos: int) -> JSONError:
        """Record a sticky error at ``pos`` in the current chunk; the caller raises it."""
        return self._at(code, message, self._base + pos)

    def _at(self, code: ErrorCode, message: str, offset: int) -> JSONError:
        error = JSONError(code, message, offset=offset, frame_id=self._frame_id)
        self._error = error
        return error

    def _out_of_range(self, s: str, start: int) -> JSONError:
        shown = s if len(s) <= 32 else s[:29] + "..."
        return self._at(
            ErrorCode.JSON_NUMBER_OUT_OF_RANGE,
            f"number {shown} is outside 64-bit integers / finite doubles; send it as a string",
            start,
        )

    def _internal(self, message: str) -> ToolForgeError:
        error = ToolForgeError(ErrorCode.INTERNAL, message, frame_id=self._frame_id)
        self._error = error
        return error


def _chars_within(text: str, budget: int) -> int:
    """How many leading characters of ``text`` fit in ``budget`` UTF-8 bytes."""
    if text.isascii():
        return min(len(text), budget)
    used = 0
    for i, c in enumerate(text[: budget + 1]):
        o = ord(c)
        used += 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
        if used > budget:
            return i
    return min(len(text), budget + 1)
