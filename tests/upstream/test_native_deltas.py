"""Native tool calls through OpenAICompatUpstream: ``delta.tool_calls`` as real servers
stream it, over the real scripted upstream on loopback.

The chunks below are shaped like recordings of each server (ids, ``x_groq``,
``system_fingerprint`` and the rest kept, so unknown keys are shown to be ignored), and the
parsed :attr:`UpstreamDelta.tool_calls` are checked piece by piece, then assembled.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest

from toolforge.core.native_tools import ToolCallAssembler, to_openai_tools
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.scripted_upstream import ScriptedUpstream
from toolforge.upstream.base import ChatRequest, ToolCallDelta, UpstreamDelta
from toolforge.upstream.openai_compat import OpenAICompatUpstream, _parse_chunk

D = ToolCallDelta
ARGS = '{"query": "sushi", "open_at": "19:00"}'
TOOLS = to_openai_tools(
    [{"name": "places.search", "description": "Find places.", "input_schema": {"type": "object"}}]
)
REQUEST = ChatRequest(
    model="m",
    messages=[{"role": "user", "content": "sushi at 7?"}],
    extra={"tools": TOOLS, "tool_choice": "auto"},
)


def event(chunk: dict[str, Any]) -> dict[str, str]:
    """A raw script step: one SSE event holding ``chunk``."""
    return {"raw": "data: " + orjson.dumps(chunk).decode() + "\n\n"}


def vllm(delta: dict[str, Any], finish: str | None = None) -> dict[str, str]:
    return event(
        {
            "id": "chatcmpl-9f2c",
            "object": "chat.completion.chunk",
            "created": 1730000000,
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


def groq(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, str]:
    return event(
        {
            "id": "chatcmpl-7d1e",
            "object": "chat.completion.chunk",
            "created": 1730000000,
            "model": "llama-3.3-70b-versatile",
            "system_fingerprint": "fp_3f3b593e33",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "x_groq": {"id": "req_01j"} | extra,
        }
    )


def ollama(delta: dict[str, Any], finish: str | None = None) -> dict[str, str]:
    return event(
        {
            "id": "chatcmpl-311",
            "object": "chat.completion.chunk",
            "created": 1730000000,
            "model": "qwen2.5:7b",
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def fragment(index: int, arguments: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}


USAGE = {"prompt_tokens": 200, "completion_tokens": 30, "total_tokens": 230}

# vLLM (and llama-server, OpenAI): role first, then id + name with empty arguments, then
# argument fragments under the same index; finish_reason "tool_calls"; usage last.
VLLM = [
    vllm({"role": "assistant", "content": ""}),
    vllm(
        {
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-5c1",
                    "type": "function",
                    "index": 0,
                    "function": {"name": "places__search", "arguments": ""},
                }
            ]
        }
    ),
    vllm(fragment(0, '{"query": "su')),
    vllm(fragment(0, 'shi", "open_at": ')),
    vllm(fragment(0, '"19:00"}')),
    vllm({"content": ""}, finish="tool_calls"),
    event({"id": "chatcmpl-9f2c", "choices": [], "usage": USAGE}),
]
VLLM_PIECES = [
    D(0, "chatcmpl-tool-5c1", "places__search", ""),
    D(0, None, None, '{"query": "su'),
    D(0, None, None, 'shi", "open_at": '),
    D(0, None, None, '"19:00"}'),
]

# Groq: each call whole in one piece, two parallel calls in one chunk; usage in x_groq.
GROQ = [
    groq({"role": "assistant", "content": None}),
    groq(
        {
            "tool_calls": [
                {
                    "id": "call_k4x",
                    "type": "function",
                    "function": {"name": "places__search", "arguments": ARGS},
                    "index": 0,
                },
                {
                    "id": "call_p9q",
                    "type": "function",
                    "function": {"name": "places__search", "arguments": '{"query": "ramen"}'},
                    "index": 1,
                },
            ]
        }
    ),
    groq({}, finish="tool_calls", usage=USAGE),
]
GROQ_PIECES = [
    D(0, "call_k4x", "places__search", ARGS),
    D(1, "call_p9q", "places__search", '{"query": "ramen"}'),
]

# Ollama /v1 before 0.4.7: no index, each call whole, content "" beside the calls.
OLLAMA = [
    ollama(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_ab12",
                    "type": "function",
                    "function": {"name": "places__search", "arguments": ARGS},
                }
            ],
        }
    ),
    ollama(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_cd34",
                    "type": "function",
                    "function": {"name": "places__search", "arguments": '{"query": "ramen"}'},
                }
            ],
        }
    ),
    ollama({"role": "assistant", "content": ""}, finish="tool_calls"),
]
OLLAMA_PIECES = [
    D(None, "call_ab12", "places__search", ARGS),
    D(None, "call_cd34", "places__search", '{"query": "ramen"}'),
]


async def run(script: list[dict[str, Any]]) -> tuple[list[UpstreamDelta], Any]:
    async with ScriptedUpstream([{"steps": script}]) as up, httpx.AsyncClient() as c:
        upstream = OpenAICompatUpstream(c, up.base_url, connect_s=1, first_byte_s=1, idle_s=1)
        deltas = [d async for d in upstream.stream(REQUEST)]
        (sent,) = up.requests
    return deltas, sent.json


@pytest.mark.parametrize(
    ("script", "pieces", "ids"),
    [
        (VLLM, VLLM_PIECES, ["chatcmpl-tool-5c1"]),
        (GROQ, GROQ_PIECES, ["call_k4x", "call_p9q"]),
        (OLLAMA, OLLAMA_PIECES, ["call_ab12", "call_cd34"]),
    ],
    ids=["vllm", "groq", "ollama-no-index"],
)
async def test_recorded_streams_parse_into_tool_call_pieces(
    script: list[dict[str, Any]], pieces: list[ToolCallDelta], ids: list[str]
) -> None:
    deltas, sent = await run(script)
    assert sent["tools"] == TOOLS and sent["tool_choice"] == "auto"
    assert [p for d in deltas for p in d.tool_calls] == pieces
    assert all(d.text == "" for d in deltas)
    finishes = [d.finish_reason for d in deltas if d.finish_reason is not None]
    assert finishes == ["tool_calls"]
    assert [d.usage for d in deltas if d.usage is not None] in ([USAGE], [])

    assembler = ToolCallAssembler()
    for delta in deltas:
        assembler.feed(delta.tool_calls)
    calls = assembler.finish()
    assert [c.id for c in calls] == ids
    assert {c.tool_name for c in calls} == {"places.search"}
    assert all(json.loads(c.arguments_text)["query"] for c in calls)


async def test_http_chunk_boundaries_inside_a_tool_call_event() -> None:
    raw = VLLM[2]["raw"] + VLLM[3]["raw"]
    cut = raw.index("su") + 1
    script = [VLLM[1], {"raw": raw, "split": [cut, cut + 9]}, VLLM[4], VLLM[5]]
    deltas, _ = await run(script)
    assert [p for d in deltas for p in d.tool_calls] == VLLM_PIECES


async def test_text_before_the_call_and_the_finish_in_the_same_chunk() -> None:
    script = [
        vllm({"content": "Let me look."}),
        vllm(
            {
                "content": None,
                "tool_calls": [
                    {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            finish="tool_calls",
        ),
    ]
    deltas, _ = await run(script)
    assert deltas == [
        UpstreamDelta("Let me look."),
        UpstreamDelta("", "tool_calls", None, (D(0, "c1", "f", "{}"),)),
    ]


# -- _parse_chunk, piece by piece ----------------------------------------------------------


def parse(tool_calls: Any) -> UpstreamDelta | None:
    return _parse_chunk(
        orjson.dumps({"choices": [{"index": 0, "delta": {"tool_calls": tool_calls}}]}).decode()
    )


@pytest.mark.parametrize(
    ("tool_calls", "pieces"),
    [
        # empty/null keys on continuation pieces mean "absent"
        (
            [{"index": 0, "id": "", "function": {"name": "", "arguments": "x"}}],
            [D(0, None, None, "x")],
        ),
        (
            [{"index": 0, "id": None, "function": {"name": None, "arguments": None}}],
            [D(0, None, None, "")],
        ),
        ([{"index": 3}], [D(3, None, None, "")]),
        ([{"function": {"arguments": "{"}}], [D(None, None, None, "{")]),
        # arguments as an object (Ollama's native shape, leaked by proxies): back to text
        (
            [{"id": "c", "function": {"name": "f", "arguments": {"a": [1, "é"]}}}],
            [D(None, "c", "f", '{"a":[1,"é"]}')],
        ),
        ([{"index": 0, "type": "function", "function": {"name": "f"}}], [D(0, None, "f", "")]),
    ],
)
def test_piece_shapes(tool_calls: Any, pieces: list[ToolCallDelta]) -> None:
    delta = parse(tool_calls)
    assert delta is not None and list(delta.tool_calls) == pieces


@pytest.mark.parametrize("tool_calls", [[], None, {}])
def test_no_tool_calls_is_nothing(tool_calls: Any) -> None:
    assert parse(tool_calls) is None


@pytest.mark.parametrize(
    "tool_calls",
    [
        {"index": 0},  # not a list
        "call",
        [1],
        [{"index": -1}],
        [{"index": "0"}],
        [{"index": True}],
        [{"index": 1.0}],
        [{"id": 7}],
        [{"function": "f"}],
        [{"function": {"name": ["f"]}}],
        [{"function": {"arguments": 12}}],
        [{"function": {"arguments": ["a"]}}],
    ],
)
def test_bad_piece_shapes_are_upstream_protocol_errors(tool_calls: Any) -> None:
    with pytest.raises(UpstreamError) as info:
        parse(tool_calls)
    assert info.value.code is ErrorCode.UPSTREAM_PROTOCOL
    assert "unexpected shape" in info.value.message


def test_plain_text_chunks_carry_no_tool_calls() -> None:
    delta = _parse_chunk('{"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}')
    assert delta == UpstreamDelta("hi")
    assert delta is not None and delta.tool_calls == ()
