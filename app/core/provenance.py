"""Argument provenance: where a tool argument's value may come from. No I/O.

A small model asked for an argument makes one up: a city spelled "MADRADAS", a place id no
search returned, a contact nobody gave. In constrained mode the turn's grammar can refuse
that, if each argument says which values exist. A workflow declares, per tool and argument,
where a value comes from (``provenance`` in docs/workflows.md):

    source                      written as                          the values
    --------------------------  ----------------------------------  ----------------------------
    the user's words            ``"user"``                          what the user's first message
                                                                    states, typed by the
                                                                    argument's schema (below)
    earlier tools' results      ``"results"``, or                   scalars found in successful
                                ``{"results": TOOL, "key": K}``     results (under K; by default
                                                                    under the argument's name)
    earlier calls' arguments    ``"calls"``, or                     the same argument (or ARG)
                                ``{"calls": TOOL, "arg": ARG}``     of earlier successful calls
    the schema alone            ``"schema"``                        anything the schema allows

A list is the union of its sources. What the user said is read by the argument's JSON
Schema ``type`` and ``format``, the same in every language: an ``integer`` or ``number``
is a number the message writes in digits (``2``, ``2,5``, ``-3``) or as a number word of
English, German or French up to twelve (a percentage, for a ``number``, its fraction
unless the argument says it is in percent); a ``date`` an ISO date, a
day-first numeric date (``3.12.2026``, ``03/12/2026``) or a day, a month name of those
languages and a year (``3 décembre 2026``); a ``time`` a time of day (``19:30``,
``19h30``, ``19 Uhr``, ``7pm``, ``7:30 p.m.``) as ``HH:MM`` (``HH:MM:SS`` and an offset,
``Z``, where the schema's format asks for one); a ``date-time`` a date and a time of it;
a plain string that is a date by its description ("MM-DD-YYYY") or name (``check_in_date``)
the dates, in that form (:func:`date_form`);
an identifier (an argument named ``id`` or ``*_id``/``*Id``, or ``format: uuid``) a token
of the message holding a digit (``T-1001``); any other string 1 to 6 of the message's
words. Every value offered is checked against the argument's own schema (its pattern,
bounds, format): a value that would fail validation is never offered.

Where a workflow declares nothing for an argument, a default applies (:func:`default_sources`):

    argument                                    default
    ------------------------------------------  ---------------------------------------------
    ``enum``/``const``, boolean, object, array  the schema alone
    required number, date, time, date-time      the user, earlier results (under any key),
                                                earlier calls
    required identifier                         earlier results (under its name or ``id``),
                                                earlier calls, the user's tokens
    required identifier, integer identifier     (also) the identifiers written inside earlier
                                                results' strings; nothing held: the tool is left
                                                out of a workflow's turn
    required e-mail address                     the user's addresses, earlier results and calls
    required plain string                       the schema alone (free text: a resolution, a
                                                message)
    optional argument                           earlier results and calls under its name
                                                only; with nothing there it is left out

A request with no workflow (the OpenAI-compatible proxy's plain requests, switched off by
its ``provenance`` guardrail) gets the same defaults, except that a boolean is what the
user's words say of it (:func:`toolforge.core.words.flag_in`; an optional one they name
is given, one they do not name is left out), a plain string may also be a value its
description documents in quotes ("Can be 'melting' or 'vaporization'", "Default is
'cm'"; :func:`described_values`, less the examples after "e.g.") and is that value, given,
where the user's words name it ("in Celsius" for 'Celsius'; :func:`named_values`), and
those words are then no other plain string's (:func:`_spend_named`), an
optional plain string is the user's like a required one (their words, quotes, names) or
left out, and an optional number may
take the user's numbers only when the user wrote more numbers than the tool's required
number arguments take ("height 150" is no gravity; "10 m/s for 5 s at 9.8" has a number
for the optional acceleration).

A call that failed for good teaches its retry (:func:`blamed`, :func:`error_values`,
:func:`in_their_form`): the arguments its message names or quotes take what the message
offers (a list it names, its words, the form of an identifier it shows), never the value
that failed; a value the list holds in another case (``Billing`` refused, "one of billing,
bug") is the one meant; an identifier a tool refused is not offered to an argument of the
same name on any tool (docs/workflows.md).

A declared source that holds nothing leaves the tool out of the turn while the argument is
required (its values do not exist yet: call what produces them first), unless the user is
one of its sources (the user said nothing for it: its schema decides), and leaves an
optional argument out; a default that holds nothing leaves a required argument to its
schema.

:func:`narrow_properties` applies it to one tool's input schema; the workflow policy
(:mod:`toolforge.core.steps`) and the per-turn compiler (:mod:`toolforge.core.compiler`)
call it with what the run holds.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import orjson

from toolforge.core.schemas import compile_schema
from toolforge.core.words import FUNCTION_WORDS as _FUNCTION_WORDS
from toolforge.core.words import flag_in, stems
from toolforge.errors import RequestError

__all__ = [
    "DROPPED",
    "CallIndex",
    "Calls",
    "Held",
    "Results",
    "Said",
    "Source",
    "User",
    "default_sources",
    "described_values",
    "named_values",
    "narrow_properties",
    "parse_sources",
    "said_in",
    "values_under",
    "words_pattern",
]

_MAX_VALUES: Final = 64  # values offered per argument (the grammar's enum)
_MAX_WORDS: Final = 64  # distinct words of the user's message
_SPAN_WORDS: Final = 6  # a plain string from the user: 1 to this many of their words
_MAX_TEXT: Final = 8192  # characters of the user's message read (a bound on the scan)

# -- what the user said ------------------------------------------------------------------------

# Words in any script: letters and digits (``\w`` less ``_``), at most 32 characters.
_WORD: Final = re.compile(r"[^\W_]{1,32}")
# A token holding a digit: an identifier as people write one ("T-1001", "ORD_77", "a1b2").
_TOKEN: Final = re.compile(r"[^\W_][\w\-./:#]{0,63}")
# An e-mail address, whole ("ana@example.com"): a value people give to be used as written.
_EMAIL: Final = re.compile(r"[\w.+-]{1,64}@[^\W_][\w-]*(?:\.[\w-]+)+")
# Number words up to twelve in English, German and French ("zwei", "deux"); Spanish and
# Italian ones are left out: "once", "due" and "sei" are words of other languages too.
_NUMBER_WORDS: Final = {
    word: value
    for line in (
        "zero one two three four five six seven eight nine ten eleven twelve",
        "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf",
        "zéro un deux trois quatre cinq six sept huit neuf dix onze douze",
    )
    for value, word in enumerate(line.split())
}
# "un"/"une" and "eins"' "ein"/"eine" are articles as often as numbers ("einen Tisch"):
# as English "a", they state no number.
del _NUMBER_WORDS["un"]
# A scale word after a number multiplies it ("100 million" is 100000000, "2,5 Milliarden"
# 2500000000): English, German, French, the languages of the tables above.
_SCALES: Final = {
    word: 10**power
    for power, line in (
        (3, "thousand tausend mille"),
        (6, "million millions millionen mio"),
        (9, "billion billions milliarde milliarden milliard milliards mrd"),
    )
    for word in line.split()
}
_SCALE_AFTER: Final = re.compile(r"\s{1,3}([^\W\d_]{3,12})\b")
# Month names (and their usual abbreviations' first three letters), the same languages.
_MONTHS: Final = {
    name: month
    for line in (
        "january february march april may june july august september october november december",
        "januar februar märz april mai juni juli august september oktober november dezember",
        "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
        "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre",
        "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre "
        "dicembre",
    )
    for month, name in enumerate(line.split(), start=1)
}
# Times of day: "19:30", "19h30", "19h", "19 Uhr", "19.30 Uhr", "7pm", "7:30 p.m.", "noon".
# "7am" and "7 a.m." but not "7 am": German "am" is "on" ("2 am 3.12." is "2 on the 3rd").
_TIME: Final = re.compile(
    r"(?<![\w:.])(?:"
    r"(?P<h12>1[0-2]|0?[1-9])(?:[:.](?P<m12>[0-5]\d))?"
    r"(?:\s?(?P<half>p)\.?\s?m\b\.?|(?P<am>a)(?:m\b|\.\s?m\b\.?)|\s(?P<am2>a)\.\s?m\b\.?)"
    r"|(?P<h24>[01]?\d|2[0-3])(?:[:h](?P<m24>[0-5]\d)(?:\s?uhr\b)?"
    r"|\.(?P<dotted>[0-5]\d)\s?uhr\b|\s?(?:h|uhr)\b)"
    r"|(?P<named>noon|midnight|midi|minuit|mittag|mitternacht|mediodía|mezzogiorno|mezzanotte)\b"
    r")(?![\d:])",
    re.IGNORECASE,
)
_NAMED_TIMES: Final = {
    "noon": 12,
    "midi": 12,
    "mittag": 12,
    "mediodía": 12,
    "mezzogiorno": 12,
    "midnight": 0,
    "minuit": 0,
    "mitternacht": 0,
    "mezzanotte": 0,
}
_ISO_DATE: Final = re.compile(r"(?<!\d)(\d{4})[-/](\d{2})[-/](\d{2})(?!\d)")
_DAY_FIRST: Final = re.compile(r"(?<![\d.])(\d{1,2})[./](\d{1,2})[./](\d{4})(?!\d)")
_NAMED_DATE: Final = re.compile(
    r"(?<!\d)(\d{1,2})(?:st|nd|rd|th|er|\.)?\s+([^\W\d_]{3,12})\.?,?\s+(\d{4})(?!\d)"
)
_MONTH_FIRST: Final = re.compile(
    r"\b([^\W\d_]{3,12})(?:\.\s{0,2}|\s{1,2})(\d{1,2})(?:st|nd|rd|th)?(?:,\s{0,2}|\s{1,2})(\d{4})(?!\d)"
)
# The form a plain string's description gives a date: "YYYY-MM-DD", "MM-DD-YYYY",
# "dd/mm/yyyy" (a year, a month and a day, one separator), "month-day-year" in words, or a
# date as example ("e.g., 2022-04-28").
_DATE_FORM: Final = re.compile(
    r"(?<![A-Za-z])([YyMmDd]{1,4})([-/.])([YyMmDd]{1,4})\2([YyMmDd]{1,4})(?![A-Za-z])"
)
_DATE_FORM_WORDS: Final = re.compile(r"\b(year|month|day)-(year|month|day)-(year|month|day)\b")
_DATE_EXAMPLE: Final = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
# A date by its name: ``date``, ``*_date``, ``*Date`` (API naming).
_DATE_NAME: Final = re.compile(r"^date$|_date$|[a-z]Date$")
_FORM_PARTS: Final = {"y": "%Y", "m": "%m", "d": "%d"}
# A number: digits with one decimal separator ("2.5", "2,5"), or groups of three digits
# ("10,000", "10.000", "1 000 000" with narrow or no-break spaces), an exponent ("1e-3"),
# a percent sign ("5%").
_NUMBER: Final = re.compile(
    r"(?<![\w.,:/-])(-?(?:\d{1,3}(?:(?P<sep>[,.\u202f\u00a0])\d{3})(?:(?P=sep)\d{3})*"
    r"(?:[.,]\d{1,6})?|\d{1,12}(?:[.,]\d{1,6})?)(?:[eE][-+]?\d{1,3})?)(?P<pct>\s?%)?"
    r"(?![\d_:/]|[.,]\d)"  # a unit may follow: "5C", "10kg", "3m"
)


@dataclass(frozen=True, slots=True)
class Said:
    """What the user's message states, read once: its words (as written and in lower case,
    distinct), tokens (e-mail addresses, and words holding a digit), numbers, times of day
    (``HH:MM``), dates (``YYYY-MM-DD``). Numbers exclude the parts of times and dates."""

    words: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()
    numbers: tuple[int | float, ...] = ()
    times: tuple[str, ...] = ()
    dates: tuple[str, ...] = ()
    names: tuple[str, ...] = ()  # the things the user named (:func:`names_in`)
    # Read only for a request with no workflow (``said_in(phrases=True)``): what the user put
    # in quotes, and runs of 1 to 6 of their words, as written (:func:`quoted_in`,
    # :func:`spans_in`).
    quoted: tuple[str, ...] = ()
    spans: tuple[str, ...] = ()
    text: str = ""  # the message as read (to _MAX_TEXT), for its flags (:func:`flag_in`)
    # the stems of its words (:func:`words.stems`): which documented values it names
    # (:func:`named_values`)
    stems: frozenset[str] = frozenset()
    lists: tuple[list[int | float], ...] = ()  # lists of numbers written in brackets
    # the numbers written more than once ("2 adults for 2 nights"): two arguments of one call
    # may both take one of these, and no other (plain requests, :func:`_one_value_each`)
    repeated: tuple[int | float, ...] = ()
    # the numbers one written number may mean ("10,000": 10000 and 10; "5%": 5 and 0.05):
    # an argument that takes one of them takes the written number, and no other argument
    # of the call takes the other
    alike: tuple[tuple[int | float, ...], ...] = ()
    # each percentage as written and as a fraction ("5%": (5, 0.05)): a rate is one or the
    # other, by its argument (:func:`_from_user`)
    percents: tuple[tuple[int | float, int | float], ...] = ()


def said_in(text: str, *, phrases: bool = False) -> Said:
    """The :class:`Said` of ``text`` (see the module docstring); ``phrases``: its quoted
    values and runs of words too, which only a request with no workflow reads."""
    text = text[:_MAX_TEXT]
    words: dict[str, None] = {}
    for word in _WORD.findall(text):
        for form in (word, word.lower()):
            if len(words) < _MAX_WORDS:
                words[form] = None
    dates: dict[str, int] = {}  # each date at where the text first writes it
    rest = text
    for pattern, order in ((_ISO_DATE, "ymd"), (_DAY_FIRST, "dmy")):
        for m in pattern.finditer(text):
            parts = dict(zip(order, m.groups(), strict=True))
            found = _date(parts["y"], parts["m"], parts["d"])
            if found:
                dates.setdefault(found, m.start())
        rest = pattern.sub(_blank, rest)  # blanked, so positions still hold

    def named(day: int, month: int, year: int) -> Callable[[re.Match[str]], str]:
        def take(m: re.Match[str]) -> str:
            number = _MONTHS.get(m[month].lower()) or _month_prefix(m[month])
            found = _date(m[year], str(number), m[day]) if number else None
            if found is None:
                return m[0]  # "3 kids, 0700" is no date: its numbers stay numbers
            dates.setdefault(found, m.start())
            return _blank(m)

        return take

    rest = _NAMED_DATE.sub(named(1, 2, 3), rest)
    rest = _MONTH_FIRST.sub(named(2, 1, 3), rest)
    times: dict[str, None] = {}
    for m in _TIME.finditer(rest):
        if m["named"]:
            times[f"{_NAMED_TIMES[m['named'].lower()]:02d}:00"] = None
            continue
        if m["h12"]:
            hour = int(m["h12"]) % 12 + (12 if m["half"] else 0)
            minute = int(m["m12"] or 0)
        else:
            hour, minute = int(m["h24"]), int(m["m24"] or m["dotted"] or 0)
        times[f"{hour:02d}:{minute:02d}"] = None
    rest = _TIME.sub(" ", rest)
    tokens = {m[0].rstrip("."): None for m in _EMAIL.finditer(rest)}
    rest = _EMAIL.sub(" ", rest)
    tokens |= {
        t.rstrip(".:/-#"): None
        for t in _TOKEN.findall(rest)
        if any(c.isdigit() for c in t) and not _NUMBER.fullmatch(t.rstrip(".:/-#"))
    }
    # A list in brackets is its items: "[200,300,400,500]" is four numbers, not one grouped
    # by thousands.
    rest = _NUMBER_LIST.sub(lambda m: m[0].replace(",", ", "), rest)
    numbers: dict[int | float, int] = {}  # each number, and how many times it is written
    alike: list[tuple[int | float, ...]] = []
    percents: list[tuple[int | float, int | float]] = []
    for m in _NUMBER.finditer(rest):
        after = _SCALE_AFTER.match(rest, m.end())
        scale = _SCALES.get(after[1].lower(), 1) if after and not m["pct"] else 1
        read: dict[int | float, None] = {}
        for value in _readings(m[1], m["sep"], percent=bool(m["pct"])):
            if scale != 1:  # "100 million": the number meant, not its first word
                value = round(value * scale, 6)
                value = int(value) if float(value).is_integer() else value
            read[value] = None
        for value in read:
            numbers[value] = numbers.get(value, 0) + 1
        if len(read) > 1 and len(alike) < _MAX_VALUES:
            alike.append(tuple(read))
        if m["pct"] and len(read) == 2 and len(percents) < _MAX_VALUES:
            percents.append(cast(tuple[int | float, int | float], tuple(read)))
    for word in _WORD.findall(rest):
        if (n := _NUMBER_WORDS.get(word.lower())) is not None:
            numbers[n] = numbers.get(n, 0) + 1
    return Said(
        names=names_in(text),
        quoted=quoted_in(text) if phrases else (),
        lists=lists_in(text),
        spans=spans_in(text) if phrases else (),
        text=text if phrases else "",
        stems=stems(text) if phrases else frozenset(),
        words=tuple(words),
        tokens=tuple(tokens)[:_MAX_WORDS],
        numbers=tuple(numbers)[:_MAX_VALUES],
        repeated=tuple(n for n, times in numbers.items() if times > 1)[:_MAX_VALUES],
        alike=tuple(alike),
        percents=tuple(percents),
        times=tuple(times)[:_MAX_VALUES],
        dates=tuple(sorted(dates, key=dates.__getitem__))[:_MAX_VALUES],
    )


def _blank(m: re.Match[str]) -> str:
    """What a match read is replaced with: as many spaces, so later readers' positions
    still hold."""
    return " " * len(m[0])


def _readings(raw: str, sep: str | None, *, percent: bool) -> list[int | float]:
    """The values a written number may mean: "10,000" is ten thousand in English and ten
    in German, so both; "5%" is 5 and 0.05 (a rate)."""
    texts = [raw]
    if sep is not None:
        texts = [raw.replace(sep, "")]  # grouped thousands
        if sep in ",." and raw.count(sep) == 1:
            texts.append(raw.replace(",", "."))  # or one decimal separator
    out: list[int | float] = []
    for text in texts:
        text = text.replace(",", ".")
        try:
            value = float(text)
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue
        for v in (value, value / 100) if percent else (value,):
            out.append(int(v) if v.is_integer() and abs(v) < 2**53 else round(v, 12))
    return out


def _month_prefix(word: str) -> int | None:
    """A month named by its first three letters or more ("Dez", "déc", "Sept")."""
    low = word.lower()
    if len(low) < 3:
        return None
    found = {m for name, m in _MONTHS.items() if name.startswith(low)}
    return found.pop() if len(found) == 1 else None


def _date(year: str, month: str, day: str) -> str | None:
    y, m, d = int(year), int(month), int(day)
    if not (1 <= m <= 12 and 1 <= d <= 31 and 1000 <= y <= 9999):
        return None
    days = (
        31,
        29 if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 28,
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    )[m - 1]
    return f"{y:04d}-{m:02d}-{d:02d}" if d <= days else None


# A value in quotes: 'Ticket to Ride', "Apple Inc.", “David”. The closing quote ends a word
# ("It's" inside 'I love it! It's fresh.' does not close it).
_QUOTED: Final = re.compile(
    r"(?<!\w)'((?:[^'\n]|'(?=\w)){1,200}?)'(?!\w)|\"([^\"\n]{1,200}?)\"|“([^”\n]{1,200}?)”|‘([^’\n]{1,200}?)’"
)
# Between two words of one span: spaces and the marks inside a phrase ("2x^2", "x = 1",
# "January 1, 2021", "Paris, France"), at most 3 characters; a sentence's end or a clause's
# (". ! ? ; :"), a quote or a bracket ends the span.
_SPAN_GAP: Final = re.compile(r"[^.!?;:\n\"'“”‘’()\[\]{}]{1,3}")
_MAX_SPANS: Final = 256
# The characters a pattern must escape (ECMA-262's SyntaxCharacter).
_SYNTAX: Final = frozenset("^$\\.*+?()[]{}|/")


# Two or more numbers in brackets or parentheses, comma-separated: a list the user wrote.
_NUMBER_LIST: Final = re.compile(
    r"[\[(]\s{0,3}(-?\d{1,12}(?:\.\d{1,12})?(?:\s{0,3},\s{0,3}-?\d{1,12}(?:\.\d{1,12})?){1,63})\s{0,3}[\])]"
)


# Three or more numbers written as a series without brackets ("the values 12, 24, 36",
# "85, 90, 88 and 92", "12, 24 und 36"): a comma and a space between them, "and" before
# the last allowed (in the languages of the number words: und, et, y, e).
_NUMBER_SERIES: Final = re.compile(
    r"(?<![\w.,\-])(-?\d{1,12}(?:\.\d{1,12})?(?:,\s{1,3}-?\d{1,12}(?:\.\d{1,12})?){1,63}"
    r"(?:,?\s{1,3}(?:and|und|et|y|e)\s{1,3}-?\d{1,12}(?:\.\d{1,12})?)?)(?![\w%]|[.,]\d|\s?%)"
)
_SERIES_SPLIT: Final = re.compile(r",?\s{1,3}(?:and|und|et|y|e)\s{1,3}|,\s{0,3}")


def lists_in(text: str) -> tuple[list[int | float], ...]:
    """The lists of numbers ``text`` writes in brackets ("[3, 4, 5]", "(40.7128, -74.006)"),
    then as a series of three or more ("the values 12, 24, 36"), each as its numbers."""
    text = text[:_MAX_TEXT]
    out: list[list[int | float]] = []
    for m in _NUMBER_LIST.finditer(text):
        numbers = [float(n) for n in m[1].split(",")]
        out.append([int(n) if n.is_integer() else n for n in numbers])
    for m in _NUMBER_SERIES.finditer(_NUMBER_LIST.sub(_blank, text)):
        numbers = [float(n) for n in _SERIES_SPLIT.split(m[1])]
        if len(numbers) >= 3:
            out.append([int(n) if n.is_integer() else n for n in numbers])
    return tuple(out[:_MAX_VALUES])


def quoted_in(text: str) -> tuple[str, ...]:
    """What ``text`` puts in quotes, whole and as written: a value given to be used as is."""
    found = (
        next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(text[:_MAX_TEXT])
    )
    return tuple(dict.fromkeys(q.strip() for q in found if q.strip()))[:_MAX_VALUES]


def spans_in(text: str) -> tuple[str, ...]:
    """Runs of 1 to 6 words of ``text`` as written, inside one phrase ("plasma membrane",
    "New York City", "theory of relativity"): a function word may sit inside a run but
    neither starts nor ends one."""
    tokens = list(_NAME_TOKEN.finditer(text[:_MAX_TEXT]))
    out: dict[str, None] = {}
    for i, first in enumerate(tokens):
        if first[0].lower() in _FUNCTION_WORDS:
            continue
        for j in range(i, min(i + _SPAN_WORDS, len(tokens))):
            last = tokens[j]
            if j > i and not _SPAN_GAP.fullmatch(text[tokens[j - 1].end() : last.start()]):
                break
            if last[0].lower() in _FUNCTION_WORDS:
                continue
            out[text[first.start() : last.end()]] = None
            if len(out) >= _MAX_SPANS:
                return tuple(out)
    return tuple(out)


def spans_pattern(spans: Sequence[str]) -> str | None:
    """A JSON Schema ``pattern`` for exactly one of ``spans``, or None when there are none
    (a span holding a character a JSON string escapes is left out)."""
    usable = [s for s in spans if '"' not in s and "\\" not in s]
    if not usable:
        return None
    escaped = ("".join("\\" + c if c in _SYNTAX else c for c in s) for s in usable)
    return f"^({'|'.join(escaped)})$"


def words_pattern(words: Sequence[str]) -> str | None:
    """A JSON Schema ``pattern`` for 1 to 6 of ``words`` separated by spaces, or None when
    there are none. Words are letters and digits only: nothing needs escaping."""
    if not words:
        return None
    alternatives = "|".join(words)
    return f"^({alternatives})( ({alternatives})){{0,{_SPAN_WORDS - 1}}}$"


# A token as a name may be written: letters and digits joined by "-", ".", "'" ("INC-88",
# "O'Neil", "St.-Denis"), less a possessive "'s" ("Einstein's" names Einstein).
_NAME_TOKEN: Final = re.compile(r"[^\W_](?:[\w\-.']{0,62}[^\W_])?(?<!'s)")
_SENTENCE_GAP: Final = re.compile(r"[.!?]")


def names_in(text: str) -> tuple[str, ...]:
    """What the message names: runs of capitalised tokens ("Acme Robotics", "Ana Lima",
    "INC-88", "CDG"), where capitals mark names. A single capitalised word opening a
    sentence is the sentence's first word, not a name; and where single capitalised words
    inside sentences outnumber the lower-case ones (German capitalises its nouns),
    capitals mark nothing and there are no names. Codes in capitals ("CDG") and tokens
    with digits are names either way. The same in any language written with capitals."""
    runs: list[list[str]] = []
    run: list[str] = []
    opens = True  # the next token opens a sentence
    run_opens = False
    lower = 0
    end = 0

    def close() -> None:
        if run and (len(run) > 1 or not run_opens):
            runs.append(list(run))
        run.clear()

    for m in _NAME_TOKEN.finditer(text[:_MAX_TEXT]):
        gap = text[end : m.start()]
        end = m.end()
        if run and gap.strip():  # punctuation between: the run ends
            close()
        if _SENTENCE_GAP.search(gap):
            opens = True
        token = m[0]
        if token[0].isupper():
            if not run:
                run_opens = opens
            run.append(token)
        else:
            close()
            if not opens and token[0].isalpha() and token.lower() not in _FUNCTION_WORDS:
                lower += 1
        opens = False
    close()
    nouns = sum(1 for r in runs if len(r) == 1 and _is_word(r[0]))
    if not runs or nouns > lower:
        return ()
    return tuple(dict.fromkeys(" ".join(r) for r in runs))[:_MAX_VALUES]


def _is_word(token: str) -> bool:
    """A capitalised word ("Tisch"), not a code ("CDG", "INC-88")."""
    return not token.isupper() and not any(c.isdigit() for c in token)


def content_words(said: Said, spent: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The user's words a grounded string may use: not a function word, not ``spent``."""
    return [w for w in said.words if w.lower() not in _FUNCTION_WORDS and w.lower() not in spent]


# -- sources -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class User:
    """The user's first message."""


@dataclass(frozen=True, slots=True)
class Results:
    """Scalars in earlier successful results: of ``tool`` (None: any), under ``key``
    (None: the argument's own name). ``tokens``: the identifiers written inside those
    strings instead (``E-4417`` in a log line), not the strings whole."""

    tool: str | None = None
    key: str | None = None
    tokens: bool = False


@dataclass(frozen=True, slots=True)
class Calls:
    """Earlier successful calls' arguments: of ``tool`` (None: any), named ``arg`` (None:
    the argument's own name)."""

    tool: str | None = None
    arg: str | None = None


@dataclass(frozen=True, slots=True)
class Anything:
    """The schema alone: no narrowing."""


Source = User | Results | Calls | Anything
ANY_KEY: Final = "*"
"""``Results(key=ANY_KEY)``: every scalar of the results, whatever its key."""
_NAMED: Final[Mapping[str, Source]] = {
    "user": User(),
    "results": Results(),
    "calls": Calls(),
    "schema": Anything(),
}


_RESULTS_KEYS: Final = frozenset({"results", "key", "tokens"})


def parse_sources(doc: object, *, where: str) -> tuple[Source, ...]:
    """A declaration (a name, a ``{"results"|"calls": ...}`` object, or a list of them) as
    sources; ``ValueError`` naming ``where`` and the problem."""
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise ValueError(f"{where}: an empty list declares no source")
    out: list[Source] = []
    for item in items:
        if isinstance(item, str):
            if item not in _NAMED:
                raise ValueError(f"{where}: unknown source {item!r}; one of {', '.join(_NAMED)}")
            out.append(_NAMED[item])
        elif isinstance(item, Mapping) and "results" in item and set(item) <= _RESULTS_KEYS:
            # "key": "*" takes every scalar of the tool's results, whatever its key;
            # "tokens": true the identifiers written inside its strings.
            tokens = item.get("tokens", False)
            if not isinstance(tokens, bool):
                raise ValueError(f"{where}: 'tokens' is true or false")
            out.append(Results(_name(item["results"], where), _opt(item.get("key"), where), tokens))
        elif isinstance(item, Mapping) and set(item) in ({"calls"}, {"calls", "arg"}):
            out.append(Calls(_name(item["calls"], where), _opt(item.get("arg"), where)))
        else:
            raise ValueError(
                f"{where}: a source is 'user', 'results', 'calls', 'schema', "
                '{"results": TOOL, "key": KEY, "tokens": BOOL} or {"calls": TOOL, "arg": ARG}'
            )
    return tuple(out)


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise ValueError(f"{where}: a tool name is a string of 1 to 64 characters")
    return value


def _opt(value: object, where: str) -> str | None:
    return None if value is None else _name(value, where)


def source_doc(source: Source) -> object:
    """A source as its declaration (``GET /v1/workflows``)."""
    match source:
        case User():
            return "user"
        case Anything():
            return "schema"
        case Results(None, None, False):
            return "results"
        case Calls(None, None):
            return "calls"
        case Results(tool, key, tokens):
            return {
                "results": tool,
                **({"key": key} if key else {}),
                **({"tokens": True} if tokens else {}),
            }
        case Calls(tool, arg):
            return {"calls": tool, **({"arg": arg} if arg else {})}


# -- what the run holds --------------------------------------------------------------------------


class CallIndex:
    """A run's successful calls indexed: the results' scalars by key (numbers under any
    key too), the identifiers inside their strings, and the calls' arguments by name, each
    in call order. It only grows: :meth:`extend` indexes the calls it has not seen."""

    __slots__ = ("args", "results", "seen", "tokens")

    def __init__(self) -> None:
        self.results: dict[str, list[tuple[str, object]]] = {}
        self.tokens: dict[str, list[tuple[str, object]]] = {}
        self.args: dict[str, list[tuple[str, object]]] = {}
        self.seen = 0

    def extend(self, calls: Sequence[tuple[str, object, object]]) -> None:
        """Index ``calls[seen:]`` (the calls are a run's, in order, only ever added to)."""
        for tool, args, data in calls[self.seen :]:
            for key, value in _scalars(data):
                self.results.setdefault(key, []).append((tool, value))
                if not isinstance(value, str):  # numbers, under any key, in call order
                    self.results.setdefault(ANY_KEY, []).append((tool, value))
                    continue
                for token in identifiers_in(value):
                    self.tokens.setdefault(key, []).append((tool, token))
                    self.tokens.setdefault(ANY_KEY, []).append((tool, token))
            if isinstance(args, Mapping):
                for name, value in args.items():
                    if isinstance(name, str) and value is not None:
                        self.args.setdefault(name, []).append((tool, value))
        self.seen = max(self.seen, len(calls))


@dataclass(frozen=True, slots=True)
class Held:
    """What a run holds when a turn is compiled: the user's :class:`Said`, the words spent
    (a grounded call whose result led nowhere), and the successful calls so far, in order:
    (tool, arguments, result data). The results' scalars by key and the calls' arguments
    by name are indexed once (:meth:`results_under`, :meth:`args_named`)."""

    said: Said = field(default_factory=Said)
    calls: tuple[tuple[str, object, object], ...] = ()
    spent: frozenset[str] = frozenset()
    # Per tool, its last call when that call failed for good: (arguments, the tool's
    # message). The retry reads the message (:func:`blamed`, :func:`error_values`).
    failures: Mapping[str, tuple[object, str]] = field(default_factory=dict)
    # (tool, argument) -> the values that made a call of it fail for good: not offered again.
    failed: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # The calls' values indexed (:class:`CallIndex`): a run passes its own, which grows
    # with its calls, so a turn does not index every call again.
    index: CallIndex = field(default_factory=CallIndex, repr=False, compare=False)
    # A request with no workflow: a plain string takes what the user quoted or a run of their
    # words as written (its ``said`` read with ``phrases``), not the words of the names given.
    plain: bool = False

    def __post_init__(self) -> None:
        self.index.extend(self.calls)

    def user_values(self, kind: Kind, prop: Mapping[str, Any], name: str = "") -> list[object]:
        """The user's values for an argument of ``kind`` called ``name`` (:func:`_from_user`)."""
        return list(_from_user(kind, prop, self.said, name))

    def results_under(self, key: str) -> list[tuple[str, object]]:
        """(tool, value) of every scalar stored under ``key`` in the results, in order
        (:data:`ANY_KEY`: under any key)."""
        return self.index.results.get(key, [])

    def tokens_under(self, key: str) -> list[tuple[str, object]]:
        """(tool, identifier) of every identifier written inside a string stored under
        ``key`` (:data:`ANY_KEY`: under any key), in order."""
        return self.index.tokens.get(key, [])

    def args_named(self, name: str) -> list[tuple[str, object]]:
        """(tool, value) of every earlier call's argument ``name``, in order."""
        return self.index.args.get(name, [])

    def refused(self, tool: str, arg: str, *, identifier: bool) -> frozenset[str]:
        """The values not offered to ``tool``'s ``arg`` again: those that made a call of
        it fail for good and, for an identifier, those any tool refused for an argument
        of the same name (a look-up refused the user's ``7781`` and found ``ORD-7781``:
        the refund's ``order_id`` is the one that worked)."""
        own = self.failed.get((tool, arg), frozenset())
        if not identifier:
            return own
        elsewhere = [v for (_, name), v in self.failed.items() if name == arg]
        return own.union(*elsewhere) if elsewhere else own


def _scalars(data: object, depth: int = 0) -> Iterator[tuple[str, object]]:
    """(key, scalar) pairs anywhere in ``data`` (JSON-like), as :func:`values_under` finds
    them."""
    if depth > 16:
        return
    if isinstance(data, Mapping):
        for k, v in data.items():
            if isinstance(v, str | int | float) and not isinstance(v, bool):
                if isinstance(k, str):
                    yield k, v
            elif isinstance(v, Mapping | list):
                yield from _scalars(v, depth + 1)
    elif isinstance(data, list):
        for item in data:
            yield from _scalars(item, depth + 1)


def values_under(data: object, key: str, depth: int = 0) -> Iterator[object]:
    """Scalar values stored under ``key`` anywhere in ``data`` (JSON-like)."""
    if depth > 16:
        return
    if isinstance(data, Mapping):
        for k, v in data.items():
            if k == key and isinstance(v, str | int | float) and not isinstance(v, bool):
                yield v
            elif isinstance(v, Mapping | list):
                yield from values_under(v, key, depth + 1)
    elif isinstance(data, list):
        for item in data:
            yield from values_under(item, key, depth + 1)


# -- narrowing ---------------------------------------------------------------------------------

Kind = Literal[
    "integer",
    "number",
    "date",
    "time",
    "date-time",
    "id",
    "number-id",
    "email",
    "string",
    "numbers",
    "other",
]
# An e-mail address by its name (``email``, ``*_email``, ``*Email``), as with identifiers.
_EMAIL_NAME: Final = re.compile(r"(?:^|_)e?mail$|[a-z]E?[mM]ail$|^e?mail_?address$")
# An identifier by its name: ``id``, ``*_id``/``*Id``, and the same for ``code`` and ``ref``
# (``error_code``, ``booking_ref``): API naming, not the user's language.
_ID_NAME: Final = re.compile(
    r"(?:^|_)(?:id|code|ref)$|[a-z](?:Id|Code|Ref)$|(?:^|_)(?:ID|CODE|REF)$"
)


def kind_of(name: str, prop: Mapping[str, Any]) -> Kind:
    """How an argument's values are read: by its type and format (and, for identifiers,
    its name)."""
    if "enum" in prop or "const" in prop:
        return "other"
    kind = prop.get("type", "string" if "pattern" in prop or "format" in prop else None)
    if kind == "integer":
        # An integer named as an identifier (``customer_id``) is one, not a quantity.
        return "number-id" if _ID_NAME.search(name) else "integer"
    if kind == "number":
        return "number"
    if kind == "array" and isinstance(items := prop.get("items"), Mapping):
        if items.get("type") in ("number", "integer") and "enum" not in items:
            return "numbers"  # read as the lists the user wrote: "[3, 4, 5]", "(40.7, -74.0)"
    if kind != "string":
        return "other"
    fmt = prop.get("format")
    if fmt == "date":
        return "date"
    if fmt == "time":
        return "time"
    if fmt == "date-time":
        return "date-time"
    if fmt == "uuid" or _ID_NAME.search(name):
        return "id"
    if fmt == "email" or _EMAIL_NAME.search(name):
        return "email"
    return "string"


def default_sources(
    name: str,
    prop: Mapping[str, Any],
    *,
    required: bool,
    plain: bool = False,
    spare: bool = False,
) -> tuple[Source, ...]:
    """The sources of an argument a workflow declares nothing for (the module docstring's
    table); ``()``: the schema alone. ``plain``: a request with no workflow, whose optional
    plain strings are the user's too; ``spare``: the user wrote more numbers than the tool
    has required number arguments, so an optional one may take the user's numbers too."""
    kind = kind_of(name, prop)
    if kind == "other":
        return ()
    if kind == "numbers":
        # With no workflow, only a list the user wrote: an optional one they did not is
        # left out. A workflow's lists keep their schema unless it declares a source.
        return (User(),) if plain else ()
    if not required and plain:
        if kind == "string":
            # What the user wrote, or a value its description documents
            # (:func:`described_values`); none that fits: left out, never made up.
            return (User(),)
        if spare and kind in ("integer", "number"):
            return (User(), Results(), Calls())  # the numbers the required ones leave
        return (Results(), Calls())
    if not required:
        return (Results(), Calls())
    if kind in ("integer", "number", "date", "time", "date-time"):
        # Under any key: a refund's amount is the order's "total".
        return (User(), Results(key=ANY_KEY), Calls())
    if kind == "id":
        # Last: the identifiers written inside results' text (the code in a log line).
        return (Results(), Results(key="id"), Calls(), User(), Results(key=ANY_KEY, tokens=True))
    if kind == "number-id":
        return (Results(), Results(key="id"), Calls(), User())
    if kind == "email":
        return (User(), Results(), Calls())
    if plain:
        # A request with no workflow has no earlier results: a required plain string's
        # value is the user's (a name or token they wrote, else 1 to 6 of their words),
        # not a description's text or a type name the model made up.
        return (User(),)
    return ()


DROPPED: Final = False  # an optional argument with nothing to offer: out of the schema


def narrow_properties(
    tool: str,
    schema: Mapping[str, Any],
    declared: Mapping[str, tuple[Source, ...]],
    held: Held,
    *,
    defaults: bool,
    plain: bool = False,
    memo: dict[object, Any] | None = None,
) -> Mapping[str, Any] | None:
    """``schema`` (a tool's input schema) with each argument held to its sources, or None
    when a required argument's declared sources hold nothing yet (the tool cannot be
    called this turn). ``declared``: argument -> sources; ``defaults``: apply
    :func:`default_sources` to the others; ``memo``: a run's cache of each argument's checks
    (the schemas must outlive it: it is keyed by their identity)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return schema
    required = schema.get("required")
    must = set(required) if isinstance(required, list) else set()
    spare = plain and _spare_numbers(props, must, held.said)
    asked: list[str] = []  # optional arguments the user's words set: required this turn
    taken: list[str] = []  # documented values the user's words named (their words, spent)
    failure = held.failures.get(tool)
    blames = blamed(failure[0], failure[1]) if failure is not None else frozenset()
    changed: dict[str, Any] = {}
    for arg, prop in props.items():
        if not isinstance(prop, Mapping):
            continue
        sources = declared.get(arg)
        is_declared = sources is not None
        if plain and defaults and not is_declared and _non_null(prop).get("type") == "boolean":
            # A flag the user's words set ("with details": detailed, "without air
            # resistance": not air_resistance); an optional one they do not name is left
            # out, its default applies (words.flag_in).
            if "enum" not in prop and "const" not in prop:
                said_flag = flag_in(arg, held.said.text)
                if said_flag is not None:
                    changed[arg] = {"type": "boolean", "const": said_flag}
                    if arg not in must:  # asked for: not the model's to leave out
                        asked.append(arg)
                elif arg not in must:
                    changed[arg] = False
            continue
        if plain and defaults and not is_declared and _is_plain_string(arg, prop):
            # A value the description documents and the user's words name ("in Celsius"
            # for "'Celsius' or 'Fahrenheit'"): that value, as documented, and given.
            named = named_values(described_values(prop.get("description")), held.said)
            if named:
                changed[arg] = {"type": "string", "enum": named}
                taken.extend(named)
                if arg not in must:
                    asked.append(arg)
                continue
        if arg in blames and not (sources and any(isinstance(s, Anything) for s in sources)):
            # The last call failed on this argument: its retry reads the tool's message.
            retry = _narrow(tool, arg, prop, sources or (), held, {} if memo is None else memo)
            if isinstance(retry, Mapping):
                changed[arg] = retry
                continue
        if sources is None:
            if not defaults:
                continue
            key = ("defaults", id(prop), arg in must, plain, spare)
            cached = None if memo is None else memo.get(key)
            if cached is None:
                cached = default_sources(
                    arg, _non_null(prop), required=arg in must, plain=plain, spare=spare
                )
                if memo is not None:
                    memo[key] = cached
            sources = cached
        if not sources or any(isinstance(s, Anything) for s in sources):
            continue
        narrowed = _narrow(tool, arg, prop, sources, held, {} if memo is None else memo)
        if narrowed is None:
            continue
        if narrowed is DROPPED:
            if arg in must:
                if is_declared and not any(isinstance(s, User) for s in sources):
                    return None  # its values come from a call not made yet
                if not is_declared and not plain and _is_identifier(arg, prop):
                    # A workflow's identifier nobody has named yet (not the user, no
                    # result): a call must find it first; made up, it fails.
                    return None
                continue  # the user said nothing for it: the schema decides
            changed[arg] = False
            continue
        changed[arg] = narrowed
    if taken:
        _spend_named(changed, taken)
    if not changed:
        return schema
    narrowed = {**props, **changed}
    out = {**schema, "properties": narrowed}
    if asked:
        out["required"] = [*(required if isinstance(required, list) else ()), *asked]
    branches = None
    if "anyOf" not in schema:
        branches = _one_value_each(
            narrowed,
            props,
            numbers=plain,
            repeated=held.said.repeated,
            alike=held.said.alike,
            required=frozenset(must.union(asked)),
        )
        if plain and (strings := _strings_apart(narrowed)) is not None:
            branches = _crossed(branches, strings)
    if branches is not None:
        out["anyOf"] = branches
    return out


_MAX_BRANCHES: Final = 16  # values of the first argument spelled out, one branch each


def _one_value_each(
    narrowed: Mapping[str, Any],
    own: Mapping[str, Any],
    *,
    numbers: bool = False,
    repeated: Sequence[object] = (),
    alike: Sequence[Sequence[object]] = (),
    required: frozenset[str] = frozenset(),
) -> list[dict[str, Any]] | None:
    """Two arguments of one call never take the same value of the run's: a flight's
    origin and destination both offered ``CDG`` and ``JFK`` take one each. The first
    argument offered values another one is offered too becomes one branch per value, the
    other arguments without it, and so on for the next such argument while the branches
    number at most :data:`_MAX_ALL_BRANCHES`. Strings of identifiers and plain strings;
    with ``numbers`` (a plain request, whose numbers are the user's alone) numbers too,
    except those in ``repeated`` (written more than once: "2 adults for 2 nights"); a
    number taken also takes the others ``alike`` names with it ("12,000" is 12000 or 12). A
    workflow's numbers of one call may well be the same (an amount and an order's total).
    None when no two arguments share a value."""
    enums = [
        (arg, prop["enum"])
        for arg, prop in narrowed.items()
        if isinstance(prop, Mapping) and len(prop) == 1 and "enum" in prop
    ]
    if len(enums) < 2:
        return None  # most calls: nothing to keep apart
    try:
        seen: set[object] = set()
        for _, values in enums:
            if not seen.isdisjoint(values):
                break
            seen.update(values)
        else:
            return None  # no value offered to two arguments
    except TypeError:  # an unhashable value (a list): nothing shared to tell apart
        return None
    offered: list[tuple[str, list[object]]] = []
    for arg, values in enums:
        base = own.get(arg)
        if not isinstance(base, Mapping):
            continue
        kind = kind_of(arg, _non_null(base))
        if all(isinstance(v, str) for v in values) and kind in ("id", "string"):
            offered.append((arg, list(values)))
        elif (
            numbers
            and kind in ("integer", "number")
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        ):
            offered.append((arg, list(values)))
    same: dict[object, frozenset[object]] = {}
    for group in alike:
        for value in group:
            same[value] = same.get(value, frozenset()) | frozenset(group)
    # No branch at all: no call could keep them apart; then they are not kept apart.
    return _apart(offered, frozenset(repeated), _MAX_ALL_BRANCHES, same, required) or None


def _strings_apart(narrowed: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A plain request's strings kept apart where they are offered both values and runs
    of the user's words (``{"anyOf": [{"enum": names}, {"pattern": runs}]}``): the first
    string whose values another string is offered too becomes one branch per value (the
    others without it, in their values and runs), and one branch where it is a run of
    words that is none of those values. "LeBron James" is then a player's name or a
    team's, never both. None when no two strings share a value."""
    strings: list[tuple[str, list[str], list[str] | None, dict[str, Any]]] = []
    for arg, prop in narrowed.items():
        offer = _string_offer(prop)
        if offer is not None:
            strings.append((arg, *offer))
    for i, (first, values, runs, extra) in enumerate(strings):
        later = strings[i + 1 :]
        others = [s for s in later if set(values) & {*s[1], *(s[2] or ())}]
        if not others or len(values) > _MAX_BRANCHES:
            continue
        if runs is None and all(s[2] is None for s in others):
            continue  # values only: _one_value_each keeps them apart
        branches: list[dict[str, Any]] = []
        for value in values:
            props: dict[str, Any] = {first: {"const": value}}
            for arg, their_values, their_runs, their_extra in others:
                props[arg] = _string_prop(
                    [v for v in their_values if v != value],
                    None
                    if their_runs is None
                    else [r for r in their_runs if not _overlaps(r, value)],
                    their_extra,
                )
            if all(p is not False for p in props.values()):
                branches.append({"properties": props})
        if runs is not None:
            own_runs = [r for r in runs if r not in values]
            if own_runs:
                branches.append({"properties": {first: _string_prop([], own_runs, extra)}})
        return branches or None
    return None


def _spend_named(changed: dict[str, Any], taken: Sequence[str]) -> None:
    """The words that named a documented value ("in celsius" for 'Celsius') said which
    value that argument takes: another plain string is not offered them, nor a run of
    words holding them ("Austin in celsius"), unless nothing else is left to offer it."""
    for arg, prop in changed.items():
        offer = _string_offer(prop)  # None for the named values themselves
        if offer is None:
            continue
        values, runs, extra = offer
        kept = [v for v in values if not any(_overlaps(v, t) for t in taken)]
        kept_runs = runs and [r for r in runs if not any(_overlaps(r, t) for t in taken)]
        if kept == values and kept_runs == runs:
            continue
        rebuilt = _string_prop(kept, kept_runs, extra)
        if isinstance(rebuilt, Mapping):
            changed[arg] = rebuilt


def _overlaps(run: str, value: str) -> bool:
    """Whether ``run`` is ``value``, a part of it or holds it, word for word ("LeBron" and
    "LeBron James")."""
    a, b = f" {run.casefold()} ", f" {value.casefold()} "
    return a in b or b in a


def _string_offer(prop: object) -> tuple[list[str], list[str] | None, dict[str, Any]] | None:
    """A narrowed plain string's values and runs of words (None: no runs), and the rest of
    its run's schema (``maxLength``); None for anything else."""
    if not isinstance(prop, Mapping):
        return None
    if len(prop) == 1 and isinstance(enum := prop.get("enum"), list):
        return (
            ([v for v in enum if isinstance(v, str)], None, {})
            if all(isinstance(v, str) for v in enum)
            else None
        )
    run = prop
    values: list[str] = []
    if len(prop) == 1 and isinstance(any_of := prop.get("anyOf"), list) and len(any_of) == 2:
        first, run = any_of
        if not (isinstance(first, Mapping) and set(first) == {"enum"}):
            return None
        if not all(isinstance(v, str) for v in first["enum"]):
            return None
        values = list(first["enum"])
    if not isinstance(run, Mapping) or run.get("type") != "string" or "pattern" not in run:
        return None
    runs = _pattern_runs(run["pattern"])
    if runs is None:
        return None
    return values, runs, {k: v for k, v in run.items() if k not in ("type", "pattern")}


def _string_prop(
    values: list[str], runs: list[str] | None, extra: Mapping[str, Any]
) -> Mapping[str, Any] | bool:
    """The schema of a string offered ``values`` and ``runs`` (as narrowing writes one);
    False when it is offered nothing."""
    return _offered(values, spans_pattern(runs) if runs else None, extra)


def _offered(
    values: Sequence[object], pattern: str | None, extra: Mapping[str, Any]
) -> Mapping[str, Any] | bool:
    """The schema narrowing writes for an argument offered ``values`` and, for a string,
    the strings ``pattern`` matches (``extra``: the argument's own bounds kept beside it):
    an ``enum``, a pattern, or ``anyOf`` both; DROPPED when it is offered nothing."""
    if pattern is None:
        return {"enum": list(values)} if values else DROPPED
    run = {"type": "string", "pattern": pattern, **extra}
    return {"anyOf": [{"enum": list(values)}, run]} if values else run


def _pattern_runs(pattern: object) -> list[str] | None:
    """The runs of words a :func:`spans_pattern` pattern admits, or None when ``pattern``
    is not one."""
    if not isinstance(pattern, str) or not (pattern.startswith("^(") and pattern.endswith(")$")):
        return None
    runs: list[str] = []
    current: list[str] = []
    escaped = False
    for c in pattern[2:-2]:
        if escaped:
            current.append(c)
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == "|":
            runs.append("".join(current))
            current = []
        elif c in _SYNTAX:
            return None  # a pattern of another kind (words_pattern's repetition)
        else:
            current.append(c)
    runs.append("".join(current))
    return runs


_MAX_ALL_BRANCHES: Final = 64  # branches of one call's arguments kept apart, in all


def _crossed(
    first: list[dict[str, Any]] | None, second: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Both sets of branches at once (each of ``first`` with each of ``second``), or
    ``second`` alone when that would make more than :data:`_MAX_ALL_BRANCHES`."""
    if not first or len(first) * len(second) > _MAX_ALL_BRANCHES:
        return second
    out: list[dict[str, Any]] = []
    for a in first:
        for b in second:
            if set(a["properties"]) & set(b["properties"]):
                return second  # both keep the same argument apart: the strings' only
            out.append({"properties": {**a["properties"], **b["properties"]}})
    return out


def _apart(
    offered: Sequence[tuple[str, list[object]]],
    repeated: frozenset[object],
    budget: int,
    same: Mapping[object, frozenset[object]],
    required: frozenset[str],
) -> list[dict[str, Any]] | None:
    """:func:`_one_value_each`'s branches for ``offered`` (argument, values), at most
    ``budget`` of them; None when no two share a value that may not repeat, ``[]`` when
    no branch can give every ``required`` argument a value of its own (an optional one
    with none left is left out). ``same``: the values one written number may mean, by
    each of them."""
    for i, (first, values) in enumerate(offered):
        later = offered[i + 1 :]
        others = [(arg, vals) for arg, vals in later if set(vals) & set(values) - repeated]
        if not others or len(values) > min(_MAX_BRANCHES, budget):
            continue
        branches: list[dict[str, Any]] = []
        for value in values:
            props: dict[str, Any] = {first: {"const": value}}
            rest_offered: list[tuple[str, list[object]]] = []
            for arg, vals in later:
                rest = vals
                if value not in repeated and any(arg == o for o, _ in others):
                    taken = same.get(value, frozenset()) | {value}
                    rest = [v for v in vals if v not in taken]
                if rest:
                    rest_offered.append((arg, rest))
                if rest is not vals:
                    props[arg] = {"enum": rest} if rest else False
            if any(p is False and arg in required for arg, p in props.items()):
                continue
            inner = _apart(rest_offered, repeated, budget // len(values), same, required)
            if inner is None:
                branches.append({"properties": props})
            else:
                for branch in inner:
                    branches.append({"properties": {**props, **branch["properties"]}})
        return branches
    return None


def _spent(value: object, spent: frozenset[str]) -> bool:
    """Whether every word of a user's ``value`` is spent (see :class:`Held`)."""
    if not spent or not isinstance(value, str):
        return False
    words = _WORD.findall(value)
    return bool(words) and all(w.lower() in spent for w in words)


def _is_plain_string(arg: str, prop: Mapping[str, Any]) -> bool:
    """A string the schema leaves free: no enum, pattern or format, not an identifier,
    e-mail address or date by its name."""
    own = _non_null(prop)
    return (
        kind_of(arg, own) == "string"
        and "pattern" not in own
        and "format" not in own
        and date_form(arg, own) is None
    )


def _is_identifier(arg: str, prop: Mapping[str, Any]) -> bool:
    return kind_of(arg, _non_null(prop)) in ("id", "number-id")


def _spare_numbers(props: Mapping[str, Any], must: set[str], said: Said) -> bool:
    """Whether the user wrote more numbers than the required number arguments take: the
    user's numbers go to those first, and only the rest may fill an optional one."""
    needed = sum(
        1
        for arg in must
        if isinstance(props.get(arg), Mapping)
        and kind_of(arg, _non_null(props[arg])) in ("integer", "number")
    )
    return len(said.numbers) > needed


def _non_null(prop: Mapping[str, Any]) -> Mapping[str, Any]:
    """An optional value's own schema: ``anyOf: [X, {"type": "null"}]`` is X (pydantic's
    ``X | None``)."""
    branches = prop.get("anyOf")
    if isinstance(branches, list):
        real = [b for b in branches if isinstance(b, Mapping) and b.get("type") != "null"]
        if len(real) == 1:
            return {**{k: v for k, v in prop.items() if k != "anyOf"}, **real[0]}
    return prop


@dataclass(slots=True)
class _Plan:
    """One argument's narrowing over a run (the memo keeps it): its schema read once, and
    per source what was read of it so far. Each source only grows (the user's message is
    read once, calls only add), so only the values new since the last turn are typed and
    checked; the answer is kept with what it depended on (``state``)."""

    sources: tuple[Source, ...]
    own: Mapping[str, Any]
    kind: Kind
    check: Any
    # per source: [where (0 user, 1 identifiers in results, 2 results, 3 calls), its key
    # (the user's values for 0), the tool it is limited to, values read, values accepted]
    reads: list[list[Any]]
    state: tuple[object, ...] | None = None
    out: Mapping[str, Any] | bool = False


def _plan(
    tool: str,
    arg: str,
    prop: Mapping[str, Any],
    sources: tuple[Source, ...],
    held: Held,
    memo: dict[object, Any],
) -> _Plan | None:
    """The argument's :class:`_Plan`, or None when it keeps its schema (a ``$ref`` that
    cannot be checked alone, a source ``schema``)."""
    entry = memo.get(id(prop))
    if entry is None:
        own = _non_null(prop)
        kind = kind_of(arg, own)
        checker = None if kind == "other" else _checker(tool, arg, own)
        entry = memo[id(prop)] = (own, kind, _shared_check(memo, own, checker))
    own, kind, check = entry
    if check is None or any(isinstance(source, Anything) for source in sources):
        return None
    reads: list[list[Any]] = []
    for source in sources:
        match source:
            case User():
                reads.append([0, held.user_values(kind, own, arg), None, 0, ()])
            case Results(tool=of, key=key, tokens=True):
                reads.append([1, key or arg, of, 0, ()])
            case Results(tool=of, key=key):
                reads.append([2, key or arg, of, 0, ()])
            case Calls(tool=of, arg=name_of):
                reads.append([3, name_of or arg, of, 0, ()])
    return _Plan(sources, own, kind, check, reads)


_NO_PLAN: Final = object()  # an argument left to its schema


def _narrow(
    tool: str,
    arg: str,
    prop: Mapping[str, Any],
    sources: tuple[Source, ...],
    held: Held,
    memo: dict[object, Any],
) -> Mapping[str, Any] | bool | None:
    """The argument's schema this turn: an ``enum`` of its values (and, for a plain string
    from the user, their words), DROPPED when its sources hold nothing, None to keep it."""
    key = ("plan", id(prop), tool, arg, id(sources))
    plan = memo.get(key)
    if plan is None or (plan is not _NO_PLAN and plan.sources is not sources):
        plan = _plan(tool, arg, prop, sources, held, memo)
        memo[key] = _NO_PLAN if plan is None else plan
    if plan is None or plan is _NO_PLAN:
        return None
    index = held.index
    check, kind = plan.check, plan.kind
    sizes: list[int] = []
    for read in plan.reads:
        where, name, of, done, accepted = read
        if where == 0:
            found: Sequence[object] = name
        elif where == 1:
            found = index.tokens.get(name, ())
        elif where == 2:
            found = index.results.get(name, ())
        else:
            found = index.args.get(name, ())
        if done < len(found):
            fresh = list(accepted)
            for item in found[done:]:
                if len(fresh) >= _MAX_VALUES:
                    break
                if where:
                    made_by, item = cast(tuple[str, object], item)
                    if of is not None and made_by != of:
                        continue
                value = _typed(kind, item)
                if check(value):
                    fresh.append(value)
            read[3], read[4] = len(found), tuple(fresh)
        sizes.append(len(read[4]))
    # What the answer depends on, over a run: the values each source offers (they only
    # grow), the spent words and failed values (they only grow too), and the tool's last
    # failure. Unchanged (most arguments, most turns: a new result rarely holds a value
    # this argument takes), the last answer stands.
    failure = held.failures.get(tool)
    failed = held.refused(tool, arg, identifier=kind in ("id", "number-id"))
    state = (
        tuple(sizes),
        len(held.spent),
        None if failure is None else (failure[1], repr(failure[0])),
        len(failed),
    )
    if plan.state != state:
        accepted = [read[4] for read in plan.reads]
        plan.out = _narrow_anew(
            tool, arg, prop, plan.own, kind, check, sources, accepted, held, memo
        )
        plan.state = state
    return plan.out


def _key(value: object) -> tuple[type, object]:
    """A value's key among an argument's values: by type (1 is not True) and, for a list
    the user wrote, by its items."""
    return (type(value), tuple(value) if isinstance(value, list) else value)


def _narrow_anew(
    tool: str,
    arg: str,
    prop: Mapping[str, Any],
    own: Mapping[str, Any],
    kind: Kind,
    check: Any,
    sources: tuple[Source, ...],
    accepted: Sequence[tuple[object, ...]],
    held: Held,
    memo: dict[object, Any],
) -> Mapping[str, Any] | bool:
    """:func:`_narrow`'s answer when what it depends on changed: ``accepted`` are each
    source's values."""
    words: list[str] | None = None  # a plain string's words from the user (the pattern)
    enum: dict[tuple[type, object], object] = {}
    free = kind == "string" and "pattern" not in own and "format" not in own
    for source, taken in zip(sources, accepted, strict=True):
        if isinstance(source, User):
            form = date_form(arg, own) if free and held.said.dates else None
            if form is not None:
                # A date by its name or description, and the user wrote dates: those
                # dates, in the form described (ISO when none is), and nothing else.
                for written in _dates_in_form(form, held.said.dates):
                    if check(written):
                        enum.setdefault((str, written), written)
                continue
            if free and held.plain:
                # No workflow: what the user quoted, whole, and runs of their words as
                # written ("plasma membrane", not "plasma" then anything), and the values
                # the description documents ("Can be 'melting' or 'vaporization'"; not
                # its examples, which illustrate and are not the user's).
                words = [w for w in held.said.spans if w.lower() not in held.spent]
                for quoted in held.said.quoted:
                    if check(quoted):
                        enum.setdefault((str, quoted), quoted)
                for documented in described_values(own.get("description"), examples=False):
                    if check(documented):
                        enum.setdefault((str, documented), documented)
            elif free:
                words = _named_words(held)
            spent = held.spent
            for value in taken:
                if not _spent(value, spent):  # a grounded call took it and gave nothing
                    enum.setdefault(_key(value), value)
        else:
            for value in taken:
                enum.setdefault(_key(value), value)
    values = list(enum.values())
    failed = held.refused(tool, arg, identifier=kind in ("id", "number-id"))
    failure = held.failures.get(tool)
    message = failure[1] if failure is not None and arg in blamed(*failure) else None
    prefixed: str | None = None
    if kind == "id":
        examples = identifiers_in(str(own.get("description", "")))
        if message is not None:
            examples = [*examples, *identifiers_in(message)]
        formed, matched = in_their_form(values, examples)
        if matched:  # values it made ("ORD-7781") are checked once, the sources' were
            held_values = set(values)
            values = [v for v in formed if v in held_values or check(v)]
        numbers = [v for v in values if isinstance(v, str) and v.isdigit() and v not in failed]
        if numbers and not matched and "pattern" not in own and "format" not in own:
            # A number the user gave may be written with the identifier's prefix
            # ("7781" as "ORD-7781"), which nothing shows yet: letters, then the number.
            prefixed = f"^[A-Za-z]{{1,8}}[-_#]?({'|'.join(numbers[:_MAX_VALUES])})$"
    elif kind == "string" and message is not None and "enum" not in own:
        # What the tool's own message offers (a list it names, else its words), the
        # user's among them first when the user is a source: "known: checkout".
        offered = [v for v in error_values(message, _not_values(tool, arg, held)) if check(v)]
        if any(isinstance(source, User) for source in sources):
            # The user's words the message names ("known: checkout"); a message that
            # names none of them ("no entity named 'File'") leaves the user's words.
            user = {w.lower() for w in content_words(held.said, held.spent)}
            offered = [v for v in offered if str(v).lower() in user]
        assert failure is not None  # a message is a failure's
        meant = _as_listed(failure[0], arg, error_values(message, frozenset()))
        if meant is not None and check(meant):
            values, words = [meant], None
        elif offered:  # else the sources' values, less what failed
            values, words = list[object](offered), None
    if kind == "string" and "pattern" not in own and "format" not in own:
        # The form the description shows, where anything offered has it: both the values
        # and the words ("IATA code, e.g. CDG": "CDG", never "Ana Lima").
        shapes = described_shapes(own.get("description"))
        formed = [v for v in values if _shape(str(v)) in shapes]
        formed_words = [w for w in words or () if _shape(w) in shapes]
        if formed or formed_words:
            values, words = list[object](formed), formed_words if words is not None else None
    if failed:  # after the form: a refused "7781" still shows its retry "ORD-7781"
        values = [v for v in values if (v if isinstance(v, str) else repr(v)) not in failed]
    values = values[:_MAX_VALUES]
    if prefixed is not None:
        return _offered(values, prefixed, {})
    if words is None:
        pattern_text = None
    else:
        pattern_text = spans_pattern(words) if held.plain else words_pattern(words)
    bounds = {"maxLength": own["maxLength"]} if "maxLength" in own else {}
    return _offered(values, pattern_text, bounds)


def _shared_check(memo: dict[object, Any], own: Mapping[str, Any], checker: Any) -> Any:
    """``checker`` with its answers kept per value over a run, shared by every argument of
    the same schema (``customer_id: integer`` in four tools of one workflow checks a new
    result's ``7`` once, not four times)."""
    if checker is None:
        return None
    try:
        fingerprint = orjson.dumps(own, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return checker
    seen: dict[tuple[type, object], bool] = memo.setdefault(("checks", fingerprint), {})

    def check(value: object) -> bool:
        try:
            key = (type(value), value)
            found = seen.get(key)
        except TypeError:  # a list or an object: not kept
            return bool(checker(value))
        if found is None:
            found = seen[key] = bool(checker(value))
        return found

    return check


# -- what a failed call's message says --------------------------------------------------------

# A list a message names: three or more items separated by commas, slashes or bars
# ("one of billing, bug, feature_request, account"); the same in any language.
_LIST: Final = re.compile(r"[^\W_][\w.\-]*(?:\s*[,/|]\s*[^\W_][\w.\-]*){2,}")
_LIST_SPLIT: Final = re.compile(r"\s*[,/|]\s*")
# A word of a message as a value may take it: letters and digits, joined by "_", "-", ".".
_VALUE_WORD: Final = re.compile(r"[^\W_](?:[\w.\-]{0,62}[^\W_])?")


@functools.lru_cache(maxsize=4096)
def _identifiers(text: str) -> tuple[str, ...]:
    return tuple(_scan_identifiers(text))


def identifiers_in(text: str) -> list[str]:
    """The identifiers written in ``text`` (:func:`_scan_identifiers`), cached by text: a
    run reads the same results and descriptions every turn."""
    return list(_identifiers(text)) if len(text) <= _MAX_TEXT else _scan_identifiers(text)


def _scan_identifiers(text: str) -> list[str]:
    """The identifiers written in ``text``: tokens holding both a letter and a digit
    (``E-4417``, ``T-1001``, ``worker-3``), at most 64, in order, each once."""
    out: dict[str, None] = {}
    for token in _TOKEN.findall(text[:_MAX_TEXT]):
        token = token.rstrip(".:/-#")
        if any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
            out[token] = None
            if len(out) >= _MAX_VALUES:
                break
    return list(out)


def blamed(args: object, message: str) -> frozenset[str]:
    """The arguments a failed call's message is about: named by it (``category``, or
    ``order id`` for ``order_id``) or quoting their value (``no log for 'fetch'``)."""
    if not isinstance(args, Mapping):
        return frozenset()
    low = message.lower()
    words = set(_VALUE_WORD.findall(low))
    out = set()
    for name, value in args.items():
        if not isinstance(name, str):
            continue
        spoken = name.lower().replace("_", " ")
        if name.lower() in words or (" " in spoken and spoken in low):
            out.add(name)
        elif isinstance(value, str | int | float) and not isinstance(value, bool):
            text = str(value).strip().lower()
            if text and text in low:
                out.add(name)
    return frozenset(out)


def error_values(message: str, exclude: frozenset[str]) -> list[str]:
    """The values a failed call's message offers its retry: the items of a list it names,
    else its words; less function words and ``exclude`` (lower case)."""
    text = message[:_MAX_TEXT]
    lists = _LIST.findall(text)
    items = _LIST_SPLIT.split(max(lists, key=len)) if lists else _VALUE_WORD.findall(text)
    out: dict[str, None] = {}
    for item in items:
        low = item.lower()
        if len(item) >= 2 and low not in _FUNCTION_WORDS and low not in exclude:
            out[item] = None
    return list(out)[:_MAX_VALUES]


def _as_listed(args: object, arg: str, offered: Sequence[object]) -> object | None:
    """The value the failed call meant, when the tool's message lists it in another case
    or spacing (``Billing`` refused, "must be one of billing, bug"): the listed form."""
    tried = args.get(arg) if isinstance(args, Mapping) else None
    if not isinstance(tried, str):
        return None
    key = tried.strip().casefold()
    # The same text is the message quoting the refused value ("no log for 'fetch'").
    return next(
        (v for v in offered if isinstance(v, str) and v != tried and v.casefold() == key), None
    )


def _not_values(tool: str, arg: str, held: Held) -> frozenset[str]:
    """What a retry's value is not: the tool's and its arguments' names and their words
    (``fetch_log(service="log")`` is no retry), the failed value's words, the user's
    spent words."""
    out = {tool.lower(), arg.lower(), *held.spent}
    out.update(w.lower() for w in _WORD.findall(f"{tool} {arg}"))  # _WORD splits at "_"
    failure = held.failures.get(tool)
    if failure is not None and isinstance(failure[0], Mapping):
        for name, value in failure[0].items():
            out.add(str(name).lower())
            if name == arg and isinstance(value, str):
                out.update(w.lower() for w in _VALUE_WORD.findall(value))
                out.add(value.lower())
    return frozenset(out)


def _named_words(held: Held) -> list[str]:
    """The user's words a plain string may use: while a name the user gave is left (not
    spent), the words of those names ("Acme Robotics", not "File" or "report"), and none
    for a code ("INC-88" is offered whole, never "88"); else every content word."""
    words = content_words(held.said, held.spent)
    left = [
        n for n in held.said.names if any(w.lower() not in held.spent for w in _WORD.findall(n))
    ]
    if not left:
        return words
    named = {w.lower() for n in left if _is_word_name(n) for w in _WORD.findall(n)}
    return [w for w in words if w.lower() in named]


def _is_word_name(name: str) -> bool:
    """A name of words ("Ana Lima"), not a code ("INC-88", "CDG")."""
    return all(_is_word(token) for token in name.split())


def date_form(name: str, prop: Mapping[str, Any]) -> str | None:
    """The ``strftime`` form of a plain string argument that is a date by its description
    ("Format: MM-DD-YYYY" is ``%m-%d-%Y``; "the date (month-day-year)"; an ISO date as
    example) or by its name (``date``, ``check_in_date``: ISO, ``%Y-%m-%d``); None when it
    is neither (docs/workflows.md, "Provenance")."""
    description = prop.get("description")
    text = description[:_MAX_TEXT] if isinstance(description, str) else ""
    for m in _DATE_FORM.finditer(text):
        parts = [m[1].lower(), m[3].lower(), m[4].lower()]
        letters = [p[0] for p in parts]
        if sorted(letters) != ["d", "m", "y"] or any(len(set(p)) != 1 for p in parts):
            continue
        if any(len(p) > 2 for p in parts if p[0] != "y"):
            continue
        return m[2].join(_FORM_PARTS[p[0]] if p[0] != "y" or len(p) > 2 else "%y" for p in parts)
    if words := _DATE_FORM_WORDS.search(text.lower()):
        if sorted(words.groups()) == ["day", "month", "year"]:
            return "-".join(_FORM_PARTS[p[0]] for p in words.groups())
    if _DATE_EXAMPLE.search(text) or _DATE_NAME.search(name):
        return "%Y-%m-%d"
    return None


def _dates_in_form(form: str, dates: Sequence[str]) -> list[str]:
    """The user's dates (ISO) written in ``form``."""
    out: list[str] = []
    for iso in dates:
        try:
            out.append(datetime.date.fromisoformat(iso).strftime(form))
        except ValueError:
            continue
    return out


@functools.lru_cache(maxsize=4096)
def _shapes_of(description: str) -> frozenset[str]:
    return frozenset(
        _shape(t)
        for t in _VALUE_WORD.findall(description[:_MAX_TEXT])
        if any(c.isdigit() for c in t) or (len(t) >= 2 and t.isupper())
    )


def described_shapes(description: object) -> frozenset[str]:
    """The forms an argument's description shows by example: its tokens in capitals or
    holding a digit ("IATA code, e.g. CDG": ``A``; "e.g. E-1234": ``A-9``); a plain word
    shows no form."""
    return _shapes_of(description) if isinstance(description, str) else frozenset()


# Where a description's quoted values are illustrations, not its vocabulary: "e.g.
# 'Amazon rainforest'", "for example 'x^3'", "such as 'IPR'". A sentence's end ends it.
_EXAMPLE_MARK: Final = re.compile(r"\be\.?\s?g\b|\bexamples?\b|\bsuch as\b|\blike\b", re.I)
_SENTENCE_END: Final = re.compile(r"[.!?]\s|[.!?]$|\n")
_NO_VALUE: Final = frozenset({"none", "null", "empty", "nothing", "current"})  # no value
_MAX_DESCRIBED: Final = 40  # characters: a documented value, not a sentence in quotes
# A default written without quotes ("the default is km/h.", "Defaults to square meters"):
# up to the clause's end, at most three words, and not a condition ("5 if not given").
_DEFAULT_WRITTEN: Final = re.compile(
    r"\bdefaults?(?:\s+value)?(?:\s+(?:is|to|of)|\s*[:=])\s+(?![\'\"“‘])"
    r"([^\s.,;()\'\"“‘][^\s,;()\'\"]*(?:\s[^\s,;()\'\"]+){0,2}?)"
    r"(?=[.;,(]\s|[.;,)]?$|\s(?:if|when|unless|for|which|and|or|but)\b|\n)",
    re.I,
)


@functools.lru_cache(maxsize=4096)
def _described(description: str) -> tuple[tuple[str, bool], ...]:
    out: dict[str, bool] = {}
    example, end = False, 0
    for m in _QUOTED.finditer(description[:_MAX_TEXT]):
        gap = description[end : m.start()]
        if _SENTENCE_END.search(gap):
            example = False
        if _EXAMPLE_MARK.search(gap):
            example = True
        end = m.end()
        value = next(g for g in m.groups() if g is not None).strip()
        if value and len(value) <= _MAX_DESCRIBED and len(out) < _MAX_VALUES:
            out.setdefault(value, example)
    for m in _DEFAULT_WRITTEN.finditer(description[:_MAX_TEXT]):
        value = m[1].rstrip(".")
        first = value.split(" ", 1)[0].lower()
        if first not in _FUNCTION_WORDS and first not in _NO_VALUE and len(out) < _MAX_VALUES:
            out.setdefault(value, False)
    return tuple(out.items())


def described_values(description: object, *, examples: bool = True) -> list[str]:
    """The values an argument's description writes in quotes: its documented vocabulary
    ("Can be 'melting', 'freezing' or 'vaporization'", "Default is 'cm'") and, with
    ``examples``, its illustrations too ("e.g. 'Amazon rainforest'")."""
    if not isinstance(description, str):
        return []
    return [v for v, example in _described(description) if examples or not example]


def named_values(values: Sequence[str], said: Said) -> list[str]:
    """Those of ``values`` the user's message names: every word of the value is one of the
    message's (by stem: "in Celsius" names 'Celsius', "gas-powered" names 'gas', "in
    detail" names 'detailed'). A value of function words only names nothing."""
    out = []
    for value in values:
        wanted = stems(value)
        if wanted and wanted <= said.stems:
            out.append(value)
    return out


def _shape(token: str) -> str:
    """An identifier's form: letters as ``A``/``a``, digits as ``9``, the rest kept, runs
    collapsed (``E-4417`` and ``E-1234`` are both ``A-9``)."""
    out: list[str] = []
    for c in token:
        mark = "9" if c.isdigit() else ("A" if c.isupper() else "a") if c.isalpha() else c
        if not out or out[-1] != mark:
            out.append(mark)
    return "".join(out)


_PREFIXED: Final = re.compile(r"(.*?\D)\d+")


def in_their_form(values: Sequence[object], examples: Sequence[str]) -> tuple[list[object], bool]:
    """``values`` in the form the ``examples`` show (a description's ``e.g. E-1234``, an
    error's ``ids look like ORD-1234``): a number the user wrote gets the examples'
    prefix (``7781`` -> ``ORD-7781``), and the values of that form are kept when any
    exist (then True); without examples, or with none of their form, ``values`` as they
    are (False)."""
    if not examples:
        return list(values), False
    shapes = {_shape(e) for e in examples}
    prefixes = {m[1] for e in examples if (m := _PREFIXED.fullmatch(e))}
    out: dict[str, object] = {}
    for value in values:
        out.setdefault(str(value), value)
        if isinstance(value, str) and value.isdigit():
            for prefix in sorted(prefixes):
                out.setdefault(prefix + value, prefix + value)
    kept = [v for v in out.values() if _shape(str(v)) in shapes]
    return (kept, True) if kept else (list(values), False)


_RETYPED: Final = frozenset(
    {"integer", "number", "number-id", "id", "email", "string", "date", "time", "date-time"}
)


def _typed(kind: Kind, value: object) -> object:
    """A held value as the argument's type: a number written as a string in a result
    (``"24"``) is a number for a number argument, and a number an identifier's string."""
    if kind in ("integer", "number", "number-id") and isinstance(value, str):
        try:
            number = float(value.replace(",", "."))
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    if kind in ("id", "email", "string", "date", "time", "date-time") and isinstance(
        value, int | float
    ):
        return str(value)
    return value


def _from_user(kind: Kind, prop: Mapping[str, Any], said: Said, name: str = "") -> Iterator[object]:
    """The user's values for an argument of ``kind`` (called ``name``), in each rendering its
    format may take (the schema's check picks the ones it accepts)."""
    if kind == "number" and said.percents:
        # A percentage the user wrote ("a rate of 5%") is, for a number, its fraction
        # (0.05), the usual form of a rate; for an argument whose name or description says
        # it is in percent ("as a percentage", ``interest_pct``), the number as written.
        # Written elsewhere too ("5% for 5 years"), the number stays as it is.
        said_of = f"{name} {prop.get('description', '')}"[:_MAX_TEXT]
        in_percent = bool(_PERCENT_WORD.search(said_of)) and not _DECIMAL_WORD.search(said_of)
        drop = {
            fraction if in_percent else written
            for written, fraction in said.percents
            if (fraction if in_percent else written) not in said.repeated
        }
        yield from (n for n in said.numbers if n not in drop)
    elif kind in ("integer", "number", "number-id"):
        yield from said.numbers
    elif kind == "numbers":
        yield from said.lists
    elif kind == "time" or (kind == "string" and "pattern" in prop):
        for t in said.times:
            yield from (t, f"{t}:00", f"{t}:00Z")
        if kind == "string":
            yield from said.dates
            yield from said.tokens
            yield from said.words
    elif kind == "date":
        yield from said.dates
    elif kind == "date-time":
        for d in said.dates:
            for t in said.times:
                yield from (f"{d}T{t}:00", f"{d}T{t}:00Z")
    elif kind == "id":
        # An e-mail address is no identifier ("booking_ref" is not "ana@example.com"),
        # unless the argument says it takes one.
        mail = "mail" in str(prop.get("description", "")).lower()
        yield from (t for t in said.tokens if mail or "@" not in t)
        # "order 7781": an identifier written as a whole number of three digits or more
        # ("for 2 people" states no identifier).
        yield from (str(n) for n in said.numbers if isinstance(n, int) and n >= 100)
    elif kind == "email":
        yield from (t for t in said.tokens if "@" in t)
    elif kind == "string":
        yield from said.names  # whole: "Acme Robotics", "INC-88"
        yield from said.tokens  # as written: "T-1001", "ana@example.com" (words are the pattern)


# An argument in percent by its name or description ("as a percentage", ``rate_pct``),
# unless it says it is a decimal or a fraction ("Enter as a decimal: 5% is 0.05").
_PERCENT_WORD: Final = re.compile(r"percent|pct|prozent|pourcent|porcentaje", re.I)
_DECIMAL_WORD: Final = re.compile(r"\b(?:decimal|fraction)", re.I)


def _checker(tool: str, arg: str, prop: Mapping[str, Any]) -> Any:
    """The argument's own schema as a check (patterns run by the project's engine), or
    None when it cannot be compiled alone (a ``$ref`` into the tool's schema)."""
    try:
        return compile_schema(prop, name=f"{tool}.{arg}", fallback=False).is_valid
    except RequestError:
        return None
