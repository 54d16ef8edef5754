"""The OpenAI chat-completions wire written from frames (``toolforge.core.protocol.openai``): the
per-token fast path writes exactly what the general path writes, batches split anywhere
between frames give the same chunks, and the last chunks are in OpenAI's order."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from toolforge.core.protocol.frames import (
    Done,
    DoneMetrics,
    Error,
    Frame,
    ReasoningDelta,
    ResultEnd,
    StreamBegin,
    TextDelta,
    ToolCall,
    encode_frame,
)
from toolforge.core.protocol.openai import DONE_LINE, ChunkWriter, CompletionBuilder
from toolforge.errors import ErrorCode, UpstreamError

METRICS = DoneMetrics(ttft_ms=1.0, duration_ms=2.0, tokens_per_s=None, frames=3)


def writer(**kw: Any) -> ChunkWriter:
    return ChunkWriter(
        stream_id="s_abc",
        completion_id="chatcmpl-abc",
        created=7,
        model=kw.pop("model", 'm%s"x'),
        include_usage=kw.pop("include_usage", True),
        mode="native",
    )


def encoded(frames: list[Frame]) -> bytes:
    return b"".join(encode_frame(i, f) for i, f in enumerate(frames, start=1))


def chunks(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: ")
            out.append(block[6:] if block == DONE_LINE[:-2] else orjson.loads(block[6:]))
    return out


def done(reason: str = "stop") -> Done:
    usage = {"prompt_tokens": 2, "completion_tokens": 3}
    return Done(reason=reason, usage=usage, metrics=METRICS)


@given(st.text(min_size=1, max_size=40))
def test_the_text_fast_path_matches_the_general_path(text: str) -> None:
    fast = writer().batch(encoded([TextDelta(text)]))
    slow = writer().frame("text.delta", {"chunk": text})
    assert fast == slow
    assert chunks(fast)[0]["choices"][0]["delta"] == {"content": text}


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8), st.data())
def test_batches_split_anywhere_between_frames_write_the_same(
    texts: list[str], data: st.DataObject
) -> None:
    frames: list[Frame] = [StreamBegin(stream_id="s", model="m", mode="native", budget_tokens=None)]
    frames += [TextDelta(t) for t in texts]
    frames.append(done())
    blocks = [encode_frame(i, f) for i, f in enumerate(frames, start=1)]
    cut = data.draw(st.integers(0, len(blocks)))
    whole = writer().batch(b"".join(blocks))
    w = writer()
    assert w.batch(b"".join(blocks[:cut])) + w.batch(b"".join(blocks[cut:])) == whole


def test_the_end_is_finish_then_usage_then_done() -> None:
    out = chunks(writer().batch(encoded([TextDelta("hi"), done()])))
    assert out[0]["choices"][0]["delta"] == {"content": "hi"}
    assert out[1]["choices"][0]["finish_reason"] == "stop"
    assert out[1]["toolforge"]["stream_id"] == "s_abc"
    assert out[2]["choices"] == [] and out[2]["usage"]["total_tokens"] == 5
    assert out[3] == b"[DONE]"
    assert out[0]["model"] == 'm%s"x'


def test_client_tool_calls_are_indexed_and_finish_as_tool_calls() -> None:
    frames: list[Frame] = [
        ToolCall(id="c1", name="a", args={"x": 1}, executor="client"),
        ToolCall(id="c2", name="b", args={}, executor="client"),
        done("tool_calls"),
    ]
    out = chunks(writer(include_usage=False).batch(encoded(frames)))
    deltas = [o["choices"][0]["delta"]["tool_calls"][0] for o in out[:2]]
    assert [(d["index"], d["id"], d["function"]["name"]) for d in deltas] == [
        (0, "c1", "a"),
        (1, "c2", "b"),
    ]
    assert orjson.loads(deltas[0]["function"]["arguments"]) == {"x": 1}
    assert out[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[3] == b"[DONE]"


def test_a_server_tool_call_is_not_the_clients() -> None:
    frames: list[Frame] = [ToolCall(id="t1", name="s", args={}), done("tool_calls")]
    out = chunks(writer(include_usage=False).batch(encoded(frames)))
    assert out[0]["choices"][0]["finish_reason"] == "stop"  # answered in the loop


def test_an_error_is_an_error_chunk_then_done() -> None:
    error = Error.of(UpstreamError(ErrorCode.UPSTREAM_UNAVAILABLE, "gone"))
    out = chunks(writer().batch(encoded([TextDelta("x"), error, done("error")])))
    assert out[1]["error"]["code"] == "UPSTREAM_UNAVAILABLE"
    assert out[1]["error"]["message"] == "gone"
    assert out[2] == b"[DONE]" and len(out) == 3


def test_the_completion_builder() -> None:
    builder = CompletionBuilder(
        stream_id="s_abc", completion_id="chatcmpl-abc", created=7, model="m", mode="native"
    )
    end = ResultEnd(id="r1", length=8, value={"n": 1}, repaired=True, degraded=False)
    frames: list[Frame] = [ReasoningDelta("why"), end, done()]
    builder.feed((f.event, f.data) for f in frames)
    body = builder.build()
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": '{"n":1}', "reasoning_content": "why"}
    assert body["toolforge"]["repaired"] is True
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
