"""The Anthropic Messages adapter: the conversion, the stream, the errors, and a whole
/v1/stream with a tool call against an Anthropic-shaped server on loopback.

The wire fixtures (fixtures/anthropic/) are written from Anthropic's documented format:
see their README.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import EventSource

from toolforge.api.app import create_app
from toolforge.core.messages import MessageType, message
from toolforge.core.native_tools import ToolCallAssembler
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.loopback import Event, frames, serve
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step
from toolforge.settings import Settings
from toolforge.upstream.anthropic import (
    UNANSWERED,
    AnthropicStreamParser,
    AnthropicUpstream,
    anthropic_body,
    to_anthropic,
)
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.sse_decoder import UpstreamSSEDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# -- the conversion ---------------------------------------------------------------------------


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_system_messages_become_the_system_parameter() -> None:
    system, messages = to_anthropic(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Hi"},
        ]
    )
    assert system == "Be brief.\n\nUse tools."
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


def test_tool_calls_and_results_become_tool_use_and_tool_result_blocks() -> None:
    envelope_ok = orjson.dumps({"ok": True, "data": {"temp": 20}}).decode()
    envelope_err = orjson.dumps({"ok": False, "errors": [{"code": "X"}]}).decode()
    _, messages = to_anthropic(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    _call("c1", "get_weather", '{"city":"Paris"}'),
                    _call("c2", "get_weather", "not json"),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": envelope_ok},
            {"role": "tool", "tool_call_id": "c2", "content": envelope_err},
        ]
    )
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "c2", "name": "get_weather", "input": {}},
        ],
    }
    # both results in ONE user message (alternation), the failed one marked as an error
    assert messages[2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": envelope_ok},
            {"type": "tool_result", "tool_use_id": "c2", "content": envelope_err, "is_error": True},
        ],
    }
    assert len(messages) == 3


def test_an_unpaired_call_gets_a_synthetic_error_result() -> None:
    _, messages = to_anthropic(
        [
            {"role": "user", "content": "Book it."},
            {"role": "assistant", "content": "", "tool_calls": [_call("c1", "book", "{}")]},
            {"role": "user", "content": "You must search first."},  # a nudge, no result
        ]
    )
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": UNANSWERED, "is_error": True},
        {"type": "text", "text": "You must search first."},
    ]
    # a call that ends the history is answered too
    _, ending = to_anthropic(
        [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": None, "tool_calls": [_call("c9", "f", "{}")]},
        ]
    )
    assert ending[-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c9", "content": UNANSWERED, "is_error": True}
        ],
    }


def test_roles_strictly_alternate_and_start_with_the_user() -> None:
    _, messages = to_anthropic(
        [
            {"role": "assistant", "content": "Earlier answer."},
            {"role": "assistant", "content": "More."},
            {"role": "user", "content": "One"},
            {"role": "user", "content": ""},  # empty text: the API rejects it
            {"role": "user", "content": "Two"},
            {"role": "tool", "tool_call_id": "stray", "content": "orphan"},
        ]
    )
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Earlier answer."},
        {"type": "text", "text": "More."},
    ]
    # a result that answers no call becomes text; no empty blocks anywhere
    assert messages[2]["content"] == [
        {"type": "text", "text": "One"},
        {"type": "text", "text": "Two"},
        {"type": "text", "text": "Tool result: orphan"},
    ]


def test_the_body_maps_sampling_and_tools_and_drops_what_anthropic_lacks() -> None:
    request = ChatRequest(
        model="claude-sonnet-4-5",
        messages=[
            message("system", "S", MessageType.SYSTEM_PROMPT),
            message("user", "Hi", MessageType.USER_INPUT, step=None),
            message("user", "Call it.", MessageType.RETRY_NUDGE, step=4),
        ],
        temperature=1.7,
        seed=42,
        top_p=0.9,
        stop=["END"],
        extra={
            "grammar": "root ::= x",
            "cache_prompt": True,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "places__search",
                        "description": "Search.",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    },
                }
            ],
            "tool_choice": "required",
        },
    )
    body = anthropic_body(request, default_max_tokens=321)
    assert body["max_tokens"] == 321 and body["stream"] is True
    assert body["system"] == "S"
    assert body["temperature"] == 1.0 and body["top_p"] == 0.9
    assert body["stop_sequences"] == ["END"]
    assert body["tools"] == [
        {
            "name": "places__search",
            "description": "Search.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    assert body["tool_choice"] == {"type": "any"}
    for absent in ("seed", "grammar", "cache_prompt"):
        assert absent not in body
    wire = orjson.dumps(body).decode()
    for word in ("meta", "step", "retry_nudge", "user_input"):
        assert word not in wire
    assert body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "Call it."}],
        }
    ]


# -- the stream ---------------------------------------------------------------------------------


def _parse(raw: bytes) -> list[UpstreamDelta]:
    decoder, parser = UpstreamSSEDecoder(), AnthropicStreamParser()
    out: list[UpstreamDelta] = []
    # one byte at a time: an event split anywhere is still one event
    for i in range(len(raw)):
        for event in decoder.feed(raw[i : i + 1]):
            delta = parser.feed(event.event, event.data)
            if delta is not None:
                out.append(delta)
    assert parser.done
    return out


def test_a_text_stream_becomes_text_then_the_finish_and_usage() -> None:
    deltas = _parse(_fixture("text.sse"))
    assert "".join(d.text for d in deltas) == "Hello! How can I help?"
    assert deltas[-1].finish_reason == "stop"
    assert deltas[-1].usage == {"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40}


def test_a_tool_use_stream_assembles_into_one_call() -> None:
    deltas = _parse(_fixture("tool_use.sse"))
    assert "".join(d.text for d in deltas) == "Okay, let's check the weather for San Francisco, CA:"
    assembler = ToolCallAssembler()
    for delta in deltas:
        assembler.feed(delta.tool_calls)
    (call,) = assembler.finish()
    assert call.id == "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
    assert call.name == "get_weather"
    assert orjson.loads(call.arguments_text) == {
        "location": "San Francisco, CA",
        "unit": "fahrenheit",
    }
    assert deltas[-1].finish_reason == "tool_calls"


def test_an_error_event_is_a_retryable_upstream_error() -> None:
    with pytest.raises(UpstreamError) as caught:
        _parse(_fixture("overloaded.sse"))
    assert caught.value.code is ErrorCode.UPSTREAM_HTTP_ERROR
    assert "overloaded_error" in caught.value.message
    assert caught.value.retryable


def test_a_malformed_event_is_a_protocol_error() -> None:
    parser = AnthropicStreamParser()
    with pytest.raises(UpstreamError) as caught:
        parser.feed(
            "content_block_delta",
            '{"type":"content_block_delta","index":3,'
            '"delta":{"type":"input_json_delta","partial_json":"{"}}',
        )
    assert caught.value.code is ErrorCode.UPSTREAM_PROTOCOL
    with pytest.raises(UpstreamError):
        parser.feed("message_start", "{not json")


# -- the adapter over HTTP (MockTransport) -----------------------------------------------------


@contextlib.asynccontextmanager
async def _adapter(
    status: int, body: bytes, content_type: str = "text/event-stream"
) -> AsyncIterator[tuple[AnthropicUpstream, list[httpx.Request]]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        yield AnthropicUpstream(client, "https://api.example.test/v1", api_key="sk-ant-test"), seen


async def _collect(upstream: AnthropicUpstream) -> list[UpstreamDelta]:
    request = ChatRequest(model="claude-x", messages=[{"role": "user", "content": "Hi"}])
    return [d async for d in upstream.stream(request)]


async def test_the_adapter_sends_its_headers_and_streams_the_fixture() -> None:
    async with _adapter(200, _fixture("tool_use.sse")) as (upstream, seen):
        deltas = await _collect(upstream)
    (request,) = seen
    assert str(request.url) == "https://api.example.test/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert orjson.loads(request.content)["max_tokens"] == 4096
    assert deltas[-1].finish_reason == "tool_calls"
    assert "sk-ant-test" not in repr(upstream)


@pytest.mark.parametrize(
    ("status", "fixture", "kind", "retryable"),
    [
        (400, "error_400.json", "invalid_request_error", False),
        (529, "error_529.json", "overloaded_error", True),
    ],
)
async def test_http_errors_carry_anthropics_type_and_message(
    status: int, fixture: str, kind: str, retryable: bool
) -> None:
    async with _adapter(status, _fixture(fixture), "application/json") as (upstream, _):
        with pytest.raises(UpstreamError) as caught:
            await _collect(upstream)
    assert caught.value.code is ErrorCode.UPSTREAM_HTTP_ERROR
    assert kind in caught.value.message and f"HTTP {status}" in caught.value.message
    assert caught.value.retryable is retryable


async def test_a_stream_that_ends_without_message_stop_is_a_protocol_error() -> None:
    cut = _fixture("text.sse").split(b"event: message_stop")[0]
    async with _adapter(200, cut) as (upstream, _):
        with pytest.raises(UpstreamError) as caught:
            await _collect(upstream)
    assert caught.value.code is ErrorCode.UPSTREAM_PROTOCOL


# -- a whole /v1/stream against an Anthropic-shaped server on loopback ---------------------------


def _sse(*events: dict[str, Any]) -> Script:
    steps = [Step(raw=f"event: {e['type']}\ndata: {orjson.dumps(e).decode()}\n\n") for e in events]
    return Script(steps=tuple(steps), end="eof")


def _anthropic_script(request: Any) -> Script:
    """The first turn calls places.search; once a tool_result came back, it answers."""
    answered = any(
        block.get("type") == "tool_result"
        for item in request["messages"]
        if isinstance(item["content"], list)
        for block in item["content"]
    )
    start = {
        "type": "message_start",
        "message": {"id": "msg_1", "usage": {"input_tokens": 50, "output_tokens": 1}},
    }
    if not answered:
        return _sse(
            start,
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Searching."},
            },
            {"type": "content_block_stop", "index": 0},
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {
                    "type": "tool_use",
                    "id": "toolu_A",
                    "name": "places__search",
                    "input": {},
                },
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"query": "piz'},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": 'za"}'},
            },
            {"type": "content_block_stop", "index": 1},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 20},
            },
            {"type": "message_stop"},
        )
    return _sse(
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Two pizza places are open."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 7},
        },
        {"type": "message_stop"},
    )


async def test_a_whole_stream_with_a_tool_call_over_anthropic(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(
            ScriptedUpstream(
                script_for=_anthropic_script,
                routes={"/v1/models": Script(end="status", status=200, body='{"data": []}')},
            )
        )
        settings = Settings(
            upstream_kind="anthropic",
            upstream_base_url=upstream.base_url,
            upstream_api_key="sk-ant-loopback",
            model_id="claude-sonnet-4-5",
            artifacts_dir=tmp_path,
            log_level="WARNING",
            upstream_first_byte_timeout_s=2.0,
            upstream_idle_timeout_s=2.0,
        )
        url = await stack.enter_async_context(serve(create_app(settings)))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        ready = await client.get(f"{url}/readyz")
        assert ready.status_code == 200
        (probe,) = [r for r in upstream.all_requests if r.path == "/v1/models"]
        assert probe.headers["x-api-key"] == "sk-ant-loopback"
        assert "authorization" not in probe.headers
        events: list[Event] = []
        async with client.stream(
            "POST", f"{url}/v1/stream", json={"input": "Pizza near me?", "tools": ["places.search"]}
        ) as response:
            assert response.status_code == 200

            async for sse in EventSource(response).aiter_sse():
                events.append(Event(sse.id, sse.event, orjson.loads(sse.data)))
    numbered = frames(events)
    kinds = [e.event for e in numbered]
    assert numbered[0].data["mode"] == "native"
    assert "tool.call" in kinds and "tool.result" in kinds
    call = next(e.data for e in numbered if e.event == "tool.call")
    assert call["name"] == "places.search" and call["args"] == {"query": "pizza"}
    result = next(e.data for e in numbered if e.event == "tool.result")
    assert result["ok"] is True
    text = "".join(e.data["chunk"] for e in numbered if e.event == "text.delta")
    assert "Two pizza places are open." in text
    assert numbered[-1].event == "done" and numbered[-1].data["reason"] == "stop"
    assert numbered[-1].data["usage"]["prompt_tokens"] == 100

    posts = [r for r in upstream.all_requests if r.path == "/v1/messages"]
    assert len(posts) == 2
    for post in posts:
        assert post.headers["x-api-key"] == "sk-ant-loopback"
        assert post.headers["anthropic-version"] == "2023-06-01"
    second = posts[1].json
    assert "system" in second and second["tools"][0]["name"] == "places__search"
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert second["messages"][1]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_A",
        "name": "places__search",
        "input": {"query": "pizza"},
    }
    answer = second["messages"][2]["content"][0]
    assert answer["type"] == "tool_result" and answer["tool_use_id"] == "toolu_A"
    assert orjson.loads(answer["content"])["ok"] is True
    raw = posts[1].body.decode()
    assert '"meta"' not in raw and '"step"' not in raw
