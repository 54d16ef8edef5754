"""The llama-server adapter's prefill of a grammar's forced text: what it sends (the prefix
as the assistant's reply begun, the grammar of the middle) and what it yields (the same text
as the whole grammar's turn, whether the server echoes the prefill or not, the suffix only
after a ``stop``), through httpx.MockTransport; bench/demo.py runs it on the real server."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import orjson
import pytest

from tests.core.gbnf_matcher import parse
from toolforge.core.protocol import sentinels
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.llama_server import LlamaServerUpstream

L, R = sentinels.OPEN, sentinels.CLOSE
GRAMMAR = (
    'root ::= ( call-1 )\nws ::= ( " " | "\\n" [ \\t]{0,8} )?\n'
    'args ::= "{" ws "\\"query\\"" ws ":" ws "\\"pizza\\"" ws "}"\n'
    'call-1 ::= "\\u27E6BEGIN_TOOL_CALL id=t1 name=places.search\\u27E7" args '
    '"\\u27E6END_TOOL_CALL id=t1\\u27E7"\n'
)
PREFIX = f"{L}BEGIN_TOOL_CALL id=t1 name=places.search{R}{{"
SUFFIX = f"{L}END_TOOL_CALL id=t1{R}"
CALL = f'{PREFIX}"query": "pizza"}}{SUFFIX}'
USER = {"role": "user", "content": "pizza?"}
REQUEST = ChatRequest(model="m", messages=[USER], extra={"grammar": GRAMMAR})


def sse(pieces: Sequence[str], finish: str = "stop") -> bytes:
    """A llama-server stream of ``pieces``, then ``finish`` and a usage chunk."""
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    timings = {"prompt_n": 1, "cache_n": 1204, "predicted_n": len(pieces)}
    chunks.append({"choices": [], "usage": {"completion_tokens": 9}, "timings": timings})
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + b"data: [DONE]\n\n"


async def run(
    pieces: Sequence[str],
    request: ChatRequest = REQUEST,
    *,
    finish: str = "stop",
    prefill: bool = True,
) -> tuple[list[UpstreamDelta], dict[str, object]]:
    sent: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(req)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=sse(pieces, finish), headers=headers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        upstream = LlamaServerUpstream(client, "http://llama:8080", prefill_forced=prefill)
        deltas = [d async for d in upstream.stream(request)]
        assert upstream.body(request) == orjson.loads(sent[0].content)  # body() says it
    return deltas, orjson.loads(sent[0].content)


def text(deltas: list[UpstreamDelta]) -> str:
    return "".join(d.text for d in deltas)


async def test_the_prefix_goes_as_the_reply_begun_and_the_grammar_holds_the_middle() -> None:
    _, body = await run(['"query"', ': "pizza"', "}"])
    assert body["messages"] == [USER, {"role": "assistant", "content": PREFIX}]
    middle = parse(str(body["grammar"]))
    assert middle.accepts('"query": "pizza"}') and not middle.accepts(CALL)
    assert body["cache_prompt"] is True


@pytest.mark.parametrize(
    "pieces",
    [
        ['"query"', ': "pizza"', "}"],  # the server sends the continuation only
        [PREFIX + '"query"', ': "pizza"', "}"],  # ... or echoes the prefill first
        [PREFIX[:5], PREFIX[5:] + '"query": "pizza"}'],  # ... split anywhere
        [PREFIX[:5], PREFIX[5:], '"query": "pizza"', "}" + SUFFIX],  # ... and the suffix too
    ],
)
async def test_the_text_is_the_whole_grammars_turn(pieces: list[str]) -> None:
    deltas, _ = await run(pieces)
    assert text(deltas) == CALL
    finish = [i for i, d in enumerate(deltas) if d.finish_reason]
    assert [deltas[i].finish_reason for i in finish] == ["stop"]
    assert text(deltas[: finish[0]]) == CALL  # all of it before the finish
    (usage,) = [d.usage for d in deltas if d.usage]
    assert usage["timings"]["cache_n"] == 1204


async def test_a_turn_cut_by_its_token_limit_gets_no_suffix() -> None:
    deltas, _ = await run(['"query": "pi'], finish="length")
    assert text(deltas) == PREFIX + '"query": "pi'
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]


async def test_a_turn_that_ends_with_no_text_still_has_its_prefix() -> None:
    deltas, _ = await run([], finish="length")
    assert text(deltas) == PREFIX


async def test_stop_strings_keep_the_suffix_in_the_grammar() -> None:
    request = ChatRequest(model="m", messages=[USER], stop=["\n\n"], extra={"grammar": GRAMMAR})
    deltas, body = await run(['"query": "pizza"}', SUFFIX], request)
    assert body["messages"][-1] == {"role": "assistant", "content": PREFIX}
    assert parse(str(body["grammar"])).accepts(f'"query": "pizza"}}{SUFFIX}')
    assert text(deltas) == CALL


@pytest.mark.parametrize(
    "request_",
    [
        ChatRequest(model="m", messages=[USER]),  # no grammar
        ChatRequest(model="m", messages=[USER], extra={"grammar": 'root ::= "a" | "b"'}),
        ChatRequest(  # the reply is already begun: llama-server continues that one
            model="m",
            messages=[USER, {"role": "assistant", "content": "so"}],
            extra={"grammar": GRAMMAR},
        ),
    ],
)
async def test_what_is_sent_whole(request_: ChatRequest) -> None:
    deltas, body = await run([CALL], request_)
    assert body["messages"] == list(request_.messages)
    assert body.get("grammar") == request_.extra.get("grammar")
    assert text(deltas) == CALL


async def test_off_it_sends_the_grammar_whole() -> None:
    deltas, body = await run([CALL], prefill=False)
    assert body["messages"] == [USER] and body["grammar"] == GRAMMAR
    assert text(deltas) == CALL
