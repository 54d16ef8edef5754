"""Whether a user's message names an offered function (toolforge.core.relevance), as tables."""

from __future__ import annotations

import pytest

from toolforge.core.relevance import named_in
from toolforge.core.words import stems

FUNCTIONS = {
    "get_weather": "Get the current weather for a city.",
    "convert_currency": "Convert an amount from one currency to another.",
    "probability_of_event": "Calculates the probability of an event.",
    "searchHolyBooks": "",
}


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ("What's the weather like in Paris?", {"get_weather": ["weath"]}),
        # a word counts by its first five letters: "conversion" names convert_currency
        # ... so "currency" also names get_weather's "current": both are named
        (
            "Currency conversion: 250 USD in EUR",
            {"get_weather": ["curre"], "convert_currency": ["conve", "curre"]},
        ),
        ("What are the probabilities of two sixes?", {"probability_of_event": ["proba"]}),
        # names split at a change of case, and a final "s" dropped
        ("Which holy book is the oldest?", {"searchHolyBooks": ["book", "holy"]}),
        # the request verbs and function words name nothing
        (
            "Get me the current one, please.",
            {"get_weather": ["curre"], "convert_currency": ["curre"]},
        ),
        ("Can you find and calculate it for me?", {}),
        ("Hi, who are you?", {}),
        # another language than the descriptions names nothing: the model decides then
        ("Wie wird das Wetter morgen in Berlin?", {}),
        ("", {}),
    ],
)
def test_what_a_message_names(message: str, named: dict[str, list[str]]) -> None:
    assert named_in(message, FUNCTIONS) == named


def test_the_words_that_may_name_something() -> None:
    assert stems("Find the CURRENT weather of the 3 biggest cities, please") == {
        "curre",
        "weath",
        "bigge",
        "citie",
    }
    assert stems("books glass") == {"book", "glass"}
    # words of two letters, digits and underscores are left out; any script counts
    assert stems("go to x_y 42 über Köln") == {"über", "köln"}


def test_a_description_in_the_users_language_is_named() -> None:
    assert named_in("Wie wird das Wetter morgen?", {"wetter": "Das Wetter einer Stadt."}) == {
        "wetter": ["wette"]
    }
