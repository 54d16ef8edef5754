"""Reasoning apart from the answer: ``<think>…</think>`` in a stream of model text.

Reasoning models (DeepSeek-R1, Qwen3, QwQ, many small fine-tunes) write their chain of
thought first, inside ``<think>…</think>`` (some ``<thinking>…</thinking>``), then the
answer. The OpenAI-compatible proxy sends the first as ``reasoning_content`` and the
second as ``content``; :class:`ReasoningSplitter` tells them apart as the text streams::

    splitter = ReasoningSplitter()
    for chunk in deltas:
        reasoning, content = splitter.feed(chunk)
    reasoning, content = splitter.close()

:func:`split_reasoning` does the same for a whole reply, and is by definition what any
chunking of it gives.

The rules:

* Only a block at the very start counts: ``<think>`` or ``<thinking>`` after optional
  whitespace (the whitespace is dropped). Tags anywhere later, including a second block
  after the first, are content: a model explaining the tags must not lose its answer.
* ``starts_in_reasoning=True`` is for chat templates that open the tag in the prompt
  (DeepSeek-R1's, Qwen3's with thinking on): the reply begins inside the reasoning, and
  its first closing tag ends it. An opening tag the model writes anyway is dropped.
  Without the flag a reply with no opening tag is all content, ``</think>`` included.
* The closing tag matches the opening one (``</think>`` for ``<think>``, ``</thinking>``
  for ``<thinking>``; either when the opening was implicit). The newlines right after it
  are not content (templates put one or two there).
* A block still open at ``close()`` is all reasoning: the model ran out of tokens while
  thinking, and there is no answer.

Theory of operation
-------------------
The splitter is a state machine in the style of the sentinel tokenizer (``tokenizer.py``)
and has the same latency rule: every character that cannot be part of a tag is released
by the ``feed`` call that delivered it. Only a run that could still become a tag is held
back, and never anything else, except the whitespace before an opening tag (it is dropped
if the tag comes, released if it does not).

    state       what we are reading                     leaves to
    ---------   -------------------------------------   ----------------------------------
    START       leading whitespace, a partial opening   REASONING on a whole opening tag,
                tag (held)                              or on anything else when
                                                        ``starts_in_reasoning``; else
                                                        CONTENT (the held text is content)
    REASONING   reasoning; a partial closing tag at     NEWLINES on the closing tag
                the end (held)
    NEWLINES    newlines after the closing tag          CONTENT on any other character
                (dropped)
    CONTENT     the answer: no more tags                -
    CLOSED      after ``close()``                       -

Each tag starts with ``<`` and has no other ``<``, so a held partial tag is always the
text from the last ``<`` on, and a chunk with no ``<`` (nearly every token) is released
whole after one C-level ``in`` test.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ReasoningSplitter",
    "split_reasoning",
]

# Opening tag -> the closing tags it takes. The implicit opening takes either.
_OPENINGS: Final = {"<think>": ("</think>",), "<thinking>": ("</thinking>",)}
_ANY_CLOSING: Final = ("</think>", "</thinking>")
_NEWLINES: Final = "\r\n"

_START: Final = 0
_REASONING: Final = 1
_NEWLINES_AFTER: Final = 2
_CONTENT: Final = 3
_CLOSED: Final = 4


class ReasoningSplitter:
    """Splits streamed model text into (reasoning, content); see the module docstring.

    ``feed`` and ``close`` return what each chunk releases, as ``(reasoning, content)``;
    joined, the results of all calls are what :func:`split_reasoning` gives for the whole
    text. Using the splitter after ``close()`` raises ``RuntimeError``.
    """

    __slots__ = ("_closings", "_held", "_implicit", "_state")

    def __init__(self, *, starts_in_reasoning: bool = False) -> None:
        self._implicit = starts_in_reasoning
        self._state = _START
        self._held = ""
        self._closings: tuple[str, ...] = _ANY_CLOSING

    def feed(self, text: str) -> tuple[str, str]:
        """Consume a chunk; return the (reasoning, content) it releases."""
        state = self._state
        # The per-token fast paths: one state test and, in reasoning, one C-level scan.
        if state == _CONTENT:
            return "", text
        if state == _REASONING and not self._held and "<" not in text:
            return text, ""
        if state == _CLOSED:
            raise RuntimeError("ReasoningSplitter used after close()")
        return self._step(text)

    def close(self) -> tuple[str, str]:
        """End of the text: release what was held back."""
        state, held = self._state, self._held
        if state == _CLOSED:
            raise RuntimeError("ReasoningSplitter used after close()")
        self._state, self._held = _CLOSED, ""
        if state == _REASONING or (state == _START and self._implicit):
            return held, ""
        return "", held  # START without the flag: whitespace or a partial opening tag

    def _step(self, text: str) -> tuple[str, str]:
        reasoning = ""
        if self._state == _START:
            buf = self._held + text
            rest = buf.lstrip()
            for opening, closings in _OPENINGS.items():
                if rest.startswith(opening):
                    self._state, self._held, self._closings = _REASONING, "", closings
                    text = rest[len(opening) :]
                    break
            else:
                if any(opening.startswith(rest) for opening in _OPENINGS):
                    self._held = buf  # whitespace, maybe with a partial opening tag
                    return "", ""
                self._held = ""
                if not self._implicit:
                    self._state = _CONTENT
                    return "", buf
                self._state = _REASONING
                text = buf
        if self._state == _REASONING:
            buf = self._held + text
            end, closing = _find_first(buf, self._closings)
            if end < 0:
                cut = _partial_tag_start(buf, self._closings)
                self._held = buf[cut:]
                return buf[:cut], ""
            self._state, self._held = _NEWLINES_AFTER, ""
            reasoning, text = buf[:end], buf[end + len(closing) :]
        # NEWLINES_AFTER: drop the newlines after the closing tag, then it is all content.
        content = text.lstrip(_NEWLINES)
        if content:
            self._state = _CONTENT
        return reasoning, content


def _find_first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """The position of the first of ``tags`` in ``text`` and which one; (-1, "") if none."""
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, tag
    return best, found


def _partial_tag_start(text: str, tags: tuple[str, ...]) -> int:
    """Where the end of ``text`` could start one of ``tags`` (len(text) if nowhere).

    Tags have one ``<``, at their start, so only the run from the last ``<`` can be one.
    """
    at = text.rfind("<")
    if at >= 0:
        tail = text[at:]
        if any(tag.startswith(tail) for tag in tags):
            return at
    return len(text)


def split_reasoning(text: str, *, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """``(reasoning, content)`` of a whole reply (the rules are the module docstring's)."""
    splitter = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning)
    reasoning, content = splitter.feed(text)
    more_reasoning, more_content = splitter.close()
    return reasoning + more_reasoning, content + more_content
