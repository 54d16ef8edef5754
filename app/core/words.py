"""The words of a message that say nothing, and how a word is compared. No I/O.

Two readers of a user's message share these: :mod:`toolforge.core.provenance` (function
words are never a grounded string's words) and :mod:`toolforge.core.relevance` (whether a
message names a function). :func:`flag_in` reads a boolean argument from the message.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["FUNCTION_WORDS", "GENERIC_WORDS", "NEGATIONS", "STEM_LETTERS", "flag_in", "stems"]

# Function words of the languages provenance's number and month tables know (English,
# German, French; Spanish and Italian): a plain string made of
# them says nothing ("for a", "pour le"), and a 135M model picks them (the likeliest
# tokens), so they are not offered as a grounded string's words. Data, one line a language.
FUNCTION_WORDS: Final = frozenset(
    " ".join(
        (
            # English
            "a about after all also am an and any are as at be been before but by can could "
            "did do does for from had has have he her him his how i if in into is it its me "
            "my no nor not of on or our ours she so some than that the their them then there "
            "these they this those to too us very was we were what when where which while who "
            "whom why will with would you your please",
            # German
            "der die das den dem des ein eine einen einem einer eines und oder aber für fur "
            "mit von zu zum zur im in am an auf aus bei nach um ich du er sie es wir ihr mir "
            "mich uns ist sind bin war bitte nicht kein keine was wie wo wann",
            # French
            "le la les l un une des du de d et ou mais pour avec sans dans sur sous à au aux "
            "je tu il elle nous vous ils elles me moi est sont suis pas ne que qui quoi où "
            "quand comment ce cet cette ces s'il plait svp",
            # Spanish and Italian
            "el los las y o para con sin en por que una uno unos unas del al lo il gli e "
            "per di da con su non",
        )
    ).split()
)
# Verbs any function may start with, and any request may use, and the words of counting:
# they tell which function is meant no more than "the" does. English, the language
# functions are described in.
GENERIC_WORDS: Final = frozenset(
    "get set find give show tell make calculate compute determine retrieve fetch list return "
    "use using given based want need help like know provide create check run perform look "
    "search one two three another other each every same".split()
)
STEM_LETTERS: Final = 5  # a word counts by this many first letters
# Words that turn the next few words around ("without air resistance", "ohne Details").
NEGATIONS: Final = frozenset(
    "no not without never exclude excluding don't dont doesn't nor ohne nicht kein keine "
    "keinen sans pas jamais sin".split()
)
_MAX_TEXT: Final = 8192  # characters of the message read
_WORD: Final = re.compile(r"[^\W\d_]{3,32}")
_ANY_WORD: Final = re.compile(r"[^\W\d_][^\W\d_']*(?:'t)?")
_CASE_CHANGE: Final = re.compile(r"(?<=[a-z])(?=[A-Z])")
_NEGATION_REACH: Final = 3  # a negation turns this many words after it


def _stem(word: str) -> str:
    """A lower-case word as compared: a final "s" dropped, then its first
    :data:`STEM_LETTERS` letters."""
    if word[-1] == "s" and word[-2] != "s" and len(word) > 3:
        word = word[:-1]
    return word[:STEM_LETTERS]


def stems(text: str) -> frozenset[str]:
    """The words of ``text`` that may name something, each as its first
    :data:`STEM_LETTERS` letters, lower case."""
    text = _CASE_CHANGE.sub(" ", text[:_MAX_TEXT])
    return frozenset(
        _stem(word)
        for word in _WORD.findall(text.lower())
        if word not in FUNCTION_WORDS and word not in GENERIC_WORDS
    )


def flag_in(name: str, text: str) -> bool | None:
    """What ``text`` says of a boolean argument called ``name``: True where it uses a word
    of the name ("with details" for ``detailed``, "assuming equal variance" for
    ``equal_variance``), False where each such word follows a negation within three words
    ("without air resistance" for ``air_resistance``), None where it uses none (or both
    ways)."""
    wanted = stems(name.replace("_", " ").replace("-", " "))
    if not wanted:
        return None
    said: set[bool] = set()
    words = [w.lower() for w in _ANY_WORD.findall(text[:_MAX_TEXT])]
    for i, word in enumerate(words):
        if len(word) < 3 or word in FUNCTION_WORDS or _stem(word) not in wanted:
            continue
        before = words[max(0, i - _NEGATION_REACH) : i]
        said.add(not any(w in NEGATIONS for w in before))
    return said.pop() if len(said) == 1 else None
