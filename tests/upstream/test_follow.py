"""``ChatStream.follow``: the deltas of a generation handed over inside the socket's read
callback, and iteration going on where the callback stopped, with the same deltas, errors
and order as iterating alone."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.openai_compat import ChatStream, OpenAICompatUpstream
from toolforge.upstream.transport import LeanTransport, UpstreamClient

REQUEST = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
TOKENS = [f"t{i} " for i in range(8)]


class Taker:
    """A consumer that takes ``limit`` deltas, then declines the next one (taking it)."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self.taken: list[UpstreamDelta] = []
        self.settled = 0
        self.in_task: list[bool] = []

    def deliver(self, delta: UpstreamDelta) -> bool:
        self.in_task.append(asyncio.current_task() is not None)
        self.taken.append(delta)
        return len(self.taken) < self.limit

    def settle(self) -> None:
        self.settled += 1


@pytest.fixture
async def lean() -> AsyncIterator[UpstreamClient]:
    async with UpstreamClient(transport=LeanTransport()) as client:
        yield client


def event(text: str) -> str:
    body = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return "data: " + orjson.dumps(body).decode() + "\n\n"


async def _start(client: httpx.AsyncClient, url: str, idle_s: float = 5.0) -> ChatStream:
    upstream = OpenAICompatUpstream(client, url, idle_s=idle_s)
    stream = upstream.stream(REQUEST)
    assert (await anext(stream)).text == TOKENS[0]  # the request is out, the body begun
    return stream


async def test_each_delta_goes_to_the_consumer_in_the_read_callback(
    lean: UpstreamClient,
) -> None:
    async with ScriptedUpstream([Script.from_tokens(TOKENS, delay_ms=10)]) as up:
        stream = await _start(lean, up.base_url)
        taker = Taker()
        iterated = 0  # deltas iteration read (a read that came before follow() did)
        while True:  # as the session reads: follow, and iterate when it returns
            await stream.follow(taker)
            delta = await anext(stream, None)
            if delta is None:
                break
            taker.taken.append(delta)
            iterated += 1
        assert [d.text for d in taker.taken] == [*TOKENS[1:], ""]  # in order, each once
        assert taker.taken[-1].finish_reason == "stop"
        delivered = len(taker.in_task)
        assert delivered >= len(TOKENS) - 2  # paced: the tokens came on their own
        assert not any(taker.in_task)  # every one inside the read callback
        assert taker.settled >= delivered - 1  # once per read


async def test_a_declined_delta_leaves_the_rest_of_its_read_to_iteration(
    lean: UpstreamClient,
) -> None:
    # The first token, then five events in one write: the consumer takes two and declines
    # the third; the other three, and the end, come from iteration, in order.
    burst = "".join(event(t) for t in ["a", "b", "c", "d", "e"])
    script = Script(steps=(Step(text=TOKENS[0]), Step(raw=burst, delay_ms=20)))
    async with ScriptedUpstream([script]) as up:
        stream = await _start(lean, up.base_url)
        taker = Taker(limit=3)
        await stream.follow(taker)
        assert [d.text for d in taker.taken] == ["a", "b", "c"]
        assert [d.text async for d in stream] == ["d", "e"]
        await stream.follow(taker)  # over: returns at once
        assert len(taker.taken) == 3


async def test_an_error_in_a_read_comes_after_the_deltas_before_it(
    lean: UpstreamClient,
) -> None:
    burst = event("a") + "data: {not json\n\n" + event("never")
    script = Script(steps=(Step(text=TOKENS[0]), Step(raw=burst, delay_ms=20)))
    async with ScriptedUpstream([script]) as up:
        stream = await _start(lean, up.base_url)
        taker = Taker()
        await stream.follow(taker)
        assert [d.text for d in taker.taken] == ["a"]
        with pytest.raises(UpstreamError) as caught:
            await anext(stream)
        assert caught.value.code is ErrorCode.UPSTREAM_PROTOCOL
        assert "non-JSON" in caught.value.message
        with pytest.raises(StopAsyncIteration):  # the error ends the generation
            await anext(stream)


async def test_a_decoder_error_in_the_callback_goes_to_the_task(lean: UpstreamClient) -> None:
    # Invalid UTF-8 is the SSE decoder's own error: raised out of the read callback, the
    # loop would report it and close the connection, and the task would read a reset.
    reported: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    script = Script(steps=(Step(text=TOKENS[0]), Step(raw="data: \udcff\n\n", delay_ms=20)))
    try:
        async with ScriptedUpstream([script]) as up:
            stream = await _start(lean, up.base_url)
            await stream.follow(Taker())
            with pytest.raises(UpstreamError) as caught:
                await anext(stream)
    finally:
        loop.set_exception_handler(None)
    assert caught.value.code is ErrorCode.UPSTREAM_PROTOCOL
    assert caught.value.message == "upstream sent invalid UTF-8 (invalid start byte)"
    assert reported == []


async def test_the_idle_timeout_holds_while_following(lean: UpstreamClient) -> None:
    script = Script(steps=(Step(text=TOKENS[0]), Step(text="b", delay_ms=5)), end="hang")
    async with ScriptedUpstream([script]) as up:
        stream = await _start(lean, up.base_url, idle_s=0.3)
        taker = Taker()
        started = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamError) as caught:
            await stream.follow(taker)
        waited = asyncio.get_running_loop().time() - started
        assert caught.value.code is ErrorCode.UPSTREAM_TIMEOUT
        assert "idle" in caught.value.message
        assert [d.text for d in taker.taken] == ["b"]
        assert 0.3 <= waited < 2.0  # the deadline moved on with "b", then passed
        await stream.aclose()
        async with asyncio.timeout(1):
            await up.wait_connections_closed()


async def test_after_finish_reason_a_stall_costs_one_idle_timeout(lean: UpstreamClient) -> None:
    # The model finished and the server never sends [DONE]: nothing is lost, the stream
    # ends after one idle timeout (the task's read), not one in follow() and another.
    steps = (Step(text=TOKENS[0]), Step(text="b", delay_ms=5), Step(finish="stop", delay_ms=5))
    async with ScriptedUpstream([Script(steps=steps, end="hang")]) as up:
        stream = await _start(lean, up.base_url, idle_s=0.3)
        taker = Taker()
        loop = asyncio.get_running_loop()
        started = loop.time()
        rest = []
        while True:
            await stream.follow(taker)
            delta = await anext(stream, None)
            if delta is None:
                break
            rest.append(delta)
        waited = loop.time() - started
        assert [d.text for d in taker.taken + rest] == ["b", ""]
        assert (taker.taken + rest)[-1].finish_reason == "stop"
        assert 0.3 <= waited < 0.55


async def test_a_cancel_while_following_detaches_and_the_close_is_prompt(
    lean: UpstreamClient,
) -> None:
    script = Script.from_tokens(TOKENS * 100, delay_ms=5)
    async with ScriptedUpstream([script]) as up:
        stream = await _start(lean, up.base_url)
        taker = Taker()
        task = asyncio.create_task(stream.follow(taker))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()
        async with asyncio.timeout(0.05):
            await up.wait_connections_closed()
        taken = len(taker.taken)
        assert taken > 0
        await asyncio.sleep(0.05)
        assert len(taker.taken) == taken  # nothing delivered after the cancel


async def test_without_the_lean_transport_follow_returns_at_once() -> None:
    async with ScriptedUpstream([Script.from_tokens(TOKENS, delay_ms=5)]) as up:
        async with httpx.AsyncClient() as client:
            stream = await _start(client, up.base_url)
            taker = Taker()
            await stream.follow(taker)
            assert taker.taken == []
            assert [d.text async for d in stream] == [*TOKENS[1:], ""]


async def test_an_open_stream_does_not_keep_its_request_body(lean: UpstreamClient) -> None:
    # The body is sent once; kept for the stream's life it was a few KB per open stream
    # (a long conversation: far more).
    request = ChatRequest(model="tiny", messages=[{"role": "user", "content": "x" * 300_000}])
    async with ScriptedUpstream([Script.from_tokens(TOKENS, delay_ms=20)]) as up:
        upstream = OpenAICompatUpstream(lean, up.base_url)
        tracemalloc.start()
        try:
            stream = upstream.stream(request)
            assert (await anext(stream)).text == TOKENS[0]
            held = [  # the body's bytes are made in exchange.request_body
                stat.size
                for stat in tracemalloc.take_snapshot().statistics("lineno")
                if stat.size >= 300_000 and stat.traceback[0].filename.endswith("exchange.py")
            ]
        finally:
            tracemalloc.stop()
        await stream.aclose()
    assert held == []
