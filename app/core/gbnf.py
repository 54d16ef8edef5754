"""GBNF grammars for ``constrained`` mode (docs/protocol.md). Pure: schemas in, text out.

llama-server samples only the tokens its request's ``grammar`` allows, so with the grammar
written here even a 135M-parameter model emits well-formed frames whose bodies have the
shape of their JSON Schemas. :class:`FrameGrammar` writes the grammar of one model turn;
:func:`json_value_grammar` the JSON-only grammar of the model-repair call.

Theory of operation
-------------------
One turn, as a grammar (docs/protocol.md's sentinel grammar, each body replaced by its schema)::

    root     ::= text ( call-1 | call-2 | ... | objects? result )
    text     ::= up to 200 characters of free text, never ⟦ or ⟧
    call-1   ::= "⟦BEGIN_TOOL_CALL id=t2 name=places.search⟧" ARGS "⟦END_TOOL_CALL id=t2⟧"
    objects  ::= object-1 text ( object-2 text ( ... )? )?
    object-1 ::= "⟦BEGIN_OBJECT id=o1 schema=Action⟧" ACTION "⟦END_OBJECT id=o1⟧" | ...
    result   ::= "⟦BEGIN_RESULT id=r1 schema=AssistantReply⟧" REPLY "⟦END_RESULT id=r1⟧"

The grammar ends at the last END, so the model can only stop there: after a tool call
(the gateway closes the upstream at its END anyway, docs/protocol.md) or after the result. The free
text is bounded, so a model that would ramble is pushed into a frame, and it can never
hold a sentinel character, so it can never open a malformed frame.

GBNF has no back-references: an END cannot repeat "whatever id the BEGIN had". The ids are
therefore fixed per turn (:class:`TurnIds`: the next unused ``tN``, ``oN``, ``rN`` after
those the stream's tokenizer has seen, :func:`next_turn_ids`), and BEGIN and END spell the
same literal. The schemas are converted once per stream (a :class:`FrameGrammar`); a turn
only adds its few id-bearing rules.

JSON Schema to GBNF, for the subset our schemas (pydantic's output, the demo tools, the
usual inline schemas) use:

    keyword                         grammar
    ------------------------------  ------------------------------------------------------
    type (or a list of types)       that JSON type (a list: any of them)
    properties, required            an object with the properties in declared order; the
                                    required ones always, the optional ones may be left out
    additionalProperties            a schema: extra members of that schema after the declared
                                    ones; false, or absent next to properties: none;
                                    absent without properties: any members
    items, minItems, maxItems       an array of ``items``, its length bounded
    minLength, maxLength            a string of that many characters (``char{m,n}``)
    pattern                         a regex subset (``^...$``, classes, groups, ``|``,
                                    quantifiers, ``\\d``, ``\\w``, ``.``), each unbounded
                                    quantifier capped at maxLength; else ignored
    enum, const                     those JSON values, literally (compact JSON)
    minimum, maximum, exclusive*    the range, digit by digit (integers exactly; numbers
                                    exactly at whole bounds, a little wider at fractional
                                    ones); a bounded number is written without exponent
    anyOf, oneOf                    any branch (oneOf's "exactly one" is not enforced)
    allOf                           the parts merged into one schema (approximately)
    $ref into $defs / definitions   one rule per target, so recursive schemas work
    readOnly: true                  an optional property the model never writes
    format, other keywords          ignored

Anything else (``{}``, ``true``, an unknown type, an unresolvable ``$ref``) is a generic
JSON value whose nesting is bounded by ``max_depth`` (docs/protocol.md: 16), counted from the top
of the body. The grammar steers; it is not the guarantee. Every body is still parsed
strictly and validated against its schema (``toolforge.core.guarantee``), so a grammar that
allows more than the schema (an ignored keyword, a generic fallback) costs at most a
repair, and one that allows less (a fixed key order) only narrows how a valid value may
be spelled.

Strings never contain a raw ``⟦``/``⟧`` (a model must write ``\\u27E6``/``\\u27E7``,
docs/protocol.md) nor a control character; every JSON escape is allowed except lone surrogates
(strict JSON, docs/protocol.md). Whitespace between tokens is one space, or one newline and up to
eight blanks of indent: a small model given unbounded whitespace can loop on newlines until
``max_tokens`` (llama.cpp's own converter bounds it too, at two newlines and twenty blanks),
and compact or two-level pretty-printed JSON still fits. Numbers have at most 16
integer digits (the validator's 64-bit range) and 24 fraction digits (a float's shortest
spelling needs at most 21).

Budget: a small model that loops inside a string or an array ("0000...", the same citation
again and again) runs into ``max_tokens`` inside its frame, which is then malformed
(``FRAME_UNCLOSED``). Given the turn's ``max_tokens``, what the schemas leave unbounded is
bounded to fit: strings to ``max_tokens / 4`` characters, arrays and open objects to
``max_tokens / 128`` members (at least 16 and 2); an explicit ``maxLength`` or ``maxItems``
is kept as it is. The members of an array of unbounded strings share one string's budget
(``max_tokens / 4`` characters over the member bound: 32 characters each, at least 16): a
135M model looping inside every citation writes about one token per character, and
seven full-length strings did not fit their turn. The values this excludes are valid, but
a turn that spends its budget on one of them would most likely not have closed its frame
anyway. Without ``max_tokens``,
nothing is added.

Sizes: llama.cpp expands ``x{m,n}`` into ``n - m`` rules and refuses a grammar whose
repetitions multiply past 2,000 rules. Every bounded repetition here applies to a single
rule, character class or literal (never a group), and bounds above 1,000 become unbounded
(minimums are capped at 1,000; validation catches the difference).
"""

# Why by hand: no well-kept PyPI library composes JSON-Schema grammars with a grammar of
# our own (the frames around them); llama.cpp's converter (common/json-schema-to-grammar)
# is C++ with a script copy that is not on PyPI; llguidance would need a Rust-enabled build
# that the registries here cannot provide. The subset we need is small and tested against
# a matcher (tests/core/gbnf_matcher.py) and a real llama-server.

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from toolforge.core.events import FrameKind
from toolforge.core.patterns import FORMAT_PATTERNS
from toolforge.core.protocol import sentinels

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_OBJECTS",
    "DEFAULT_MAX_TEXT_CHARS",
    "FrameGrammar",
    "TurnIds",
    "decoding_gaps",
    "frame_grammar",
    "json_value_grammar",
    "next_turn_ids",
]

DEFAULT_MAX_TEXT_CHARS: Final = 200
"""Free text before each frame: room for a sentence, not for a ramble."""
DEFAULT_MAX_OBJECTS: Final = 4
"""OBJECT frames the grammar allows before the result, each with its own id."""
DEFAULT_MAX_DEPTH: Final = 16
"""docs/protocol.md's JSON depth limit: containers a body may nest."""

# llama.cpp refuses repetitions that expand past 2,000 rules (MAX_REPETITION_THRESHOLD).
_MAX_REPEAT: Final = 1000
# A number's integer digits at most: the validator's 64-bit range (see "nat").
_MAX_DIGITS: Final = 16
# A fraction with a non-zero digit (above a strict whole lower bound: "0.5" in "> 0"), and
# one of zeros only (at a whole upper bound: "50.0" in "<= 50").
_NONZERO_FRACTION: Final = '"." "0"{0,23} [1-9] [0-9]{0,23}'
_ZERO_FRACTION: Final = '( "." "0"{1,24} )?'
_ANY_FRACTION: Final = '( "." [0-9]{1,24} )?'
# $ref chains followed before giving up (a -> b -> a).
_MAX_REF_HOPS: Final = 32
# An array's string members share a string's budget, down to this many characters each.
_MIN_SHARED_CHARS: Final = 16
# Per-turn bounds from max_tokens (see "Budget" above): characters and members per token.
_CHARS_PER_TOKEN_BUDGET: Final = 1 / 4
_ITEMS_PER_TOKEN_BUDGET: Final = 1 / 128
_SEEN_ID_RE: Final = re.compile(r"([tor])([0-9]{1,18})")
# Keywords that say nothing about the value's shape.
_ANNOTATIONS: Final = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$schema",
        "$id",
        "$anchor",
        "$defs",
        "definitions",
        "discriminator",
        "format",
    }
)

# A JSON string's characters: no quote, backslash, control character or sentinel raw;
# every escape, surrogates only as a high-low pair.
# The sentinel characters as GBNF writes them inside a character class.
_SENTINEL_CLASS: Final = "".join(f"\\u{ord(ch):04X}" for ch in (sentinels.OPEN, sentinels.CLOSE))
_SAFE: Final = '"\\\\\\x00-\\x1F' + _SENTINEL_CLASS  # as it appears inside [^...]
_PRIMITIVES: Final = {
    "ws": r'( " " | "\n" [ \t]{0,8} )?',
    "hex": r"[0-9a-fA-F]",
    "char": (
        f"[^{_SAFE}]"
        r' | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-Ce-fE-F] hex{3} | [dD] [0-7] hex{2}'
        r' | [dD] [89abAB] hex{2} "\\u" [dD] [c-fC-F] hex{2} ) )'
    ),
    "string": r'"\"" char* "\""',
    "nat": r'"0" | [1-9] [0-9]{0,15}',
    "integer": r'"-"? nat',
    "unsigned": r'nat ( "." [0-9]{1,24} )? ( [eE] [-+]? [0-9]{1,3} )?',
    "number": r'"-"? unsigned',
    "boolean": r'"true" | "false"',
    "null": r'"null"',
}
_TEXT_CLASS: Final = f"[^{_SENTINEL_CLASS}\\x00-\\x08\\x0B-\\x1F\\x7F]"
_TURN_RULES: Final = ("root", "text", "objects", "result")


@dataclass(frozen=True, slots=True)
class TurnIds:
    """The frame ids one turn may use: fixed, so each END can repeat its BEGIN's id."""

    call: str
    objects: tuple[str, ...]
    result: str

    def __post_init__(self) -> None:
        for frame_id in (self.call, *self.objects, self.result):
            if not sentinels.ID_RE.fullmatch(frame_id):
                raise ValueError(f"bad frame id {frame_id!r}: use 1-64 of A-Z a-z 0-9 _ . : -")
        if len({self.call, *self.objects, self.result}) != 2 + len(self.objects):
            raise ValueError("the ids of a turn must be distinct")


def next_turn_ids(seen: Collection[str], *, max_objects: int = DEFAULT_MAX_OBJECTS) -> TurnIds:
    """The next unused ids after ``seen`` (the stream's ids so far): ``t2`` after ``t1``.

    Each kind counts from the highest number seen, so an id is never reused even when the
    model picked its own ids earlier (``t7`` then ``t8``).
    """
    top = {"t": 0, "o": 0, "r": 0}
    for frame_id in seen:
        m = _SEEN_ID_RE.fullmatch(frame_id)
        if m is not None:
            top[m[1]] = max(top[m[1]], int(m[2]))
    return TurnIds(
        call=f"t{top['t'] + 1}",
        objects=tuple(f"o{top['o'] + i}" for i in range(1, max_objects + 1)),
        result=f"r{top['r'] + 1}",
    )


class FrameGrammar:
    """The grammar of a stream's turns: its schemas converted once, ids filled in per turn.

    ``tools``: tool name -> input JSON Schema; ``result``: (schema name, schema) of the
    RESULT frame; ``objects``: schema name -> schema for OBJECT frames (none: no OBJECT
    frames). Schemas are trusted to be checked already (``toolforge.core.schemas``).
    """

    def __init__(
        self,
        *,
        tools: Mapping[str, Mapping[str, Any]],
        result: tuple[str, Mapping[str, Any]],
        objects: Mapping[str, Mapping[str, Any]] | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        max_objects: int = DEFAULT_MAX_OBJECTS,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_tokens: int | None = None,
    ) -> None:
        if max_text_chars < 0 or max_objects < 0 or max_depth < 0:
            raise ValueError("max_text_chars, max_objects and max_depth must be >= 0")
        self.max_objects = max_objects
        self._limits = _Limits.of(max_depth, max_tokens)
        self._rules = _Rules(self._limits, reserved=_TURN_RULES)
        by_name: dict[tuple[str, str], str] = {}

        def body(prefix: str, name: str, schema: Mapping[str, Any]) -> str:
            if (prefix, name) not in by_name:
                by_name[prefix, name] = _Converter(self._rules, schema).root(f"{prefix}-{name}")
            return by_name[prefix, name]

        # A tool whose name no sentinel can carry is left out: no mode could call it.
        self._tools = [
            (name, body("tool", name, s))
            for name, s in tools.items()
            if sentinels.NAME_RE.fullmatch(name)
        ]
        self._result = (result[0], body("schema", *result))
        self._objects = [(name, body("schema", name, s)) for name, s in (objects or {}).items()]
        self._text = _repeat(_TEXT_CLASS, 0, max_text_chars)
        # (tool, narrowed schema) -> its root rule and the rules it adds (for_turn).
        self._turn_bodies: dict[tuple[str, bytes], tuple[str, dict[str, str]]] = {}

    def for_turn(
        self,
        ids: TurnIds,
        *,
        allow_tools: bool = True,
        narrowed: Mapping[str, Mapping[str, Any] | None] | None = None,
        allow_result: bool = True,
        free_text: bool = True,
    ) -> str:
        """The GBNF of one turn using ``ids``; ``allow_tools=False`` leaves only the result.

        ``narrowed`` (a workflow's argument-matched prerequisites, docs/workflows.md): tool -> the
        input schema to use this turn instead of its own (an argument reduced to an
        ``enum`` of the values earlier results hold), or None to leave the tool out.
        ``allow_result=False`` leaves the RESULT frame out while a call is possible (a
        workflow ends with its terminal tool, not a RESULT frame); ``free_text=False``
        leaves out the free text before a call (a small model spends its tokens there).
        """
        rules = dict(self._rules.rules)
        text = "text " if self._text else ""
        if self._text:
            rules["text"] = self._text
        choices: list[str] = []
        lead = text
        if allow_tools:
            tools = self._tools
            if narrowed:
                tools = []
                for name, args in self._tools:
                    if name not in narrowed:
                        tools.append((name, args))
                        continue
                    schema = narrowed[name]
                    if schema is not None:
                        tools.append((name, self._narrowed_body(name, schema, rules)))
            for i, (name, args) in enumerate(tools, start=1):
                rules[f"call-{i}"] = (
                    f"{_lit(sentinels.begin(FrameKind.TOOL_CALL, ids.call, name))} "
                    f"{args} {_lit(sentinels.end(FrameKind.TOOL_CALL, ids.call))}"
                )
                choices.append(f"call-{i}")
        objects = ""
        if self._objects and ids.objects:
            for i, frame_id in enumerate(ids.objects, start=1):
                rules[f"object-{i}"] = " | ".join(
                    f"{_lit(sentinels.begin(FrameKind.OBJECT, frame_id, name))} "
                    f"{value} {_lit(sentinels.end(FrameKind.OBJECT, frame_id))}"
                    for name, value in self._objects
                )
            chain = ""
            for i in range(len(ids.objects), 0, -1):
                chain = f"object-{i} {text}" + (f"( {chain})? " if chain else "")
            rules["objects"] = chain.strip()
            objects = "objects? "
        name, value = self._result
        rules["result"] = (
            f"{_lit(sentinels.begin(FrameKind.RESULT, ids.result, name))} "
            f"{value} {_lit(sentinels.end(FrameKind.RESULT, ids.result))}"
        )
        if allow_result or not choices:
            choices.append(f"{objects}result")
        elif not free_text:
            lead = ""
        rules["root"] = f"{lead}( {' | '.join(choices)} )"
        return _render(rules)

    def _narrowed_body(self, name: str, schema: Mapping[str, Any], rules: dict[str, str]) -> str:
        """The rule of ``name``'s narrowed arguments, its rules added to ``rules``: converted
        once per distinct schema and kept (a workflow's turns narrow the same tools the same
        way until a call changes what the run holds)."""
        key = (name, orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
        cached = self._turn_bodies.pop(key, None)
        if cached is None:
            fork = self._rules.fork()
            root = _Converter(fork, schema).root(f"turn-{name}")
            base = self._rules.rules
            cached = (root, {k: v for k, v in fork.rules.items() if base.get(k) != v})
        self._turn_bodies[key] = cached  # the most recently used last
        while len(self._turn_bodies) > _TURN_BODIES:
            del self._turn_bodies[next(iter(self._turn_bodies))]
        root, added = cached
        if any(rules.get(k, v) != v for k, v in added.items()):
            # Two tools whose names reduce to the same rule name: convert this one into
            # the turn's own copy, where names are made unique.
            turn = _Rules.__new__(_Rules)
            turn.limits, turn.rules = self._limits, rules
            turn._taken, turn._pending = set(rules), set()
            turn._next, turn.size = {}, 0
            return _Converter(turn, schema).root(f"turn-{name}")
        rules.update(added)
        return root

    def json_value(self, schema: Mapping[str, Any] | bool) -> str:
        """:func:`json_value_grammar` with this grammar's limits (model repair)."""
        rules = _Rules(self._limits, reserved=("root",))
        rules.rules["root"] = _Converter(rules, schema).root("value")
        return _render(rules.rules)

    def next_turn(
        self,
        seen_ids: Collection[str],
        *,
        allow_tools: bool = True,
        narrowed: Mapping[str, Mapping[str, Any] | None] | None = None,
        allow_result: bool = True,
        free_text: bool = True,
    ) -> str:
        """The grammar of the turn after the ids in ``seen_ids`` (see :func:`next_turn_ids`)."""
        ids = next_turn_ids(seen_ids, max_objects=self.max_objects)
        return self.for_turn(
            ids,
            allow_tools=allow_tools,
            narrowed=narrowed,
            allow_result=allow_result,
            free_text=free_text,
        )


def frame_grammar(
    *,
    tools: Mapping[str, Mapping[str, Any]],
    result: tuple[str, Mapping[str, Any]],
    objects: Mapping[str, Mapping[str, Any]] | None = None,
    ids: TurnIds,
    allow_tools: bool = True,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_tokens: int | None = None,
) -> str:
    """The GBNF of one model turn (see the module docstring); one-shot :class:`FrameGrammar`."""
    grammar = FrameGrammar(
        tools=tools,
        result=result,
        objects=objects,
        max_text_chars=max_text_chars,
        max_objects=len(ids.objects),
        max_depth=max_depth,
        max_tokens=max_tokens,
    )
    return grammar.for_turn(ids, allow_tools=allow_tools)


def json_value_grammar(
    schema: Mapping[str, Any] | bool,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_tokens: int | None = None,
) -> str:
    """A grammar for one JSON value shaped by ``schema``, nothing around it (model repair)."""
    grammar = FrameGrammar(tools={}, result=("Any", {}), max_depth=max_depth, max_tokens=max_tokens)
    return grammar.json_value(schema)


def decoding_gaps(schema: object) -> list[str]:
    """Where the grammar leaves a string's constraint to validation: a ``pattern`` it
    cannot express (lookarounds, back-references, ...) or a ``format`` it has no shape for,
    each as ``"<path>: pattern '...'"``. Validation checks them all after decoding; the
    plan records the list, so a user sees which constraints the model was not held to.
    Cached by content: every constrained request of a client asks again for its tools."""
    return list(_gaps_of(orjson.dumps(schema)))


@functools.lru_cache(maxsize=256)
def _gaps_of(blob: bytes) -> tuple[str, ...]:
    schema = orjson.loads(blob)
    gaps: list[str] = []
    probe = _Rules(_Limits.of(DEFAULT_MAX_DEPTH, None))
    stack: list[tuple[object, str, int]] = [(schema, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > 64 or len(gaps) >= 32:
            break
        if isinstance(node, Mapping):
            pattern, fmt = node.get("pattern"), node.get("format")
            if isinstance(pattern, str) and _Regex(probe, "probe", None).convert(pattern) is None:
                gaps.append(f"{path}: pattern {pattern!r}")
            elif isinstance(fmt, str) and not isinstance(pattern, str):
                if fmt not in FORMAT_PATTERNS:
                    gaps.append(f"{path}: format {fmt!r}")
            for key, value in node.items():
                if key not in ("enum", "const", "default", "examples"):
                    stack.append((value, f"{path}.{key}", depth + 1))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node))
    return tuple(sorted(gaps))


# --- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Limits:
    """Nesting, and the bounds for what a schema leaves unbounded (None: unbounded)."""

    max_depth: int
    max_chars: int | None
    max_items: int | None

    @classmethod
    def of(cls, max_depth: int, max_tokens: int | None) -> _Limits:
        if max_tokens is None:
            return cls(max_depth, None, None)
        chars = max(16, int(max_tokens * _CHARS_PER_TOKEN_BUDGET))
        return cls(max_depth, chars, max(2, int(max_tokens * _ITEMS_PER_TOKEN_BUDGET)))


class _Rules:
    """Named rules, in the order they were made; names unique and GBNF-safe."""

    def __init__(self, limits: _Limits, *, reserved: Collection[str] = ()) -> None:
        self.limits = limits
        self.rules: dict[str, str] = dict(_PRIMITIVES)
        if limits.max_chars is not None:  # keys and generic strings too
            self.rules["string"] = f'"\\"" {_repeat("char", 0, limits.max_chars)} "\\""'
        self._taken = set(self.rules) | set(reserved)
        self._pending: set[str] = set()  # reserved names whose body is still being built
        self._next: dict[str, int] = {}  # the next number to try, per base name
        self.size = 0  # characters of the rules added since

    def fork(self) -> _Rules:
        """A copy to add one turn's rules to, leaving these as they are."""
        other = _Rules.__new__(_Rules)
        other.limits = self.limits
        other.rules = dict(self.rules)
        other._taken = set(self._taken)
        other._pending = set(self._pending)
        other._next = dict(self._next)
        other.size = self.size
        return other

    def reserve(self, hint: str) -> str:
        """A new name for a rule defined later (a ``$ref`` target, which may recur)."""
        name = self._new(hint)
        self._pending.add(name)
        return name

    def define(self, name: str, body: str) -> None:
        """The body of a reserved rule, unless ``add`` already filled it."""
        if name in self._pending:
            self._pending.discard(name)
            self.rules[name] = body
            self.size += len(body)

    def add(self, hint: str, body: str) -> str:
        """A rule named after ``hint``; a pending reserved ``hint`` itself gets the body."""
        if hint in self._pending:
            self._pending.discard(hint)
            self.rules[hint] = body
            self.size += len(body)
            return hint
        name = self._new(hint)
        self.rules[name] = body
        self.size += len(body)
        return name

    def _new(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9]+", "-", hint).strip("-") or "rule"
        # Numbering resumes where this base's last name stopped: a schema with thousands
        # of same-named parts costs linear time, not quadratic.
        n = self._next.get(base, 1)
        name = base if n == 1 else f"{base}-{n}"
        while name in self._taken or _NUMBERED.fullmatch(name):
            n += 1
            name = f"{base}-{n}"
        self._next[base] = n + 1
        self._taken.add(name)
        self.rules[name] = ""  # keeps its place: a rule is listed before its parts
        return name

    def generic(self, levels: int) -> str:
        """Any JSON value with at most ``levels`` nested containers (the fallback)."""
        name = f"json-value-{levels}"
        if name not in self.rules:
            scalars = "string | number | boolean | null"
            if levels == 0:
                self.rules[name] = scalars
                return name
            self.rules[name] = ""  # placed before its parts
            inner = self.generic(levels - 1)
            member = f'string ws ":" ws {inner}'
            hi = None if self.limits.max_items is None else self.limits.max_items - 1
            self.rules[f"json-members-{levels}"] = f'ws "," ws {member}'
            more = _repeat(f"json-members-{levels}", 0, hi)
            self.rules[f"json-object-{levels}"] = f'"{{" ws ( {member} {more} ws )? "}}"'
            self.rules[f"json-items-{levels}"] = f'ws "," ws {inner}'
            more = _repeat(f"json-items-{levels}", 0, hi)
            self.rules[f"json-array-{levels}"] = f'"[" ws ( {inner} {more} ws )? "]"'
            self.rules[name] = f"json-object-{levels} | json-array-{levels} | {scalars}"
        return name

    def more(self, hint: str, member: str, lo: int = 0, hi: int | None = None) -> str:
        """``ws "," ws member``, ``lo`` to ``hi`` times after a first member (``hi`` None:
        up to the member bound, less the first; "" for none)."""
        if hi is None and self.limits.max_items is not None:
            hi = max(lo, self.limits.max_items - 1)
        return _repeat(self.add(hint, f'ws "," ws {member}'), lo, hi)


_TURN_BODIES: Final = 256  # narrowed tool schemas a stream's grammar keeps converted
# Names the per-turn and generic rules use (``call-1``, ``json-value-16``).
_NUMBERED: Final = re.compile(r"(json-(value|object|array|members|items)|call|object)-[0-9]+")
_LITERAL_OR_CLASS: Final = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]')
_WORD: Final = re.compile(r"[A-Za-z0-9-]+")


def _render(rules: Mapping[str, str]) -> str:
    """``root`` and every rule it reaches, one per line, in the order they were made."""
    reached = {"root"}
    todo = ["root"]
    while todo:
        body = _LITERAL_OR_CLASS.sub(" ", rules[todo.pop()])
        for word in _WORD.findall(body):
            if word in rules and word not in reached:
                reached.add(word)
                todo.append(word)
    order = ["root", *(name for name in rules if name in reached and name != "root")]
    return "".join(f"{name} ::= {rules[name]}\n" for name in order)


def _repeat(item: str, lo: int, hi: int | None) -> str:
    """``item`` ``lo`` to ``hi`` times (None: unbounded), as GBNF; "" for exactly zero."""
    lo = min(max(lo, 0), _MAX_REPEAT)
    if hi is not None and hi > _MAX_REPEAT:
        hi = None
    if hi is not None:
        hi = max(hi, lo)
    match lo, hi:
        case 0, 0:
            return ""
        case 1, 1:
            return item
        case 0, None:
            return f"{item}*"
        case 1, None:
            return f"{item}+"
        case 0, 1:
            return f"{item}?"
        case _, None:
            return f"{item}{{{lo},}}"
        case _ if lo == hi:
            return f"{item}{{{lo}}}"
    return f"{item}{{{lo},{hi}}}"


def _lit(text: str) -> str:
    """``text`` as a GBNF string literal (pure ASCII: everything else escaped)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        else:
            out.append(_char(ch))
    out.append('"')
    return "".join(out)


def _char(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02X}"
    if code < 0x80:
        return ch
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def _class_char(ch: str) -> str:
    """``ch`` as it may stand inside ``[...]``."""
    if ch in '\\]["-':
        return "\\" + ch
    if ch == "^":
        return "\\x5E"
    return _char(ch)


def _json_text(value: object) -> str:
    """Compact JSON for a literal value, sentinels escaped as the model must write them."""
    return sentinels.escape(orjson.dumps(value).decode())


# --- JSON Schema -> rules --------------------------------------------------------------------


# Subschemas converted for one grammar, at most: SchemaStore's schemas need at most
# about 2,200; inlined recursion (a $ref with narrowing siblings) could otherwise grow
# the grammar without bound.
_MAX_WORK: Final = 5_000
# And at most this much rule text (SchemaStore's p99 is 185 KB): llama.cpp parses the
# grammar with every request, and a model's sampler walks it with every token.
_MAX_GRAMMAR_CHARS: Final = 256 * 1024


class _Converter:
    """One schema document (its ``$ref`` targets resolve inside it) into rules."""

    def __init__(self, rules: _Rules, doc: Mapping[str, Any] | bool) -> None:
        self._rules = rules
        self._doc = doc
        self._max_depth = rules.limits.max_depth
        self._refs: dict[str, str] = {}
        self._work = 0

    def root(self, hint: str) -> str:
        """The rule (or atom) for the whole document."""
        return self.value(self._doc, hint, 0)

    def value(self, schema: object, hint: str, depth: int) -> str:
        """An atom (rule name or literal) for values of ``schema`` at nesting ``depth``."""
        self._work += 1
        too_big = self._work > _MAX_WORK or self._rules.size > _MAX_GRAMMAR_CHARS
        if not isinstance(schema, Mapping) or too_big:
            # True, or junk (False is dropped by callers); or a schema whose inlined parts
            # (a $ref with narrowing siblings, recursively) would multiply past the budget:
            # the rest is a generic value, and validation still checks it exactly.
            return self._any(depth)
        if isinstance(schema.get("$ref"), str):
            return self._ref(schema, hint, depth)
        if "const" in schema:
            return _lit(_json_text(schema["const"]))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            choices = list(dict.fromkeys(_lit(_json_text(v)) for v in schema["enum"]))
            return choices[0] if len(choices) == 1 else self._rules.add(hint, " | ".join(choices))
        if isinstance(schema.get("allOf"), list):
            merged: Mapping[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                merged = _merge(merged, self._deref(part))
            return self.value(merged, hint, depth)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return self._union(schema, key, hint, depth)
        types = _types(schema)
        if not types:
            return self._any(depth)
        if len(types) == 1:
            return self._typed(types[0], schema, hint, depth)
        atoms = dict.fromkeys(self._typed(t, schema, f"{hint}-{t}", depth) for t in types)
        return self._rules.add(hint, " | ".join(atoms))

    def _any(self, depth: int) -> str:
        return self._rules.generic(max(0, self._max_depth - depth))

    def _deref(self, schema: object) -> object:
        for _ in range(_MAX_REF_HOPS):
            if not (isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str)):
                return schema
            target = _resolve(self._doc, schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = _merge(target, rest) if rest else target
        return True

    def _ref(self, schema: Mapping[str, Any], hint: str, depth: int) -> str:
        ref: str = schema["$ref"]
        if any(k not in _ANNOTATIONS for k in schema if k != "$ref"):
            return self.value(self._deref(schema), hint, depth)  # siblings narrow the target
        if ref in self._refs:
            return self._refs[ref]
        target = _resolve(self._doc, ref)
        if target is True:  # unresolvable: the gateway never fetches schemas
            return self._any(depth)
        # One rule per target, built at the depth of its first use: a generic value inside
        # it is bounded from there (approximate; the validator's depth limit is exact).
        name = self._rules.reserve(f"{hint.split('-')[0]}-{ref.rsplit('/', 1)[-1]}")
        self._refs[ref] = name
        self._rules.define(name, self.value(target, name, depth))
        return name

    def _union(self, schema: Mapping[str, Any], key: str, hint: str, depth: int) -> str:
        rest = {k: v for k, v in schema.items() if k != key}
        shaped = any(k not in _ANNOTATIONS for k in rest)
        branches = [b for b in schema[key] if b is not False]
        atoms = list(
            dict.fromkeys(
                self.value(_merge(rest, self._deref(b)) if shaped else b, f"{hint}-{i}", depth)
                for i, b in enumerate(branches)
            )
        )
        if not atoms:
            return self._any(depth)
        return atoms[0] if len(atoms) == 1 else self._rules.add(hint, " | ".join(atoms))

    def _typed(self, kind: str, schema: Mapping[str, Any], hint: str, depth: int) -> str:
        match kind:
            case "object":
                return self._object(schema, hint, depth)
            case "array":
                return self._array(schema, hint, depth)
            case "string":
                return self._string(schema, hint)
            case "integer":
                return self._integer(schema, hint)
            case "number":
                return self._number(schema, hint)
            case "boolean" | "null":
                return kind
        return self._any(depth)

    def _object(self, schema: Mapping[str, Any], hint: str, depth: int) -> str:
        if depth >= self._max_depth:
            return self._any(depth)
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        required = [k for k in required if isinstance(k, str)] if isinstance(required, list) else []
        extra_schema = schema.get("additionalProperties", True if not props else False)
        if "patternProperties" in schema and extra_schema is not False:
            extra_schema = True
        members: list[tuple[str, bool]] = []  # (member atom, required)
        for key, sub in [*props.items(), *((k, extra_schema) for k in required if k not in props)]:
            must = key in required
            if not must and (sub is False or (isinstance(sub, Mapping) and sub.get("readOnly"))):
                continue
            value = self.value(sub, f"{hint}-{key}", depth + 1)
            members.append((f'{_lit(_json_text(key))} ws ":" ws {value}', must))
        extra = None
        if extra_schema is not False:
            value = self.value(extra_schema, f"{hint}-extra", depth + 1)
            extra = self._rules.add(f"{hint}-kv", f'string ws ":" ws {value}')
        # rest[i]: members i.. after something was written (each with its comma);
        # first[i]: a non-empty member list starting at i, or None.
        rest: list[str] = [""] * (len(members) + 1)
        rest[-1] = self._rules.more(f"{hint}-more", extra) if extra else ""
        for i in range(len(members) - 1, 0, -1):
            member, must = members[i]
            piece = f'ws "," ws {member}' if must else f'( ws "," ws {member} )?'
            tail = rest[i + 1]
            rest[i] = self._rules.add(f"{hint}-rest", f"{piece} {tail}") if tail else piece
        first: str | None = f"{extra} {rest[-1]}" if extra else None
        for i in range(len(members) - 1, -1, -1):
            member, must = members[i]
            head = f"{member} {rest[i + 1]}".strip()
            if must or first is None:
                first = head
            else:
                first = self._rules.add(f"{hint}-from", f"{head} | {first}")
        if first is None:
            return self._rules.add(hint, '"{" ws "}"')
        if any(must for _, must in members):
            return self._rules.add(hint, f'"{{" ws {first} ws "}}"')
        return self._rules.add(hint, f'"{{" ws ( {first} ws )? "}}"')

    def _array(self, schema: Mapping[str, Any], hint: str, depth: int) -> str:
        if depth >= self._max_depth:
            return self._any(depth)
        items = True if "prefixItems" in schema else schema.get("items", True)
        lo = _int(schema.get("minItems")) or 0
        hi = _int(schema.get("maxItems"))
        if items is False or hi == 0:
            return self._rules.add(hint, '"[" ws "]"')
        item = self._shared_string(items, hi) or self.value(items, f"{hint}-item", depth + 1)
        tail = self._rules.more(f"{hint}-more", item, lo - 1, None if hi is None else hi - 1)
        body = f"{item} {tail}".strip()
        if lo == 0:
            return self._rules.add(hint, f'"[" ws ( {body} ws )? "]"')
        return self._rules.add(hint, f'"[" ws {body} ws "]"')

    def _shared_string(self, items: object, declared: int | None) -> str | None:
        """The members of an array of unbounded strings share one string's budget (see
        "Budget"), or None when ``items`` is anything else or nothing is budgeted."""
        limits = self._rules.limits
        if limits.max_chars is None or limits.max_items is None:
            return None
        schema = self._deref(items)
        if not isinstance(schema, Mapping) or _types(schema) != ("string",):
            return None
        if any(k in schema for k in ("maxLength", "pattern", "enum", "const", "format")):
            return None
        members = declared if declared is not None else limits.max_items
        chars = max(_MIN_SHARED_CHARS, limits.max_chars // max(members, 1))
        if chars >= limits.max_chars:
            return None
        return self._rules.add("shared-string", f'"\\"" {_repeat("char", 0, chars)} "\\""')

    def _string(self, schema: Mapping[str, Any], hint: str) -> str:
        pattern = schema.get("pattern")
        fmt = schema.get("format")
        if not isinstance(pattern, str) and isinstance(fmt, str):
            pattern = FORMAT_PATTERNS.get(fmt)  # the format's shape; validation checks the rest
        declared = _int(schema.get("maxLength"))
        hi = declared if declared is not None else self._rules.limits.max_chars
        if isinstance(pattern, str):
            expr = _Regex(self._rules, f"{hint}-re", hi).convert(pattern)
            if expr is not None:
                return self._rules.add(hint, f'"\\"" {expr} "\\""' if expr else '"\\"\\""')
        lo = _int(schema.get("minLength")) or 0
        if lo == 0 and declared is None:
            return "string"  # bounded by the limits already
        chars = _repeat("char", lo, hi)
        return self._rules.add(hint, f'"\\"" {chars} "\\""' if chars else '"\\"\\""')

    def _integer(self, schema: Mapping[str, Any], hint: str) -> str:
        lo, hi = _bounds(schema)
        low = None if lo is None else math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0])
        high = None if hi is None else math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0])
        if low is None and high is None:
            return "integer"
        parts = []
        if low is None or low < 0:  # the negative integers in range, by magnitude
            top = None if low is None else -low
            bottom = 1 if high is None or high >= 0 else -high
            if top is None or bottom <= top:
                parts.append(f'"-" ( {_naturals(bottom, top)} )')
        if high is None or high >= 0:
            bottom = 0 if low is None else max(low, 0)
            if high is None or bottom <= high:
                parts.append(_naturals(bottom, high))
        # An empty range: the schema cannot be met; validation says so.
        return self._rules.add(hint, " | ".join(parts)) if parts else "integer"

    def _number(self, schema: Mapping[str, Any], hint: str) -> str:
        lo, hi = _bounds(schema)
        if lo is None and hi is None:
            return "number"
        parts = []
        if lo is None or lo[0] < 0:  # below zero: "-" and a magnitude
            # Zero itself belongs to the other branch ("-0" is not written).
            near = (-hi[0], hi[1]) if hi is not None and hi[0] < 0 else (0.0, True)
            far = None if lo is None else (-lo[0], lo[1])
            if alts := _magnitudes(near, far):
                parts.append(f'"-" ( {" | ".join(alts)} )')
        if hi is None or hi[0] > 0 or (hi[0] == 0 and not hi[1]):
            parts.extend(_magnitudes(lo if lo is not None and lo[0] >= 0 else (0.0, False), hi))
        return self._rules.add(hint, " | ".join(parts)) if parts else "number"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# A bound: its value and whether it is strict (exclusiveMinimum / exclusiveMaximum).
_Bound = tuple[float, bool]


def _bounds(schema: Mapping[str, Any]) -> tuple[_Bound | None, _Bound | None]:
    """The tightest lower and upper bounds; draft 4's boolean ``exclusive*`` is read too.
    Bounds past the digits a number may have (``_MAX_DIGITS``) are dropped."""

    def tightest(inclusive: str, exclusive: str, *, lower: bool) -> _Bound | None:
        found: list[_Bound] = []
        strict_flag = schema.get(exclusive) is True
        for key, strict in ((inclusive, strict_flag), (exclusive, True)):
            v = schema.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                if abs(v) < 10**_MAX_DIGITS:
                    found.append((float(v), strict))
        if not found:
            return None
        # The tightest value; at a tie, the strict bound.
        return max(found, key=lambda b: (b[0] if lower else -b[0], b[1]))

    return (
        tightest("minimum", "exclusiveMinimum", lower=True),
        tightest("maximum", "exclusiveMaximum", lower=False),
    )


def _magnitudes(lo: _Bound, hi: _Bound | None) -> list[str]:
    """Alternatives for a non-negative decimal between ``lo`` (>= 0) and ``hi``, without
    exponent. Exact when the bounds are whole numbers; at a fractional bound the whole
    part is bounded, not the fraction (``<= 2.5`` allows ``2.9``: validation catches it)."""
    base = math.floor(lo[0])
    parts: list[str] = []
    start = base
    if lo == (base, True):  # "> 3": 3 only with a non-zero fraction
        if hi is None or hi[0] > base:
            parts.append(f"{_lit(str(base))} {_NONZERO_FRACTION}")
        start = base + 1
    end: int | None = None
    top_part = ""
    if hi is not None:
        top = math.floor(hi[0])
        end = top - 1 if hi[0] == top else top
        if hi == (top, False) and top >= start:  # "<= 50": 50 only with zeros after
            top_part = f"{_lit(str(top))} {_ZERO_FRACTION}"
    if end is None or start <= end:
        parts.append(f"( {_naturals(start, end)} ) {_ANY_FRACTION}")
    if top_part:
        parts.append(top_part)
    return parts


def _naturals(lo: int, hi: int | None) -> str:
    """The numerals of ``lo`` to ``hi`` (None: up to ``_MAX_DIGITS`` digits), no leading
    zeros, as alternatives of digit classes: ``[1-9] [0-9]`` for 10-99, and so on."""
    width = len(str(lo))
    top = hi if hi is not None else 10**_MAX_DIGITS - 1
    parts = []
    for n in range(width, len(str(top)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(top, 10**n - 1)
        if hi is None and n > width:  # every longer numeral
            parts.append(f"[1-9] {_repeat('[0-9]', n - 1, _MAX_DIGITS - 1)}")
            break
        if a <= b:
            parts.append(_digit_span(str(a), str(b)))
    return " | ".join(parts)


def _digit_span(lo: str, hi: str) -> str:
    """The numerals from ``lo`` to ``hi``, two digit strings of one length, ``lo <= hi``."""
    if lo == hi:
        return _lit(lo)
    rest = len(lo) - 1
    any_rest = _repeat("[0-9]", rest, rest)
    if lo[0] == hi[0]:
        return f"{_lit(lo[0])} ( {_digit_span(lo[1:], hi[1:])} )"
    parts = []
    first, last = int(lo[0]), int(hi[0])
    if rest and lo[1:] != "0" * rest:  # lo's first digit, then lo's tail up to 9...9
        parts.append(f"{_lit(lo[0])} ( {_digit_span(lo[1:], '9' * rest)} )")
        first += 1
    tail_full = not rest or hi[1:] == "9" * rest
    if not tail_full:
        last -= 1
    if first <= last:
        digits = f"[{first}]" if first == last else f"[{first}-{last}]"
        parts.append(f"{digits} {any_rest}".rstrip())
    if not tail_full:  # hi's first digit, then 0...0 up to hi's tail
        parts.append(f"{_lit(hi[0])} ( {_digit_span('0' * rest, hi[1:])} )")
    return " | ".join(parts)


def _types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, list):
        return tuple(t for t in declared if isinstance(t, str))
    for hints, kind in (
        (("properties", "required", "additionalProperties"), "object"),
        (("items", "prefixItems", "minItems", "maxItems"), "array"),
        (("minLength", "maxLength", "pattern"), "string"),
        (("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
    ):
        if any(h in schema for h in hints):
            return (kind,)
    return ()


def _merge(a: object, b: object) -> Mapping[str, Any]:
    """Both schemas' keywords in one (allOf, a union branch with its parent, $ref siblings).

    Approximate, as the synthesiser's merge in ``toolforge.core.schemas`` is: properties and
    required are unioned, other keywords taken from ``b``; validation is exact.
    """
    if not isinstance(a, Mapping):
        return b if isinstance(b, Mapping) else {}
    if not isinstance(b, Mapping):
        return a
    out = {**a, **b}
    if isinstance(a.get("properties"), Mapping) and isinstance(b.get("properties"), Mapping):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out


def _resolve(doc: object, ref: str) -> object:
    """A local ``$ref`` (``#``, ``#/$defs/X``, any JSON pointer); True when it does not
    resolve (the generic value)."""
    if not ref.startswith("#"):
        return True
    node = doc
    pointer = ref[1:]
    if pointer and not pointer.startswith("/"):
        return True  # an anchor: not used by the schemas we generate
    for part in pointer.split("/")[1:]:
        key = part.replace("%25", "%").replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return True
    return node


# --- pattern -> rules ----------------------------------------------------------------------


class _Unsupported(Exception):
    pass


# Characters that a pattern may match literally inside a JSON string without an escape.
def _json_safe(ch: str) -> bool:
    return ch not in '"\\' and ch not in sentinels.ESCAPES and ord(ch) >= 0x20


_SHORTHANDS: Final = {"d": "0-9", "w": "a-zA-Z0-9_"}
_META: Final = frozenset("\\^$.|?*+()[]{}/-")
# One group of literal alternatives, ``(Paris|Paris, France|New York)``: the form provenance
# writes for the user's words (hundreds of them a request). Read by one regex instead of
# character by character (the general parser took most of a plain request's planning);
# the grammar is the same text the parser writes.
_LITERAL_GROUP: Final = re.compile(
    r"\((?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}/-])+"
    r"(?:\|(?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}/-])+)*\)"
)
_LITERAL_OPTION: Final = re.compile(r"(?:[^\\|]|\\.)+")
_UNESCAPE: Final = re.compile(r"\\(.)")


def _literal_group(body: str) -> str | None:
    """``body`` as :class:`_Regex` writes it when it is one group of literal alternatives
    (no empty one), else None (the general parser reads it)."""
    if not _LITERAL_GROUP.fullmatch(body):
        return None
    options = []
    for raw in _LITERAL_OPTION.findall(body, 1, len(body) - 1):
        text = _UNESCAPE.sub(r"\1", raw)
        if not all(_json_safe(ch) for ch in text):
            return None
        options.append(_lit(text))
    return f"( {' | '.join(options)} )"


class _Regex:
    """A JSON Schema ``pattern`` (ECMA-262) as GBNF over a string's raw characters.

    Only the subset schemas use in practice: anchored ``^...$``, literals, ``.``, classes
    (ranges, negation, ``\\d``, ``\\w``), groups (``(...)``, ``(?:...)``), ``|`` and the
    quantifiers ``? * + {m} {m,} {m,n}``. Anything else (lookaround, back-references, an
    unanchored pattern, a character that a JSON string must escape) returns None, and the
    string is left to its length bounds; validation checks the pattern either way.
    """

    def __init__(self, rules: _Rules, hint: str, max_length: int | None) -> None:
        self._rules = rules
        self._hint = hint
        # maxLength bounds each unbounded quantifier (not their sum): a model repeating
        # one character ("7777...") must stop after that many.
        self._max_length = max_length
        self._s = ""
        self._i = 0

    def convert(self, pattern: str) -> str | None:
        # JSON Schema searches: an end without its anchor may hold any other characters.
        start = pattern.startswith("^")
        end = pattern.endswith("$") and not _escaped_at(pattern, len(pattern) - 1)
        if start and end and len(pattern) < 2:
            return None
        self._s, self._i = pattern[int(start) : len(pattern) - int(end)], 0
        literals = _literal_group(self._s)
        if literals is not None:
            options = [literals]
        else:
            try:
                options = self._alternation()
            except (_Unsupported, IndexError):
                return None
            if self._i != len(self._s):
                return None
        if len(options) == 1:
            expr = options[0]
        elif start or end:
            return None  # ``^a|b$`` is ``^a`` or ``b$``: anchors bind one option only
        else:
            expr = f"( {' | '.join(options)} )"
        free = _repeat("char", 0, self._max_length)
        return " ".join(part for part in (free * (not start), expr, free * (not end)) if part)

    def _peek(self) -> str:
        return self._s[self._i] if self._i < len(self._s) else ""

    def _alternation(self) -> list[str]:
        options = [self._sequence()]
        while self._peek() == "|":
            self._i += 1
            options.append(self._sequence())
        return options

    def _sequence(self) -> str:
        parts: list[str] = []
        literal = ""  # adjacent unquantified literal characters, joined into one literal
        while self._peek() not in ("", "|", ")"):
            atom, text = self._atom()
            quantified = self._quantifier(atom, group=text is None and atom.startswith("("))
            if quantified is None and text is not None:
                literal += text
                continue
            if literal:
                parts.append(_lit(literal))
                literal = ""
            if quantified is None:
                parts.append(atom)
            elif quantified:
                parts.append(quantified)
        if literal:
            parts.append(_lit(literal))
        return " ".join(parts)

    def _atom(self) -> tuple[str, str | None]:
        """The next atom, and its text when it is one literal character."""
        ch = self._s[self._i]
        self._i += 1
        if ch == "(":
            if self._s.startswith("?:", self._i):
                self._i += 2
            elif self._peek() == "?":
                raise _Unsupported
            inner = self._alternation()
            if self._peek() != ")":
                raise _Unsupported
            self._i += 1
            return f"( {' | '.join(inner)} )", None
        if ch == "[":
            return self._class(), None
        if ch == ".":
            return f"[^{_SAFE}\\u2028\\u2029]", None
        if ch == "\\":
            escaped = self._escape()
            if len(escaped) > 1:  # a shorthand class
                return f"[{escaped}]", None
            ch = escaped
        elif ch in "^$*+?{}]":
            raise _Unsupported
        if not _json_safe(ch):
            raise _Unsupported
        return _lit(ch), ch

    def _escape(self) -> str:
        """After a backslash: one character, or a shorthand's class items (``0-9``)."""
        ch = self._s[self._i]
        self._i += 1
        if ch in _SHORTHANDS:
            return _SHORTHANDS[ch]
        if ch in _META:
            return ch
        if ch in "ux":
            width = 4 if ch == "u" else 2
            digits = self._s[self._i : self._i + width]
            if len(digits) != width or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise _Unsupported
            self._i += width
            return chr(int(digits, 16))
        raise _Unsupported  # \s, \b, \D, back-references, ...

    def _class(self) -> str:
        negate = self._peek() == "^"
        self._i += negate
        items: list[str] = []
        while True:
            ch = self._s[self._i]
            self._i += 1
            if ch == "]" and items:
                break
            if ch == "[" or ch == "]":
                raise _Unsupported
            lo = self._escape() if ch == "\\" else ch
            if len(lo) > 1:
                items.append(lo)
                continue
            if self._peek() == "-" and self._s[self._i + 1] != "]":
                self._i += 1
                ch = self._s[self._i]
                self._i += 1
                hi = self._escape() if ch == "\\" else ch
                if len(hi) > 1 or hi < lo:
                    raise _Unsupported
                if not negate and not all(_json_safe(chr(c)) for c in _span(lo, hi)):
                    raise _Unsupported
                items.append(f"{_class_char(lo)}-{_class_char(hi)}")
            else:
                if not negate and not _json_safe(lo):
                    raise _Unsupported
                items.append(_class_char(lo))
        if negate:
            return f"[^{''.join(items)}{_SAFE}]"
        return f"[{''.join(items)}]"

    def _quantifier(self, atom: str, *, group: bool) -> str | None:
        """The quantified atom ("" when repeated zero times), or None when unquantified."""
        ch = self._peek()
        if ch in ("?", "*", "+"):
            self._i += 1
            lo, hi = {"?": (0, 1), "*": (0, None), "+": (1, None)}[ch]
        elif ch == "{":
            m = re.compile(r"\{([0-9]{1,4})(,([0-9]{0,4}))?\}").match(self._s, self._i)
            if m is None:
                raise _Unsupported
            self._i = m.end()
            lo = int(m[1])
            hi = lo if m[2] is None else (int(m[3]) if m[3] else None)
            if hi is not None and hi < lo:
                raise _Unsupported
        else:
            return None
        if self._peek() == "?":  # lazy: the same language
            self._i += 1
        if group:
            # llama.cpp multiplies a group's rules by its repetition: repeat a rule instead
            atom = self._rules.add(self._hint, atom[2:-2])
        if hi is None and self._max_length is not None:
            hi = max(lo, self._max_length)
        return _repeat(atom, lo, hi)


def _escaped_at(text: str, i: int) -> bool:
    """Whether ``text[i]`` follows an odd run of backslashes (``\\$`` is a literal)."""
    run = 0
    while i - run - 1 >= 0 and text[i - run - 1] == "\\":
        run += 1
    return run % 2 == 1


def _span(lo: str, hi: str) -> Iterator[int]:
    return iter(range(ord(lo), ord(hi) + 1))
