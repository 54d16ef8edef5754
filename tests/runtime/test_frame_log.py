"""FrameLog: numbering, coalescing, backpressure and replay, without a network."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from toolforge.core.protocol.frames import Done, TextDelta, encode_frame
from toolforge.runtime.frame_log import FrameLog, decode_events


def text(i: int) -> TextDelta:
    return TextDelta(f"t{i}")


async def test_ids_are_sequential_and_encoding_is_stable() -> None:
    log = FrameLog(max_pending=10)
    assert [log.append(text(i)) for i in range(3)] == [1, 2, 3]
    assert log.encoded_after(0) == [encode_frame(i + 1, text(i)) for i in range(3)]
    assert encode_frame(2, text(1)) == b'id: 2\nevent: text.delta\ndata: {"chunk":"t1"}\n\n'


async def test_buffered_frames_are_coalesced_into_one_write() -> None:
    log = FrameLog(max_pending=10)
    for i in range(5):
        log.append(text(i))
    log.close()
    batches = [b async for b in log.follow(0)]
    assert batches == [b"".join(encode_frame(i + 1, text(i)) for i in range(5))]


async def test_a_lone_frame_is_written_without_waiting_for_company() -> None:
    log = FrameLog(max_pending=10)
    reader = log.follow(0)
    log.append(text(0))
    first = await asyncio.wait_for(anext(reader), 0.1)
    assert first == encode_frame(1, text(0))
    pending = asyncio.ensure_future(anext(reader))
    await asyncio.sleep(0.01)
    assert not pending.done()  # nothing new: the reader waits
    log.append(text(1))
    assert await asyncio.wait_for(pending, 0.1) == encode_frame(2, text(1))
    log.close()
    with pytest.raises(StopAsyncIteration):
        await anext(reader)


async def test_producer_waits_when_the_primary_reader_is_max_pending_behind() -> None:
    log = FrameLog(max_pending=3)
    log.attach_primary()
    for i in range(3):
        log.append(text(i))
    assert log.pending() == 3
    producer = asyncio.ensure_future(log.wait_for_room())
    await asyncio.sleep(0.02)
    assert not producer.done(), "the producer must wait for the slow client"
    reader = log.follow(0, primary=True)
    await anext(reader)  # the client takes the three frames...
    pending_read = asyncio.ensure_future(anext(reader))  # ...and writes them (cursor moves)
    await asyncio.sleep(0.01)
    assert producer.done(), "the producer resumes as soon as the client drains"
    assert log.paused_s >= 0.015
    assert log.high_water == 3
    pending_read.cancel()


async def test_only_the_primary_reader_throttles() -> None:
    log = FrameLog(max_pending=2)
    for i in range(10):  # no primary attached: nothing to wait for
        await log.wait_for_room()
        log.append(text(i))
    log.attach_primary()
    log.append(text(10))
    log.detach_primary()  # the client left: the producer must not block forever
    await asyncio.wait_for(log.wait_for_room(), 0.1)


async def test_replay_from_any_id_then_live() -> None:
    log = FrameLog(max_pending=10)
    for i in range(4):
        log.append(text(i))
    reader = log.follow(2)
    assert await anext(reader) == encode_frame(3, text(2)) + encode_frame(4, text(3))
    log.append(text(4))
    assert await anext(reader) == encode_frame(5, text(4))
    log.close()
    assert [b async for b in reader] == []
    # Out-of-range cursors are clamped: past the end means "only what comes next".
    assert [b async for b in log.follow(99)] == []


async def test_append_after_close_is_refused() -> None:
    log = FrameLog(max_pending=1)
    log.close()
    with pytest.raises(RuntimeError):
        log.append(text(0))


def test_frames_are_stored_compactly() -> None:
    # One buffer and an offset per frame: no object per frame (a bytes object alone
    # costs 33 bytes of header and a list slot on top of its payload).
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = FrameLog(max_pending=10_000)
        for i in range(2_000):
            log.append(text(i))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    payload = sum(len(b) for b in log.encoded_after(0))
    assert held < payload * 1.3 + 2_000 * 8
    assert log.take(1_998) == (b"".join(log.encoded_after(1_998)), 2_000)


async def test_a_reader_that_gives_up_does_not_disturb_the_others() -> None:
    log = FrameLog(max_pending=10)
    quitter = asyncio.create_task(log.wait())
    stayer = asyncio.create_task(log.wait())
    await asyncio.sleep(0)
    quitter.cancel()
    await asyncio.sleep(0)
    assert quitter.cancelled() and not stayer.done()
    assert len(log._readers) == 1  # the cancelled waiter is gone: nothing builds up
    log.append(text(0))
    await asyncio.wait_for(stayer, 1)
    assert log._readers == []


def test_frames_decode_back_to_typed_values_and_events_to_what_was_sent() -> None:
    log = FrameLog(max_pending=10)
    done = Done(
        reason="stop",
        usage={"completion_chunks": 1},
        metrics={"ttft_ms": None, "duration_ms": 1.5, "tokens_per_s": None, "frames": 2},
    )
    log.append(text(0))
    log.append(done)
    assert log.frames == [text(0), done]
    assert list(decode_events(log.encoded_after(0))) == [
        ("text.delta", {"chunk": "t0"}),
        ("done", done.data),
    ]
