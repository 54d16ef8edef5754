"""toolforge.core.native_tools: assembling streamed native tool calls, names, wire shapes.

The assembler's invariant: the calls do not depend on how the upstream groups its pieces
into chunks. Each dialect's stream is fed whole, piece by piece and at random groupings
(hypothesis), and must give the same calls.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolforge.core.native_tools import (
    MAX_NATIVE_CALLS,
    AssembledCall,
    ToolCallAssembler,
    ToolCallDelta,
    assistant_tool_call_message,
    from_openai_name,
    to_openai_name,
    to_openai_tools,
    tool_result_message,
)
from toolforge.core.tool_specs import MAX_ARGS_BYTES
from toolforge.errors import ErrorCode, ModelBehaviorError
from toolforge.tools import default_registry
from toolforge.upstream import base

D = ToolCallDelta


def assemble(chunks: Sequence[Sequence[ToolCallDelta]], **kw: Any) -> list[AssembledCall]:
    assembler = ToolCallAssembler(**kw)
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler.finish()


def every_grouping(pieces: Sequence[ToolCallDelta]) -> list[list[list[ToolCallDelta]]]:
    """The pieces whole, one per chunk, and at a few seeded random groupings."""
    rng = random.Random(len(pieces))
    out = [[list(pieces)], [[p] for p in pieces]]
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(pieces)), rng.randint(0, len(pieces) - 1)))
        bounds = [0, *cuts, len(pieces)]
        out.append([list(pieces[a:b]) for a, b in itertools.pairwise(bounds)])
    return out


def call(index: int, call_id: str, name: str, arguments: str) -> AssembledCall:
    return AssembledCall(index, call_id, name, arguments)


# -- dialects, as tables -------------------------------------------------------------------

CASES: dict[str, tuple[list[ToolCallDelta], list[AssembledCall]]] = {
    # vLLM, llama-server, OpenAI: id and name first, then fragments under the same index.
    "fragments": (
        [
            D(0, "chatcmpl-tool-1", "places__search"),
            D(0, None, None, '{"query": "su'),
            D(0, None, None, 'shi", "open_at'),
            D(0, None, None, '": "19:00"}'),
        ],
        [call(0, "chatcmpl-tool-1", "places__search", '{"query": "sushi", "open_at": "19:00"}')],
    ),
    # Groq: every call whole, one per piece.
    "whole calls": (
        [D(0, "call_a", "places__search", '{"q": 1}'), D(1, "call_b", "time__now", "{}")],
        [call(0, "call_a", "places__search", '{"q": 1}'), call(1, "call_b", "time__now", "{}")],
    ),
    # Parallel calls streamed interleaved by index (OpenAI with parallel_tool_calls).
    "interleaved": (
        [
            D(0, "a", "f", ""),
            D(1, "b", "g", ""),
            D(1, None, None, '{"y":'),
            D(0, None, None, '{"x":'),
            D(0, None, None, "1}"),
            D(1, None, None, "2}"),
        ],
        [call(0, "a", "f", '{"x":1}'), call(1, "b", "g", '{"y":2}')],
    ),
    # Ollama /v1 before 0.4.7 (ollama/ollama#7881): no index, whole calls with ids.
    "no index, whole": (
        [D(None, "call_x", "f", '{"a": 1}'), D(None, "call_y", "f", '{"a": 2}')],
        [call(0, "call_x", "f", '{"a": 1}'), call(1, "call_y", "f", '{"a": 2}')],
    ),
    # No index, no id: a piece with a name starts a call, the rest continue it.
    "no index, no id, fragments": (
        [
            D(None, None, "f", '{"a"'),
            D(None, None, None, ": 1}"),
            D(None, None, "g", ""),
            D(None, None, None, "{}"),
        ],
        [call(0, "call_0", "f", '{"a": 1}'), call(1, "call_1", "g", "{}")],
    ),
    # No index, the id repeated in every piece.
    "no index, id repeated": (
        [D(None, "k", "f", '{"a"'), D(None, "k", None, ": 1}"), D(None, "m", "g", "{}")],
        [call(0, "k", "f", '{"a": 1}'), call(1, "m", "g", "{}")],
    ),
    # Ollama reusing index 0 for parallel calls (ollama/ollama#15457): ids tell them apart.
    "index reused, ids differ": (
        [
            D(0, "call_1", "write", '{"path": "a"}'),
            D(0, "call_2", "write", '{"path": "b"}'),
            D(0, None, None, ""),
        ],
        [call(0, "call_1", "write", '{"path": "a"}'), call(1, "call_2", "write", '{"path": "b"}')],
    ),
    # Index reused without ids, but another name: another call.
    "index reused, names differ": (
        [D(0, None, "f", "{}"), D(0, None, "g", "{}")],
        [call(0, "call_0", "f", "{}"), call(1, "call_1", "g", "{}")],
    ),
    # Some servers repeat the name (and id) in every piece of a call.
    "name repeated under one index": (
        [D(0, None, "f", '{"a"'), D(0, None, "f", ": 1}")],
        [call(0, "call_0", "f", '{"a": 1}')],
    ),
    # The id can come after the first piece.
    "id late": (
        [D(0, None, "f", "{"), D(0, "late", None, "}")],
        [call(0, "late", "f", "{}")],
    ),
    # Indexes need not start at 0; they are kept.
    "sparse index": (
        [D(2, "a", "f", "{}"), D(5, "b", "g", "{}")],
        [call(2, "a", "f", "{}"), call(5, "b", "g", "{}")],
    ),
    # Two calls with one id (a server bug) still get distinct ids; ours avoid theirs.
    "duplicate and colliding ids": (
        [D(0, "dup", "f", "{}"), D(1, "dup", "f", "{}"), D(2, "call_1", "f", "{}")],
        [call(0, "dup", "f", "{}"), call(1, "call_1_1", "f", "{}"), call(2, "call_1", "f", "{}")],
    ),
    # No arguments, or whitespace: a call to a tool without parameters.
    "empty arguments": (
        [D(0, "a", "time__now"), D(1, "b", "f", " \n")],
        [call(0, "a", "time__now", "{}"), call(1, "b", "f", "{}")],
    ),
    # A piece without index after indexed ones continues the most recent call.
    "index dropped mid-call": (
        [D(0, "a", "f", '{"x"'), D(None, None, None, ":1}")],
        [call(0, "a", "f", '{"x":1}')],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dialects_in_every_grouping(name: str) -> None:
    pieces, expected = CASES[name]
    for chunks in every_grouping(pieces):
        assert assemble(chunks) == expected, chunks


def test_no_pieces_no_calls() -> None:
    assembler = ToolCallAssembler()
    assembler.feed([])
    assert not assembler.has_calls
    assert assembler.finish() == []


def test_id_prefix_and_tool_name() -> None:
    (only,) = assemble([[D(None, None, "places__search", "{}")]], id_prefix="call_2_")
    assert only.id == "call_2_0"
    assert only.tool_name == "places.search"


def test_finish_is_repeatable_and_feed_after_finish_is_a_bug() -> None:
    assembler = ToolCallAssembler()
    assembler.feed([D(0, "a", "f", "{}")])
    assert assembler.has_calls
    first = assembler.finish()
    assert assembler.finish() == first
    with pytest.raises(RuntimeError):
        assembler.feed([])


# -- split invariance, generated ---------------------------------------------------------

NAMES = st.sampled_from(["places__search", "bookings__create", "time__now", "f"])


@dataclass(frozen=True)
class Planned:
    index: int
    id: str | None
    name: str
    fragments: tuple[str, ...]

    @property
    def expected(self) -> AssembledCall:
        text = "".join(self.fragments)
        return AssembledCall(
            self.index, self.id or f"call_{self.index}", self.name, text if text.strip() else "{}"
        )


@st.composite
def planned_calls(draw: st.DrawFn) -> list[Planned]:
    out = []
    for index in range(draw(st.integers(1, 4))):
        text = draw(st.text(max_size=30))
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
        bounds = [0, *cuts, len(text)]
        fragments = tuple(text[a:b] for a, b in itertools.pairwise(bounds))
        call_id = f"id-{index}" if draw(st.booleans()) else None
        out.append(Planned(index, call_id, draw(NAMES), fragments))
    return out


def group(draw: st.DrawFn, pieces: list[ToolCallDelta]) -> list[list[ToolCallDelta]]:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(pieces) - 1)), max_size=6))))
    bounds = [0, *[c for c in cuts if c < len(pieces)], len(pieces)]
    return [pieces[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def indexed_streams(draw: st.DrawFn) -> tuple[list[list[ToolCallDelta]], list[AssembledCall]]:
    """OpenAI-style: every piece has its index; calls interleave; id and name arrive in
    any one piece of their call (and may be repeated)."""
    calls = draw(planned_calls())
    queues: list[list[ToolCallDelta]] = []
    for c in calls:
        n = len(c.fragments)
        id_at = draw(st.integers(0, n - 1))
        name_at = draw(st.integers(0, n - 1))
        repeat = draw(st.booleans())
        queues.append(
            [
                D(
                    c.index,
                    c.id if i == id_at or (repeat and i > id_at) else None,
                    c.name if i == name_at or (repeat and i > name_at) else None,
                    fragment,
                )
                for i, fragment in enumerate(c.fragments)
            ]
        )
    pieces: list[ToolCallDelta] = []
    while any(queues):
        live = [q for q in queues if q]
        pieces.append(draw(st.sampled_from(live)).pop(0))
    return group(draw, pieces), [c.expected for c in calls]


@st.composite
def unindexed_streams(draw: st.DrawFn) -> tuple[list[list[ToolCallDelta]], list[AssembledCall]]:
    """Ollama-style: no index; calls one after the other, the name (and id) in the first
    piece of each, the id maybe repeated in the rest."""
    calls = draw(planned_calls())
    pieces: list[ToolCallDelta] = []
    for c in calls:
        repeat_id = draw(st.booleans())
        for i, fragment in enumerate(c.fragments):
            first = i == 0
            pieces.append(
                D(None, c.id if first or repeat_id else None, c.name if first else None, fragment)
            )
    return group(draw, pieces), [c.expected for c in calls]


@given(stream=indexed_streams())
@settings(max_examples=300, deadline=None)
def test_indexed_streams_assemble_the_same_however_grouped(
    stream: tuple[list[list[ToolCallDelta]], list[AssembledCall]],
) -> None:
    chunks, expected = stream
    pieces = [p for chunk in chunks for p in chunk]
    assert assemble(chunks) == expected
    assert assemble([pieces]) == expected
    assert assemble([[p] for p in pieces]) == expected


@given(stream=unindexed_streams())
@settings(max_examples=300, deadline=None)
def test_unindexed_streams_assemble_the_same_however_grouped(
    stream: tuple[list[list[ToolCallDelta]], list[AssembledCall]],
) -> None:
    chunks, expected = stream
    pieces = [p for chunk in chunks for p in chunk]
    assert assemble(chunks) == expected
    assert assemble([pieces]) == expected
    assert assemble([[p] for p in pieces]) == expected


# -- errors ------------------------------------------------------------------------------


def test_a_call_without_a_name_is_malformed_and_the_error_sticks() -> None:
    assembler = ToolCallAssembler()
    assembler.feed([D(0, "a", None, "{}")])
    with pytest.raises(ModelBehaviorError) as info:
        assembler.finish()
    assert info.value.code is ErrorCode.NATIVE_TOOL_CALL_MALFORMED
    assert "no function name" in info.value.message
    with pytest.raises(ModelBehaviorError) as again:
        assembler.finish()
    assert again.value == info.value
    with pytest.raises(ModelBehaviorError):
        assembler.feed([])


def test_one_id_with_two_names_is_malformed() -> None:
    assembler = ToolCallAssembler()
    with pytest.raises(ModelBehaviorError) as info:
        assembler.feed([D(0, "a", "f", ""), D(0, "a", "g", "")])
    assert info.value.code is ErrorCode.NATIVE_TOOL_CALL_MALFORMED
    with pytest.raises(ModelBehaviorError):
        assembler.finish()


def test_more_calls_than_the_limit_stop_at_feed() -> None:
    assembler = ToolCallAssembler()
    assembler.feed([D(i, f"c{i}", "f", "{}") for i in range(MAX_NATIVE_CALLS)])
    with pytest.raises(ModelBehaviorError) as info:
        assembler.feed([D(None, "one-more", "f", "{}")])
    assert info.value.code is ErrorCode.TOOL_CALL_LIMIT
    assert str(MAX_NATIVE_CALLS) in info.value.message


def test_arguments_over_the_limit_stop_at_feed_counting_utf8_bytes() -> None:
    assert MAX_ARGS_BYTES == 32 * 1024
    assembler = ToolCallAssembler()
    assembler.feed([D(0, "a", "f", "x" * (MAX_ARGS_BYTES - 2))])
    assembler.feed([D(0, None, None, "é")])  # 2 bytes: exactly at the limit
    with pytest.raises(ModelBehaviorError) as info:
        assembler.feed([D(0, None, None, "é")])
    assert info.value.code is ErrorCode.ARGUMENTS_TOO_LARGE
    assert info.value.details == [{"size": str(MAX_ARGS_BYTES + 2), "limit": str(MAX_ARGS_BYTES)}]
    # The limit is per call.
    small = ToolCallAssembler(max_argument_bytes=4)
    small.feed([D(0, "a", "f", "1234"), D(1, "b", "f", "1234")])
    assert [c.arguments_text for c in small.finish()] == ["1234", "1234"]


# -- names -------------------------------------------------------------------------------

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.mark.parametrize(
    ("ours", "wire"),
    [
        ("places.search", "places__search"),
        ("bookings.create", "bookings__create"),
        ("fs.read", "fs__read"),
        ("a.b.c", "a__b__c"),
        ("get_weather", "get_weather"),
        ("kebab-case", "kebab-case"),
        ("a._b", "a___b"),
    ],
)
def test_names_map_both_ways(ours: str, wire: str) -> None:
    assert to_openai_name(ours) == wire
    assert from_openai_name(wire) == ours


@pytest.mark.parametrize(
    "ours", ["a__b", "a_.b", "", "x" * 65, "a.b" + "c" * 62, "with space", "naïve", "a/b"]
)
def test_names_that_cannot_go_native_are_refused(ours: str) -> None:
    with pytest.raises(ValueError, match="cannot be sent natively"):
        to_openai_name(ours)


@given(name=st.text(alphabet="ab_-.", min_size=1, max_size=20))
def test_every_accepted_name_round_trips_and_is_an_openai_name(name: str) -> None:
    try:
        wire = to_openai_name(name)
    except ValueError:
        return
    assert OPENAI_NAME.match(wire)
    assert from_openai_name(wire) == name


# -- wire shapes -------------------------------------------------------------------------


def test_demo_tools_in_openai_format() -> None:
    specs = [spec.to_dict() for spec in default_registry().visible()]
    tools = to_openai_tools(specs)
    assert [t["function"]["name"] for t in tools] == ["places__search", "bookings__create"]
    for tool, spec in zip(tools, specs, strict=True):
        # exact key sets (docs/tools.md: each wire format's exact keys)
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        assert set(tool["function"]) == {"name", "description", "parameters"}
        assert tool["function"]["description"] == spec["description"]
        assert tool["function"]["parameters"] == spec["input_schema"]
        assert from_openai_name(tool["function"]["name"]) == spec["name"]


def test_openai_tools_defaults_and_refusals() -> None:
    (tool,) = to_openai_tools([MappingProxyType({"name": "time.now"})])
    assert tool == {
        "type": "function",
        "function": {"name": "time__now", "parameters": {"type": "object", "properties": {}}},
    }
    with pytest.raises(ValueError, match="twice"):
        to_openai_tools([{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="natively"):
        to_openai_tools([{"name": "a__b"}])


def test_continuation_messages() -> None:
    calls = [
        call(0, "call_a", "places__search", '{"query": "sushi"}'),
        call(1, "call_b", "time__now", "{}"),
        call(2, "call_c", "f", '{"broken'),  # sent back as {} (vLLM json.loads history)
        call(3, "call_d", "f", "[1, 2]"),  # not an object: templates expect a mapping
    ]
    message = assistant_tool_call_message(calls)
    assert message == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "places__search", "arguments": '{"query": "sushi"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "time__now", "arguments": "{}"},
            },
            {"id": "call_c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_d", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ],
    }
    assert assistant_tool_call_message(calls[:1], content=None)["content"] is None
    assert assistant_tool_call_message(calls[:1], "Let me look.")["content"] == "Let me look."
    orjson.dumps(message)  # JSON-ready as built

    assert tool_result_message("call_a", "plain text") == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "plain text",
    }
    envelope = {"ok": True, "data": MappingProxyType({"n": 1, "é": "ü"}), "warnings": []}
    result = tool_result_message("call_b", envelope)
    assert orjson.loads(result["content"]) == {
        "ok": True,
        "data": {"n": 1, "é": "ü"},
        "warnings": [],
    }
    with pytest.raises(TypeError):
        tool_result_message("call_c", {"x": object()})


def test_the_upstream_seam_re_exports_the_delta_type() -> None:
    assert base.ToolCallDelta is ToolCallDelta
    assert base.UpstreamDelta("x") == base.UpstreamDelta("x", None, None, ())
    assert ToolCallDelta(0, None, None).arguments == ""
