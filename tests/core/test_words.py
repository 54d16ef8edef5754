"""The shared word lists and readings (toolforge.core.words), as tables."""

from __future__ import annotations

import pytest

from toolforge.core.words import flag_in


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("detailed", "Find me detailed information about the structure of a cell", True),
        ("detailed", "Standings of the Warriors with details", True),
        ("equal_variance", "Run a T-test assuming equal variance.", True),
        ("fullName", "What was the full name of the king of England in 1800?", True),
        ("format_as_ratio", "What are the odds? Format it as ratio.", True),
        ("air_resistance", "An object dropped from 100 m without air resistance.", False),
        ("full_text", "Find the case, and don't return full text.", False),
        ("details", "Wetter in Berlin, ohne Details bitte", False),
        ("include_description", "What proteins are in the plasma membrane?", None),
        # "get" and function words name nothing
        ("get_all", "Get me all of them", None),
        # both ways: nothing is said
        ("details", "details, or not details?", None),
    ],
)
def test_what_a_message_says_of_a_flag(name: str, text: str, said: bool | None) -> None:
    assert flag_in(name, text) is said
