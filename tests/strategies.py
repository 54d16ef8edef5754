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
