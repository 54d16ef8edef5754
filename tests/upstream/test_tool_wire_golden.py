"""The wire formats (docs/tools.md): per upstream adapter, the exact wire
shape of the tool definitions sent, of the calls assembled from a recorded stream, and of
the result messages that continue the conversation; checked against committed goldens
(``tests/upstream/fixtures/golden/*.golden.json``), as structures (key order is free,
extra or missing keys are not).

The tools are a Python tool (``places.search``, its schema derived from pydantic) and an
MCP-style tool (``fixture.add``, its JSON Schema as a server listed it), so both sources
go through the same encoders. ``UPDATE_GOLDEN=1`` rewrites the goldens (review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from toolforge.core.chat import ChatRequest
from toolforge.core.native_tools import (
    AssembledCall,
    ToolCallAssembler,
    assistant_tool_call_message,
    to_openai_tools,
    tool_result_message,
)
from toolforge.core.tool_specs import JsonArgs, ToolEnvelope, ToolSpec
from toolforge.tools.places import places_search_spec
from toolforge.upstream.ollama_wire import ChatLineParser, chat_body
from toolforge.upstream.openai_compat import OpenAICompatUpstream, _parse_chunk
from toolforge.upstream.sse_decoder import UpstreamSSEDecoder

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
ADAPTERS = ["openai_compat", "ollama"]


async def _never(args: Any) -> object:
    raise AssertionError("not called")


def specs() -> list[ToolSpec[Any]]:
    mcp_add = ToolSpec(
        name="fixture.add",
        description="Add two integers.",
        args_model=JsonArgs,
        json_schema={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        fn=_never,
        output_allowlist=frozenset(),
        source="mcp:fixture",
    )
    return [places_search_spec(), mcp_add]


def assembled(adapter: str) -> list[AssembledCall]:
    assembler = ToolCallAssembler()
    if adapter == "openai_compat":
        decoder = UpstreamSSEDecoder()
        raw = (GOLDEN / "openai_stream.sse").read_bytes()
        for message in [*decoder.feed(raw), *decoder.close()]:
            if message.data and message.data != "[DONE]":
                delta = _parse_chunk(message.data)
                if delta is not None:
                    assembler.feed(delta.tool_calls)
    else:
        parser = ChatLineParser()
        for line in (GOLDEN / "ollama_stream.ndjson").read_bytes().splitlines():
            delta = parser.parse(line)
            if delta is not None:
                assembler.feed(delta.tool_calls)
    return assembler.finish()


def wire_body(adapter: str, request: ChatRequest) -> dict[str, Any]:
    if adapter == "openai_compat":
        client = httpx.AsyncClient()  # never used: body() only builds the JSON
        return OpenAICompatUpstream(client, "http://127.0.0.1:9/v1").body(request)
    return chat_body(request, num_ctx=4096, keep_alive=None)


def build(adapter: str) -> dict[str, Any]:
    tools = to_openai_tools([s.to_dict() for s in specs()])
    calls = assembled(adapter)
    results = {
        "places.search": ToolEnvelope.success({"count": 1, "places": [{"id": "trattoria-roma"}]}),
        "fixture.add": ToolEnvelope.success({"sum": 5}),
    }
    messages = [
        {"role": "user", "content": "Find pizza, and add 2 and 3."},
        assistant_tool_call_message(calls),
        *(tool_result_message(c.id, results[c.tool_name].to_dict()) for c in calls),
    ]
    body = wire_body(
        adapter,
        ChatRequest(model="m", messages=messages, extra={"tools": tools, "tool_choice": "auto"}),
    )
    return {
        "tool_definitions": body["tools"],
        "assembled_calls": [
            {"id": c.id, "index": c.index, "name": c.tool_name, "arguments": c.arguments_text}
            for c in calls
        ],
        "result_messages": body["messages"][1:],
    }


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_wire_shapes_match_the_goldens(adapter: str) -> None:
    path = GOLDEN / f"{adapter}.golden.json"
    got = orjson.loads(orjson.dumps(build(adapter)))
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(orjson.dumps(got, option=orjson.OPT_INDENT_2) + b"\n")
    golden = orjson.loads(path.read_bytes())
    assert got == golden  # dict equality: exact keys and values, any key order


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_exact_key_sets(adapter: str) -> None:
    golden = orjson.loads((GOLDEN / f"{adapter}.golden.json").read_bytes())
    for tool in golden["tool_definitions"]:
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        assert set(tool["function"]) == {"name", "description", "parameters"}
        assert tool["function"]["parameters"]["type"] == "object"
    assert [t["function"]["name"] for t in golden["tool_definitions"]] == [
        "places__search",
        "fixture__add",
    ]
    assistant, *tool_messages = golden["result_messages"]
    assert set(assistant) == {"role", "content", "tool_calls"}
    call_keys = {"id", "type", "function"}
    function_keys = {"name", "arguments"} | ({"index"} if adapter == "ollama" else set())
    for call in assistant["tool_calls"]:
        assert set(call) == call_keys and set(call["function"]) == function_keys
    expected = {"role", "tool_call_id", "content"} | (
        {"tool_name"} if adapter == "ollama" else set()
    )
    assert all(set(m) == expected for m in tool_messages)
    assert [c["name"] for c in golden["assembled_calls"]] == ["places.search", "fixture.add"]
