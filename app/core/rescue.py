"""Tool calls a model wrote as text, rescued (docs/workflows.md: "a JSON object in a code fence or
bare, ``<tool_call>…</tool_call>`` tags, ``name(args)``, Mistral-style ``[TOOL_CALLS]``, and
``name[ARGS]{…}`` forms, the tool's name in another case or with ``_`` for ``.``").

Small models asked for native tool calls often answer with the call in their text instead.
:func:`rescue_tool_calls` finds such calls to known tools; :func:`find_unknown_call` names a
tool the text tried to call that is not known, so that the caller can tell the model which
tools there are. Both read the same forms:

    form            the model wrote                                     from
    -------------   -------------------------------------------------   --------------------
    fenced_json     ```json                                             most chat models
                    {"name": "places.search", "arguments": {...}}
                    ```                     (the fence holds only calls)
    bare_json       Sure: {"name": "places.search", "arguments": {...}} most chat models
    tool_call_tag   <tool_call>{"name": ..., "arguments": {...}}        Hermes, Qwen
                    </tool_call>         (or name(...), name{...} in it)
    mistral         [TOOL_CALLS] [{"name": ..., "arguments": {...}}]    Mistral (v3 .. v7)
                    [TOOL_CALLS]places.search[ARGS]{...}                Mistral (v11+)
                    [TOOL_CALLS]places.search{...}
    call_syntax     places.search({"query": "pizza"})                   Llama 3.2, Gemma,
                    places.search(query="pizza", limit=3)               "pythonic" templates
    args_block      places.search[ARGS]{"query": "pizza"}               Mistral, marker lost

A JSON call is an object in one of these shapes (or a list of them, or ``{"tool_calls":
[...]}``: parallel calls)::

    {"name": N, "arguments": A}        {"function": N, "arguments": A}
    {"name": N, "parameters": A}       {"tool": N, "args": A}
    {"name": N, "input": A}            {"type": "function", "function": {"name": N, "arguments": A}}
    {"name": N}                        (no arguments; nothing but "id" or "type" beside it)

where A is an object, a JSON string holding one (OpenAI sends arguments so), ``""`` or
``null`` (no arguments). Keyword arguments in ``name(k=v, ...)`` are Python or JSON
literals: strings in ``'`` or ``"``, numbers, ``true``/``True``, ``false``/``False``,
``null``/``None``, and JSON arrays or objects. A tool's name matches whatever its case and
with ``_`` or ``-`` for ``.`` (``Places_Search`` is ``places.search``), and an OpenAI-style
``functions.`` prefix is ignored; :func:`canonical_tool_name` decides.

What is not a call: prose that names a tool (``I will use places.search``), a JSON value
that is not in a call shape (a call nested in other data included: the model's answer may
be JSON that mentions a call), ``name(...)`` whose arguments are no literals (``f(x)``), and
``name()`` with nothing else in the reply but whitespace, backticks or a fence around it
(``use get_time() to ...`` is prose). An object whose braces do not balance is never
repaired into a call: a reply cut off by the token limit would run the tool with arguments
the model never finished.

Theory of operation
-------------------
One left-to-right scan (``_Scanner``) jumps from one character that can start a form to
the next (``{``, ``[``, ``<``, a backtick, and ``(`` or ``[ARGS]``, from which the tool
name is looked for backwards) and tries the form that starts there. A form that reads
moves the scan past its end; one that does not moves it one character on, so a call inside
broken text is still found. A JSON value that is not a call is skipped whole (a call
nested in it is data), unparsed when it lacks the words every JSON call has (``name``,
``function``, ``tool``): code and data cost one bracket match.

JSON is matched brace to brace (strings respected: only ``"`` opens one), then parsed
strictly by the gateway's own validator, then, if that fails, repaired by ``json_repair``
through the JSON guarantee's :func:`~toolforge.core.guarantee.local_repair`, which screens out
the inputs on which json_repair is superlinear. Only text between balanced braces is ever
parsed or repaired.

No input makes either function raise or run long: the scan reads the first
``MAX_SCAN_CHARS`` characters, values nest at most ``MAX_DEPTH`` deep, and a budget bounds
the bracket-matching steps and the characters parsed and repaired over the whole scan (an
adversarial reply, say 64 Ki of ``{"``, spends it and gets the calls found so far).
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Final, Literal, cast

from toolforge.core.guarantee import RepairLimits, local_repair
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.core.protocol.sentinels import MAX_NAME_CHARS
from toolforge.errors import ToolForgeError

__all__ = [
    "MAX_DEPTH",
    "MAX_SCAN_CHARS",
    "RescueForm",
    "RescuedCall",
    "canonical_tool_name",
    "find_unknown_call",
    "rescue_tool_calls",
]

# docs/protocol.md's frame limit: a call longer than any frame the gateway accepts is no call.
MAX_SCAN_CHARS: Final = 64 * 1024
# Deeper than any real arguments (frames allow 16 levels) plus the call's own wrapping.
MAX_DEPTH: Final = 64
# The work one scan may do. A real reply needs a fraction of each; a hostile one spends
# it in about 0.1 s (measured on 64 KiB of '{"x', of '{{{…' and of '{ name … }'), then the
# scan stops (steps, parsing) or goes on without repairs. Steps: one per quote, backslash
# or bracket the brace matcher looks at (64 KiB of nested unclosed brackets would take 64
# per character). Parsing: characters given to the strict validator. Repairs: json_repair
# costs ~0.3 ms a call however small the text, and up to 0.25 s for 64 KiB (RepairLimits).
_STEP_BUDGET: Final = 2 * MAX_SCAN_CHARS
_PARSE_BUDGET: Final = 4 * MAX_SCAN_CHARS
_REPAIR_BUDGET: Final = MAX_SCAN_CHARS
_REPAIR_CALLS: Final = 16

RescueForm = Literal[
    "fenced_json", "bare_json", "tool_call_tag", "mistral", "call_syntax", "args_block"
]


@dataclass(frozen=True, slots=True)
class RescuedCall:
    """A tool call found in a model's text."""

    name: str
    """The canonical registered tool name (not necessarily as the model spelled it)."""
    arguments: dict[str, object]
    form: RescueForm
    """How the model wrote it (the table in the module docstring)."""


# -- tool names --------------------------------------------------------------------------

_NAME_CHARS: Final = r"A-Za-z0-9_.:\-"  # sentinels.ID_CHARS, as a class body
_NAME_SET: Final = frozenset(string.ascii_letters + string.digits + "_.:-")
_NAME_FIRST: Final = frozenset(string.ascii_letters + "_")
_TOOL_NAME: Final = re.compile(f"[A-Za-z_][{_NAME_CHARS}]{{0,{MAX_NAME_CHARS - 1}}}")
_OPENAI_PREFIX: Final = "functions."  # how OpenAI's own templates address tools


def _fold(name: str) -> str:
    return name.lower().replace("_", ".").replace("-", ".")


class _ToolIndex:
    """Known tool names by their exact and their folded spelling."""

    __slots__ = ("_exact", "_folded")

    def __init__(self, tools: Collection[str]) -> None:
        if isinstance(tools, str):  # a str is a Collection[str] too: of its letters
            raise TypeError("tools must be a collection of tool names, not one name")
        self._exact = frozenset(tools)
        folded: dict[str, str | None] = {}
        for tool in self._exact:
            key = _fold(tool)
            folded[key] = None if key in folded else tool  # None: two tools fold alike
        self._folded = folded

    def canonical(self, name: str) -> str | None:
        name = name.strip()
        if name in self._exact:
            return name
        found = self._folded.get(_fold(name))
        if found is None and name.lower().startswith(_OPENAI_PREFIX):
            bare = name[len(_OPENAI_PREFIX) :]
            found = bare if bare in self._exact else self._folded.get(_fold(bare))
        return found


def canonical_tool_name(name: str, tools: Collection[str]) -> str | None:
    """The tool in ``tools`` that ``name`` means, or None (unknown, or ambiguous).

    An exact match wins; otherwise case is ignored and ``_`` and ``-`` match ``.``
    (``Places_Search`` is ``places.search``), unless two tools match so. A leading
    ``functions.`` (OpenAI's namespace for tools) is ignored.
    """
    return _ToolIndex(tools).canonical(name)


# -- the scan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    name: str  # as written
    arguments: dict[str, object]
    form: RescueForm
    explicit: bool  # the shape alone says "a call": an unknown name is worth reporting


_Read = tuple[list[_Found], int]  # what a form read (empty: a non-call value), and its end


class _Exhausted(Exception):
    """The scan's work budget is spent (see the module docstring)."""


# The first character of every form but the named ones, whose "(" or "[ARGS]" is found
# instead and the name looked for backwards. A one-character class is what lets the
# regex engine skip prose at C speed (~8 ns a character; an alternation of the forms
# costs ~140).
_TRIGGER: Final = re.compile(r"[{\[(<`]")
_TAG_OPEN: Final = re.compile(r"<tool_call>", re.IGNORECASE)
_MISTRAL: Final = "[TOOL_CALLS]"
_MAX_BLANKS: Final = 8  # between a name and its "(": more is layout, not a call
_NAME_AT: Final = re.compile(
    rf"[A-Za-z_][{_NAME_CHARS}]{{0,{MAX_NAME_CHARS - 1}}}(?![{_NAME_CHARS}])"
)
_TAG_EDGE: Final = re.compile(r"</?tool_call>", re.IGNORECASE)
_FENCE_HEAD: Final = re.compile(r"```[A-Za-z0-9_+.\-]*[ \t]*\r?\n")
_ARGS_HEAD: Final = re.compile(r"(?:\[CALL_ID\][A-Za-z0-9_\-]{1,64})?\[ARGS\]\s*")
_PAREN: Final = re.compile(r"[ \t]*\(\s*")
_SPACE: Final = re.compile(r"\s*")
_NON_SPACE: Final = re.compile(r"\S")
_OUTSIDE_STRING: Final = re.compile(r'["{}\[\]]')
_INSIDE_STRING: Final = re.compile(r'["\\]')
_CLOSER: Final = {"{": "}", "[": "]"}

_NAME_KEYS: Final = ("name", "function", "tool")
_ARGUMENT_KEYS: Final = ("arguments", "parameters", "args", "input")
_BESIDE_A_NAME: Final = frozenset({"id", "type"})  # all a call without arguments may have
# A JSON call has one of these words in it (a key of _NAME_KEYS, or "tool_calls").
_CALL_WORDS: Final = ("name", "function", "tool")

_KEYWORD: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)\s*")
_PY_STRING: Final = {
    '"': re.compile(r'"((?:[^"\\\n]|\\.)*)"'),
    "'": re.compile(r"'((?:[^'\\\n]|\\.)*)'"),
}
_ESCAPE_OR_QUOTE: Final = re.compile(r'\\x[0-9A-Fa-f]{2}|\\U[0-9A-Fa-f]{8}|\\.|"')
_NUMBER: Final = re.compile(rf"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![{_NAME_CHARS}])")
_WORD: Final = re.compile(r"[A-Za-z]+(?![A-Za-z0-9_])")
_LITERALS: Final[dict[str, object]] = {
    "true": True,
    "True": True,
    "false": False,
    "False": False,
    "null": None,
    "None": None,
}
_NO_VALUE: Final = object()
# For local_repair: any container (the call shapes are checked here, not by a schema).
_CONTAINER: Final = {"type": ["object", "array"]}
_REPAIR_LIMITS: Final = RepairLimits(max_chars=MAX_SCAN_CHARS, max_depth=MAX_DEPTH)


class _Scanner:
    """One scan of one text (the module docstring's theory of operation)."""

    __slots__ = ("_core", "_parse_left", "_repair_left", "_repairs_left", "_steps_left", "_text")

    def __init__(self, text: str) -> None:
        truncated = len(text) > MAX_SCAN_CHARS
        self._text = text = text[:MAX_SCAN_CHARS]
        # Where a call must lie to be the whole reply; nowhere when the text was cut.
        self._core = (-1, -1) if truncated else _core_span(text)
        self._steps_left = _STEP_BUDGET
        self._parse_left = _PARSE_BUDGET
        self._repair_left = _REPAIR_BUDGET
        self._repairs_left = _REPAIR_CALLS

    def calls(self) -> Iterator[_Found]:
        text, pos = self._text, 0
        try:
            while (m := _TRIGGER.search(text, pos)) is not None:
                start = m.start()
                read = self._form_at(start, pos)
                if read is None:
                    pos = start + 1  # one character on: a call may start inside
                    continue
                yield from read[0]
                pos = read[1]
        except _Exhausted:
            return

    def _form_at(self, start: int, floor: int) -> _Read | None:
        """The form that starts (or, named, whose name ends) at ``start``, read."""
        text = self._text
        c = text[start]
        if c == "{":
            return self._json(start, "bare_json")
        if c == "<":
            tag = _TAG_OPEN.match(text, start)
            return None if tag is None else self._tag(tag.end())
        if c == "`":
            return self._fence(start)
        if c == "(" or text.startswith(("[ARGS]", "[CALL_ID]"), start):
            name = self._name_before(start, floor)
            return None if name is None else self._named(*name, None)
        if text.startswith(_MISTRAL, start):
            return self._mistral(start + len(_MISTRAL))
        return self._json(start, "bare_json")

    # -- the forms -------------------------------------------------------------------

    def _json(self, start: int, form: RescueForm) -> _Read | None:
        """A JSON value at ``start``: its calls, or [] for a value that holds none."""
        end = self._balanced(start)
        if end < 0:
            return None
        candidate = self._text[start:end]
        if not any(key in candidate for key in _CALL_WORDS):
            return [], end  # no call in it, nested or not: skip it unparsed (code, data)
        value = self._parse(candidate)
        if value is _NO_VALUE:
            return None
        return self._calls_in(value, form) or [], end

    def _named(self, start: int, end: int, block: RescueForm | None) -> _Read | None:
        """``name[ARGS]{…}`` or ``name(…)``; in a tag or after ``[TOOL_CALLS]`` (``block``)
        also ``name{…}``, and every call there is of the block's form."""
        text, name = self._text, self._text[start:end]
        if text.startswith("[", end) and (head := _ARGS_HEAD.match(text, end)) is not None:
            read = self._object_at(head.end())
            if read is None:
                return None
            return [_Found(name, read[0], block or "args_block", True)], read[1]
        if (paren := _PAREN.match(text, end)) is not None:
            call = self._call_arguments(paren.end())
            if call is None:
                return None
            arguments, close = call
            whole = (start, close) == self._core
            if not arguments and block is None and not whole:
                return None  # `name()` in prose is a mention
            return [
                _Found(name, arguments, block or "call_syntax", block is not None or whole)
            ], close
        if block is not None:
            read = self._object_at(_skip_space(text, end))
            if read is not None:
                return [_Found(name, read[0], block, True)], read[1]
        return None

    def _name_before(self, at: int, floor: int) -> tuple[int, int] | None:
        """Where the tool name that ends just before ``at`` (and blanks) lies, if any.

        Found by walking back from the ``(``: one regex with a name alternative in front
        would cost ~130 ns a character of prose, this a few per name.
        """
        text, end = self._text, at
        while end > floor and at - end < _MAX_BLANKS and text[end - 1] in " \t":
            end -= 1
        start = end
        while start > floor and text[start - 1] in _NAME_SET:
            start -= 1
            if end - start > MAX_NAME_CHARS:
                return None
        if start == end or text[start] not in _NAME_FIRST:
            return None
        if start > 0 and text[start - 1] in _NAME_SET:
            return None  # the name began in text already read
        return start, end

    def _tag(self, content: int) -> _Read | None:
        """``<tool_call>`` calls ``</tool_call>``; the closing tag may be missing."""
        edge = _TAG_EDGE.search(self._text, content)
        end = len(self._text) if edge is None else edge.start()
        found = self._block(content, end, "tool_call_tag", json_only=False)
        if found is None:
            return None
        closed = edge is not None and edge.group()[1] == "/"
        return found, edge.end() if closed and edge is not None else end

    def _mistral(self, after: int) -> _Read | None:
        """``[TOOL_CALLS]`` then a JSON call or list of calls, or a named call."""
        read = self._call_at(_skip_space(self._text, after), "mistral", json_only=False)
        return read if read is not None and read[0] else None

    def _fence(self, start: int) -> _Read | None:
        """A fenced block of nothing but JSON calls (anything else is scanned as text)."""
        head = _FENCE_HEAD.match(self._text, start)
        if head is None:
            return None
        close = self._text.find("```", head.end())
        if close < 0:
            return None
        found = self._block(head.end(), close, "fenced_json", json_only=True)
        return None if found is None else (found, close + 3)

    def _block(
        self, start: int, end: int, form: RescueForm, *, json_only: bool
    ) -> list[_Found] | None:
        """The calls that fill ``text[start:end]`` (with whitespace between), else None."""
        found: list[_Found] = []
        pos = start
        while (at := _NON_SPACE.search(self._text, pos, end)) is not None:
            read = self._call_at(at.start(), form, json_only=json_only)
            if read is None or not read[0] or read[1] > end:
                return None
            found += read[0]
            pos = read[1]
        return found or None

    def _call_at(self, start: int, form: RescueForm, *, json_only: bool) -> _Read | None:
        text = self._text
        if start < len(text) and text[start] in "{[":
            return self._json(start, form)
        if json_only or (name := _NAME_AT.match(text, start)) is None:
            return None
        return self._named(start, name.end(), form)

    # -- JSON ------------------------------------------------------------------------

    def _calls_in(self, value: object, form: RescueForm) -> list[_Found] | None:
        """The calls ``value`` is (one object, a list, ``{"tool_calls": [...]}``), or None."""
        if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
            value = value["tool_calls"]
        if isinstance(value, dict):
            one = self._call_in(value, form)
            return None if one is None else [one]
        if not isinstance(value, list) or not value:
            return None
        found = [self._call_in(item, form) for item in value]
        return None if None in found else cast(list[_Found], found)

    def _call_in(self, item: object, form: RescueForm) -> _Found | None:
        if not isinstance(item, dict):
            return None
        inner = item.get("function")
        value: dict[str, object] = inner if isinstance(inner, dict) else item  # OpenAI's shape
        names = [key for key in _NAME_KEYS if key in value]
        if len(names) != 1:
            return None
        name = value[names[0]]
        if not isinstance(name, str) or _TOOL_NAME.fullmatch(name.strip()) is None:
            return None
        keys = [key for key in _ARGUMENT_KEYS if key in value]
        if len(keys) > 1:
            return None
        if not keys:
            if not value.keys() <= {names[0], *_BESIDE_A_NAME}:
                return None
            return _Found(name.strip(), {}, form, False)
        arguments = self._arguments(value[keys[0]])
        return None if arguments is None else _Found(name.strip(), arguments, form, True)

    def _arguments(self, raw: object) -> dict[str, object] | None:
        if raw is None:
            return {}
        if isinstance(raw, str):  # OpenAI's shape: the arguments as a JSON string
            if not raw.strip():
                return {}
            raw = self._parse(raw.strip())
        return cast(dict[str, object], raw) if isinstance(raw, dict) else None

    def _object_at(self, start: int) -> tuple[dict[str, object], int] | None:
        """A JSON object at ``start`` (arguments written bare) and its end."""
        if not self._text.startswith("{", start):
            return None
        end = self._balanced(start)
        if end < 0:
            return None
        value = self._parse(self._text[start:end])
        return (cast(dict[str, object], value), end) if isinstance(value, dict) else None

    def _balanced(self, start: int) -> int:
        """The end of the bracketed run at ``start`` (JSON strings respected), or -1.

        Only double quotes open strings: an apostrophe in prose is no string.
        """
        text, stack, pos = self._text, [_CLOSER[self._text[start]]], start + 1
        while True:
            self._steps_left -= 1
            if self._steps_left < 0:
                raise _Exhausted
            m = _OUTSIDE_STRING.search(text, pos)
            if m is None:
                return -1
            c, pos = m.group(), m.end()
            if c == '"':
                while True:  # to the end of the string
                    self._steps_left -= 1
                    if self._steps_left < 0:
                        raise _Exhausted
                    s = _INSIDE_STRING.search(text, pos)
                    if s is None:
                        return -1
                    pos = s.end() + (s.group() == "\\")
                    if s.group() == '"':
                        break
            elif c in "{[":
                stack.append(_CLOSER[c])
                if len(stack) > MAX_DEPTH:
                    return -1
            elif c != stack.pop():
                return -1
            elif not stack:
                return pos

    def _parse(self, text: str) -> object:
        """``text`` as strict JSON, else as json_repair mends it; ``_NO_VALUE`` if neither."""
        self._parse_left -= len(text)
        if self._parse_left < 0:
            raise _Exhausted
        validator = StreamingJSONValidator(max_depth=MAX_DEPTH, max_bytes=4 * MAX_SCAN_CHARS)
        try:
            validator.feed(text)
            return validator.close()
        except ToolForgeError:
            pass
        if self._repairs_left <= 0 or len(text) > self._repair_left:
            return _NO_VALUE  # repairs spent: strict JSON only from here on
        self._repairs_left -= 1
        self._repair_left -= len(text)
        value = local_repair(text, _CONTAINER, limits=_REPAIR_LIMITS)
        return _NO_VALUE if value is None else value

    # -- call syntax -----------------------------------------------------------------

    def _call_arguments(self, start: int) -> tuple[dict[str, object], int] | None:
        """After ``name(``: ``)``, ``{json})`` or ``k=v, ...)``; the arguments and the end."""
        text = self._text
        if text.startswith(")", start):
            return {}, start + 1
        if text.startswith("{", start):
            read = self._object_at(start)
            if read is None:
                return None
            close = _skip_space(text, read[1])
            return (read[0], close + 1) if text.startswith(")", close) else None
        arguments: dict[str, object] = {}
        pos = start
        while (key := _KEYWORD.match(text, pos)) is not None:
            value, pos = self._literal(key.end())
            if value is _NO_VALUE:
                return None
            arguments[key.group(1)] = value
            pos = _skip_space(text, pos)
            comma = text.startswith(",", pos)
            pos = _skip_space(text, pos + comma)
            if text.startswith(")", pos):
                return arguments, pos + 1
            if not comma:
                return None
        return None

    def _literal(self, start: int) -> tuple[object, int]:
        """A Python or JSON literal at ``start`` and its end; ``_NO_VALUE`` if none."""
        text = self._text
        c = text[start : start + 1]
        if c in ("'", '"'):
            m = _PY_STRING[c].match(text, start)
            if m is None:
                return _NO_VALUE, start
            return self._string(m.group(1)), m.end()
        if c in ("{", "["):
            end = self._balanced(start)
            return (_NO_VALUE, start) if end < 0 else (self._parse(text[start:end]), end)
        if (m := _NUMBER.match(text, start)) is not None:
            return self._strict(m.group()), m.end()
        if (m := _WORD.match(text, start)) is not None and m.group() in _LITERALS:
            return _LITERALS[m.group()], m.end()
        return _NO_VALUE, start

    def _string(self, body: str) -> object:
        """A quoted string's body (either quote) read as JSON reads the same escapes."""
        as_json = _ESCAPE_OR_QUOTE.sub(_to_json_escape, body)
        return self._strict(f'"{as_json}"')

    def _strict(self, text: str) -> object:
        self._parse_left -= len(text)
        if self._parse_left < 0:
            raise _Exhausted
        validator = StreamingJSONValidator(max_depth=MAX_DEPTH, max_bytes=4 * MAX_SCAN_CHARS)
        try:
            validator.feed(text)
            return validator.close()
        except ToolForgeError:
            return _NO_VALUE


def _skip_space(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches


def _to_json_escape(m: re.Match[str]) -> str:
    """One escape of a Python string as JSON writes it (``repr`` writes ``\\x``/``\\U``)."""
    s = m.group()
    if s == '"':
        return '\\"'  # a double quote inside a single-quoted string
    if s == "\\'":
        return "'"
    if len(s) == 4:  # \xNN
        return "\\u00" + s[2:]
    if len(s) == 10:  # \UNNNNNNNN
        code = int(s[2:], 16)
        if code < 0x10000:
            return f"\\u{code:04x}"  # the validator judges surrogates
        return chr(code) if code <= 0x10FFFF else s  # s: no JSON escape, refused
    return s  # JSON judges the other escapes


def _core_span(text: str) -> tuple[int, int]:
    """Where a reply's one call would lie: inside whitespace, one code fence, backticks
    and a trailing ``;``."""
    start, end = _strip(text, 0, len(text))
    head = _FENCE_HEAD.match(text, start, end)
    if head is not None and end - head.end() >= 3 and text.startswith("```", end - 3):
        start, end = _strip(text, head.end(), end - 3)
    while start < end and text[start] == "`":
        start += 1
    while end > start and text[end - 1] in "`;":
        end -= 1
    return _strip(text, start, end)


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    first = _NON_SPACE.search(text, start, end)
    if first is None:
        return start, start
    return first.start(), first.start() + len(text[first.start() : end].rstrip())


def rescue_tool_calls(text: str, tools: Collection[str]) -> list[RescuedCall]:
    """The calls to tools in ``tools`` that ``text`` holds, in order (the module docstring
    has the forms). Calls to unknown tools are left out (see :func:`find_unknown_call`).

    Never raises; a text with no call, however broken, gives [].
    """
    if not text or not tools:
        return []
    index = _ToolIndex(tools)
    rescued: list[RescuedCall] = []
    for found in _Scanner(text).calls():
        name = index.canonical(found.name)
        if name is not None:
            rescued.append(RescuedCall(name, found.arguments, found.form))
    return rescued


def find_unknown_call(text: str, tools: Collection[str]) -> str | None:
    """The name, as written, of the first tool ``text`` plainly tries to call that is not
    in ``tools``; None if there is none.

    "Plainly": a JSON call with arguments, a tag, a ``[TOOL_CALLS]`` marker, ``[ARGS]``,
    or ``name(...)`` that is the whole reply (``print(x=1)`` in an answer about code is not
    a call). Never raises.
    """
    if not text:
        return None
    index = _ToolIndex(tools)
    for found in _Scanner(text).calls():
        if found.explicit and index.canonical(found.name) is None:
            return found.name
    return None
