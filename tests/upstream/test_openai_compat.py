"""OpenAICompatUpstream against the real scripted upstream over loopback, plus MockTransport.

Every usual upstream fault (RST, FIN, truncated chunked body, hangs before
and after headers and mid-stream, bad data, HTTP errors, refused connections) must end in
one ``UpstreamError`` with a stable code and leave no connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import json_values
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.scripted_upstream import End, Script, ScriptedUpstream, ScriptLike, Step
from toolforge.upstream.base import PROFILES, ChatRequest, Upstream, UpstreamDelta
from toolforge.upstream.openai_compat import OpenAICompatUpstream, _parse_chunk

T = 0.2  # the first-byte and idle timeouts in these tests
CONNECT_S = 5.0  # no test here times a connect out: a loaded machine may take a while
REQUEST = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def chunk_event(text: str) -> str:
    """An OpenAI chunk event as text, for raw steps."""
    body = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return "data: " + orjson.dumps(body).decode() + "\n\n"


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as c:
        yield c


def adapter(client: httpx.AsyncClient, base_url: str, **kw: Any) -> OpenAICompatUpstream:
    return OpenAICompatUpstream(
        client, base_url, **{"connect_s": CONNECT_S, "first_byte_s": T, "idle_s": T, **kw}
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


@contextlib.asynccontextmanager
async def served(*scripts: ScriptLike) -> AsyncIterator[tuple[ScriptedUpstream, httpx.AsyncClient]]:
    """A scripted upstream and a client; on exit, the client is closed and the server must
    have seen every connection closed."""
    async with ScriptedUpstream(scripts) as up:
        async with httpx.AsyncClient() as c:
            yield up, c
        async with asyncio.timeout(0.5):
            await up.wait_connections_closed()


# -- happy path ----------------------------------------------------------------------------


async def test_happy_path_preserves_chunks_and_reports_finish_and_usage() -> None:
    tokens = ["Hel", "lo", " ⟦BEGIN_OBJECT", " id=1", "😀", ""]
    async with served(Script.from_tokens(tokens, usage=USAGE)) as (up, c):
        request = PROFILES["demo"].apply(REQUEST)
        deltas, error = await collect(adapter(c, up.base_url, api_key="sk-test"), request)
    assert error is None
    # one delta per upstream chunk: no merging, no splitting, empty content skipped
    assert deltas == [UpstreamDelta(t) for t in tokens if t] + [UpstreamDelta("", "stop", USAGE)]
    (sent,) = up.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.json == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "seed": 42,
        "max_tokens": 384,
    }


async def test_usage_only_chunk_after_finish() -> None:
    script = Script(steps=(Step(text="a"), Step(finish="length"), Step(usage=USAGE)))
    async with served(script) as (up, c):
        deltas, error = await collect(adapter(c, up.base_url))
    assert error is None
    assert deltas == [
        UpstreamDelta("a"),
        UpstreamDelta("", "length"),
        UpstreamDelta("", None, USAGE),
    ]


async def test_utf8_and_crlf_split_across_http_chunks() -> None:
    event = chunk_event("é⟦").replace("\n\n", "\r\n\r\n")
    raw = event.encode()
    cut_in_char = raw.index("é".encode()) + 1  # between the two bytes of é
    cut_cr_lf = len(raw) - 3  # "...\r" | "\n\r\n"
    script = {"steps": [{"raw": event, "split": [cut_in_char, cut_cr_lf]}], "end": "done"}
    async with served(script) as (up, c):
        deltas, error = await collect(adapter(c, up.base_url))
    assert error is None
    assert deltas == [UpstreamDelta("é⟦")]


async def test_malformed_but_valid_sse_is_accepted() -> None:
    raw = (
        "\ufeff: a comment\r"
        "event: message\rid: 3\rretry: 10\rx-unknown: 1\r"
        'data:{"choices":[{"index":0,\rdata: "delta":{"content":"ok"}}]}\r\r'
        "data: \n\n"  # empty data: skipped
        'data: {"choices":[{"index":1,"delta":{"content":"other choice"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    )
    async with served([{"raw": raw}, {"finish": "stop"}]) as (up, c):
        deltas, error = await collect(adapter(c, up.base_url))
    assert error is None
    assert deltas == [UpstreamDelta("ok"), UpstreamDelta("", "stop")]


async def test_done_ends_the_stream_and_the_connection_is_reused() -> None:
    after_done = {
        "steps": [{"text": "a"}, {"raw": "data: [DONE]\n\n"}, {"raw": chunk_event("late")}],
        "end": "eof",
    }
    async with served(after_done, Script.from_tokens(["b"])) as (up, c):
        first = await collect(adapter(c, up.base_url))
        second = await collect(adapter(c, up.base_url))
        assert up.connections_total == 1  # the body was drained, so the pool kept it
    assert first == ([UpstreamDelta("a")], None)
    assert second == ([UpstreamDelta("b"), UpstreamDelta("", "stop")], None)


async def test_finish_reason_then_close_without_done_is_a_normal_end() -> None:
    for end in ("fin", "rst", "eof", "hang"):  # "hang": ends normally after idle_s
        script = Script(steps=(Step(text="a"), Step(finish="stop")), end=end, end_delay_ms=10)
        async with served(script) as (up, c):
            assert await collect(adapter(c, up.base_url)) == (
                [UpstreamDelta("a"), UpstreamDelta("", "stop")],
                None,
            )


async def test_idle_clock_does_not_run_while_the_consumer_is_busy() -> None:
    async with served(Script.from_tokens(["a", "b"])) as (up, c):
        out = []
        async for delta in adapter(c, up.base_url).stream(REQUEST):
            out.append(delta.text)
            await asyncio.sleep(T * 1.5)  # backpressure longer than idle_s
    assert out == ["a", "b", ""]


async def test_slow_but_steady_upstream_is_not_idle() -> None:
    # each gap is under idle_s, the whole stream is far over it: the deadline moves on
    script = Script.from_tokens(["a", "b", "c", "d"], delay_ms=T * 1000 * 0.6)
    async with served(script) as (up, c):
        deltas, error = await collect(adapter(c, up.base_url))
    assert error is None
    assert "".join(d.text for d in deltas) == "abcd"


async def test_idle_deadline_shorter_than_first_byte_deadline_applies() -> None:
    async with served(Script(steps=(Step(text="a"),), end="hang")) as (up, c):
        loop = asyncio.get_running_loop()
        start = loop.time()
        _, error = await collect(adapter(c, up.base_url, first_byte_s=5, idle_s=0.1))
        assert error is not None
        assert "idle timeout" in error.message
        assert loop.time() - start < 0.3


# -- faults --------------------------------------------------------------------------------

EARLY = "upstream closed the stream early"


@pytest.mark.parametrize(
    ("script", "code", "message"),
    [
        pytest.param(
            # the delay lets the client read "a" before the RST discards its buffers
            Script(steps=(Step(text="a"),), end="rst", end_delay_ms=20),
            ErrorCode.UPSTREAM_PROTOCOL,
            EARLY,
            id="rst",
        ),
        pytest.param(
            Script(steps=(Step(text="a"),), end="fin"),
            ErrorCode.UPSTREAM_PROTOCOL,
            EARLY,
            id="fin-truncated-chunked-body",
        ),
        pytest.param(
            Script(steps=(Step(text="a"),), end="fin", chunked=False),
            ErrorCode.UPSTREAM_PROTOCOL,
            EARLY,
            id="fin-close-delimited-body",
        ),
        pytest.param(
            Script(steps=(Step(text="a"),), end="eof"),
            ErrorCode.UPSTREAM_PROTOCOL,
            EARLY,
            id="clean-http-end-without-done",
        ),
        pytest.param(
            Script(steps=(Step(text="a"),), end="hang"),
            ErrorCode.UPSTREAM_TIMEOUT,
            "idle timeout",
            id="hang-mid-stream",
        ),
        pytest.param(
            Script(end="hang_before_headers"),
            ErrorCode.UPSTREAM_TIMEOUT,
            "first-byte timeout",
            id="hang-before-headers",
        ),
        pytest.param(
            Script(end="hang_after_headers"),
            ErrorCode.UPSTREAM_TIMEOUT,
            "first-byte timeout",
            id="hang-after-headers",
        ),
        pytest.param(
            Script(steps=(Step(text="a"), Step(raw="data: {not json\n\n"))),
            ErrorCode.UPSTREAM_PROTOCOL,
            "non-JSON data: '{not json'",
            id="non-json-data",
        ),
        pytest.param(
            Script(steps=(Step(text="a"), Step(raw="data: \udcff\n\n"))),
            ErrorCode.UPSTREAM_PROTOCOL,
            "invalid UTF-8",
            id="invalid-utf8",
        ),
        pytest.param(
            Script(steps=(Step(raw='data: {"choices": "nope"}\n\n'),)),
            ErrorCode.UPSTREAM_PROTOCOL,
            "unexpected shape",
            id="wrong-schema",
        ),
        pytest.param(
            Script(steps=(Step(raw='data: {"error": {"message": "CUDA out of memory"}}\n\n'),)),
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "CUDA out of memory",
            id="error-object-in-stream",
        ),
        pytest.param(
            Script(end="status", status=500, body='{"error": {"message": "model crashed"}}'),
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "HTTP 500: 'model crashed'",
            id="http-500",
        ),
        pytest.param(
            Script(end="status", status=401, body="Invalid API Key"),
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "HTTP 401: 'Invalid API Key'",
            id="http-401",
        ),
        pytest.param(
            Script(
                end="status",
                status=400,
                body='{"error": {"code": 400, "message": "the request exceeds the available '
                'context size, try increasing it", "type": "exceed_context_size_error", '
                '"n_prompt_tokens": 5000, "n_ctx": 4096}}',
            ),
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            "the prompt is 5000 tokens, the model's context 4096",
            id="llama-server-over-context",
        ),
        pytest.param(
            Script(
                end="status",
                status=400,
                body='{"error": {"message": "This model\'s maximum context length is 8192 '
                'tokens. However, your messages resulted in 9000 tokens.", "type": '
                '"invalid_request_error", "code": "context_length_exceeded"}}',
            ),
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            "maximum context length is 8192 tokens",
            id="openai-over-context",
        ),
        pytest.param(
            Script(
                end="status",
                status=400,
                body='{"error": {"message": "maximum context length is 2048 tokens, '
                'but you asked for 2100", "type": "BadRequestError"}}',
            ),
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            "maximum context length is 2048 tokens",
            id="vllm-over-context",
        ),
        pytest.param(
            Script(end="status", status=400, body='{"error": {"message": "bad temperature"}}'),
            ErrorCode.UPSTREAM_HTTP_ERROR,
            "HTTP 400: 'bad temperature'",
            id="http-400",
        ),
        pytest.param(
            Script(end="status", status=200, body='{"choices": []}'),
            ErrorCode.UPSTREAM_PROTOCOL,
            "upstream answered application/json, not text/event-stream",
            id="not-sse",
        ),
    ],
)
async def test_faults(script: Script, code: ErrorCode, message: str) -> None:
    async with served(script) as (up, c):
        loop = asyncio.get_running_loop()
        start = loop.time()
        deltas, error = await collect(adapter(c, up.base_url))
        elapsed = loop.time() - start
    assert error is not None, deltas
    assert error.code is code
    assert message in error.message
    if code is ErrorCode.CONTEXT_LENGTH_EXCEEDED:
        assert not error.retryable  # the same prompt is refused again
    assert deltas in ([], [UpstreamDelta("a")])
    if code is ErrorCode.UPSTREAM_TIMEOUT:
        assert T <= elapsed < T + 0.15
    else:
        assert elapsed < T  # faults that need no timeout are reported at once


async def test_http_error_retryable_only_for_server_side_statuses() -> None:
    statuses = (500, 503, 429, 401, 403, 400)
    scripts = [Script(end="status", status=s, body="{}") for s in statuses]
    async with served(*scripts) as (up, c):
        errors = [(await collect(adapter(c, up.base_url)))[1] for _ in statuses]
    assert [e.retryable if e else None for e in errors] == [True, True, True, False, False, False]


async def test_connection_refused_is_unavailable(client: httpx.AsyncClient) -> None:
    with socket.socket() as sock:  # bind, note the port, close: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    deltas, error = await collect(adapter(client, f"http://127.0.0.1:{port}/v1"))
    assert deltas == []
    assert error is not None
    assert error.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert f"127.0.0.1:{port}" in error.message


# -- cancellation --------------------------------------------------------------------------


async def _consume(upstream: OpenAICompatUpstream, first: asyncio.Event) -> None:
    async for _ in upstream.stream(REQUEST):
        first.set()


@pytest.mark.parametrize("end", ["hang", "hang_before_headers", "hang_after_headers"])
async def test_cancelling_the_consumer_closes_the_upstream_connection_within_50ms(
    end: End,
) -> None:
    steps = (Step(text="a"),) if end == "hang" else ()
    async with served(Script(steps=steps, end=end)) as (up, c):
        upstream = adapter(c, up.base_url, first_byte_s=10, idle_s=10)
        first = asyncio.Event()
        task = asyncio.create_task(_consume(upstream, first))
        if end == "hang":
            await first.wait()
        else:
            async with asyncio.timeout(1):
                await up.wait_for_requests()
        assert up.open_connections == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(0.05):
            await up.wait_connections_closed()


async def test_closing_the_generator_closes_the_upstream_connection_within_50ms() -> None:
    script = Script(steps=(Step(text="a"), Step(text="b", delay_ms=5000)))
    async with served(script) as (up, c):
        stream = adapter(c, up.base_url, idle_s=10).stream(REQUEST)
        assert await anext(stream) == UpstreamDelta("a")
        await stream.aclose()
        async with asyncio.timeout(0.05):
            await up.wait_connections_closed()


# -- scripted upstream ---------------------------------------------------------------------


async def test_script_for_selects_by_request_and_no_script_is_a_500() -> None:
    def script_for(body: Any) -> ScriptLike:
        return [{"text": body["model"]}, {"finish": "stop"}]

    async with ScriptedUpstream(script_for=script_for) as up, httpx.AsyncClient() as c:
        request = ChatRequest(model="picked", messages=[])
        assert (await collect(adapter(c, up.base_url), request))[0][0].text == "picked"
    async with served() as (up, c):
        _, error = await collect(adapter(c, up.base_url))
        assert error is not None
        assert "no script left" in error.message


async def test_the_upstream_records_when_each_step_went_out() -> None:
    script = [{"text": "a"}, {"text": "b", "delay_ms": 30}, {"text": "c", "delay_ms": 30}]
    async with served([*script, {"finish": "stop"}]) as (up, c):
        started = time.perf_counter_ns()
        deltas, error = await collect(adapter(c, up.base_url))
        finished = time.perf_counter_ns()
    assert error is None and [d.text for d in deltas][:3] == ["a", "b", "c"]
    written = up.requests[0].written_ns
    assert len(written) == 4  # three text steps and the finish chunk
    assert started < written[0] and written[-1] < finished
    assert all(b - a >= 25_000_000 for a, b in itertools.pairwise(written[:3]))  # the delays


async def test_pace_false_ignores_delays() -> None:
    script = Script.from_tokens(["a", "b"], delay_ms=10_000)
    async with ScriptedUpstream([script], pace=False) as up, httpx.AsyncClient() as c:
        async with asyncio.timeout(1):
            deltas, error = await collect(adapter(c, up.base_url))
    assert (len(deltas), error) == (3, None)


def test_script_round_trips_through_json() -> None:
    script = Script(
        steps=(
            Step(text="a", delay_ms=3, split=(1,)),
            Step(raw="x"),
            Step(finish="stop", usage=USAGE),
        ),
        end="rst",
        end_delay_ms=4,
    )
    assert Script.from_json(orjson.loads(orjson.dumps(script.to_json()))) == script
    with pytest.raises(ValueError, match="unknown end"):
        Script.from_json({"end": "explode"})
    with pytest.raises(ValueError, match="exactly one"):
        Step(text="a", raw="b")


# -- pure unit cases with MockTransport ----------------------------------------------------


UNAVAILABLE = ErrorCode.UPSTREAM_UNAVAILABLE


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (httpx.ConnectError("[Errno -2] Name or service not known"), UNAVAILABLE, "Name or"),
        (httpx.ConnectTimeout("timed out"), ErrorCode.UPSTREAM_TIMEOUT, "connect timeout"),
        (httpx.PoolTimeout("timed out"), ErrorCode.UPSTREAM_TIMEOUT, "pool timeout"),
        (httpx.RemoteProtocolError("Server disconnected"), UNAVAILABLE, "before responding"),
    ],
)
async def test_transport_errors_before_the_response(
    exc: Exception, code: ErrorCode, message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    async with mock_client(handler) as c:
        _, error = await collect(adapter(c, "http://upstream.test/v1"))
    assert error is not None
    assert (error.code, message in error.message) == (code, True)
    assert error.__cause__ is exc


async def test_read_error_mid_stream_is_an_early_close() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield chunk_event("a").encode()
        raise httpx.ReadError("connection reset by peer")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async with mock_client(handler) as c:
        deltas, error = await collect(adapter(c, "http://upstream.test/v1"))
    assert deltas == [UpstreamDelta("a")]
    assert error is not None
    assert error.code is ErrorCode.UPSTREAM_PROTOCOL
    assert error.message == f"{EARLY} (ReadError: connection reset by peer)"


@pytest.mark.parametrize(("retry_unanswered", "attempts"), [(False, 1), (True, 2)])
async def test_a_request_dropped_unanswered_is_sent_again_only_when_asked(
    retry_unanswered: bool, attempts: int
) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    async with mock_client(handler) as c:
        upstream = adapter(c, "http://upstream.test/v1", retry_unanswered=retry_unanswered)
        _, error = await collect(upstream)
    assert error is not None and error.code is UNAVAILABLE
    assert len(sent) == attempts and sent[-1].content == sent[0].content


@pytest.mark.parametrize("status", [500, 503])
async def test_an_answer_is_never_sent_again_even_an_error(status: int) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(status, json={"error": {"message": "busy"}})

    async with mock_client(handler) as c:
        _, error = await collect(adapter(c, "http://upstream.test/v1", retry_unanswered=True))
    assert error is not None and error.code is ErrorCode.UPSTREAM_HTTP_ERROR and len(sent) == 1


async def test_a_stream_broken_after_its_first_token_is_not_sent_again() -> None:
    sent: list[httpx.Request] = []

    async def body() -> AsyncIterator[bytes]:
        yield chunk_event("a").encode()
        raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async with mock_client(handler) as c:
        deltas, error = await collect(adapter(c, "http://upstream.test/v1", retry_unanswered=True))
    assert deltas == [UpstreamDelta("a")] and len(sent) == 1
    assert error is not None and error.code is ErrorCode.UPSTREAM_PROTOCOL


async def test_body_sends_extra_last_and_serialises_read_only_mappings() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n"
        )

    from types import MappingProxyType

    request = ChatRequest(
        model="m",
        messages=(MappingProxyType({"role": "user", "content": "x"}),),
        stop=("\n\n",),
        top_p=0.9,
        extra={"stream_options": None, "grammar": "root ::= x", "cache_prompt": True},
    )
    async with mock_client(handler) as c:
        assert await collect(adapter(c, "http://upstream.test/v1/"), request) == ([], None)
    assert seen == [
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": None,
            "top_p": 0.9,
            "stop": ["\n\n"],
            "grammar": "root ::= x",
            "cache_prompt": True,
        }
    ]


def test_base_url_must_be_http(client: httpx.AsyncClient) -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAICompatUpstream(client, "ftp://x/v1")
    assert "sk-" not in repr(OpenAICompatUpstream(client, "http://h/v1", api_key="sk-secret"))


KEYS = st.sampled_from(
    "choices delta content finish_reason index usage error message x_groq"
    " tool_calls function id name arguments".split()
)
JSON = json_values(
    max_leaves=12,
    floats=st.floats(allow_nan=False),
    keys=KEYS | st.text(max_size=3),
    max_list_size=3,
    max_dict_size=4,
)


@given(value=JSON)
@settings(max_examples=500, deadline=None)
def test_any_json_chunk_parses_or_raises_ours(value: Any) -> None:
    try:
        delta = _parse_chunk(json.dumps(value))  # stdlib: also ints beyond 64 bits
    except UpstreamError as exc:
        assert exc.code in (ErrorCode.UPSTREAM_PROTOCOL, ErrorCode.UPSTREAM_HTTP_ERROR)
    else:
        assert delta is None or isinstance(delta.text, str)
        for piece in delta.tool_calls if delta is not None else ():
            assert isinstance(piece.arguments, str)
