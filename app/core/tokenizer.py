"""The sentinel tokenizer: model text in, framing events out (docs/protocol.md). No I/O.

Theory of operation
-------------------
The model writes free text with frames in it::

    Sure. ⟦BEGIN_TOOL_CALL id=t1 name=places.search⟧{"q":"pizza"}⟦END_TOOL_CALL id=t1⟧

``feed(text)`` takes whatever the upstream delivered, however it was split, and returns
the events it now knows for certain: ``Text`` for free text, ``FrameBegin`` /
``FrameDelta`` / ``FrameEnd`` for frames, and at most one final ``Violation``. ``close()``
says the input is over.

The whole difficulty is that a sentinel can arrive split across any number of chunks,
and that latency matters: every character that cannot be part of a sentinel is emitted
by the very ``feed`` call that delivered it. Only a run that starts with ``⟦`` and is
still a prefix of a possible sentinel is held back (the "hold-back rule"); this is the
same problem httpx's ``LineDecoder`` solves for a trailing ``\\r``.

We write this by hand rather than with a library because no library knows our grammar,
and a regex over an accumulating buffer would re-scan it on every chunk (O(n²)).

States (the only place transitions happen is ``_step``'s dispatch on them):

    state       what we are reading                  leaves to
    ---------   ----------------------------------   -------------------------------------
    TEXT        free text                            TEXT_HOLD on ``⟦``
    TEXT_HOLD   ``⟦``, ``⟦B``, ... not yet committed  SENTINEL on ``⟦BEGIN_`` / ``⟦END_``;
                                                     TEXT on anything else (a lookalike:
                                                     the held run is plain text)
    BODY        a frame body (JSON)                  BODY_HOLD on ``⟦`` outside a string
    BODY_HOLD   like TEXT_HOLD, inside a frame       SENTINEL, or BODY (lookalike content)
    SENTINEL    a committed sentinel, up to ``⟧``    BODY after a valid BEGIN, TEXT after a
                                                     valid END; FAILED on any violation
    FAILED      sticky: every later call re-raises   -
    CLOSED      after ``close()``                    -

The commit points are ``⟦BEGIN_`` and ``⟦END_``: a shorter run that goes wrong (``⟦B!``,
``⟦ENDING``, ``⟦⟧``) is a lookalike and stays text, while anything after a commit point
either completes a valid sentinel or is a typed violation (``⟦BEGIN_FOO …⟧`` is
``UNKNOWN_FRAME_KIND``, not text).

Inside a frame body the tokenizer tracks JSON strings and backslash escapes, because a
``⟦`` inside a JSON string is content, not a sentinel (docs/protocol.md). It does not validate the
JSON: that is ``StreamingJSONValidator``'s job, and a lookalike ``⟦`` outside a string is
passed on as body content for the validator to reject. A body whose string never closes
swallows the END sentinel; the frame then hits ``FRAME_TOO_LARGE`` or ``FRAME_UNCLOSED``.

Errors are sticky, as in h11. After a violation the framing of the rest of the stream
cannot be trusted: guessing where a frame really ended could run a tool on the wrong
bytes, so the tokenizer stays FAILED and the session reports the violation and ends (or
asks the model to retry from a clean prompt). Recovery, where wanted, is a policy of the
session, never a guess of the tokenizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, auto
from typing import Final

from toolforge.core.events import (
    Event,
    FrameBegin,
    FrameDelta,
    FrameEnd,
    FrameKind,
    Text,
    Violation,
)
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.sentinels import CLOSE, ID_RE, MAX_SENTINEL_CHARS, NAME_RE, OPEN
from toolforge.errors import ErrorCode, SentinelError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "SentinelTokenizer",
]


# docs/protocol.md: a frame body is capped at 64 KB (the same order as Envoy's and h11's header
# buffers: enough for any real tool call, small enough that one stream cannot hold
# megabytes in the gateway).
DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024

_COMMIT_PREFIXES: Final = (OPEN + "BEGIN_", OPEN + "END_")

_KINDS: Final = {kind.value: kind for kind in FrameKind}

# Inside a committed sentinel: anything but another ``⟦`` or a control character.
_SENTINEL_BAD_CHAR: Final = re.compile(f"[{OPEN}\x00-\x1f\x7f]")

# Inside a body: the characters that change the tokenizer's JSON-string state.
_BODY_SPECIAL_IN_STRING: Final = re.compile(r'["\\]')
_BODY_SPECIAL_OUTSIDE: Final = re.compile(f'["{OPEN}]')


class _State(Enum):
    TEXT = auto()
    TEXT_HOLD = auto()
    BODY = auto()
    BODY_HOLD = auto()
    SENTINEL = auto()
    FAILED = auto()
    CLOSED = auto()


@dataclass(slots=True)
class _OpenFrame:
    kind: FrameKind
    id: str
    size: int = 0  # UTF-8 bytes of body emitted so far


@dataclass(frozen=True, slots=True)
class _Sentinel:
    is_begin: bool
    kind: FrameKind
    id: str
    name: str  # "" for END


def _utf8_len(s: str) -> int:
    # str.isascii() is O(1) in CPython: the common case costs no encoding.
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


class SentinelTokenizer:
    """Incremental tokenizer for the sentinel framing grammar of docs/protocol.md.

    ``feed`` and ``close`` return events; a protocol violation is returned as a final
    ``Violation`` event (so the events before it are identical however the input was
    chunked), after which every call raises that same ``SentinelError``.
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        seen_ids: set[str] | None = None,
    ) -> None:
        """``seen_ids``: ids already used in this stream, shared across the tokenizers of
        one stream's generation turns (ids are unique per stream, docs/protocol.md)."""
        self._max_frame_bytes = max_frame_bytes
        self._state = _State.TEXT
        self._held = ""  # a candidate or committed sentinel, starting with ⟦
        self._held_in_body = False  # whether ``_held`` started inside a frame body
        self._frame: _OpenFrame | None = None
        self._in_string = False
        self._escape = False
        self._seen_ids: set[str] = seen_ids if seen_ids is not None else set()
        self._error: SentinelError | None = None

    # -- public API -------------------------------------------------------------------

    @property
    def open_frame_id(self) -> str | None:
        """The id of the frame being read, if any."""
        return self._frame.id if self._frame is not None else None

    @property
    def failed(self) -> bool:
        return self._error is not None

    def feed(self, text: str) -> list[Event]:
        """Consume ``text`` and return every event it completes, in order."""
        # Fast paths for the two common chunks (one upstream token each): free text with
        # no ⟦, and body text with no ⟦ and no backslash. In the latter every quote toggles
        # the in-string state, so the parity of the quote count is all there is to track.
        # Both are C-level scans; everything else takes the general path below.
        state = self._state
        if OPEN not in text:
            if state is _State.TEXT:
                return [Text(text)] if text else []
            if state is _State.BODY and not self._escape and "\\" not in text:
                frame = self._frame
                assert frame is not None
                size = frame.size + (
                    len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
                )
                if size <= self._max_frame_bytes:
                    if text.count('"') & 1:
                        self._in_string = not self._in_string
                    frame.size = size
                    return [FrameDelta(frame.id, text)] if text else []
        self._check_usable()
        out: list[Event] = []
        try:
            self._consume(text, out)
        except SentinelError as exc:
            self._fail(exc, out)
        return out

    def close(self) -> list[Event]:
        """End of input: flush held text, and report a frame or sentinel left open."""
        self._check_usable()
        out: list[Event] = []
        state = self._state
        try:
            if state is _State.TEXT_HOLD:
                self._emit_text(out, self._held)
                self._held = ""
            elif state is _State.SENTINEL and not self._held_in_body:
                raise SentinelError(
                    ErrorCode.MALFORMED_SENTINEL,
                    f"the stream ended inside a sentinel: {self._held!r}",
                )
            elif self._frame is not None:
                if state is _State.BODY_HOLD:
                    self._emit_body(out, self._held)
                    self._held = ""
                frame_id = self._frame.id
                raise SentinelError(
                    ErrorCode.FRAME_UNCLOSED,
                    f"the stream ended inside frame {frame_id!r}; "
                    f"expected {sentinels.end(self._frame.kind, frame_id)}",
                    frame_id=frame_id,
                )
        except SentinelError as exc:
            self._fail(exc, out)
            return out
        self._state = _State.CLOSED
        return out

    # -- the machine ------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._state is _State.CLOSED:
            raise RuntimeError("SentinelTokenizer used after close()")

    def _fail(self, exc: SentinelError, out: list[Event]) -> None:
        self._error = exc
        self._state = _State.FAILED
        out.append(Violation(exc))

    def _consume(self, text: str, out: list[Event]) -> None:
        pos = 0
        end = len(text)
        while pos < end:
            state = self._state
            if state is _State.TEXT:
                i = text.find(OPEN, pos)
                if i < 0:
                    self._emit_text(out, text[pos:] if pos else text)
                    return
                if i > pos:
                    self._emit_text(out, text[pos:i])
                self._start_hold(in_body=False)
                pos = i + 1
            elif state is _State.BODY:
                pos = self._consume_body(text, pos, out)
            elif state is _State.SENTINEL:
                pos = self._consume_sentinel(text, pos, out)
            else:  # TEXT_HOLD or BODY_HOLD
                pos = self._consume_hold(text, pos, out)

    def _start_hold(self, *, in_body: bool) -> None:
        self._held = OPEN
        self._held_in_body = in_body
        self._state = _State.BODY_HOLD if in_body else _State.TEXT_HOLD

    def _consume_hold(self, text: str, pos: int, out: list[Event]) -> int:
        """Extend an uncommitted ``⟦…`` run; commit, or give it back as a lookalike."""
        held = self._held
        end = len(text)
        while pos < end:
            candidate = held + text[pos]
            if candidate in _COMMIT_PREFIXES:
                self._held = candidate
                self._state = _State.SENTINEL
                return pos + 1
            if any(prefix.startswith(candidate) for prefix in _COMMIT_PREFIXES):
                held = candidate
                pos += 1
                continue
            # A lookalike: the held run is ordinary content. The current character is
            # not consumed: it may itself be ``⟦`` or a quote, so its own state decides.
            self._held = ""
            if self._held_in_body:
                self._state = _State.BODY
                self._emit_body(out, held)
            else:
                self._state = _State.TEXT
                self._emit_text(out, held)
            return pos
        self._held = held
        return pos

    def _consume_sentinel(self, text: str, pos: int, out: list[Event]) -> int:
        """Accumulate a committed sentinel up to its ``⟧``, then act on it."""
        close = text.find(CLOSE, pos)
        stop = len(text) if close < 0 else close
        piece = text[pos:stop]
        bad = _SENTINEL_BAD_CHAR.search(piece)
        if bad is not None:
            self._held += piece[: bad.start()]
            raise SentinelError(
                ErrorCode.MALFORMED_SENTINEL,
                f"unexpected {piece[bad.start()]!r} inside sentinel {self._held!r}",
                frame_id=self.open_frame_id,
            )
        held = self._held + piece
        if len(held) + (close >= 0) > MAX_SENTINEL_CHARS:
            raise SentinelError(
                ErrorCode.MALFORMED_SENTINEL,
                f"sentinel longer than {MAX_SENTINEL_CHARS} characters: {held[:40]!r}…",
                frame_id=self.open_frame_id,
            )
        if close < 0:
            self._held = held
            return stop
        self._held = ""
        self._apply(self._parse(held + CLOSE), out)
        return close + 1

    def _consume_body(self, text: str, pos: int, out: list[Event]) -> int:
        """Pass body text through, tracking JSON strings, until a ``⟦`` outside one."""
        start = pos
        end = len(text)
        in_string = self._in_string
        while pos < end:
            if self._escape:
                self._escape = False
                pos += 1
                continue
            if in_string:
                m = _BODY_SPECIAL_IN_STRING.search(text, pos)
                if m is None:
                    pos = end
                    break
                pos = m.end()
                if text[m.start()] == '"':
                    in_string = False
                else:
                    self._escape = True
            else:
                m = _BODY_SPECIAL_OUTSIDE.search(text, pos)
                if m is None:
                    pos = end
                    break
                if text[m.start()] == '"':
                    in_string = True
                    pos = m.end()
                else:  # ⟦ outside a string: maybe our END sentinel
                    self._in_string = False
                    if m.start() > start:
                        self._emit_body(out, text[start : m.start()])
                    self._start_hold(in_body=True)
                    return m.end()
        self._in_string = in_string
        if pos > start:
            self._emit_body(out, text[start:pos] if start or pos < end else text)
        return pos

    # -- acting on a complete sentinel ------------------------------------------------

    def _parse(self, sentinel: str) -> _Sentinel:
        """Parse ``⟦VERB_KIND k=v …⟧`` strictly, as the grammar of docs/protocol.md writes it."""
        head, *attrs = sentinel[1:-1].split(" ")
        verb, _, kind_name = head.partition("_")
        is_begin = verb == "BEGIN"
        pairs = [attr.partition("=") for attr in attrs]
        given = {key: value for key, sep, value in pairs if sep}
        frame_id = given.get("id", "")
        report_id = frame_id or None
        kind = _KINDS.get(kind_name)
        if kind is None:
            raise SentinelError(
                ErrorCode.UNKNOWN_FRAME_KIND,
                f"unknown frame kind {kind_name!r} in {sentinel!r}; "
                f"expected one of {', '.join(_KINDS)}",
                frame_id=report_id,
            )
        expected = ["id", kind.name_attribute] if is_begin else ["id"]
        keys = [key if sep else None for key, sep, _ in pairs]
        if keys != expected:
            form = (
                sentinels.begin(kind, "<id>", "<name>") if is_begin else sentinels.end(kind, "<id>")
            )
            raise SentinelError(
                ErrorCode.MALFORMED_SENTINEL,
                f"malformed attributes in {sentinel!r}; expected exactly {form}",
                frame_id=report_id,
            )
        if not ID_RE.fullmatch(frame_id):
            raise SentinelError(
                ErrorCode.MALFORMED_SENTINEL,
                f"bad frame id in {sentinel!r}: 1-64 characters of A-Z a-z 0-9 _ . : -",
                frame_id=report_id,
            )
        name = given.get(kind.name_attribute, "")
        if is_begin and not NAME_RE.fullmatch(name):
            raise SentinelError(
                ErrorCode.MALFORMED_SENTINEL,
                f"bad {kind.name_attribute} in {sentinel!r}: "
                "1-128 characters of A-Z a-z 0-9 _ . : -",
                frame_id=frame_id,
            )
        return _Sentinel(is_begin, kind, frame_id, name)

    def _apply(self, s: _Sentinel, out: list[Event]) -> None:
        frame = self._frame
        if s.is_begin:
            if frame is not None:
                raise SentinelError(
                    ErrorCode.NESTED_BEGIN,
                    f"{sentinels.begin(s.kind, s.id, s.name)} inside open frame {frame.id!r}; "
                    "frames do not nest: close the open frame first",
                    frame_id=frame.id,
                )
            if s.id in self._seen_ids:
                raise SentinelError(
                    ErrorCode.DUPLICATE_FRAME_ID,
                    f"frame id {s.id!r} was already used in this stream; ids are unique",
                    frame_id=s.id,
                )
            self._seen_ids.add(s.id)
            self._frame = _OpenFrame(s.kind, s.id)
            self._in_string = False
            self._escape = False
            self._state = _State.BODY
            out.append(FrameBegin(s.kind, s.id, s.name))
            return
        if frame is None:
            raise SentinelError(
                ErrorCode.END_WITHOUT_BEGIN,
                f"{sentinels.end(s.kind, s.id)} with no open frame",
                frame_id=s.id,
            )
        if s.id != frame.id:
            raise SentinelError(
                ErrorCode.END_ID_MISMATCH,
                f"{sentinels.end(s.kind, s.id)} does not close the open frame {frame.id!r}",
                frame_id=frame.id,
            )
        if s.kind is not frame.kind:
            raise SentinelError(
                ErrorCode.END_KIND_MISMATCH,
                f"{sentinels.end(s.kind, s.id)} closes a {frame.kind} frame; "
                f"expected {sentinels.end(frame.kind, frame.id)}",
                frame_id=frame.id,
            )
        self._frame = None
        self._state = _State.TEXT
        out.append(FrameEnd(frame.kind, frame.id))

    # -- emission ---------------------------------------------------------------------

    @staticmethod
    def _emit_text(out: list[Event], text: str) -> None:
        if out and type(last := out[-1]) is Text:
            out[-1] = Text(last.text + text)
        else:
            out.append(Text(text))

    def _emit_body(self, out: list[Event], chunk: str) -> None:
        frame = self._frame
        assert frame is not None
        size = frame.size + _utf8_len(chunk)
        if size > self._max_frame_bytes:
            # Emit exactly the bytes that fit, so the events before the violation do not
            # depend on how the input was chunked.
            room = self._max_frame_bytes - frame.size
            fitting = chunk.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
            if fitting:
                self._emit_delta(out, frame.id, fitting)
            raise SentinelError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame {frame.id!r} is over {self._max_frame_bytes} bytes",
                frame_id=frame.id,
            )
        frame.size = size
        self._emit_delta(out, frame.id, chunk)

    @staticmethod
    def _emit_delta(out: list[Event], frame_id: str, chunk: str) -> None:
        if out and type(last := out[-1]) is FrameDelta:
            out[-1] = FrameDelta(frame_id, last.chunk + chunk)
        else:
            out.append(FrameDelta(frame_id, chunk))
