"""Shared hypothesis strategies for the test suite.

``json_values`` draws arbitrary JSON-shaped values: ``None``, booleans, integers, floats and
strings as leaves, nested in lists and string-keyed dicts. Each test module picks the leaf
strategies and sizes it needs (integer range, which floats, string alphabet, dict keys), so
that one definition serves every property test that feeds "any JSON value" to the code.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

FINITE_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
"""Floats that JSON can spell: no NaN, no infinities."""

_INTEGERS = st.integers()
_TEXT = st.text()


def json_values(
    *,
    max_leaves: int,
    integers: st.SearchStrategy[int] = _INTEGERS,
    floats: st.SearchStrategy[float] | None = FINITE_FLOATS,
    text: st.SearchStrategy[str] = _TEXT,
    keys: st.SearchStrategy[str] = _TEXT,
    max_list_size: int | None = None,
    max_dict_size: int | None = None,
) -> st.SearchStrategy[Any]:
    """JSON values with at most ``max_leaves`` leaves.

    Leaves are ``None``, booleans, ``integers``, ``floats`` (left out when ``None``) and
    ``text``; containers are lists of at most ``max_list_size`` items and dicts keyed by
    ``keys`` with at most ``max_dict_size`` entries (``None``: no bound).
    """
    scalars: list[st.SearchStrategy[Any]] = [st.none(), st.booleans(), integers]
    if floats is not None:
        scalars.append(floats)
    scalars.append(text)
    return st.recursive(
        st.one_of(scalars),
        lambda inner: (
            st.lists(inner, max_size=max_list_size)
            | st.dictionaries(keys, inner, max_size=max_dict_size)
        ),
        max_leaves=max_leaves,
    )


# What secrets, secret keys and their look-alikes are made of, in any case and spelling.
LOOKALIKES = st.sampled_from(
    [
        "sk-",
        "gsk_",
        "Bearer ",
        "to\u212aen",  # "token" with a Kelvin sign
        "Api-Key",
        "PASSWD=",
        "pa\u00dfword",  # "password" with an eszett: case-folds to "passw..."
        "\u017fecret",  # a long s
        "ssn",
        "S-S-N",
        " Ssn ",
        "my-field",
        "MY_FIELD",
        "data",
        "@",
        "?key=",
        "://u:p@",
        '"',
        "\\",
        "\n",
        "\u0000",
        "abcdefgh12345678",
        "\u03a3",  # a capital sigma, whose lower case depends on its neighbours
        "\u0130",  # a dotted capital I, which lowers to two characters
    ]
)
LOOKALIKE_TEXT = st.lists(st.one_of(LOOKALIKES, st.text(max_size=3)), max_size=6).map("".join)
"""Text made of those pieces and a little of anything else: what redaction must see through."""
