"""Grounding: a workflow's arguments narrowed to what the conversation holds. No I/O.

A small model asked for an argument makes one up: a search query nobody said, a place id no
search returned. In constrained mode the turn's grammar can refuse that, if the schema of
each tool says which values exist. Two things narrow an argument:

    source                         marked by                     the argument becomes
    -----------------------------  ----------------------------  ---------------------------
    an earlier tool's results      an argument-matched           an ``enum`` of the values
    (``place_id`` from a search)   prerequisite                  the results hold, less those
                                   (``match_arg``)               whose call failed for good
    where its value comes from     ``provenance`` (declared, or  what that source holds,
    (the user's words, earlier     the defaults), and            typed by the argument's
    results or calls)              ``grounded`` (= "user")       schema
                                                                 (:mod:`toolforge.core.provenance`)

Words that led nowhere are spent: the words of a grounded call whose result gave an
argument-matched prerequisite nothing (a search that found nothing to book), or whose every
matched value then failed, are not offered again, so the next search differs.

:class:`Grounding` holds one run's state (what the user said, the successful calls, the
spent words, the failed values); the functions are pure. The workflow policy
(:mod:`toolforge.core.steps`) owns the results it narrows to and hands them in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from toolforge.core.messages import content_text, first_user_index
from toolforge.core.provenance import (
    Anything,
    CallIndex,
    Held,
    Said,
    Source,
    User,
    blamed,
    narrow_properties,
    said_in,
    values_under,
    words_pattern,
)
from toolforge.core.workflow import Prerequisite, WorkflowDef
from toolforge.errors import ErrorCode

__all__ = [
    "Grounding",
    "user_values",
    "user_words",
    "value_key",
    "values_under",
    "words_pattern",
]

_WORD_SPLIT: Final = re.compile(r"[^\W_]{1,32}")

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


def user_values(messages: Sequence[Mapping[str, Any]]) -> Said:
    """What the first user message states (:func:`toolforge.core.provenance.said_in`)."""
    first = first_user_index(messages)
    text = content_text(messages[first].get("content"), " ") if first >= 0 else ""
    return said_in(text)


def user_words(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The words of the first user message (:class:`~toolforge.core.provenance.Said`)."""
    return list(user_values(messages).words)


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
        self._said: Said | None = None
        self._calls: list[tuple[str, object, object]] = []  # successful: (tool, args, data)
        self._index = CallIndex()  # the calls' values, indexed as they come
        # Per tool, its last call when it failed for good: (arguments, message); and the
        # values each failure was about, per (tool, argument), not offered again.
        self._failures: dict[str, tuple[object, str]] = {}
        self._blamed_values: dict[tuple[str, str], set[str]] = {}
        self._outcomes = 0  # calls learned from: the narrowing's cache key
        # The grounded arguments' words less those of calls whose results gave nothing.
        self.spent_words: set[str] = set()
        # (tool, argument) -> argument-matched values whose call failed for good.
        self._failed_values: dict[tuple[str, str], set[str]] = {}
        # The argument checks of this run (keyed by the schemas' identity: they live as
        # long as the run), and the last narrowing with what it was computed from.
        self._memo: dict[object, Any] = {}
        self._last: tuple[tuple[object, ...], dict[str, Mapping[str, Any] | None]] | None = None
        # Per tool: its declared provenance, with its argument-matched arguments left to
        # the prerequisite's enum (they are narrowed already).
        self._declared: dict[str, dict[str, tuple[Source, ...]]] = {}
        for tool in workflow.tools:
            declared = dict(workflow.provenance.get(tool, {}))
            for prereq in workflow.prerequisites.get(tool, ()):
                if prereq.match_arg is not None:
                    declared[prereq.match_arg] = (Anything(),)
            self._declared[tool] = declared

    def hear(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """The user's values, from the first messages the workflow sends."""
        if self._said is None:
            self._said = user_values(messages)

    def narrowed(self, values: Values) -> dict[str, Mapping[str, Any] | None]:
        """Tool -> its input schema narrowed (argument-matched values, provenance), or
        None: a value it needs does not exist yet."""
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
        # Nothing new since the last turn (no call succeeded, no word or value spent): the
        # same schemas, so the grammar's rules for them are the same too.
        state = (
            self._outcomes,
            len(self._calls),
            len(self.spent_words),
            sum(len(v) for v in self._failed_values.values()),
            tuple((t, None if s is None else id(s)) for t, s in narrowed.items()),
        )
        if self._last is not None and self._last[0] == state:
            return dict(self._last[1])
        held = Held(
            said=self._said or Said(),
            calls=tuple(self._calls),
            index=self._index,
            spent=frozenset(self.spent_words),
            failures=dict(self._failures),
            failed={key: frozenset(v) for key, v in self._blamed_values.items()},
        )
        for tool in workflow.tools:
            base = narrowed[tool] if tool in narrowed else self._schemas.get(tool)
            if base is None:
                continue
            out = narrow_properties(
                tool, base, self._declared[tool], held, defaults=True, memo=self._memo
            )
            if out is not base:
                narrowed[tool] = out
        self._last = (state, narrowed)
        return dict(narrowed)

    def succeeded(self, name: str, args: object, data: object) -> None:
        """A successful call: its values are held from now on; a grounded one whose
        result gave the workflow nothing spends its words (a small model otherwise repeats
        the same query until max_iterations)."""
        self._calls.append((name, args, data))
        self._outcomes += 1
        self._failures.pop(name, None)
        grounded = self._user_args(name)
        if not grounded or not isinstance(args, Mapping):
            return
        again = max(self._workflow.max_calls.get(name, 1), self._workflow.min_calls.get(name, 1))
        if self._fruitless(name, data) or again > 1:
            # Led nowhere, or a tool meant to be called again (one report per supplier):
            # its words are not offered again, so the next call differs.
            self._spend(args, grounded)

    def failed(self, name: str, args: object, envelope: Mapping[str, object], calls: Calls) -> None:
        """A call that failed for good on an argument-matched value (the booking of a
        place that is closed or full): that value is not offered again, so the next try
        names another; the user's words it used are spent too. Argument errors and
        retryable failures say nothing of the value."""
        errors = envelope.get("errors")
        first = errors[0] if isinstance(errors, list | tuple) and errors else None
        if not isinstance(first, Mapping) or not isinstance(args, Mapping):
            return
        if first.get("retryable") or first.get("code") in _NOT_THE_VALUE:
            return
        # The tool's message is read by the retry: the arguments it is about
        # (``provenance.blamed``) take what it offers, and not the value that failed.
        message = str(first.get("message") or "")
        self._outcomes += 1
        self._failures[name] = (args, message)
        for arg in blamed(args, message):
            if args.get(arg) is not None:
                self._blamed_values.setdefault((name, arg), set()).add(value_key(args[arg]))
        # The user's words that made a call fail for good ("no log for 'errors'") are not
        # offered again: the next try takes other words of the user's.
        grounded = self._user_args(name)
        if grounded:
            self._spend(args, grounded)
        for prereq in self._workflow.prerequisites.get(name, ()):
            if prereq.match_arg is not None and prereq.match_arg in args:
                failed = self._failed_values.setdefault((name, prereq.match_arg), set())
                failed.add(value_key(args[prereq.match_arg]))
                self._spend_exhausted(prereq, failed, calls)

    def _user_args(self, tool: str) -> list[str]:
        """The arguments of ``tool`` whose declared provenance includes the user."""
        return [
            arg
            for arg, sources in self._workflow.provenance.get(tool, {}).items()
            if any(isinstance(s, User) for s in sources)
        ]

    def _spend_exhausted(self, prereq: Prerequisite, failed: set[str], calls: Calls) -> None:
        """A grounded call whose every matched value has now failed led nowhere either:
        its words are spent too, so the next search is not the same one again."""
        grounded = self._user_args(prereq.tool)
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
                self.spent_words.update(w.lower() for w in _WORD_SPLIT.findall(value))

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
