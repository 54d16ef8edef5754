"""A small GBNF matcher for tests: does a grammar accept a whole text?

It reads the GBNF subset ``toolforge.core.gbnf`` writes, with llama.cpp's syntax rules
(src/llama-grammar.cpp): rules ``name ::= alternatives`` (names of ``a-z A-Z 0-9 -``),
string literals and character classes with llama.cpp's escapes (``\\x`` ``\\u`` ``\\U``
``\\t`` ``\\r`` ``\\n`` ``\\\\`` ``\\"`` ``\\[`` ``\\]`` ``\\-``), negated classes and ranges,
groups, empty alternatives, ``?`` ``*`` ``+`` ``{m}`` ``{m,}`` ``{m,n}``, rule references
and ``#`` comments. Matching is recursive descent over sets of end positions, memoised per
(rule, position), so ambiguity costs no backtracking. Left recursion is not supported
(llama.cpp refuses it too).

``parse`` also checks what llama.cpp would refuse: an undefined rule, a missing
``root``, and a bounded repetition of a group (llama.cpp multiplies the group's rules by
the bound and rejects a grammar past 2,000 rules; ``toolforge.core.gbnf`` never does it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Grammar", "GrammarSyntaxError", "parse"]


class GrammarSyntaxError(ValueError):
    pass


@dataclass(frozen=True, slots=True, eq=False)
class Lit:
    text: str


@dataclass(frozen=True, slots=True, eq=False)
class Cls:
    ranges: tuple[tuple[int, int], ...]
    negated: bool

    def has(self, ch: str) -> bool:
        code = ord(ch)
        inside = any(lo <= code <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(frozen=True, slots=True, eq=False)
class Ref:
    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Rep:
    item: Node
    lo: int
    hi: int | None


Node = Lit | Cls | Ref | Seq | Alt | Rep

_WORD = re.compile(r"[A-Za-z0-9-]+")
_SIMPLE_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}


@dataclass
class Grammar:
    rules: dict[str, Node]
    _memo: dict[tuple[object, int], frozenset[int]] = field(default_factory=dict)

    def accepts(self, text: str, rule: str = "root") -> bool:
        """Whether ``rule`` matches the whole of ``text``."""
        self._memo.clear()
        self._text = text
        return len(text) in self._ends(Ref(rule), 0)

    def _ends(self, node: Node, pos: int) -> frozenset[int]:
        key: tuple[object, int] = (node.name if isinstance(node, Ref) else id(node), pos)
        found = self._memo.get(key)
        if found is not None:
            return found
        text = self._text
        result: frozenset[int]
        match node:
            case Lit(s):
                result = frozenset({pos + len(s)}) if text.startswith(s, pos) else frozenset()
            case Cls():
                ok = pos < len(text) and node.has(text[pos])
                result = frozenset({pos + 1}) if ok else frozenset()
            case Ref(name):
                self._memo[key] = frozenset()  # left recursion finds nothing, never loops
                result = self._ends(self.rules[name], pos)
            case Seq(items):
                current = frozenset({pos})
                for item in items:
                    current = frozenset(e for p in current for e in self._ends(item, p))
                    if not current:
                        break
                result = current
            case Alt(options):
                result = frozenset(e for option in options for e in self._ends(option, pos))
            case Rep(item, lo, hi):
                done: set[int] = {pos} if lo == 0 else set()
                frontier = {pos}
                count = 0
                while frontier and (hi is None or count < hi):
                    count += 1
                    frontier = {e for p in frontier for e in self._ends(item, p)}
                    if count >= lo:
                        if hi is None:
                            frontier -= done  # nothing new can follow a position seen
                        done |= frontier
                result = frozenset(done)
        self._memo[key] = result
        return result


def parse(source: str) -> Grammar:
    """Parse GBNF text; raises :class:`GrammarSyntaxError` where llama.cpp would."""
    parser = _Parser(source)
    rules = parser.grammar()
    if "root" not in rules:
        raise GrammarSyntaxError("no root rule")
    for name, node in rules.items():
        for ref in _refs(node):
            if ref not in rules:
                raise GrammarSyntaxError(f"rule {name!r} refers to undefined rule {ref!r}")
    return Grammar(rules)


def _refs(node: Node) -> list[str]:
    match node:
        case Ref(name):
            return [name]
        case Seq(items) | Alt(items):
            return [r for item in items for r in _refs(item)]
        case Rep(item, _, _):
            return _refs(item)
    return []


class _Parser:
    def __init__(self, source: str) -> None:
        self.s = source
        self.i = 0

    def error(self, message: str) -> GrammarSyntaxError:
        return GrammarSyntaxError(f"{message} at {self.s[self.i : self.i + 40]!r}")

    def space(self, newline_ok: bool) -> None:
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif ch in " \t" or (newline_ok and ch in "\r\n"):
                self.i += 1
            else:
                break

    def grammar(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.space(True)
        while self.i < len(self.s):
            m = _WORD.match(self.s, self.i)
            if m is None:
                raise self.error("expecting name")
            self.i = m.end()
            self.space(False)
            if not self.s.startswith("::=", self.i):
                raise self.error("expecting ::=")
            self.i += 3
            self.space(True)
            if m[0] in rules:
                raise self.error(f"rule {m[0]!r} defined twice")
            rules[m[0]] = self.alternates(nested=False)
            if self.i < len(self.s) and self.s[self.i] not in "\r\n":
                raise self.error("expecting newline or end")
            self.space(True)
        return rules

    def alternates(self, *, nested: bool) -> Node:
        options = [self.sequence(nested=nested)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            self.space(True)
            options.append(self.sequence(nested=nested))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def char(self) -> str:
        s = self.s
        if s[self.i] != "\\":
            self.i += 1
            return s[self.i - 1]
        kind = s[self.i + 1]
        if kind in _SIMPLE_ESCAPES or kind == "-":
            self.i += 2
            return _SIMPLE_ESCAPES.get(kind, kind)
        width = {"x": 2, "u": 4, "U": 8}.get(kind)
        if width is None:
            raise self.error("unknown escape")
        digits = s[self.i + 2 : self.i + 2 + width]
        if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
            raise self.error("bad hex escape")
        self.i += 2 + width
        return chr(int(digits, 16))

    def sequence(self, *, nested: bool) -> Node:
        items: list[Node] = []
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch == '"':
                self.i += 1
                out = []
                while True:
                    if self.i >= len(self.s):
                        raise self.error("unterminated literal")
                    if self.s[self.i] == '"':
                        break
                    out.append(self.char())
                self.i += 1
                items.append(Lit("".join(out)))
            elif ch == "[":
                self.i += 1
                negated = self.s.startswith("^", self.i)
                self.i += negated
                ranges: list[tuple[int, int]] = []
                while True:
                    if self.i >= len(self.s):
                        raise self.error("unterminated class")
                    if self.s[self.i] == "]":
                        break
                    lo = self.char()
                    hi = lo
                    if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                        self.i += 1
                        hi = self.char()
                    ranges.append((ord(lo), ord(hi)))
                self.i += 1
                items.append(Cls(tuple(ranges), negated))
            elif ch == "(":
                self.i += 1
                self.space(True)
                inner = self.alternates(nested=True)
                if self.i >= len(self.s) or self.s[self.i] != ")":
                    raise self.error("expecting )")
                self.i += 1
                items.append(_Group(inner))
            elif _WORD.match(ch):
                m = _WORD.match(self.s, self.i)
                assert m is not None
                self.i = m.end()
                items.append(Ref(m[0]))
            elif ch in "*+?{":
                if not items:
                    raise self.error("expecting an item before a repetition")
                lo, hi = self.repetition()
                last = items.pop()
                if isinstance(last, _Group) and ch == "{" and (hi is None or hi > 1):
                    raise self.error("bounded repetition of a group (llama.cpp multiplies it)")
                items.append(Rep(_unwrap(last), lo, hi))
            else:
                break
            self.space(nested)
        return Seq(tuple(_unwrap(item) for item in items))

    def repetition(self) -> tuple[int, int | None]:
        ch = self.s[self.i]
        self.i += 1
        if ch != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        m = re.compile(r"\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}").match(self.s, self.i)
        if m is None:
            raise self.error("bad {m,n}")
        self.i = m.end()
        lo = int(m[1])
        if m[2] is None:
            return lo, lo
        return lo, int(m[3]) if m[3] else None


@dataclass(frozen=True, slots=True, eq=False)
class _Group:
    inner: Node


def _unwrap(node: Node | _Group) -> Node:
    return node.inner if isinstance(node, _Group) else node
