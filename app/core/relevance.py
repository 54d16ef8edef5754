"""Relevance: whether a user's message names one of the functions offered. No I/O.

A small model offered its functions and ``respond`` (the answer as a call, under
``tool_choice: auto``) picks between them by noise: SmolLM2-135M answers in words about one
request in ten where a call is wanted, and calls a function that cannot help about nine
times in ten where none is (bench/RESULTS.md, "BFCL irrelevance" and "The relevance
guard"). The message itself says more: a request that uses a word of a function's name or
description ("the *weather* in Paris" for ``get_weather``, "*convert* 250 dollars" for
``convert_currency``) is, nearly always, a request for it.

:func:`named_in` finds those words. A word counts by its first five letters
(``conversion`` names ``convert``, ``probabilities`` names ``probability_of_event``),
names are split at ``_``, ``.``, ``-`` and lower-to-upper case changes, and a word names
nothing when it is a function word of the languages :mod:`toolforge.core.provenance` knows
or one of the words any request or function may use (:data:`GENERIC_WORDS`: "get",
"find", "calculate", "one", "another"). A final "s" is dropped first ("books" names
``search_holy_book``). Words of two letters or fewer, and digits, are left out.

This is a lexical reading, on purpose: no model at this size judges relevance better than
chance, and a reading in the words can only say "named", never "not relevant" (a user
writing in another language than the functions' descriptions names nothing, and the model
decides as it would have). The proxy uses it to take ``respond`` out of the grammar of a
plain request whose last message names a function (its ``relevance`` guardrail,
docs/proxy.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Final

from toolforge.core.provenance import FUNCTION_WORDS

__all__ = ["GENERIC_WORDS", "STEM_LETTERS", "named_in", "stems"]

# Verbs any function may start with, and any request may use, and the words of counting:
# they tell which function is meant no more than "the" does. English, the language
# functions are described in.
GENERIC_WORDS: Final = frozenset(
    "get set find give show tell make calculate compute determine retrieve fetch list return "
    "use using given based want need help like know provide create check run perform look "
    "search one two three another other each every same".split()
)
STEM_LETTERS: Final = 5  # a word counts by this many first letters
_MAX_TEXT: Final = 8192  # characters of the message read
_WORD: Final = re.compile(r"[^\W\d_]{3,32}")
_CASE_CHANGE: Final = re.compile(r"(?<=[a-z])(?=[A-Z])")


def stems(text: str) -> frozenset[str]:
    """The words of ``text`` that may name something, each as its first
    :data:`STEM_LETTERS` letters, lower case."""
    text = _CASE_CHANGE.sub(" ", text[:_MAX_TEXT])
    return frozenset(
        (word[:-1] if word[-1] == "s" and word[-2] != "s" and len(word) > 3 else word)[
            :STEM_LETTERS
        ]
        for word in _WORD.findall(text.lower())
        if word not in FUNCTION_WORDS and word not in GENERIC_WORDS
    )


@functools.lru_cache(maxsize=512)
def _function_stems(name: str, description: str) -> frozenset[str]:
    """A function's words, once per name and description (a client sends the same tools
    on every request)."""
    return stems(name.replace("_", " ").replace(".", " ").replace("-", " ")) | stems(description)


def named_in(text: str, functions: Mapping[str, str]) -> dict[str, list[str]]:
    """The functions (name -> description) that ``text`` names, each with the words that
    name it (as stems, sorted); empty when it names none."""
    said = stems(text)
    if not said:
        return {}
    out: dict[str, list[str]] = {}
    for name, description in functions.items():
        shared = said & _function_stems(name, description or "")
        if shared:
            out[name] = sorted(shared)
    return out
