"""The workflow's compiled turn on each backend, over HTTP: what the gateway sends.

- a vLLM-style OpenAI-compatible server (native mode): only the legal tools, their
  parameters narrowed to what the run holds, ``tool_choice`` naming the one to call;
- Ollama (native mode, its /api/chat wire): the same tools, and the call's JSON Schema as
  ``format`` (Ollama has no ``tool_choice``); the call comes back as that JSON and runs;
- the plan's artifact names the constraint each stream used.
"""

from __future__ import annotations

from typing import Any

import orjson

from tests.api.conftest import HarnessFactory, assert_well_formed, frames, sentinel_reply
from tests.api.test_native import vllm_style_call
from tests.api.test_servers_route import ollama_routes
from toolforge.eval.scripted_upstream import Script, Step

BOOK = "book_a_table"
ASK = "Find pizza near me; book a table for 2 at 7pm."


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


async def test_a_vllm_style_server_gets_the_legal_tools_and_a_named_tool_choice(
    make_gateway: HarnessFactory,
) -> None:
    search = '{"query": "pizza"}'
    gw = await make_gateway(
        [vllm_style_call("call_1", search), Script.from_tokens([sentinel_reply()])]
    )
    events = await gw.stream({"input": ASK, "mode": "native", "workflow": BOOK})
    assert_well_formed(events)
    first, second = (r.json for r in gw.upstream.requests[:2])
    # Turn 1: the search is the only legal step; its query is the user's words, and the
    # optional arguments nobody gave (radius, open_at, limit) are not offered.
    assert _names(first["tools"]) == ["places__search"]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "places__search"}}
    params = first["tools"][0]["function"]["parameters"]
    assert set(params["properties"]) == {"query"}
    assert "pizza" in params["properties"]["query"]["pattern"]
    # Turn 2: the search is done; the booking's place_id is an id the search returned,
    # its time and party size what the user said.
    assert _names(second["tools"]) == ["bookings__create"]
    assert second["tool_choice"]["function"]["name"] == "bookings__create"
    booking = second["tools"][0]["function"]["parameters"]["properties"]
    (result,) = [e.data for e in frames(events) if e.event == "tool.result"]
    ids = [p["id"] for p in result["result"]["places"]]
    assert booking["place_id"] == {"enum": ids}
    assert booking["time"] == {"enum": ["19:00"]} and booking["party_size"] == {"enum": [2]}
    assert "contact" not in booking and "guest_name" not in booking  # never invented


def _ollama_line(content: str = "", *, done: bool = False) -> str:
    line: dict[str, Any] = {
        "model": "qwen3:8b",
        "created_at": "2026-11-27T00:00:00Z",
        "message": {"role": "assistant", "content": content},
        "done": done,
    }
    if done:
        line |= {"done_reason": "stop", "prompt_eval_count": 10, "eval_count": 5}
    return orjson.dumps(line).decode() + "\n"


async def test_ollama_gets_the_call_as_its_format_and_the_json_call_runs(
    make_gateway: HarnessFactory,
) -> None:
    routes = ollama_routes()
    call = orjson.dumps({"name": "places.search", "arguments": {"query": "pizza"}}).decode()
    routes["/api/chat"] = Script(
        steps=(Step(raw=_ollama_line(call) + _ollama_line(done=True)),), end="eof"
    )
    gw = await make_gateway(routes=routes, upstream_kind="ollama", model_id="qwen3:8b")
    events = await gw.stream({"input": ASK, "mode": "native", "workflow": BOOK})
    assert events[-1].event == "done"
    chats = [r.json for r in gw.upstream.all_requests if r.path == "/api/chat"]
    first = chats[0]
    assert "tool_choice" not in first  # Ollama has none
    assert _names(first["tools"]) == ["places__search"]
    (branch,) = first["format"]["anyOf"]
    assert branch["properties"]["name"] == {"const": "places__search"}
    assert set(branch["properties"]["arguments"]["properties"]) == {"query"}
    # The JSON call came back as text and ran as the workflow's call.
    calls = [e.data for e in frames(events) if e.event == "tool.call"]
    assert calls and calls[0]["name"] == "places.search"
    assert calls[0]["args"] == {"query": "pizza"}


async def test_the_plan_says_which_constraint_a_stream_used(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    events = await gw.stream({"input": "pizza?", "mode": "sentinel"})
    await gw.settle()
    run = gw.artifacts / "runs" / frames(events)[0].data["stream_id"]
    assert orjson.loads((run / "prompt.json").read_bytes())["constraint"] == "validation"
    native = await gw.stream({"input": ASK, "mode": "native", "workflow": BOOK})
    await gw.settle()
    run = gw.artifacts / "runs" / frames(native)[0].data["stream_id"]
    assert orjson.loads((run / "prompt.json").read_bytes())["constraint"] == "tool_choice"
