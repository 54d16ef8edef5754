"""Relevance: whether a user's message names one of the functions offered. No I/O.

A small model offered its functions and ``respond`` (the answer as a call, under
``tool_choice: auto``) picks between them by noise: SmolLM2-135M answers in words about one
request in ten where a call is wanted, and calls a function that cannot help about nine
times in ten where none is (bench/RESULTS.md, "BFCL irrelevance" and "The relevance
guard"). The message itself says more: a request that uses a word of a function's name or
description ("the *weather* in Paris" for ``get_weather``, "*convert* 250 dollars" for
``convert_currency``) is, nearly always, a request for it.

:func:`named_in` finds those words (:func:`toolforge.core.words.stems`). A word counts by
its first five letters (``conversion`` names ``convert``, ``probabilities`` names
``probability_of_event``) after a final "s" is dropped ("books" names
``search_holy_book``); names are split at ``_``, ``.``, ``-`` and lower-to-upper case
changes; function words of the languages :mod:`toolforge.core.provenance` knows, and the
words any request or function may use (:data:`~toolforge.core.words.GENERIC_WORDS`:
"get", "find", "calculate", "one", "another"), name nothing; so do words of two letters or
fewer, and digits.

This is a lexical reading, on purpose: no model at this size judges relevance better than
chance, and a reading in the words can only say "named", never "not relevant" (a user
writing in another language than the functions' descriptions names nothing, and the model
decides as it would have). The proxy uses it to take ``respond`` out of the grammar of a
plain request whose last message names a function (its ``relevance`` guardrail,
docs/proxy.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from toolforge.core.words import stems

__all__ = ["named_in"]


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
