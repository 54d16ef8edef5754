"""Incremental, sans-IO decoder for the upstream's ``text/event-stream``.

Why a wrapper and not ``httpx_sse.aconnect_sse``: the adapter reads raw bytes
(``response.aiter_raw()``, the cheapest httpx path, see
bench/RESULTS.md) and must bound what a misbehaving
upstream can make us buffer, reject invalid UTF-8 instead of replacing it, and raise our
own error type. httpx-sse's public API decodes text with ``errors="replace"`` and has no
limits, so we reuse only its two WHATWG building blocks and put the rest around them.

Theory of operation (one ``feed`` call)::

    bytes --(line-length guard, on bytes)--> strict incremental UTF-8 (drops one leading BOM)
          --> SSELineDecoder (CR, LF, CRLF; holds back a partial line and a trailing CR)
          --> SSEDecoder (fields: data/event/id/retry, comments, unknown fields ignored)
          --> SSEMessage values

Semantics are httpx-sse's, which follow the WHATWG "event stream interpretation": a blank
line dispatches; ``data:`` with or without one leading space; several ``data`` lines joined
with ``\\n``; an ``id`` containing NUL is ignored; an event with no terminating blank line at
end of stream is discarded. One deviation from WHATWG inherited from httpx-sse: a block
with ``event``/``id``/``retry`` but no ``data`` is still dispatched (with ``data == ""``);
the OpenAI adapter skips empty data, so this is harmless.

Errors are sticky (as in h11): after the decoder raised, every later call raises the same
``UpstreamError(UPSTREAM_PROTOCOL)``.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Final

# httpx-sse exposes only connect/aconnect helpers publicly; its decoders live in a private
# module. We import them here, in one place, because they are the well-tested WHATWG
# implementation the project chose (docs/architecture.md) and reimplementing them buys no measurable
# speed (see tests/upstream/test_sse_decoder.py::test_cost_per_event). If a release moves
# them, this import is the only line to change.
from httpx_sse._decoders import SSEDecoder, SSELineDecoder

from toolforge.errors import ErrorCode, UpstreamError

__all__ = ["MAX_EVENT_CHARS", "MAX_LINE_BYTES", "SSEMessage", "UpstreamSSEDecoder"]

MAX_LINE_BYTES: Final = 1024 * 1024
"""One SSE line may not exceed 1 MiB: an OpenAI chunk is a few hundred bytes, and the
oversized-input category of upstream faults asks for a bound on a single line."""

MAX_EVENT_CHARS: Final = 4 * 1024 * 1024
"""Field lines of one event (before its blank line) may not exceed 4 Mi characters, so an
upstream that never sends a blank line cannot grow an event without bound."""

_LINE_BREAK: Final = re.compile(rb"[\r\n]")


@dataclass(frozen=True, slots=True)
class SSEMessage:
    """One dispatched server-sent event. ``event`` is ``"message"`` when not given."""

    data: str
    event: str = "message"
    id: str = ""
    retry: int | None = None


def _protocol_error(message: str) -> UpstreamError:
    return UpstreamError(ErrorCode.UPSTREAM_PROTOCOL, message)


class UpstreamSSEDecoder:
    """Turns upstream body bytes into :class:`SSEMessage` values; does no I/O.

    ``feed(data)`` returns the events completed by ``data``; ``close()`` flushes at end of
    stream. Both raise ``UpstreamError(UPSTREAM_PROTOCOL)`` on invalid UTF-8, a line over
    :data:`MAX_LINE_BYTES` or an event over :data:`MAX_EVENT_CHARS`.
    """

    __slots__ = (
        "_at_start",
        "_clean",
        "_error",
        "_event_chars",
        "_last_id",
        "_line_bytes",
        "_lines",
        "_sse",
        "_text",
    )

    def __init__(self) -> None:
        # Strict: a model's tokens must not silently turn into U+FFFD. (Not "utf-8-sig":
        # its decoder accepts a truncated BOM at end of stream without an error.)
        self._text = codecs.getincrementaldecoder("utf-8")("strict")
        self._at_start = True  # WHATWG: one U+FEFF at the very start of the stream is dropped
        self._lines = SSELineDecoder()
        self._sse = SSEDecoder()
        self._line_bytes = 0  # bytes of the current, unterminated line
        self._event_chars = 0  # characters of field lines in the current event
        self._error: UpstreamError | None = None
        # Nothing is held back: no partial line, event or character (the last chunk
        # ended with a blank line, or none came yet). Then a chunk of whole data-only
        # events can take the fast path.
        self._clean = True
        self._last_id = ""  # the id every event carries until an id field changes it

    def feed(self, data: bytes) -> list[SSEMessage]:
        """Decode one chunk of the body; return the events it completed, in order."""
        if self._error is not None:
            raise self._error
        if not data:
            return []
        if self._clean and data[-2:] == b"\n\n" and b"\r" not in data:
            messages = self._data_events(data)
            if messages is not None:
                return messages
        overflow = self._line_overflow(data)
        if overflow >= 0:
            # Report the earliest fault in byte order, however the stream was chunked:
            # the bytes before the overflow may hold an invalid character or a huge event.
            self._decode(data[:overflow])
            raise self._fail(f"upstream SSE line longer than {MAX_LINE_BYTES} bytes")
        messages = self._decode(data)
        self._clean = data[-2:] == b"\n\n"
        if messages:
            self._last_id = messages[-1].id
        return messages

    def _data_events(self, data: bytes) -> list[SSEMessage] | None:
        """The fast path, for what OpenAI-compatible servers send: whole events of one
        ``data:`` line each, ``\n`` line ends. ``None``: anything else (other fields,
        comments, blank-line runs, a BOM at the start, invalid UTF-8, a line over the
        limit), which the general path decodes, with the same result."""
        if self._at_start and data[:3] == b"\xef\xbb\xbf":
            return None
        out: list[SSEMessage] = []
        last_id = self._last_id
        for line in data[:-2].split(b"\n\n"):
            if line[:5] != b"data:" or b"\n" in line or len(line) > MAX_LINE_BYTES:
                return None
            try:
                text = line[6:].decode() if line[5:6] == b" " else line[5:].decode()
            except UnicodeDecodeError:
                return None
            if len(line) > MAX_EVENT_CHARS:
                return None
            out.append(SSEMessage(text, "message", last_id))
        self._at_start = False
        return out

    def close(self) -> list[SSEMessage]:
        """End of stream: flush held-back bytes; an unterminated event is discarded."""
        if self._error is not None:
            raise self._error
        try:
            # Returns "" or raises: only a truncated multi-byte character can be held back.
            self._text.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise self._fail(f"upstream sent invalid UTF-8 ({exc.reason})") from exc
        return self._dispatch(self._lines.flush())

    def _decode(self, data: bytes) -> list[SSEMessage]:
        try:
            text = self._text.decode(data)
        except UnicodeDecodeError as exc:
            # As in feed(): the valid text before the bad byte may complete a huge event.
            self._text_to_messages(exc.object[: exc.start].decode())
            raise self._fail(f"upstream sent invalid UTF-8 ({exc.reason})") from exc
        return self._text_to_messages(text) if text else []

    def _text_to_messages(self, text: str) -> list[SSEMessage]:
        if self._at_start and text:
            self._at_start = False
            if text[0] == "\ufeff":
                text = text[1:]
        if not text:  # so far only part of a multi-byte character, or the BOM
            return []
        return self._dispatch(self._lines.decode(text))

    def _line_overflow(self, data: bytes) -> int:
        """Index in ``data`` of the first byte beyond the line limit, or -1; tracks the
        length of the unterminated line."""
        pending = self._line_bytes + len(data)
        if pending <= MAX_LINE_BYTES:  # fast path: no line in this chunk can be too long
            if data[-1] in b"\r\n":  # the usual chunk: whole events
                self._line_bytes = 0
            else:
                last = max(data.rfind(b"\n"), data.rfind(b"\r"))
                self._line_bytes = pending if last < 0 else len(data) - last - 1
            return -1
        start, length = 0, self._line_bytes
        for match in _LINE_BREAK.finditer(data):
            if length + match.start() - start > MAX_LINE_BYTES:
                break
            start, length = match.end(), 0
        if length + len(data) - start > MAX_LINE_BYTES:
            return start + MAX_LINE_BYTES - length
        self._line_bytes = length + len(data) - start
        return -1

    def _dispatch(self, lines: list[str]) -> list[SSEMessage]:
        out: list[SSEMessage] = []
        decode = self._sse.decode
        for line in lines:
            if line:
                self._event_chars += len(line)
                if self._event_chars > MAX_EVENT_CHARS:
                    raise self._fail(f"upstream SSE event longer than {MAX_EVENT_CHARS} chars")
                decode(line)
                continue
            self._event_chars = 0
            sse = decode(line)
            if sse is not None:
                out.append(SSEMessage(sse.data, sse.event, sse.id, sse.retry))
        return out

    def _fail(self, message: str) -> UpstreamError:
        self._error = _protocol_error(message)
        return self._error
