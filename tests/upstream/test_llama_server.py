"""The llama-server adapter on responses recorded from the real server (fixtures/llama_server,
see its README), through httpx.MockTransport; tests/integration runs it against the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.llama_server import LlamaServerUpstream

FIXTURES = Path(__file__).parent / "fixtures" / "llama_server"
REQUEST = ChatRequest(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "hi"}])


def recorded(
    name: str, status: int = 200, sent: list[httpx.Request] | None = None
) -> httpx.MockTransport:
    body = (FIXTURES / name).read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        if sent is not None:
            sent.append(request)
        if request.url.path == "/props":
            return httpx.Response(200, content=(FIXTURES / "props.json").read_bytes())
        kind = "text/event-stream" if status == 200 else "application/json"
        return httpx.Response(status, content=body, headers={"content-type": kind})

    return httpx.MockTransport(handler)


async def collect(
    upstream: LlamaServerUpstream, request: ChatRequest = REQUEST
) -> list[UpstreamDelta]:
    return [delta async for delta in upstream.stream(request)]


async def test_the_body_adds_cache_prompt_and_keeps_the_request_extra() -> None:
    sent: list[httpx.Request] = []
    async with httpx.AsyncClient(transport=recorded("chat_text.sse", sent=sent)) as client:
        upstream = LlamaServerUpstream(client, "http://llama:8080/", slot=1)
        grammar = 'root ::= "a"'
        await collect(upstream, ChatRequest(**{**_fields(REQUEST), "extra": {"grammar": grammar}}))
    body = orjson.loads(sent[0].content)
    assert str(sent[0].url) == "http://llama:8080/v1/chat/completions"
    assert body["cache_prompt"] is True and body["id_slot"] == 1 and body["grammar"] == grammar
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_the_request_can_turn_the_cache_off() -> None:
    async with httpx.AsyncClient(transport=recorded("chat_text.sse")) as client:
        upstream = LlamaServerUpstream(client, "http://llama:8080", cache_prompt=False)
        assert upstream.body(REQUEST)["cache_prompt"] is False
        override = ChatRequest(**{**_fields(REQUEST), "extra": {"cache_prompt": True}})
        assert upstream.body(override)["cache_prompt"] is True


async def test_recorded_stream_text_usage_and_timings() -> None:
    async with httpx.AsyncClient(transport=recorded("chat_text.sse")) as client:
        deltas = await collect(LlamaServerUpstream(client, "http://llama:8080"))
    text = "".join(d.text for d in deltas)
    assert text and "\ufffd" not in text
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]
    (usage,) = [d.usage for d in deltas if d.usage]
    assert usage["completion_tokens"] == 12
    assert usage["timings"]["cache_n"] == 0 and usage["timings"]["predicted_n"] == 12


async def test_a_repeated_prompt_reports_the_cache_hit() -> None:
    async with httpx.AsyncClient(transport=recorded("chat_text_cached.sse")) as client:
        deltas = await collect(LlamaServerUpstream(client, "http://llama:8080"))
    (usage,) = [d.usage for d in deltas if d.usage]
    assert usage["timings"]["cache_n"] == 35  # the prompt's tokens came from the cache


async def test_a_grammar_constrained_answer() -> None:
    async with httpx.AsyncClient(transport=recorded("chat_grammar.sse")) as client:
        deltas = await collect(LlamaServerUpstream(client, "http://llama:8080"))
    assert "".join(d.text for d in deltas) == "red"


async def test_a_grammar_the_server_rejects_is_a_typed_error() -> None:
    body = (FIXTURES / "bad_grammar.txt").read_text().split("\nHTTP")[0]
    transport = httpx.MockTransport(
        lambda request: httpx.Response(
            400, content=body.encode(), headers={"content-type": "application/json"}
        )
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(UpstreamError) as caught:
            await collect(LlamaServerUpstream(client, "http://llama:8080"))
    assert caught.value.code is ErrorCode.UPSTREAM_HTTP_ERROR and caught.value.retryable is False
    assert "failed to parse grammar" in caught.value.message


async def test_props_reads_the_slot_context_and_template_caps() -> None:
    async with httpx.AsyncClient(transport=recorded("chat_text.sse")) as client:
        props = await LlamaServerUpstream(client, "http://llama:8080").props()
    assert props["default_generation_settings"]["n_ctx"] == 4096 and props["total_slots"] == 2
    assert props["chat_template_caps"]["supports_tool_calls"] is False


async def test_props_of_a_server_that_is_not_there() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(UpstreamError) as caught:
            await LlamaServerUpstream(client, "http://127.0.0.1:9", connect_s=1).props()
    assert caught.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert "is it running" in caught.value.message


def _fields(request: ChatRequest) -> dict[str, object]:
    return {"model": request.model, "messages": request.messages}


async def test_a_dropped_kept_alive_connection_is_tried_once_more() -> None:
    attempts: list[int] = []
    body = (FIXTURES / "chat_text.sse").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        deltas = await collect(LlamaServerUpstream(client, "http://llama:8080"))
    assert len(attempts) == 2 and "".join(d.text for d in deltas)


async def test_a_server_that_stays_away_is_not_retried_forever() -> None:
    attempts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        raise httpx.ConnectError("refused")

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(UpstreamError) as caught:
            await collect(LlamaServerUpstream(client, "http://llama:8080"))
    assert caught.value.code is ErrorCode.UPSTREAM_UNAVAILABLE and len(attempts) == 2


@pytest.mark.parametrize(("drops", "counted"), [(0, True), (1, True), (2, False)])
async def test_tokenize_is_sent_again_once_when_a_kept_alive_connection_was_dropped(
    drops: int, counted: bool
) -> None:
    """llama-server closing a reused connection unanswered costs one retry, not the
    stream's exact count; twice in a row is the server's failure."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) <= drops:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, json={"tokens": [1, 2, 3]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        upstream = LlamaServerUpstream(client, "http://llama:8080")
        if counted:
            assert await upstream.tokenize("abc") == 3
        else:
            with pytest.raises(UpstreamError) as failed:
                await upstream.tokenize("abc")
            assert failed.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert len(sent) == min(drops + 1, 2)
