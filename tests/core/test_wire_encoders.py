"""The wire encoders of the Responses API, AG-UI and the AI SDK's UI stream
(``toolforge.core.protocol.responses``, ``.agui``, ``.ai_sdk_ui``), with no server.

Each writer has a per-token path that splices a frame's JSON string into the event's bytes
instead of building and dumping a value (the CPU per token of every format stays beside
``/v1/stream``'s). These tests hold that path to the general one: the same frames give the
same bytes whether written through the splice or event by event, and whether the frames
come in one batch or one at a time — text with quotes, newlines and non-ASCII included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from ag_ui.core import Event
from pydantic import TypeAdapter

from toolforge.core.protocol import agui, ai_sdk_ui, responses
from toolforge.core.protocol.frames import (
    Done,
    Frame,
    ReasoningDelta,
    StreamBegin,
    TextDelta,
    ToolCall,
    encode_frame,
)

FRAMES: list[Frame] = [
    StreamBegin(stream_id="s_ab", model="m", mode="native", budget_tokens=None),
    TextDelta(chunk="Hel"),
    TextDelta(chunk='lo "there"\n'),
    TextDelta(chunk="— é ☃ \\ end"),
    ReasoningDelta(chunk="hmm"),
    ReasoningDelta(chunk=" ok"),
    TextDelta(chunk="again"),
    TextDelta(chunk=" and again"),
    ToolCall(id="call_1", name="get_weather", args={"city": "Zürich"}, executor="client"),
    TextDelta(chunk="after"),
    TextDelta(chunk=" the call"),
    Done(reason="stop", usage={"prompt_tokens": 3, "completion_tokens": 5}, metrics={}),  # type: ignore[typeddict-item]
]
ENCODED = [encode_frame(i + 1, frame) for i, frame in enumerate(FRAMES)]

Make = Callable[[], Any]
WRITERS: dict[str, tuple[Make, Callable[[Any, bytes], bytes], Callable[[Any], bytes]]] = {
    "responses": (
        lambda: responses.ResponseWriter(
            response_id="resp_ab", created_at=1, echo={}, stream_id="s_ab", mode="native"
        ),
        lambda w, b: w.batch(b, now=2),
        lambda w: b"".join(
            responses.sse_event(e)
            for e in [
                *w.start(),
                *(
                    e
                    for f in FRAMES
                    for e in w.frame(f.event, orjson.loads(orjson.dumps(f.data)), now=2)
                ),
            ]
        ),
    ),
    "agui": (
        lambda: agui.RunWriter(thread_id="t", run_id="r", stream_id="s_ab"),
        lambda w, b: w.batch(b),
        lambda w: b"".join(
            agui._encode(e)
            for e in [
                *w.start(),
                *(
                    e
                    for i, f in enumerate(FRAMES)
                    for e in w.frame(i + 1, f.event, orjson.loads(orjson.dumps(f.data)))
                ),
            ]
        ),
    ),
    "ui-stream": (
        lambda: ai_sdk_ui.UIStreamWriter(message_id="msg_ab", stream_id="s_ab"),
        lambda w, b: w.batch(b),
        lambda w: (
            b"".join(
                ai_sdk_ui._chunk(c)
                for c in [
                    *w.start(),
                    *(
                        c
                        for i, f in enumerate(FRAMES)
                        for c in w.frame(i + 1, f.event, orjson.loads(orjson.dumps(f.data)))
                    ),
                ]
            )
            + ai_sdk_ui.DONE_LINE
        ),
    ),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_the_per_token_path_writes_what_the_general_one_does(name: str) -> None:
    make, batch, general = WRITERS[name]
    whole = batch(make(), b"".join(ENCODED))
    one_by_one_writer = make()
    one_by_one = b"".join(batch(one_by_one_writer, frame) for frame in ENCODED)
    reference = general(make())
    assert whole == reference
    assert one_by_one == reference


def test_the_responses_text_is_whole_at_the_end() -> None:
    make, batch, _ = WRITERS["responses"]
    writer = make()
    batch(writer, b"".join(ENCODED))
    text = 'Hello "there"\n— é ☃ \\ endagain and againafter the call'
    assert writer.output_text == text
    assert writer.resource()["status"] == "completed"
    sequence = [
        orjson.loads(block.split(b"\ndata: ", 1)[1])["sequence_number"]
        for block in batch(make(), b"".join(ENCODED)).split(b"\n\n")
        if block
    ]
    assert sequence == list(range(len(sequence)))


def test_every_ag_ui_event_parses_with_the_package() -> None:
    make, batch, _ = WRITERS["agui"]
    body = batch(make(), b"".join(ENCODED))
    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    events = [
        adapter.validate_python(orjson.loads(block.removeprefix(b"data: ")))
        for block in body.split(b"\n\n")
        if block
    ]
    deltas = "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")
    assert deltas == 'Hello "there"\n— é ☃ \\ endagain and againafter the call'
