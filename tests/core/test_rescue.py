"""Tool-call rescue: a table of every form (and of what is not a call), name matching,
unknown names, and the invariants: rendered calls come back exactly, prose with no
structure gives nothing, and no text makes it raise or run long."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.core.rescue import (
    MAX_SCAN_CHARS,
    RescuedCall,
    canonical_tool_name,
    find_unknown_call,
    rescue_tool_calls,
)

TOOLS = ("places.search", "get_time", "weather.now", "send_email")
PIZZA = {"query": "pizza"}


def call(name: str, arguments: dict[str, Any], form: str) -> RescuedCall:
    return RescuedCall(name, arguments, form)  # type: ignore[arg-type]


# -- the forms ---------------------------------------------------------------------------

J = '{"name": "places.search", "arguments": {"query": "pizza"}}'

# (id, text, the calls rescued)
FOUND: list[tuple[str, str, list[RescuedCall]]] = [
    # fenced_json
    ("fence-json", f"```json\n{J}\n```", [call("places.search", PIZZA, "fenced_json")]),
    (
        "fence-plain",
        f"Calling:\n```\n{J}\n```\nDone.",
        [call("places.search", PIZZA, "fenced_json")],
    ),
    ("fence-tool-lang", f"```tool_call\n{J}\n```", [call("places.search", PIZZA, "fenced_json")]),
    (
        "fence-two-objects",
        f'```json\n{J}\n{{"name": "get_time", "arguments": {{}}}}\n```',
        [call("places.search", PIZZA, "fenced_json"), call("get_time", {}, "fenced_json")],
    ),
    (
        "fence-with-prose-inside-is-bare",
        f"```\nCall this: {J}\n```",
        [call("places.search", PIZZA, "bare_json")],
    ),
    # bare_json
    ("bare", J, [call("places.search", PIZZA, "bare_json")]),
    ("bare-in-prose", f"Sure! {J} Let me know.", [call("places.search", PIZZA, "bare_json")]),
    (
        "bare-parameters",
        '{"name": "places.search", "parameters": {"query": "pizza"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "bare-function-key",
        '{"function": "places.search", "arguments": {"query": "pizza"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "bare-tool-args",
        '{"tool": "places.search", "args": {"query": "pizza"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "bare-input",
        '{"type": "tool_use", "name": "places.search", "input": {"query": "pizza"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "openai-shape-string-arguments",
        '{"type": "function", "function": {"name": "places.search", '
        '"arguments": "{\\"query\\": \\"pizza\\"}"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "openai-shape-object-arguments",
        '{"id": "call_1", "type": "function", "function": '
        '{"name": "places.search", "arguments": {"query": "pizza"}}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "string-arguments-near-json",
        '{"name": "places.search", "arguments": "{\'query\': \'pizza\',}"}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "empty-string-arguments",
        '{"name": "get_time", "arguments": ""}',
        [call("get_time", {}, "bare_json")],
    ),
    (
        "null-arguments",
        '{"name": "get_time", "arguments": null}',
        [call("get_time", {}, "bare_json")],
    ),
    ("no-arguments", '{"name": "get_time"}', [call("get_time", {}, "bare_json")]),
    (
        "no-arguments-with-id",
        '{"id": "1", "type": "function", "name": "get_time"}',
        [call("get_time", {}, "bare_json")],
    ),
    (
        "extra-keys-beside-arguments",
        '{"name": "places.search", "arguments": {"query": "pizza"}, "reason": "asked"}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    (
        "near-json-single-quotes-trailing-comma",
        "{'name': 'places.search', 'arguments': {'query': 'pizza', 'open': True,},}",
        [call("places.search", {"query": "pizza", "open": True}, "bare_json")],
    ),
    (
        "parallel-list",
        '[{"name": "places.search", "arguments": {"query": "pizza"}}, '
        '{"name": "get_time", "arguments": {}}]',
        [call("places.search", PIZZA, "bare_json"), call("get_time", {}, "bare_json")],
    ),
    (
        "parallel-tool-calls-wrapper",
        '{"role": "assistant", "tool_calls": [{"type": "function", "function": '
        '{"name": "get_time", "arguments": "{}"}}, {"type": "function", "function": '
        '{"name": "weather.now", "arguments": "{\\"city\\": \\"Oslo\\"}"}}]}',
        [call("get_time", {}, "bare_json"), call("weather.now", {"city": "Oslo"}, "bare_json")],
    ),
    (
        "two-objects-in-prose",
        f'First {J}, then {{"name": "get_time", "arguments": {{}}}}.',
        [call("places.search", PIZZA, "bare_json"), call("get_time", {}, "bare_json")],
    ),
    (
        "braces-in-strings",
        '{"name": "places.search", "arguments": {"query": "} { ] [ \\" }"}}',
        [call("places.search", {"query": '} { ] [ " }'}, "bare_json")],
    ),
    (
        "after-a-stray-brace",
        f"Hmm {{ let me think. {J}",
        [call("places.search", PIZZA, "bare_json")],
    ),
    # tool_call_tag
    ("tag", f"<tool_call>\n{J}\n</tool_call>", [call("places.search", PIZZA, "tool_call_tag")]),
    ("tag-unclosed", f"<tool_call>\n{J}", [call("places.search", PIZZA, "tool_call_tag")]),
    (
        "tag-upper-case",
        f"<TOOL_CALL>{J}</TOOL_CALL>",
        [call("places.search", PIZZA, "tool_call_tag")],
    ),
    (
        "tag-twice",
        f"<tool_call>{J}</tool_call>\n"
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        [call("places.search", PIZZA, "tool_call_tag"), call("get_time", {}, "tool_call_tag")],
    ),
    (
        "tag-twice-unclosed",
        f'<tool_call>{J}<tool_call>{{"name": "get_time"}}',
        [call("places.search", PIZZA, "tool_call_tag"), call("get_time", {}, "tool_call_tag")],
    ),
    (
        "tag-call-syntax",
        '<tool_call>places.search(query="pizza")</tool_call>',
        [call("places.search", PIZZA, "tool_call_tag")],
    ),
    (
        "tag-name-then-object",
        '<tool_call>places.search\n{"query": "pizza"}</tool_call>',
        [call("places.search", PIZZA, "tool_call_tag")],
    ),
    (
        "tag-empty-call",
        "<tool_call>get_time()</tool_call>",
        [call("get_time", {}, "tool_call_tag")],
    ),
    # mistral
    ("mistral-list", f"[TOOL_CALLS] [{J}]", [call("places.search", PIZZA, "mistral")]),
    ("mistral-object", f"[TOOL_CALLS]{J}", [call("places.search", PIZZA, "mistral")]),
    (
        "mistral-list-parallel",
        f'[TOOL_CALLS][{J}, {{"name": "get_time", "arguments": {{}}}}]',
        [call("places.search", PIZZA, "mistral"), call("get_time", {}, "mistral")],
    ),
    (
        "mistral-args",
        '[TOOL_CALLS]places.search[ARGS]{"query": "pizza"}',
        [call("places.search", PIZZA, "mistral")],
    ),
    (
        "mistral-call-id",
        '[TOOL_CALLS]places.search[CALL_ID]a1B2c3D4e[ARGS]{"query": "pizza"}',
        [call("places.search", PIZZA, "mistral")],
    ),
    (
        "mistral-name-object",
        '[TOOL_CALLS]places.search{"query": "pizza"}',
        [call("places.search", PIZZA, "mistral")],
    ),
    (
        "mistral-twice",
        '[TOOL_CALLS]places.search[ARGS]{"query": "pizza"}[TOOL_CALLS]get_time[ARGS]{}',
        [call("places.search", PIZZA, "mistral"), call("get_time", {}, "mistral")],
    ),
    # call_syntax
    (
        "call-json",
        'places.search({"query": "pizza"})',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    (
        "call-keywords",
        'places.search(query="pizza")',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    (
        "call-literals",
        "places.search(query='it\\'s \"x\"', limit=3, near=-1.5e2, open=True, a=false, "
        "b=None, c=null, tags=['a', 'b'], where={\"lat\": 1},)",
        [
            call(
                "places.search",
                {
                    "query": 'it\'s "x"',
                    "limit": 3,
                    "near": -150.0,
                    "open": True,
                    "a": False,
                    "b": None,
                    "c": None,
                    "tags": ["a", "b"],
                    "where": {"lat": 1},
                },
                "call_syntax",
            )
        ],
    ),
    (
        "call-escapes",
        'places.search(query="a\\nb\\u00e9")',
        [call("places.search", {"query": "a\nbé"}, "call_syntax")],
    ),
    (
        "call-spaces",
        "places.search ( query = 'pizza' )",
        [call("places.search", PIZZA, "call_syntax")],
    ),
    (
        "call-in-prose",
        'Let me look: places.search(query="pizza") and then answer.',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    (
        "call-backticks",
        '`places.search(query="pizza")`',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    (
        "call-fenced",
        '```python\nplaces.search(query="pizza")\n```',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    ("call-empty-whole-reply", "  get_time()\n", [call("get_time", {}, "call_syntax")]),
    ("call-empty-in-fence", "```\nget_time();\n```", [call("get_time", {}, "call_syntax")]),
    (
        "call-two",
        'places.search(query="pizza")\nget_time(zone="UTC")',
        [
            call("places.search", PIZZA, "call_syntax"),
            call("get_time", {"zone": "UTC"}, "call_syntax"),
        ],
    ),
    # args_block
    (
        "args-block",
        'places.search[ARGS]{"query": "pizza"}',
        [call("places.search", PIZZA, "args_block")],
    ),
    (
        "args-block-in-prose",
        'OK places.search[ARGS] {"query": "pizza"} ok',
        [call("places.search", PIZZA, "args_block")],
    ),
    # names
    (
        "name-case-and-underscore",
        '{"name": "Places_Search", "arguments": {"query": "pizza"}}',
        [call("places.search", PIZZA, "bare_json")],
    ),
    ("name-dash", 'PLACES-SEARCH(query="pizza")', [call("places.search", PIZZA, "call_syntax")]),
    ("name-dot-for-underscore", "get.time()", [call("get_time", {}, "call_syntax")]),
    (
        "name-openai-prefix",
        'functions.places.search(query="pizza")',
        [call("places.search", PIZZA, "call_syntax")],
    ),
    ("name-padded", '{"name": " get_time ", "arguments": {}}', [call("get_time", {}, "bare_json")]),
    (
        "unknown-left-out-of-a-list",
        '[{"name": "weather", "arguments": {}}, {"name": "get_time", "arguments": {}}]',
        [call("get_time", {}, "bare_json")],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in FOUND], ids=[c[0] for c in FOUND])
def test_forms(text: str, expected: list[RescuedCall]) -> None:
    assert rescue_tool_calls(text, TOOLS) == expected


# (id, text): no call
NOT_FOUND: list[tuple[str, str]] = [
    ("empty", ""),
    ("whitespace", " \n\t"),
    ("prose-mentions-tool", "I will use places.search to look for pizza."),
    ("prose-mentions-call", "You can call get_time() whenever you like."),
    ("prose-parenthesis", "The places.search tool (which finds places) is handy."),
    ("positional-argument", 'places.search("pizza")'),
    ("identifier-argument", "places.search(query)"),
    ("non-literal-argument", "places.search(query=pizza)"),
    ("expression-argument", "places.search(limit=1+2)"),
    ("unclosed-call", 'places.search(query="pizza"'),
    ("unbalanced-object", '{"name": "places.search", "arguments": {"query": "pizza"}'),
    ("cut-off-object", '{"name": "places.search", "arguments": {"query": "piz'),
    ("unknown-tool-json", '{"name": "weather", "arguments": {"city": "Paris"}}'),
    ("unknown-tool-call", 'weather(city="Paris")'),
    ("data-not-a-call", '{"name": "places.search", "rating": 5}'),
    ("call-nested-in-data", f'{{"answer": {J}}}'),
    ("list-with-a-non-call", f'[{J}, {{"name": "places.search", "rating": 5}}]'),
    ("empty-list", "[]"),
    ("two-name-keys", '{"name": "places.search", "tool": "get_time", "arguments": {}}'),
    ("two-argument-keys", '{"name": "get_time", "arguments": {}, "args": {}}'),
    ("arguments-not-an-object", '{"name": "places.search", "arguments": ["pizza"]}'),
    ("arguments-string-not-json", '{"name": "places.search", "arguments": "pizza"}'),
    ("name-not-a-string", '{"name": 3, "arguments": {}}'),
    ("name-with-space", '{"name": "places search", "arguments": {}}'),
    ("markdown-link", "[places.search](https://example.com/places.search(x))"),
    ("code-braces", "function f() { return {a: 1}; }"),
    ("args-marker-without-object", "places.search[ARGS] pizza"),
    ("mistral-marker-without-call", "[TOOL_CALLS] nothing here"),
    ("tag-with-prose", "<tool_call>I would search for pizza</tool_call>"),
    ("lone-surrogate-in-arguments", '{"name": "get_time", "arguments": {"zone": "\ud800"}}'),
    ("escaped-lone-surrogate", '{"name": "get_time", "arguments": {"zone": "\\ud800"}}'),
    ("number-out-of-range", "places.search(limit=1e999)"),
    ("too-deep", '{"name": "get_time", "arguments": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}"),
]


@pytest.mark.parametrize("text", [c[1] for c in NOT_FOUND], ids=[c[0] for c in NOT_FOUND])
def test_not_calls(text: str) -> None:
    assert rescue_tool_calls(text, TOOLS) == []


def test_no_tools_no_calls() -> None:
    assert rescue_tool_calls(J, []) == []


def test_tools_must_be_a_collection_of_names() -> None:
    with pytest.raises(TypeError):
        rescue_tool_calls(J, "places.search")


# -- names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tools", "expected"),
    [
        ("places.search", TOOLS, "places.search"),
        ("Places.Search", TOOLS, "places.search"),
        ("places_search", TOOLS, "places.search"),
        ("places-search", TOOLS, "places.search"),
        ("PLACES_SEARCH", TOOLS, "places.search"),
        ("send.email", TOOLS, "send_email"),
        ("Send-Email", TOOLS, "send_email"),
        ("functions.get_time", TOOLS, "get_time"),
        ("functions.Places_Search", TOOLS, "places.search"),
        (" get_time ", TOOLS, "get_time"),
        ("weather", TOOLS, None),
        ("places", TOOLS, None),
        ("search", TOOLS, None),
        ("placessearch", TOOLS, None),
        ("", TOOLS, None),
        # two tools that fold alike: only an exact spelling decides
        ("a_b", ("a_b", "a.b"), "a_b"),
        ("a.b", ("a_b", "a.b"), "a.b"),
        ("A-B", ("a_b", "a.b"), None),
        ("functions." * 5000 + "x", TOOLS, None),
    ],
)
def test_canonical_tool_name(name: str, tools: tuple[str, ...], expected: str | None) -> None:
    assert canonical_tool_name(name, tools) == expected


# -- unknown tools -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "weather", "arguments": {"city": "Paris"}}', "weather"),
        ('Sure: {"tool": "Weather.Today", "args": {}}', "Weather.Today"),
        ('```json\n{"name": "weather", "arguments": {}}\n```', "weather"),
        ('<tool_call>{"name": "weather", "arguments": {}}</tool_call>', "weather"),
        ('<tool_call>weather(city="Paris")</tool_call>', "weather"),
        ('[TOOL_CALLS]weather[ARGS]{"city": "Paris"}', "weather"),
        ('weather[ARGS]{"city": "Paris"}', "weather"),
        ('weather(city="Paris")', "weather"),
        ("`weather()`", "weather"),
        (
            '[{"name": "get_time", "arguments": {}}, {"name": "weather", "arguments": {}}]',
            "weather",
        ),
        # not plainly a call, or no unknown name
        ('Sure, weather(city="Paris") it is.', None),
        ("Use print(x=1) to see it.", None),
        ('{"name": "Alice", "age": 3}', None),
        ('{"name": "Alice"}', None),
        ('{"name": "places.search", "arguments": {}}', None),
        ('{"name": "not a tool name", "arguments": {}}', None),
        ("I would call weather for that.", None),
        ("", None),
    ],
)
def test_find_unknown_call(text: str, expected: str | None) -> None:
    assert find_unknown_call(text, TOOLS) == expected


def test_find_unknown_call_with_no_tools_names_any_call() -> None:
    assert find_unknown_call(J, []) == "places.search"


# -- invariants --------------------------------------------------------------------------

_arguments = st.dictionaries(
    st.text(max_size=8),
    json_values(max_leaves=8, integers=st.integers(-(2**53), 2**53)),
    max_size=4,
)


def _renderings(arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """(form, text) for one call to places.search with ``arguments``, in every JSON form."""
    args = orjson.dumps(arguments).decode()
    obj = f'{{"name": "places.search", "arguments": {args}}}'
    as_string = orjson.dumps({"name": "places.search", "arguments": args}).decode()
    return [
        ("fenced_json", f"```json\n{obj}\n```"),
        ("bare_json", f"Sure! {obj} (that should do)."),
        ("bare_json", f"Sure! {as_string}"),
        ("bare_json", f'{{"tool_calls": [{{"type": "function", "function": {as_string}}}]}}'),
        ("tool_call_tag", f"<tool_call>\n{obj}\n</tool_call>"),
        ("mistral", f"[TOOL_CALLS] [{obj}]"),
        ("mistral", f"[TOOL_CALLS]places.search[ARGS]{args}"),
        ("args_block", f"places.search[ARGS]{args}"),
    ] + ([("call_syntax", f"Looking: places.search({args})")] if arguments else [])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_arguments)
def test_any_arguments_come_back_exactly_in_every_form(arguments: dict[str, Any]) -> None:
    fence_inside = "```" in orjson.dumps(arguments).decode()
    for form, text in _renderings(arguments):
        (found,) = rescue_tool_calls(text, TOOLS)
        assert (found.name, found.arguments) == ("places.search", arguments), form
        # A fence inside the arguments may make a fenced call read as a bare one: the
        # call is the same, only the form's label differs.
        assert found.form == form or fence_inside, form


_KEYWORD_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=10)
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), _KEYWORD_VALUES, max_size=4
    ),
    st.booleans(),
)
def test_keyword_arguments_come_back_exactly(arguments: dict[str, Any], python: bool) -> None:
    def literal(value: object) -> str:
        return repr(value) if python else orjson.dumps(value).decode()

    rendered = ", ".join(f"{key}={literal(value)}" for key, value in arguments.items())
    text = f"places.search({rendered})"
    assert rescue_tool_calls(text, TOOLS) == [call("places.search", arguments, "call_syntax")]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{[(<`"), max_size=200))
def test_text_without_structure_is_never_a_call(text: str) -> None:
    for name in TOOLS:
        assert rescue_tool_calls(f"{text} {name} {text}", TOOLS) == []


_NOISE_PIECES = [
    *"{}[]()<>`\"'\\:,= \n",
    *("name", "arguments", "places.search", "get_time", "tool_call", "[TOOL_CALLS]", "[ARGS]"),
    *("```", "true", "1", "\ud800"),
]
_NOISE = st.lists(st.sampled_from(_NOISE_PIECES), max_size=60).map("".join)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_NOISE, max_size=6).map("".join) | st.text(max_size=200))
def test_any_text_gives_calls_to_known_tools_and_never_raises(text: str) -> None:
    for found in rescue_tool_calls(text, TOOLS):
        assert found.name in TOOLS
        assert isinstance(found.arguments, dict)
        orjson.dumps(found.arguments)  # strict JSON: no surrogates, NaN or huge integers
    name = find_unknown_call(text, TOOLS)
    assert name is None or canonical_tool_name(name, TOOLS) is None


HOSTILE = [
    '{"' * 32_000,
    "{" * 100_000,
    "[" * 64 + "]" * 64,
    ("{" * 63 + '"name": get_time' + "}" * 63) * 10,
    '{"x' * 30_000 + '"}' * 30_000,
    "a(" * 30_000,
    "get_time(" * 10_000,
    "<tool_call>" * 6_000,
    "```\n" * 16_000,
    "[TOOL_CALLS]" * 5_000,
    '{"name":1} ' * 6_000,
    '{"name": ' * 7_000,
    "{'name': '" * 5_000,
    "{ name function tool }" * 3_000,
    "{{{{{{{{{{name}" * 5_000,
    "[" * 63 + '{"name": "x", "args": 1' * 1_000,
    '{"tool": {"a": "' + "\\\\" * 30_000 + '"}}',
    "\ud800" * 100_000,
    "x" * 1_000_000 + J,  # a call beyond the scan limit is not read
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_is_refused_fast(text: str) -> None:
    started = time.perf_counter()
    assert rescue_tool_calls(text, TOOLS) == []
    assert find_unknown_call(text, TOOLS) is None
    # ~0.1 s each measured (the work budget); the bound leaves room for a slow machine.
    assert time.perf_counter() - started < 3


def test_calls_before_the_scan_limit_are_found_in_a_long_text() -> None:
    text = J + "x" * (2 * MAX_SCAN_CHARS)
    assert rescue_tool_calls(text, TOOLS) == [call("places.search", PIZZA, "bare_json")]


def test_calls_before_hostile_text_survive_the_budget() -> None:
    text = f"{J} " + '{"x' * 20_000
    assert rescue_tool_calls(text, TOOLS) == [call("places.search", PIZZA, "bare_json")]


def test_a_mention_in_a_long_text_is_not_a_whole_reply_call() -> None:
    assert rescue_tool_calls("get_time()" + " " * MAX_SCAN_CHARS + "and more", TOOLS) == []
