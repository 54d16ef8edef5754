"""The text a GBNF grammar forces before and after the part the model chooses.

Theory of operation: a constrained turn's grammar often starts and ends with literals the
model has no choice about: a tool call's ``⟦BEGIN_TOOL_CALL id=t1 name=places.search⟧`` and
``⟦END_TOOL_CALL id=t1⟧`` are 24 and 17 of SmolLM2's tokens, against about 11 for the
arguments between them. llama-server decodes a forced token exactly as a free one: one
forward pass each. :func:`forced_text` finds that text, so the llama-server adapter can send
the prefix as the start of the assistant's reply (processed as prompt, in one batch) and
write the suffix itself once the grammar of the middle is complete
(docs/performance.md, "The booking demo, end to end").

The grammar is read, not compiled: rules one per line (``name ::= body``, the shape
:mod:`toolforge.core.gbnf` renders), string literals with GBNF's escapes. From ``root``, a
body that is a single sequence (no top-level ``|``) gives up its leading and trailing
string literals; a rule name or group at either end whose body is one sequence is written
in its place, and peeling goes on inside it.
A suffix is only taken off when what remains ends with a literal on every path (a closing
``}`` or ``"``): where the middle could go on (a bare number), ending it is the model's
choice of the suffix's first character, which an end of generation would not be.
Anything this reader does not recognise gives ``None``: the grammar is then sent whole.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

__all__ = ["ForcedText", "forced_text"]

_RULE: Final = re.compile(r"^([A-Za-z0-9_-]+) ::= (.*)$")
_NAME: Final = re.compile(r"[A-Za-z0-9_-]+")
_REPEAT: Final = re.compile(r"[*+?]|\{\d+(?:,\d*)?\}")
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "[": "[", "]": "]"}
_HEX: Final = {"x": 2, "u": 4, "U": 8}
_MAX_DEPTH: Final = 16  # rule names followed from root; the gateway's nest two or three


@dataclass(frozen=True, slots=True)
class ForcedText:
    """``grammar`` holds the model to what lies between ``prefix`` and ``suffix``; the
    whole grammar's language is ``prefix + middle + suffix``."""

    prefix: str
    suffix: str
    grammar: str


@dataclass(frozen=True, slots=True)
class _Item:
    kind: str  # "lit", "name", "group", "class", "alt"
    source: str  # as written, repetition included
    value: str = ""  # a literal's text; a group's inner body; a name
    repeated: bool = False


class _Unreadable(Exception):
    """The grammar uses something this reader does not parse: send it whole."""


@functools.lru_cache(maxsize=64)
def forced_text(grammar: str, *, suffix: bool = True) -> ForcedText | None:
    """The forced prefix and suffix of ``grammar`` and the grammar of the rest, or None
    when it forces nothing at either end (or cannot be read). ``suffix=False`` keeps the
    suffix in the grammar (a request whose stop strings could end the middle early)."""
    try:
        return _split(grammar, take_suffix=suffix)
    except _Unreadable:
        return None


def _split(grammar: str, *, take_suffix: bool) -> ForcedText | None:
    rules: dict[str, str] = {}
    for line in grammar.splitlines():
        if not line.strip():
            continue
        match = _RULE.match(line)
        if match is None:
            raise _Unreadable(line)
        rules[match[1]] = match[2]
    if "root" not in rules:
        return None
    seq = _sequence(rules["root"])
    if seq is None:
        return None
    head: list[str] = []
    tail: list[str] = []
    for _ in range(_MAX_DEPTH):
        while seq and seq[0].kind == "lit" and not seq[0].repeated:
            head.append(seq.pop(0).value)
        while take_suffix and seq and seq[-1].kind == "lit" and not seq[-1].repeated:
            if not _closed(seq[:-1], rules, _MAX_DEPTH):
                break
            tail.insert(0, seq.pop().value)
        # A rule or group at either end whose body is one sequence is written in its
        # place, and peeling goes on inside it.
        if seq and (first := _inlined(seq[0], rules)) is not None:
            seq = first + seq[1:]
        elif take_suffix and seq and (last := _inlined(seq[-1], rules)) is not None:
            seq = seq[:-1] + last
        else:
            break
    if not seq or not (head or tail):
        return None  # nothing forced, or nothing left for the model to choose
    body = " ".join(item.source for item in seq)
    lines = [f"root ::= {body}"] + [f"{k} ::= {v}" for k, v in rules.items() if k != "root"]
    return ForcedText("".join(head), "".join(tail), "\n".join(lines) + "\n")


def _inlined(item: _Item, rules: dict[str, str]) -> list[_Item] | None:
    """The items ``item`` stands for, when it is an unrepeated rule name or group whose
    body is one sequence beginning or ending with a literal, or one more such name or
    group (else None)."""
    if item.repeated or item.kind not in ("name", "group"):
        return None
    body = rules.get(item.value) if item.kind == "name" else item.value
    seq = _sequence(body) if body is not None else None
    if not seq:
        return None
    chain = len(seq) == 1 and not seq[0].repeated and seq[0].kind in ("name", "group")
    return seq if chain or seq[0].kind == "lit" or seq[-1].kind == "lit" else None


def _closed(seq: list[_Item], rules: dict[str, str], depth: int) -> bool:
    """Whether every string ``seq`` matches ends where the sequence does: its last item is
    an unrepeated literal or character class, or a rule or group each of whose
    alternatives is closed."""
    if not seq or depth <= 0:
        return False
    last = seq[-1]
    if last.repeated:
        return False
    if last.kind == "lit":
        return bool(last.value)
    if last.kind == "class":
        return True  # one character
    if last.kind not in ("name", "group"):
        return False
    body = rules.get(last.value) if last.kind == "name" else last.value
    if body is None:
        return False
    return all(_closed(alt, rules, depth - 1) for alt in _alternatives(_items(body)))


def _sequence(body: str) -> list[_Item] | None:
    """``body``'s items when it is one sequence (no top-level alternation), else None."""
    items = _items(body)
    return None if any(item.kind == "alt" for item in items) else items


def _alternatives(items: list[_Item]) -> list[list[_Item]]:
    out: list[list[_Item]] = [[]]
    for item in items:
        if item.kind == "alt":
            out.append([])
        else:
            out[-1].append(item)
    return out


def _items(body: str) -> list[_Item]:
    items: list[_Item] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch in " \t":
            i += 1
            continue
        start = i
        if ch == "|":
            items.append(_Item("alt", "|"))
            i += 1
            continue
        if ch == '"':
            value, i = _literal(body, i + 1)
            kind = "lit"
        elif ch == "[":
            i = _skip_class(body, i + 1)
            kind, value = "class", ""
        elif ch == "(":
            i = _skip_group(body, i + 1)
            kind, value = "group", body[start + 1 : i - 1]
        elif (name := _NAME.match(body, i)) is not None:
            kind, value, i = "name", name[0], name.end()
        else:
            raise _Unreadable(body[i:])
        repeat = _REPEAT.match(body, i)
        if repeat is not None:
            i = repeat.end()
        items.append(_Item(kind, body[start:i], value, repeat is not None))
    return items


def _literal(body: str, i: int) -> tuple[str, int]:
    """The text of the literal whose first character is at ``i``; the index after it."""
    out: list[str] = []
    while i < len(body):
        ch = body[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _HEX:
            digits = body[i + 2 : i + 2 + _HEX[code]]
            if len(digits) != _HEX[code] or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise _Unreadable(body[i:])
            out.append(chr(int(digits, 16)))
            i += 2 + _HEX[code]
        elif code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
        else:
            raise _Unreadable(body[i:])
    raise _Unreadable("unterminated literal")


def _skip_class(body: str, i: int) -> int:
    while i < len(body):
        if body[i] == "\\":
            i += 2
        elif body[i] == "]":
            return i + 1
        else:
            i += 1
    raise _Unreadable("unterminated character class")


def _skip_group(body: str, i: int) -> int:
    depth = 1
    while i < len(body):
        ch = body[i]
        if ch == '"':
            _, i = _literal(body, i + 1)
            continue
        if ch == "[":
            i = _skip_class(body, i + 1)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Unreadable("unterminated group")
