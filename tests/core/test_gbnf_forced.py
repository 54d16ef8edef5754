"""The text a grammar forces at either end (toolforge.core.gbnf_forced): the prefix, the
grammar of the middle and the suffix accept exactly what the whole grammar accepts
(tests/core/gbnf_matcher.py decides), and a grammar the reader cannot follow is left whole.
"""

from __future__ import annotations

import pytest

from tests.core.gbnf_matcher import parse
from toolforge.core.gbnf import TurnIds, frame_grammar, json_value_grammar
from toolforge.core.gbnf_forced import ForcedText, forced_text
from toolforge.core.protocol import sentinels

L, R = sentinels.OPEN, sentinels.CLOSE

# The booking workflow's two turns, as the gateway sends them to llama-server.
SEARCH = r"""root ::= ( call-1 )
ws ::= ( " " | "\n" [ \t]{0,8} )?
turn-places-search-query-re ::= " " ( "Find" | "find" | "pizza" | "near" | "book" | "table" | "2" | "7pm" | "open" )
turn-places-search-query ::= "\"" ( "Find" | "find" | "pizza" | "near" | "book" | "table" | "2" | "7pm" | "open" ) turn-places-search-query-re{0,5} "\""
turn-places-search ::= "{" ws "\"query\"" ws ":" ws turn-places-search-query ws "}"
call-1 ::= "\u27E6BEGIN_TOOL_CALL id=t1 name=places.search\u27E7" turn-places-search "\u27E6END_TOOL_CALL id=t1\u27E7"
"""  # noqa: E501
BOOK = r"""root ::= ( call-1 )
ws ::= ( " " | "\n" [ \t]{0,8} )?
turn-bookings-create-place-id ::= "\"morning-brew\"" | "\"trattoria-roma\"" | "\"the-night-owl\""
turn-bookings-create-rest ::= ws "," ws "\"time\"" ws ":" ws "\"19:00\"" ws "," ws "\"party_size\"" ws ":" ws "2"
turn-bookings-create ::= "{" ws "\"place_id\"" ws ":" ws turn-bookings-create-place-id turn-bookings-create-rest ws "}"
call-1 ::= "\u27E6BEGIN_TOOL_CALL id=t2 name=bookings.create\u27E7" turn-bookings-create "\u27E6END_TOOL_CALL id=t2\u27E7"
"""  # noqa: E501

SEARCH_TEXTS = [
    f'{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{"query": "pizza"}}{L}END_TOOL_CALL id=t1{R}',
    f'{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{\n  "query": "book pizza near 7pm"\n  }}'
    f"{L}END_TOOL_CALL id=t1{R}",
    f'{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{"query":"sushi"}}{L}END_TOOL_CALL id=t1{R}',
    f'{L}BEGIN_TOOL_CALL id=t2 name=places.search{R}{{"query":"pizza"}}{L}END_TOOL_CALL id=t2{R}',
    f'{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{"query":"pizza"}}',
    '{"query":"pizza"}',
    "",
]
BOOK_TEXTS = [
    f'{L}BEGIN_TOOL_CALL id=t2 name=bookings.create{R}{{"place_id": "trattoria-roma", '
    f'"time": "19:00", "party_size": 2}}{L}END_TOOL_CALL id=t2{R}',
    f'{L}BEGIN_TOOL_CALL id=t2 name=bookings.create{R}{{\n"place_id":"the-night-owl",\n'
    f'"time":"19:00",\n"party_size":2\n}}{L}END_TOOL_CALL id=t2{R}',
    f'{L}BEGIN_TOOL_CALL id=t2 name=bookings.create{R}{{"place_id": "made-up", '
    f'"time": "19:00", "party_size": 2}}{L}END_TOOL_CALL id=t2{R}',
    f'{L}BEGIN_TOOL_CALL id=t2 name=bookings.create{R}{{"place_id": "trattoria-roma", '
    f'"time": "19:00", "party_size": 2}}',
]


def same_language(grammar: str, forced: ForcedText, texts: list[str]) -> None:
    """``grammar`` accepts a text exactly when the prefix, the middle's grammar and the
    suffix do, in turn."""
    whole, middle = parse(grammar), parse(forced.grammar)
    for text in texts:
        inner = text.startswith(forced.prefix) and text.endswith(forced.suffix)
        cut = text[len(forced.prefix) : len(text) - len(forced.suffix)] if inner else ""
        split = inner and len(text) >= len(forced.prefix + forced.suffix) and middle.accepts(cut)
        assert whole.accepts(text) == split, text


@pytest.mark.parametrize(("grammar", "texts"), [(SEARCH, SEARCH_TEXTS), (BOOK, BOOK_TEXTS)])
def test_the_booking_turns_give_up_their_sentinels_and_opening_brace(
    grammar: str, texts: list[str]
) -> None:
    forced = forced_text(grammar)
    assert forced is not None
    call, name = ("t1", "places.search") if grammar is SEARCH else ("t2", "bookings.create")
    assert forced.prefix == f"{L}BEGIN_TOOL_CALL id={call} name={name}{R}{{"
    assert forced.suffix == f"{L}END_TOOL_CALL id={call}{R}"
    assert forced.grammar.startswith("root ::= ws ") and forced.grammar.count("root ::=") == 1
    assert parse(grammar).accepts(texts[0]) and texts[0].startswith(forced.prefix)
    same_language(grammar, forced, texts)


def test_without_the_suffix_the_middle_keeps_it() -> None:
    forced = forced_text(SEARCH, suffix=False)
    assert forced is not None and forced.suffix == ""
    assert forced.prefix == f"{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{"
    same_language(SEARCH, forced, SEARCH_TEXTS)


@pytest.mark.parametrize(
    ("grammar", "prefix", "suffix", "texts"),
    [
        # A middle that could go on (digits) keeps its suffix: ending it is the model's
        # choice of the suffix's first character.
        ('root ::= "n=" [0-9]+ ";"\n', "n=", "", ["n=1;", "n=12;", "n=;", "n=1", "x=1;"]),
        # One character class is one character: the suffix after it is forced.
        ('root ::= "n=" [0-9] ";"\n', "n=", ";", ["n=1;", "n=12;", "n=;", "n=1"]),
        # ... and one that ends in a literal on every path gives it up.
        (
            'root ::= "<" v ">"\nv ::= "a" | "b" [0-9]{1,2} "c"\n',
            "<",
            ">",
            ["<a>", "<b1c>", "<b12c>", "<b>", "<ac>", "<a"],
        ),
        # Escapes in literals: \x \u \U \" \\ \n \t
        (
            'root ::= "\\x41\\u27E6\\U0001F600\\"\\\\\\n\\t" [a-z] "!"\n',
            'A\u27e6\U0001f600"\\\n\t',
            "!",
            ['A\u27e6\U0001f600"\\\n\tq!', 'A\u27e6\U0001f600"\\\n\t!', "Aq!"],
        ),
        # Nested groups and rules are followed while each is one sequence.
        (
            'root ::= ( ( "[" inner ) )\ninner ::= "x" [0-9] "]"\n',
            "[x",
            "]",
            ["[x1]", "[x]", "[y1]", "[x12]"],
        ),
    ],
)
def test_forced_ends_of_small_grammars(
    grammar: str, prefix: str, suffix: str, texts: list[str]
) -> None:
    forced = forced_text(grammar)
    assert forced is not None
    assert (forced.prefix, forced.suffix) == (prefix, suffix)
    same_language(grammar, forced, texts)


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "a" | "b"\n',  # a choice at the top: nothing forced
        'root ::= ( call-1 | call-2 )\ncall-1 ::= "x" [a-z]\ncall-2 ::= "y" [a-z]\n',
        'root ::= "abc"\n',  # everything forced: nothing left to generate
        'root ::= "a"* [b]\n',  # a repeated literal is not forced
        '# a comment\nroot ::= "a" [b]\n',  # a line this reader does not take
        'root ::= "a" [b] "\\q"\n',  # an escape llama.cpp does not know
        'root ::= "a" (b\nb ::= "c"\n',  # unbalanced
        'start ::= "a" [b]\n',  # no root
        "",
    ],
)
def test_what_forces_nothing_or_cannot_be_read_is_sent_whole(grammar: str) -> None:
    assert forced_text(grammar) is None


def test_the_sentinel_grammar_with_a_choice_of_frames_is_sent_whole() -> None:
    grammar = frame_grammar(
        tools={"places.search": {"type": "object"}},
        result=("Reply", {"type": "object"}),
        ids=TurnIds(call="t1", objects=(), result="r1"),
    )
    assert forced_text(grammar) is None
    # A plain JSON value: "{" is forced only where the schema is an object with a required
    # first key; a bare object schema starts with a choice of whitespace or a key.
    assert forced_text(json_value_grammar({"type": "string", "enum": ["a", "b"]})) is None
