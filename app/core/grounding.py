"""Grounding: a workflow's arguments narrowed to what the conversation holds. No I/O.

A small model asked for an argument makes one up: a search query nobody said, a place id no
search returned. In constrained mode the turn's grammar can refuse that, if the schema of
each tool says which values exist. Two sources narrow an argument:

    source                         marked by                     the argument becomes
    -----------------------------  ----------------------------  ---------------------------
    an earlier tool's results      an argument-matched           an ``enum`` of the values
    (``place_id`` from a search)   prerequisite                  the results hold, less those
                                   (``match_arg``)               whose call failed for good
    the user's first message       ``grounded`` (tool ->         a plain string: 1 to 6 of
    ("pizza", "7pm", "for 2")      argument names)               the user's words; a string
                                                                 with a ``pattern``: the
                                                                 times and words that match
                                                                 it; a number: the numbers
                                                                 the user stated

Words that led nowhere are spent: the words of a grounded call whose result gave an
argument-matched prerequisite nothing (a search that found nothing to book), or whose every
matched value then failed, are not offered again, so the next search differs. English
function words are never offered. An argument nothing usable narrows keeps its schema.

:class:`Grounding` holds one run's state (what the user said, the spent words, the failed
values); the functions are pure. The workflow policy (:mod:`toolforge.core.steps`) owns the
results it narrows to and hands them in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jsonschema import Draft202012Validator

from toolforge.core.messages import content_text, first_user_index
from toolforge.core.workflow import Prerequisite, WorkflowDef
from toolforge.errors import ErrorCode

__all__ = [
    "Grounding",
    "UserValues",
    "user_values",
    "user_words",
    "value_key",
    "values_under",
    "words_pattern",
]

# A grounded argument (WorkflowDef.grounded): 1 to _GROUNDED_WORDS words, each one of the
# user's first message (at most _USER_WORDS distinct ones, each at most 32 characters).
_GROUNDED_WORDS: Final = 6
_USER_WORDS: Final = 64
_WORD: Final = re.compile(r"[A-Za-z0-9]{1,32}")
# English function words: a grounded string made of them says nothing ("at if", "for a"),
# and a 135M model picks them (they are the likeliest tokens), so they are not offered.
_FUNCTION_WORDS: Final = frozenset(
    "a about after all also am an and any are as at be been before but by can could did do "
    "does for from had has have he her him his how i if in into is it its me my no nor not "
    "of on or our ours she so some than that the their them then there these they this "
    "those to too us very was we were what when where which while who whom why will with "
    "would you your".split()
)
# Times of day in the user's words: "7pm", "7:30 p.m.", "19:00", "noon", "midnight".
_TIME: Final = re.compile(
    r"\b(?:(?P<hour>\d{1,2})(?::(?P<minute>[0-5]\d))?\s?(?P<half>[ap])\.?m\b\.?"
    r"|(?P<h24>[01]?\d|2[0-3]):(?P<m24>[0-5]\d)\b"
    r"|(?P<word>noon|midnight)\b)",
    re.IGNORECASE,
)
_NAMED_TIMES: Final = {"noon": "12:00", "midnight": "00:00"}
_NUMBER_WORDS: Final = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}
_NUMBER: Final = re.compile(r"\b(?:\d{1,6}|" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)

# Failures that are about the arguments' shape or the request, not the matched value.
_NOT_THE_VALUE: Final = frozenset(
    {
        ErrorCode.TOOL_ARGS_INVALID,
        ErrorCode.INVALID_JSON,
        ErrorCode.ARGUMENTS_TOO_LARGE,
        ErrorCode.TOOL_CALL_LIMIT,
        ErrorCode.TOOL_NOT_FOUND,
        ErrorCode.TOOL_NOT_ALLOWED,
        ErrorCode.STEP_REQUIRED,
        ErrorCode.PREREQUISITE_MISSING,
        ErrorCode.TOOL_APPROVAL_DENIED,
        ErrorCode.TOOL_APPROVAL_TIMEOUT,
    }
)

Values = Callable[[Prerequisite], list[object]]
"""The values an argument-matched prerequisite allows so far (the policy's results)."""
Calls = Callable[[str], Sequence[tuple[object, object]]]
"""A tool's successful calls so far: (arguments, result data)."""


@dataclass(frozen=True, slots=True)
class UserValues:
    """What the user's first message says, for grounded arguments: its words (as written
    and in lower case, distinct, at most 64), the times of day it names as 24-hour
    ``"HH:MM"`` ("7pm", "7:30 p.m.", "19:00", "noon"), and the whole numbers it states
    ("2", "two"; not the parts of a time)."""

    words: tuple[str, ...] = ()
    times: tuple[str, ...] = ()
    numbers: tuple[int, ...] = ()


def user_values(messages: Sequence[Mapping[str, Any]]) -> UserValues:
    """The :class:`UserValues` of the first user message."""
    first = first_user_index(messages)
    text = content_text(messages[first].get("content"), " ") if first >= 0 else ""
    words: dict[str, None] = {}
    for word in _WORD.findall(text):
        for form in (word, word.lower()):
            if len(words) < _USER_WORDS:
                words[form] = None
    times: dict[str, None] = {}
    for m in _TIME.finditer(text):
        if m["word"]:
            times[_NAMED_TIMES[m["word"].lower()]] = None
            continue
        hour, minute = int(m["hour"] or m["h24"]), int(m["minute"] or m["m24"] or 0)
        if m["half"]:
            if not 1 <= hour <= 12:
                continue
            hour = hour % 12 + (12 if m["half"].lower() == "p" else 0)
        times[f"{hour:02d}:{minute:02d}"] = None
    rest = _TIME.sub(" ", text)
    numbers: dict[int, None] = {}
    for m in _NUMBER.finditer(rest):
        numbers[int(m[0]) if m[0].isdigit() else _NUMBER_WORDS[m[0].lower()]] = None
    return UserValues(tuple(words), tuple(times)[:_USER_WORDS], tuple(numbers)[:_USER_WORDS])


def user_words(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The words of the first user message (:class:`UserValues`)."""
    return list(user_values(messages).words)


def words_pattern(words: Sequence[str]) -> str | None:
    """A JSON Schema ``pattern`` for 1 to 6 of ``words`` separated by spaces, or None
    when there are none. Words are letters and digits only: nothing needs escaping."""
    if not words:
        return None
    alternatives = "|".join(words)
    return f"^({alternatives})( ({alternatives})){{0,{_GROUNDED_WORDS - 1}}}$"


def values_under(data: object, key: str, depth: int = 0) -> Iterator[object]:
    """Scalar values stored under ``key`` anywhere in ``data`` (JSON-like)."""
    if depth > 16:
        return
    if isinstance(data, Mapping):
        for k, v in data.items():
            if k == key and isinstance(v, str | int) and not isinstance(v, bool):
                yield v
            elif isinstance(v, Mapping | list):
                yield from values_under(v, key, depth + 1)
    elif isinstance(data, list):
        for item in data:
            yield from values_under(item, key, depth + 1)


def value_key(value: object) -> str:
    """A JSON value as a hashable key (an id is a string; anything else its repr)."""
    return value if isinstance(value, str) else repr(value)


class Grounding:
    """One workflow run's grounding state: see the module docstring.

    ``hear`` the messages before each turn (the first user message is read once),
    ``narrowed`` builds the turn's schemas, and ``succeeded``/``failed`` learn from each
    call's outcome."""

    def __init__(self, workflow: WorkflowDef, schemas: Mapping[str, Mapping[str, Any]]) -> None:
        self._workflow = workflow
        self._schemas = schemas
        self._said: UserValues | None = None
        # The grounded arguments' words less those of calls whose results gave nothing.
        self.spent_words: set[str] = set()
        # (tool, argument) -> argument-matched values whose call failed for good.
        self._failed_values: dict[tuple[str, str], set[str]] = {}

    def hear(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """The user's values, from the first messages a grounded workflow sends."""
        if self._said is None and self._workflow.grounded:
            self._said = user_values(messages)

    def narrowed(self, values: Values) -> dict[str, Mapping[str, Any] | None]:
        """Tool -> its input schema narrowed (argument-matched values, grounded
        arguments), or None: an argument-matched value is needed and none is left."""
        workflow = self._workflow
        narrowed: dict[str, Mapping[str, Any] | None] = {}
        for tool, prereqs in workflow.prerequisites.items():
            schema = self._schemas.get(tool)
            for prereq in prereqs:
                if prereq.match_arg is None or schema is None:
                    continue
                props = schema.get("properties")
                if not isinstance(props, Mapping) or prereq.match_arg not in props:
                    continue
                allowed = values(prereq)
                failed = self._failed_values.get((tool, prereq.match_arg))
                if failed:
                    allowed = [v for v in allowed if value_key(v) not in failed]
                if not allowed:
                    narrowed[tool] = None
                    break
                # Only the argument changes: the rest of the schema is shared, not copied.
                changed = dict(schema)
                changed["properties"] = {**props, prereq.match_arg: {"enum": allowed}}
                narrowed[tool] = changed
                schema = changed
        said = self._said or UserValues()
        unsaid = self.spent_words | _FUNCTION_WORDS
        pattern = words_pattern([w for w in said.words if w.lower() not in unsaid])
        for tool, args in workflow.grounded.items():
            base = narrowed.get(tool, self._schemas.get(tool))
            if base is not None:
                narrowed[tool] = _grounded(base, args, pattern, said)
        return narrowed

    def succeeded(self, name: str, args: object, data: object) -> None:
        """A successful call: a grounded one whose result gave the workflow nothing spends
        its words (a small model otherwise repeats the same query until max_iterations)."""
        grounded = self._workflow.grounded.get(name)
        if grounded and isinstance(args, Mapping) and self._fruitless(name, data):
            self._spend(args, grounded)

    def failed(self, name: str, args: object, envelope: Mapping[str, object], calls: Calls) -> None:
        """A call that failed for good on an argument-matched value (the booking of a
        place that is closed or full): that value is not offered again, so the next try
        names another. Argument errors and retryable failures say nothing of the value."""
        errors = envelope.get("errors")
        first = errors[0] if isinstance(errors, list | tuple) and errors else None
        if not isinstance(first, Mapping) or not isinstance(args, Mapping):
            return
        if first.get("retryable") or first.get("code") in _NOT_THE_VALUE:
            return
        for prereq in self._workflow.prerequisites.get(name, ()):
            if prereq.match_arg is not None and prereq.match_arg in args:
                failed = self._failed_values.setdefault((name, prereq.match_arg), set())
                failed.add(value_key(args[prereq.match_arg]))
                self._spend_exhausted(prereq, failed, calls)

    def _spend_exhausted(self, prereq: Prerequisite, failed: set[str], calls: Calls) -> None:
        """A grounded call whose every matched value has now failed led nowhere either:
        its words are spent too, so the next search is not the same one again."""
        grounded = self._workflow.grounded.get(prereq.tool)
        if not grounded or prereq.result_key is None:
            return
        for args, data in calls(prereq.tool):
            found = [value_key(v) for v in values_under(data, prereq.result_key)]
            if found and all(v in failed for v in found) and isinstance(args, Mapping):
                self._spend(args, grounded)

    def _spend(self, args: Mapping[str, object], grounded: Sequence[str]) -> None:
        """The words of a grounded call's arguments are not offered again."""
        for arg in grounded:
            value = args.get(arg)
            if isinstance(value, str):
                self.spent_words.update(w.lower() for w in _WORD.findall(value))

    def _fruitless(self, name: str, data: object) -> bool:
        """Whether a result of ``name`` gives no value to any argument-matched
        prerequisite that takes its values from ``name``'s results (a search that found
        nothing to book). False when no such prerequisite exists: nothing says so."""
        keys = [
            p.result_key
            for prereqs in self._workflow.prerequisites.values()
            for p in prereqs
            if p.tool == name and p.match_arg is not None and p.result_key is not None
        ]
        return bool(keys) and not any(
            next(values_under(data, key), None) is not None for key in keys
        )


def _grounded(
    schema: Mapping[str, Any], args: Sequence[str], pattern: str | None, said: UserValues
) -> Mapping[str, Any]:
    """``schema`` with each argument of ``args`` held to what the user said: a plain
    string to ``pattern`` (the user's words); a string with a ``pattern`` of its own to the
    user's times and words that match it; a whole number to the user's numbers within its
    bounds. An argument the user said nothing usable for is left as it is."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return schema
    changed = dict(props)
    for arg in args:
        prop = props.get(arg)
        if not isinstance(prop, Mapping):
            continue
        kind = prop.get("type", "string")
        if kind == "string" and "pattern" not in prop:
            if pattern is not None:
                changed[arg] = {**prop, "type": "string", "pattern": pattern}
            continue
        values: list[object]
        if kind == "string":
            own = _compiled(prop["pattern"])
            candidates = (*said.times, *said.words)
            values = [v for v in candidates if own is not None and own.search(v)]
        elif kind in ("integer", "number"):
            fits = Draft202012Validator(prop).is_valid  # its bounds, multipleOf, type
            values = [n for n in said.numbers if fits(n)]
        else:
            continue
        if values:
            changed[arg] = {**prop, "enum": values}
    return {**schema, "properties": changed}


def _compiled(pattern: object) -> re.Pattern[str] | None:
    """A schema's ``pattern`` as a Python regex (JSON Schema's ECMA dialect shares the
    subset schemas use), or None when Python cannot read it."""
    if not isinstance(pattern, str):
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None
