"""FrameLog's relay, without a network: when it takes frames, and when the reader's queue
takes over (the relay writes exactly what the queue would have, once)."""

from __future__ import annotations

import asyncio

from toolforge.core.protocol.frames import Done, TextDelta, encode_frame
from toolforge.runtime.frame_log import FrameLog

DONE = Done(
    reason="stop",
    usage={"completion_chunks": 1},
    metrics={"ttft_ms": None, "duration_ms": 1.5, "tokens_per_s": None, "frames": 2},
)


def text(i: int) -> TextDelta:
    return TextDelta(f"t{i}")


class Client:
    """A relay that records what it writes, as the SSE writer's does (and reports it)."""

    def __init__(self, log: FrameLog, *, accept: bool = True) -> None:
        self.log = log
        self.accept = accept
        self.writes: list[bytes] = []

    def __call__(self, batch: bytes, seq: int) -> bool:
        if not self.accept:
            return False
        self.writes.append(batch)
        self.log.written(seq, len(batch), primary=True)
        return True


async def _relaying(log: FrameLog, client: Client) -> asyncio.Task[None]:
    """The primary reader, caught up, parked with its relay lent."""
    reader = asyncio.ensure_future(log.wait_relaying(client))
    await asyncio.sleep(0)
    return reader


async def test_one_step_of_frames_goes_out_in_one_write_and_the_reader_sleeps() -> None:
    log = FrameLog(max_pending=8)
    log.attach_primary()
    client = Client(log)
    reader = await _relaying(log, client)
    assert log.relaying
    for i in range(3):  # one producer step: three frames of one upstream read
        log.append(text(i))
    assert client.writes == []  # handed over at the end of the step, not frame by frame
    await asyncio.sleep(0)
    assert client.writes == [b"".join(encode_frame(i + 1, text(i)) for i in range(3))]
    assert log.pending() == 0 and log.relayed == 3
    log.append(text(3))
    await asyncio.sleep(0)
    assert client.writes[-1] == encode_frame(4, text(3))
    assert not reader.done(), "the reader's task was woken for a relayed frame"
    log.close()
    await asyncio.wait_for(reader, 1)


async def test_done_is_left_to_the_reader_with_the_frames_before_it() -> None:
    log = FrameLog(max_pending=8)
    log.attach_primary()
    client = Client(log)
    reader = await _relaying(log, client)
    log.append(text(0))
    log.append(DONE)
    await asyncio.wait_for(reader, 1)  # woken: the queue takes both
    assert not log.relaying
    await asyncio.sleep(0)
    assert client.writes == []
    batch, end = log.take(0)
    assert batch == encode_frame(1, text(0)) + encode_frame(2, DONE) and end == 2


async def test_a_declined_batch_wakes_the_reader_and_stays_queued() -> None:
    log = FrameLog(max_pending=8)
    log.attach_primary()
    client = Client(log, accept=False)  # a ping is due, or the client left
    reader = await _relaying(log, client)
    log.append(text(0))
    await asyncio.wait_for(reader, 1)
    assert not log.relaying and log.relayed == 0
    assert log.pending() == 1
    assert log.take(0) == (encode_frame(1, text(0)), 1)


async def test_wake_close_and_unrelay_give_the_reader_back_its_queue() -> None:
    for end in (FrameLog.wake, FrameLog.close, FrameLog.unrelay, FrameLog.detach_primary):
        log = FrameLog(max_pending=8)
        log.attach_primary()
        client = Client(log)
        reader = await _relaying(log, client)
        end(log)
        await asyncio.wait_for(reader, 1)
        assert not log.relaying, end.__name__


async def test_no_relay_when_it_is_off_behind_or_not_primary() -> None:
    off = FrameLog(max_pending=8, relay=False)
    off.attach_primary()
    behind = FrameLog(max_pending=8)
    behind.attach_primary()
    behind.append(text(0))  # one frame not yet written
    no_primary = FrameLog(max_pending=8)
    for log in (off, behind, no_primary):
        reader = await _relaying(log, Client(log))
        assert not log.relaying
        log.append(text(9))
        await asyncio.wait_for(reader, 1)  # the plain wait: woken by the frame
        assert log.relayed == 0


async def test_a_cancelled_reader_takes_its_relay_with_it() -> None:
    log = FrameLog(max_pending=8)
    log.attach_primary()
    client = Client(log)
    reader = await _relaying(log, client)
    reader.cancel()
    await asyncio.sleep(0)
    assert not log.relaying
    log.append(text(0))
    await asyncio.sleep(0)
    assert client.writes == [] and log.pending() == 1
