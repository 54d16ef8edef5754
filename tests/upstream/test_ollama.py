"""OllamaUpstream: Ollama's native /api/chat NDJSON stream, over MockTransport and over a
real loopback server.

The bodies come from ``fixtures/ollama`` (written from Ollama's documented wire format;
see the README there). Every stream is fed whole, byte by byte and at random splits, and
must give the same deltas; every fault must end in one ``UpstreamError`` with a stable
code and leave no connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.core.native_tools import (
    AssembledCall,
    ToolCallAssembler,
    assistant_tool_call_message,
    to_openai_tools,
    tool_result_message,
)
from toolforge.errors import ErrorCode, ModelBehaviorError, UpstreamError
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step
from toolforge.upstream.base import PROFILES, ChatRequest, ToolCallDelta, Upstream, UpstreamDelta
from toolforge.upstream.ollama import OllamaModelNotFound, OllamaUpstream
from toolforge.upstream.ollama_wire import ChatLineParser, NDJSONDecoder
from toolforge.upstream.openai_compat import _parse_chunk

FIXTURES = Path(__file__).parent / "fixtures" / "ollama"
STREAMS = ("chat_text.ndjson", "chat_tool_calls.ndjson", "chat_length.ndjson")
T = 0.2  # the first-byte and idle timeouts in these tests
CONNECT_S = 5.0  # no test here times a connect out: a loaded machine may take a while
NUM_CTX = 8192
BASE = "http://ollama.test:11434"
REQUEST = ChatRequest(model="qwen3:8b", messages=[{"role": "user", "content": "ramen?"}])
TEXT_USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 7,
    "total_tokens": 18,
    "total_duration_ns": 174560334,
    "load_duration_ns": 101397084,
    "prompt_eval_duration_ns": 13074791,
    "eval_duration_ns": 52479709,
}
TEXT_DELTAS = [
    *(UpstreamDelta(t) for t in ["Ramen", " near", " Shibuya", " (渋谷", ")", ": café", " 🍜"]),
    UpstreamDelta("", "stop", TEXT_USAGE),
]
TOOLS = to_openai_tools(
    [{"name": "places.search", "description": "Find places.", "input_schema": {"type": "object"}}]
)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def line(**chunk: Any) -> bytes:
    return orjson.dumps({"model": "qwen3:8b", "created_at": "2025-10-17T23:14:07Z", **chunk})


def token(text: str) -> bytes:
    return line(message={"role": "assistant", "content": text}, done=False) + b"\n"


def done(reason: str | None = "stop", **counts: Any) -> bytes:
    extra = {"done_reason": reason} if reason is not None else {}
    return line(message={"role": "assistant", "content": ""}, done=True, **extra, **counts) + b"\n"


def chunked(body: bytes, cuts: Iterable[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


def ndjson(chunks: Iterable[bytes], status: int = 200) -> httpx.Response:
    parts = list(chunks)

    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return httpx.Response(status, headers={"content-type": "application/x-ndjson"}, content=body())


class Recorder:
    """A MockTransport handler that answers with ``respond`` and keeps the bodies sent."""

    def __init__(self, respond: Callable[[], httpx.Response]) -> None:
        self.respond = respond
        self.bodies: list[Any] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        self.bodies.append(orjson.loads(request.content))
        return self.respond()


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def adapter(client: httpx.AsyncClient, base_url: str = BASE, **kw: Any) -> OllamaUpstream:
    return OllamaUpstream(
        client,
        base_url,
        **{"num_ctx": NUM_CTX, "connect_s": CONNECT_S, "first_byte_s": T, "idle_s": T, **kw},
    )


async def collect(
    upstream: Upstream, request: ChatRequest = REQUEST
) -> tuple[list[UpstreamDelta], UpstreamError | None]:
    out: list[UpstreamDelta] = []
    try:
        async for delta in upstream.stream(request):
            out.append(delta)
    except UpstreamError as exc:
        return out, exc
    return out, None


async def stream_chunks(
    chunks: Iterable[bytes], request: ChatRequest = REQUEST
) -> tuple[list[UpstreamDelta], UpstreamError | None]:
    parts = list(chunks)
    async with mock_client(lambda _: ndjson(parts)) as c:
        return await collect(adapter(c), request)


def parse_sans_io(chunks: Iterable[bytes]) -> list[UpstreamDelta]:
    decoder, lines = NDJSONDecoder(), ChatLineParser()
    out: list[UpstreamDelta] = []
    for chunk in chunks:
        out += [d for item in decoder.feed(chunk) if (d := lines.parse(item)) is not None]
    out += [d for item in decoder.close() if (d := lines.parse(item)) is not None]
    return out


# -- streaming text ------------------------------------------------------------------------


async def test_text_stream_one_delta_per_line_then_finish_and_usage() -> None:
    assert await stream_chunks([fixture("chat_text.ndjson")]) == (TEXT_DELTAS, None)


def _utf8_cuts(body: bytes) -> list[int]:
    """Offsets inside every multi-byte UTF-8 character of ``body``."""
    return [i for i, byte in enumerate(body) if 0x80 <= byte < 0xC0]


@pytest.mark.parametrize(
    "cuts",
    [
        pytest.param(lambda b: range(1, len(b)), id="byte-by-byte"),
        pytest.param(_utf8_cuts, id="inside-every-utf8-char"),
        pytest.param(lambda b: [b.index(b'"content"') + 3, b.index(b"done") + 2], id="in-a-line"),
        pytest.param(lambda b: [i + 1 for i, c in enumerate(b) if c == 0x0A], id="at-newlines"),
        pytest.param(lambda b: [i for i, c in enumerate(b) if c == 0x0A], id="before-newlines"),
    ],
)
async def test_any_chunking_gives_the_same_deltas(cuts: Callable[[bytes], Iterable[int]]) -> None:
    body = fixture("chat_text.ndjson")
    assert await stream_chunks(chunked(body, cuts(body))) == (TEXT_DELTAS, None)


@pytest.mark.parametrize("name", STREAMS)
@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_random_splits_parse_like_the_whole_body(name: str, data: st.DataObject) -> None:
    body = fixture(name)
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=40))
    assert parse_sans_io(chunked(body, cuts)) == parse_sans_io([body])


def test_decoder_holds_back_a_partial_line_and_drops_blank_lines() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a":') == []
    assert decoder.feed(b"1") == []
    assert decoder.feed(b'}\r\n\n  \n{"b"') == [b'{"a":1}\r']
    assert decoder.feed(b":2}") == []
    assert decoder.close() == [b'{"b":2}']  # a last line without "\n" is still a line
    assert decoder.close() == []


def test_decoder_refuses_an_endless_line() -> None:
    decoder = NDJSONDecoder(max_line_bytes=8)
    decoder.feed(b"12345")
    with pytest.raises(UpstreamError, match="longer than 8 bytes") as info:
        decoder.feed(b"6789")
    assert info.value.code is ErrorCode.UPSTREAM_PROTOCOL
    with pytest.raises(UpstreamError, match="longer than 8 bytes"):
        NDJSONDecoder(max_line_bytes=8).feed(b"123456789\n")


async def test_real_loopback_server_streams_ndjson_and_reuses_the_connection() -> None:
    text = fixture("chat_text.ndjson").decode()
    raw = text.encode()
    # one write per line, the 渋 of 渋谷 cut in two, and one line cut inside its JSON
    newlines = [i + 1 for i, byte in enumerate(raw[:-1]) if byte == 0x0A]
    cuts = [*newlines, raw.index("渋".encode()) + 1, raw.index(b"done") + 1]
    steps = [Step(raw=text, split=tuple(cuts))]
    routes = {"/api/chat": Script(steps=tuple(steps), end="eof")}
    async with ScriptedUpstream(routes=routes) as up:
        async with httpx.AsyncClient() as c:
            upstream = adapter(c, up.base_url, keep_alive="10m")  # base_url ends in /v1
            first = await collect(upstream, PROFILES["demo"].apply(REQUEST))
            second = await collect(upstream)
            assert up.connections_total == 1  # the body was read to its end both times
        async with asyncio.timeout(0.5):
            await up.wait_connections_closed()
    assert first == second == (TEXT_DELTAS, None)
    sent = up.all_requests[0]
    assert (sent.method, sent.path) == ("POST", "/api/chat")
    assert sent.json == {
        "model": "qwen3:8b",
        "messages": [{"role": "user", "content": "ramen?"}],
        "stream": True,
        "options": {"temperature": 0.2, "seed": 42, "num_predict": 384, "num_ctx": NUM_CTX},
        "keep_alive": "10m",
    }


# -- native tool calls ---------------------------------------------------------------------

SEARCH_RAMEN = '{"query":"ramen","near":"Shibuya"}'
SEARCH_SUSHI = '{"query":"sushi","near":"Shibuya","open_now":true}'
TOOL_USAGE = {
    "prompt_tokens": 214,
    "completion_tokens": 61,
    "total_tokens": 275,
    "total_duration_ns": 912244458,
    "load_duration_ns": 3753500,
    "prompt_eval_duration_ns": 328493000,
    "eval_duration_ns": 552222000,
}
EXPECTED_CALLS = [
    AssembledCall(0, "call_0", "places__search", SEARCH_RAMEN),
    AssembledCall(1, "call_1", "places__search", SEARCH_SUSHI),
]


def assemble(deltas: Iterable[UpstreamDelta]) -> list[AssembledCall]:
    assembler = ToolCallAssembler()
    for delta in deltas:
        assembler.feed(delta.tool_calls)
    return assembler.finish()


async def test_tool_calls_become_indexed_deltas_with_compact_json_arguments() -> None:
    request = ChatRequest(model="qwen3:8b", messages=REQUEST.messages, extra={"tools": TOOLS})
    deltas, error = await stream_chunks([fixture("chat_tool_calls.ndjson")], request)
    assert error is None
    assert deltas == [
        UpstreamDelta("", None, None, (ToolCallDelta(0, None, "places__search", SEARCH_RAMEN),)),
        UpstreamDelta("", None, None, (ToolCallDelta(1, None, "places__search", SEARCH_SUSHI),)),
        UpstreamDelta("", "tool_calls", TOOL_USAGE),
    ]
    assert assemble(deltas) == EXPECTED_CALLS


def test_tool_calls_assemble_as_the_same_calls_as_an_openai_stream() -> None:
    def openai_chunk(index: int, arguments: str) -> str:
        function = {"name": "places__search", "arguments": arguments}
        delta = {"role": "assistant", "tool_calls": [{"index": index, "function": function}]}
        return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})

    openai = [
        _parse_chunk(openai_chunk(0, SEARCH_RAMEN)),
        _parse_chunk(openai_chunk(1, SEARCH_SUSHI)),
    ]
    ollama = parse_sans_io([fixture("chat_tool_calls.ndjson")])
    assert assemble(d for d in openai if d is not None) == assemble(ollama) == EXPECTED_CALLS


def test_parallel_calls_in_one_line_with_ids_and_same_index_stay_apart() -> None:
    calls = [
        {"id": "call_a", "function": {"index": 0, "name": "places__search", "arguments": {}}},
        {"function": {"name": "places__search", "arguments": {"query": "ü"}}},  # no index
        {"function": {"name": "places__search"}},  # no arguments at all
    ]
    body = line(message={"role": "assistant", "content": "", "tool_calls": calls}, done=False)
    deltas = parse_sans_io([body + b"\n", done()])
    assert assemble(deltas) == [
        AssembledCall(0, "call_a", "places__search", "{}"),
        AssembledCall(1, "call_1", "places__search", '{"query":"ü"}'),
        AssembledCall(2, "call_2", "places__search", "{}"),
    ]
    assert deltas[-1].finish_reason == "tool_calls"


def test_tool_calls_on_the_done_line_itself() -> None:
    # Servers that do not stream tool calls send the whole message on the last line.
    calls = [{"function": {"name": "places__search", "arguments": {"query": "ramen"}}}]
    body = line(
        message={"role": "assistant", "content": "", "tool_calls": calls},
        done_reason="stop",
        done=True,
    )
    (delta,) = parse_sans_io([body])
    assert delta.finish_reason == "tool_calls"
    assert delta.tool_calls == (ToolCallDelta(0, None, "places__search", '{"query":"ramen"}'),)


def test_a_call_without_a_name_is_the_models_fault_not_the_upstreams() -> None:
    calls = [{"function": {"arguments": {"q": 1}}}]
    body = line(message={"role": "assistant", "content": "", "tool_calls": calls}, done=False)
    deltas = parse_sans_io([body + b"\n", done()])
    assembler = ToolCallAssembler()
    assembler.feed(deltas[0].tool_calls)
    with pytest.raises(ModelBehaviorError, match="no function name") as info:
        assembler.finish()
    assert info.value.code is ErrorCode.NATIVE_TOOL_CALL_MALFORMED


# -- finish and usage ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("stop", "stop"), ("length", "length"), ("load", "stop"), (None, "stop"), ("new", "new")],
)
def test_done_reason_maps_to_finish_reason(reason: str | None, finish: str) -> None:
    (delta,) = parse_sans_io([done(reason)])
    assert delta.finish_reason == finish


def test_length_fixture_and_counts_omitted_when_zero() -> None:
    deltas = parse_sans_io([fixture("chat_length.ndjson")])
    assert [d.text for d in deltas] == ["The", " sky", ""]
    assert deltas[-1].finish_reason == "length"
    assert deltas[-1].usage is not None and deltas[-1].usage["completion_tokens"] == 2
    (cached,) = parse_sans_io([done(eval_count=3)])  # prompt_eval_count left out
    assert cached.usage == {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3}


def test_lines_with_nothing_for_us_are_skipped() -> None:
    thinking = line(message={"role": "assistant", "content": "", "thinking": "hm"}, done=False)
    no_message = line(done=False)
    null_content = line(message={"role": "assistant", "content": None}, done=False)
    text = b"\n".join([thinking, no_message, null_content, token("ok").strip(), done().strip()])
    assert [d.text for d in parse_sans_io([text])] == ["ok", ""]


# -- the request body ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        REQUEST,
        PROFILES["demo"].apply(REQUEST),
        ChatRequest(model="m", messages=[], stop=("\n\n",), top_p=0.9, max_tokens=0),
        ChatRequest(model="m", messages=[], extra={"options": {"num_ctx": 99, "top_k": 20}}),
        ChatRequest(model="m", messages=[], extra={"tools": TOOLS, "tool_choice": "auto"}),
    ],
)
async def test_num_ctx_is_on_every_request(request_: ChatRequest) -> None:
    recorder = Recorder(lambda: ndjson([done()]))
    async with mock_client(recorder) as c:
        assert (await collect(adapter(c), request_))[1] is None
    (body,) = recorder.bodies
    assert recorder.paths == ["/api/chat"]
    assert body["options"]["num_ctx"] == NUM_CTX  # even when extra options say otherwise
    assert body["stream"] is True
    assert "keep_alive" not in body  # not given: the server's default


def test_body_maps_sampling_to_options_and_passes_tools_and_extra(
    client: httpx.AsyncClient,
) -> None:
    upstream = adapter(client, keep_alive=-1)
    request = ChatRequest(
        model="qwen3:8b",
        messages=(MappingProxyType({"role": "user", "content": "x"}),),
        temperature=0.0,
        seed=7,
        max_tokens=64,
        top_p=0.5,
        stop=("</s>",),
        extra={
            "tools": TOOLS,
            "tool_choice": "auto",
            "stream_options": {"include_usage": True},
            "options": {"top_k": 20},
            "think": False,
            "keep_alive": "1h",
        },
    )
    assert upstream.body(request) == {
        "model": "qwen3:8b",
        "messages": [MappingProxyType({"role": "user", "content": "x"})],
        "stream": True,
        "options": {
            "temperature": 0.0,
            "seed": 7,
            "num_predict": 64,
            "top_p": 0.5,
            "stop": ["</s>"],
            "top_k": 20,
            "num_ctx": NUM_CTX,
        },
        "keep_alive": "1h",  # extra is merged last, as for every adapter
        "tools": TOOLS,
        "think": False,
    }
    assert orjson.loads(orjson.dumps(upstream.body(request), default=dict))["messages"] == [
        {"role": "user", "content": "x"}
    ]


def test_continuation_messages_are_converted_to_ollamas_shape(client: httpx.AsyncClient) -> None:
    calls = [
        AssembledCall(0, "call_1_0", "places__search", '{"query": "ramen"}'),
        AssembledCall(1, "call_1_1", "bookings__create", "[1]"),
    ]
    user = {"role": "user", "content": "book ramen"}
    request = ChatRequest(
        model="m",
        messages=[
            user,
            assistant_tool_call_message(calls, content=None),
            tool_result_message("call_1_0", {"ok": True}),
            tool_result_message("call_1_1", "booked"),
            tool_result_message("call_unknown", "?"),
        ],
    )
    assert adapter(client).body(request)["messages"] == [
        user,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {
                        "index": 0,
                        "name": "places__search",
                        "arguments": {"query": "ramen"},
                    },
                    "id": "call_1_0",
                },
                {
                    "type": "function",
                    "function": {"index": 1, "name": "bookings__create", "arguments": {}},
                    "id": "call_1_1",
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1_0",
            "content": '{"ok":true}',
            "tool_name": "places__search",
        },
        {
            "role": "tool",
            "tool_call_id": "call_1_1",
            "content": "booked",
            "tool_name": "bookings__create",
        },
        {"role": "tool", "tool_call_id": "call_unknown", "content": "?"},
    ]


def test_constructor_checks_its_arguments(client: httpx.AsyncClient) -> None:
    with pytest.raises(ValueError, match="http"):
        OllamaUpstream(client, "ftp://x", num_ctx=1)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_ctx"):
            OllamaUpstream(client, BASE, num_ctx=bad)  # type: ignore[arg-type]
    upstream = OllamaUpstream(client, "http://h:11434/v1/", num_ctx=4096)
    assert repr(upstream) == "OllamaUpstream('http://h:11434/api/chat', num_ctx=4096)"
    assert upstream.num_ctx == 4096
    behind_a_proxy = OllamaUpstream(client, "https://gpu.example/ollama/", num_ctx=1)
    assert "'https://gpu.example/ollama/api/chat'" in repr(behind_a_proxy)


# -- faults --------------------------------------------------------------------------------

NOT_FOUND = fixture("error_model_not_found.json")


@pytest.mark.parametrize(
    ("chunks", "code", "message", "texts"),
    [
        pytest.param(
            [fixture("chat_error_midstream.ndjson")],
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "error mid-stream: 'an error was encountered while running the model'",
            [" Yes", "."],
            id="error-line",
        ),
        pytest.param(
            [token("a"), b"{not json\n"],
            ErrorCode.UPSTREAM_PROTOCOL,
            "not JSON (",
            ["a"],
            id="not-json",
        ),
        pytest.param(
            [token("a"), b'"\xff"\n'],
            ErrorCode.UPSTREAM_PROTOCOL,
            "not valid UTF-8",
            ["a"],
            id="invalid-utf8",
        ),
        pytest.param(
            [b'{"message": "hi", "done": false}\n'],
            ErrorCode.UPSTREAM_PROTOCOL,
            "unexpected shape",
            [],
            id="wrong-shape",
        ),
        pytest.param(
            [b'{"message": {"content": "x"}, "done": "yes"}\n'],
            ErrorCode.UPSTREAM_PROTOCOL,
            "unexpected shape",
            [],
            id="done-not-bool",
        ),
        pytest.param(
            [token("a"), token("b")],
            ErrorCode.UPSTREAM_PROTOCOL,
            'upstream closed the stream early (no line with "done": true)',
            ["a", "b"],
            id="no-done-line",
        ),
        pytest.param(
            [token("a")[:-9]],
            ErrorCode.UPSTREAM_PROTOCOL,
            "not JSON",
            [],
            id="truncated-last-line",
        ),
    ],
)
async def test_stream_faults(
    chunks: list[bytes], code: ErrorCode, message: str, texts: list[str]
) -> None:
    deltas, error = await stream_chunks(chunks)
    assert error is not None, deltas
    assert error.code is code
    assert message in error.message
    assert [d.text for d in deltas] == texts


async def test_model_not_found_is_a_404_that_says_what_to_do() -> None:
    async with mock_client(lambda _: httpx.Response(404, content=NOT_FOUND)) as c:
        deltas, error = await collect(adapter(c))
    assert deltas == []
    assert isinstance(error, OllamaModelNotFound)
    assert (error.code, error.retryable, error.model) == (
        ErrorCode.UPSTREAM_HTTP_ERROR,
        False,
        "qwen3:8b",
    )
    assert "`ollama pull qwen3:8b`" in error.message
    assert "model 'qwen3:8b' not found" in error.message


@pytest.mark.parametrize(
    ("status", "body", "retryable", "message"),
    [
        (404, b"404 page not found", False, "is this an Ollama server?"),
        (400, b'{"error":"qwen2:0.5b does not support tools"}', False, "use mode sentinel"),
        (500, b'{"error":"model requires more system memory"}', True, "HTTP 500"),
        (503, b"", True, "HTTP 503"),
        (429, b"{}", True, "HTTP 429"),
    ],
)
async def test_http_errors(status: int, body: bytes, retryable: bool, message: str) -> None:
    async with mock_client(lambda _: httpx.Response(status, content=body)) as c:
        _, error = await collect(adapter(c))
    assert error is not None and not isinstance(error, OllamaModelNotFound)
    assert (error.code, error.retryable) == (ErrorCode.UPSTREAM_HTTP_ERROR, retryable)
    assert message in error.message


async def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as sock:  # bind, note the port, close: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with httpx.AsyncClient() as c:
        deltas, error = await collect(adapter(c, f"http://127.0.0.1:{port}"))
    assert deltas == []
    assert error is not None
    assert error.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert f"127.0.0.1:{port}" in error.message


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (httpx.ConnectTimeout("timed out"), ErrorCode.UPSTREAM_TIMEOUT, "connect timeout"),
        (httpx.ConnectError("Name or service not known"), ErrorCode.UPSTREAM_UNAVAILABLE, "Name"),
        (httpx.ReadError("reset"), ErrorCode.UPSTREAM_UNAVAILABLE, "before responding"),
    ],
)
async def test_transport_errors_before_the_response(
    exc: Exception, code: ErrorCode, message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    async with mock_client(handler) as c:
        _, error = await collect(adapter(c))
    assert error is not None
    assert (error.code, message in error.message) == (code, True)
    assert error.__cause__ is exc


async def test_read_error_mid_stream_is_an_early_close() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield token("a")
        raise httpx.ReadError("connection reset by peer")

    async with mock_client(lambda _: httpx.Response(200, content=body())) as c:
        deltas, error = await collect(adapter(c))
    assert deltas == [UpstreamDelta("a")]
    assert error is not None
    assert error.code is ErrorCode.UPSTREAM_PROTOCOL
    assert "closed the stream early (ReadError: connection reset by peer)" in error.message


@contextlib.asynccontextmanager
async def served(script: Script) -> AsyncIterator[tuple[ScriptedUpstream, httpx.AsyncClient]]:
    """A loopback server answering /api/chat with ``script``; on exit every connection
    must have been closed."""
    async with ScriptedUpstream(routes={"/api/chat": script}) as up:
        async with httpx.AsyncClient() as c:
            yield up, c
        async with asyncio.timeout(0.5):
            await up.wait_connections_closed()


@pytest.mark.parametrize(
    ("script", "code", "message"),
    [
        (Script(end="hang_before_headers"), ErrorCode.UPSTREAM_TIMEOUT, "first-byte timeout"),
        (Script(end="hang_after_headers"), ErrorCode.UPSTREAM_TIMEOUT, "first-byte timeout"),
        (
            Script(steps=(Step(raw=token("a").decode()),), end="hang"),
            ErrorCode.UPSTREAM_TIMEOUT,
            "idle timeout",
        ),
        (
            Script(steps=(Step(raw=token("a").decode()),), end="rst", end_delay_ms=20),
            ErrorCode.UPSTREAM_PROTOCOL,
            "closed the stream early",
        ),
        (
            Script(steps=(Step(raw=token("a").decode()),), end="fin"),
            ErrorCode.UPSTREAM_PROTOCOL,
            "closed the stream early",
        ),
        (
            Script(end="status", status=404, body=NOT_FOUND.decode()),
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "`ollama pull qwen3:8b`",
        ),
    ],
    ids=["hang-before-headers", "hang-after-headers", "hang-mid-stream", "rst", "fin", "404"],
)
async def test_faults_over_a_real_socket(script: Script, code: ErrorCode, message: str) -> None:
    async with served(script) as (up, c):
        loop = asyncio.get_running_loop()
        start = loop.time()
        deltas, error = await collect(adapter(c, up.base_url))
        elapsed = loop.time() - start
    assert error is not None, deltas
    assert (error.code, message in error.message) == (code, True), error.message
    assert deltas in ([], [UpstreamDelta("a")])
    if code is ErrorCode.UPSTREAM_TIMEOUT:
        assert T <= elapsed < T + 0.15
    else:
        assert elapsed < T


async def test_idle_clock_does_not_run_while_the_consumer_is_busy() -> None:
    steps = (Step(raw=token("a").decode()), Step(raw=done().decode()))
    async with served(Script(steps=steps, end="eof")) as (up, c):
        out = []
        async for delta in adapter(c, up.base_url).stream(REQUEST):
            out.append(delta.text)
            await asyncio.sleep(T * 1.5)  # backpressure longer than idle_s
    assert out == ["a", ""]


# -- closing -------------------------------------------------------------------------------


async def test_aclose_mid_stream_closes_the_connection_within_50ms() -> None:
    steps = (Step(raw=token("a").decode()), Step(raw=token("b").decode(), delay_ms=5000))
    async with served(Script(steps=steps, end="eof")) as (up, c):
        stream = adapter(c, up.base_url, idle_s=10).stream(REQUEST)
        assert await anext(stream) == UpstreamDelta("a")
        assert up.open_connections == 1
        await stream.aclose()
        async with asyncio.timeout(0.05):
            await up.wait_connections_closed()


async def _wait_for_a_request(up: ScriptedUpstream) -> None:
    # The scripted upstream signals only /chat/completions requests; poll for ours.
    while not up.all_requests:  # noqa: ASYNC110
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("end", ["hang", "hang_before_headers"])
async def test_cancelling_the_consumer_closes_the_connection_within_50ms(end: Any) -> None:
    steps = (Step(raw=token("a").decode()),) if end == "hang" else ()
    async with served(Script(steps=steps, end=end)) as (up, c):
        upstream = adapter(c, up.base_url, first_byte_s=10, idle_s=10)
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in upstream.stream(REQUEST):
                first.set()

        task = asyncio.create_task(consume())
        async with asyncio.timeout(1):
            await (first.wait() if end == "hang" else _wait_for_a_request(up))
        assert up.open_connections == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(0.05):
            await up.wait_connections_closed()


# -- any line parses or raises ours --------------------------------------------------------

KEYS = st.sampled_from(
    "message content role done done_reason error tool_calls function name arguments id"
    " index prompt_eval_count eval_count total_duration thinking".split()
)
JSON = json_values(
    max_leaves=14,
    floats=st.floats(allow_nan=False),
    keys=KEYS | st.text(max_size=3),
    max_list_size=3,
    max_dict_size=5,
)


@given(value=JSON)
@settings(max_examples=500, deadline=None)
def test_any_json_line_parses_or_raises_ours(value: Any) -> None:
    try:
        delta = ChatLineParser().parse(json.dumps(value).encode())  # stdlib: ints past 64 bits too
    except UpstreamError as exc:
        assert exc.code in (ErrorCode.UPSTREAM_PROTOCOL, ErrorCode.UPSTREAM_HTTP_ERROR)
    else:
        assert delta is None or isinstance(delta.text, str)
        for piece in delta.tool_calls if delta is not None else ():
            assert isinstance(piece.arguments, str)
            assert isinstance(piece.index, int)
