"""Schemas as an attacker writes them, over real HTTP on loopback: references to a slow
server, catastrophic patterns; and the everyday patterns a gateway must take.

The gateway never fetches anything a schema names (a typed refusal, and the slow server
sees no connection), and no pattern stalls it: ``/healthz`` answers throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from tests.api.conftest import (
    SDK,
    Harness,
    HarnessFactory,
    assert_well_formed,
    sentinel_reply,
)
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script


class SlowServer:
    """A TCP server that accepts and never answers, counting who came."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(Exception):
            await asyncio.sleep(60)
        writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SlowServer]:
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


@contextlib.asynccontextmanager
async def healthz_watch(gw: Harness) -> AsyncIterator[list[float]]:
    """Polls ``/healthz`` for as long as the block runs; yields each answer's seconds."""
    times: list[float] = []
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            response = await gw.client.get(f"{gw.url}/healthz")
            assert response.status_code == 200
            times.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(poll())
    try:
        yield times
    finally:
        stop.set()
        await task


def _tool(parameters: dict[str, Any], name: str = "lookup") -> dict[str, Any]:
    return {"name": name, "description": "Looks it up.", "parameters": parameters}


def _remote_schemas(url: str) -> dict[str, dict[str, Any]]:
    return {
        "$ref": {"type": "object", "properties": {"a": {"$ref": url}}},
        "$dynamicRef": {"type": "object", "properties": {"a": {"$dynamicRef": url}}},
        "nested $id": {
            "type": "object",
            "properties": {"a": {"$id": url, "$ref": "#/$defs/x"}},
            "$defs": {"x": {"type": "string"}},
        },
        "unused $defs": {"type": "object", "$defs": {"x": {"$ref": url + "#/deep"}}},
        "relative to a remote root": {
            "$id": url,
            "type": "object",
            "properties": {"a": {"$ref": "other.json"}},
        },
    }


@pytest.mark.parametrize("where", ["client_tools", "object_schemas", "proxy tools", "proxy format"])
async def test_a_remote_reference_is_refused_and_never_fetched(
    make_gateway: HarnessFactory, where: str
) -> None:
    gw = await make_gateway([])
    async with SlowServer().running() as slow, healthz_watch(gw) as times:
        url = f"http://127.0.0.1:{slow.port}/schema.json"
        for label, schema in _remote_schemas(url).items():
            if where.startswith("proxy"):
                body: dict[str, Any] = {
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                }
                if where == "proxy tools":
                    body["tools"] = [{"type": "function", "function": _tool(schema)}]
                else:
                    body["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "out", "schema": schema},
                    }
                response = await gw.client.post(f"{gw.url}/v1/chat/completions", json=body)
                assert response.status_code == 400, (label, response.text)
                assert response.json()["error"]["code"] == "INVALID_SCHEMA", label
            else:
                body = {"input": "hi", "tools": []}
                if where == "client_tools":
                    body["client_tools"] = [_tool(schema)]
                else:
                    body["object_schemas"] = [{"name": "Out", "schema": schema}]
                response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
                assert response.status_code == 422, (label, response.text)
                assert response.json()["error"]["code"] == "INVALID_SCHEMA", label
            message = response.json()["error"]["message"]
            assert "is not local" in message or "another document" in message, message
        await asyncio.sleep(0.05)
    assert slow.connections == 0  # nothing was fetched, ever
    assert times and max(times) < 0.1
    assert gw.upstream.requests == []  # refused before any model call


def _calling(args: dict[str, Any], name: str = "lookup") -> Script:
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", name, orjson.dumps(args).decode())
    return Script.from_tokens(["Looking. ", call])


async def _stream(gw: Harness, body: dict[str, Any]) -> list[Event]:
    response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
    assert response.status_code == 200, response.text
    events = []
    for block in response.text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            events.append(
                Event(fields.get("id", ""), fields["event"], orjson.loads(fields["data"]))
            )
    return events


@pytest.mark.parametrize(
    "pattern",
    ["^(a+)+$", "^(a|a)+(?=b)$", "^(a|aa)+\\1$"],
    ids=["nested quantifier", "with a lookahead", "with a back-reference"],
)
async def test_a_catastrophic_pattern_never_stalls_the_gateway(
    make_gateway: HarnessFactory, pattern: str
) -> None:
    """The model writes 40 ``a``s and a ``!`` against a pattern that backtracks
    exponentially in Python's ``re``: the call is refused with the pattern named, goes
    back to the model, and ``/healthz`` answers throughout."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": pattern}},
        "required": ["s"],
    }
    evil = {"s": "a" * 40 + "!"}
    gw = await make_gateway([_calling(evil), Script.from_tokens([sentinel_reply("Done.")])])
    body = {"input": "go", "tools": [], "client_tools": [_tool(schema)]}
    async with healthz_watch(gw) as times:
        events = await _stream(gw, body)
    assert_well_formed(events)
    assert max(times) < 0.1
    assert "tool.call" not in [e.event for e in events]  # never reached the client
    retry = orjson.loads(gw.upstream.requests[1].body)["messages"]
    told = " ".join(str(m.get("content")) for m in retry)
    assert "does not match" in told


# Everyday patterns, each refused before ("cannot construct any value"), now accepted.
EVERYDAY = {
    "order number": ("^[0-9]{5}$", "12345"),
    "time": ("^[0-2][0-9]:[0-5][0-9]$", "19:30"),
    "sku": ("^[A-Z]-[0-9]+$", "B-42"),
    "unanchored": ("[a-z]+", "ABCd"),
}


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
@pytest.mark.parametrize("case", list(EVERYDAY), ids=list(EVERYDAY))
async def test_everyday_patterns_are_accepted_and_enforced_on_stream(
    make_gateway: HarnessFactory, case: str, required: bool
) -> None:
    pattern, good = EVERYDAY[case]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"v": {"type": "string", "pattern": pattern}},
    }
    if required:
        schema["required"] = ["v"]
    gw = await make_gateway(
        [_calling({"v": good}), Script.from_tokens([sentinel_reply()])],
        client_tool_timeout_ms=100,  # nobody answers the call: the stream goes on without it
    )
    body = {"input": "go", "tools": [], "client_tools": [_tool(schema)]}
    response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
    assert response.status_code == 200, response.text
    assert '"args":{"v":"' + good + '"}' in response.text  # valid: reached the client


@pytest.mark.parametrize("case", list(EVERYDAY), ids=list(EVERYDAY))
async def test_everyday_patterns_are_accepted_by_the_proxy(
    make_gateway: HarnessFactory, case: str
) -> None:
    pattern, _good = EVERYDAY[case]
    gw = await make_gateway([Script.from_tokens(["Hello."])] * 4)  # a text answer, nudged
    schema = {
        "type": "object",
        "properties": {
            "v": {"type": "string", "pattern": pattern},
            "when": {"type": "string", "format": "date-time"},
        },
        "required": ["v", "when"],
    }
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": _tool(schema)}],
    }
    response = await gw.client.post(f"{gw.url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def _heavy_schema(k: int) -> dict[str, Any]:
    """About 62 KB, just under the limit: ~200 ms to check and build a fallback for."""
    props = {
        f"p{i}_{k}": {"type": "string", "pattern": f"^[a-z]{{{i % 40 + 1}}}-[0-9]+$"}
        for i in range(780)
    }
    return {"type": "object", "properties": props, "required": list(props)}


async def test_heavy_schemas_are_checked_off_the_event_loop(make_gateway: HarnessFactory) -> None:
    """Four requests, each with a new schema at the size limit: the loop keeps serving."""
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])] * 4)

    async def send(k: int) -> int:
        body = {
            "input": "x",
            "tools": [],
            "object_schemas": [{"name": "Big", "schema": _heavy_schema(k)}],
        }
        response = await gw.client.post(f"{gw.url}/v1/stream", json=body)
        return response.status_code

    async with healthz_watch(gw) as times:
        statuses = await asyncio.gather(*(send(k) for k in range(4)))
    assert statuses == [200] * 4
    # Checked on the loop, the four would hold it ~0.8 s in one piece. In the worker, the
    # loop shares the GIL with it (a switch every 5 ms): answers slow down, never stop.
    assert len(times) > 5 and max(times) < 0.4, times
    assert statistics.median(times) < 0.1, times


async def test_the_plan_says_what_the_grammar_left_to_validation(
    make_gateway: HarnessFactory,
) -> None:
    """A lookahead is no grammar's: the pattern is accepted, enforced after decoding, and
    the plan (prompt.json) names it; a pattern the grammar holds is not listed."""
    schema = {
        "type": "object",
        "properties": {
            "password": {"type": "string", "pattern": "^(?=.*[0-9]).{8,}$"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "v6": {"type": "string", "format": "ipv6"},
        },
        "required": ["password", "zip", "v6"],
    }
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], upstream_kind="llama_server")
    body = {"input": "x", "mode": "constrained", "tools": [], "client_tools": [_tool(schema)]}
    events = await gw.stream(body)
    assert_well_formed(events)
    await gw.settle()
    run = gw.artifacts / "runs" / events[0].data["stream_id"]
    prompt = orjson.loads((run / "prompt.json").read_bytes())
    assert prompt["validated_after_decoding"] == {
        "lookup": [
            "$.properties.password: pattern '^(?=.*[0-9]).{8,}$'",
            "$.properties.v6: format 'ipv6'",
        ]
    }
    grammar = orjson.loads(gw.upstream.requests[0].body)["grammar"]
    assert "[0-9]{5}" in grammar or "[0-9] [0-9] [0-9] [0-9] [0-9]" in grammar


async def test_the_openai_sdk_sends_a_pattern_tool_and_gets_a_typed_refusal(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    """The official client, as an agent loop calls the proxy: a tool whose argument has a
    pattern and a format goes through; one whose schema points at another document is a
    ``BadRequestError`` with the gateway's code, before any model call."""
    gw = await make_gateway([Script.from_tokens(["Hello."])] * 4)
    client = sdk(gw)
    order = {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^[0-9]{5}$"},
            "placed_on": {"type": "string", "format": "date"},
        },
        "required": ["order_id"],
    }
    messages: Any = [{"role": "user", "content": "Where is order 48213?"}]
    tools: Any = [{"type": "function", "function": _tool(order, name="get_order")}]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=tools)
    assert answer.choices[0].message.content
    remote: Any = [
        {"type": "function", "function": _tool({"$ref": "https://example.com/order.json"})}
    ]
    asked = len(gw.upstream.requests)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=messages, tools=remote)
    assert info.value.code == "INVALID_SCHEMA"
    assert "is not local" in info.value.message
    assert len(gw.upstream.requests) == asked
