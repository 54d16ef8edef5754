"""StreamRegistry: lookups, expiry and idempotency records, with an injected clock."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from toolforge.errors import RequestError
from toolforge.runtime.streams import Collector, StreamRegistry


class FakeSession:
    """A session and its task in one: ended at once unless ``running``."""

    def __init__(self, sid: str, *, running: bool = False, finished_at: float | None = 0.0) -> None:
        self.id = sid
        self.running = running
        self.finished_at = finished_at
        self._callbacks: list[Callable[[object], None]] = []

    def start(self) -> FakeSession:
        return self

    def add_done_callback(self, callback: Callable[[object], None]) -> None:
        self._callbacks.append(callback)
        if not self.running:
            callback(self)

    def end(self, at: float) -> None:
        self.running, self.finished_at = False, at
        for callback in self._callbacks:
            callback(self)


def registry(now: list[float], ttl: float = 10.0) -> StreamRegistry:
    return StreamRegistry(resume_ttl_s=ttl, clock=lambda: now[0])


def test_a_finished_stream_is_found_until_its_ttl_then_404() -> None:
    now = [0.0]
    reg = registry(now)
    reg.start(FakeSession("a"))  # type: ignore[arg-type]
    now[0] = 9.9
    assert reg.get("a").id == "a"
    now[0] = 10.1  # expired, whether or not a full sweep ran since
    with pytest.raises(RequestError) as err:
        reg.get("a")
    assert err.value.http_status == 404


def test_sweeps_reclaim_memory_and_keys() -> None:
    now = [0.0]
    reg = registry(now, ttl=1.0)
    for i in range(100):
        reg.start(FakeSession(f"s{i}"), idempotency_key=f"k{i}", body_hash="h")  # type: ignore[arg-type]
    assert len(reg) == 100
    now[0] = 5.0
    reg.sweep()
    assert len(reg) == 0
    assert reg.replay_for("k1", "h") is None  # the key went with its stream


def test_idempotency_records() -> None:
    now = [0.0]
    reg = registry(now)
    running: Any = FakeSession("r", running=True, finished_at=None)
    reg.start(running, idempotency_key="k", body_hash="h1")
    with pytest.raises(RequestError) as busy:
        reg.replay_for("k", "h1")
    assert busy.value.http_status == 409
    with pytest.raises(RequestError) as other:
        reg.replay_for("k", "h2")
    assert other.value.http_status == 422
    running.running, running.finished_at = False, 1.0
    assert reg.replay_for("k", "h1") is running
    now[0] = 100.0
    assert reg.replay_for("k", "h1") is None  # expired: a new stream may start


def test_sweeps_go_in_the_order_streams_ended() -> None:
    now = [0.0]
    reg = registry(now, ttl=10.0)
    late: Any = FakeSession("late", running=True, finished_at=None)
    reg.start(late, idempotency_key="k", body_hash="h")
    reg.start(FakeSession("early", finished_at=0.0))  # type: ignore[arg-type]
    now[0] = 5.0
    late.end(5.0)
    now[0] = 10.5  # "early" expired, "late" has 4.5 s left
    reg.sweep()
    assert len(reg) == 1 and reg.get("late") is late
    assert reg.replay_for("k", "h") is late
    now[0] = 15.5
    reg.sweep()
    assert len(reg) == 0 and reg.replay_for("k", "h") is None


def test_a_session_that_never_ended_is_not_kept_once_its_task_is_done() -> None:
    now = [0.0]
    reg = registry(now)
    reg.start(FakeSession("cut", finished_at=None))  # type: ignore[arg-type]
    reg.sweep()
    assert len(reg) == 0


def test_the_young_generation_is_collected_as_a_stream_ends() -> None:
    reg = registry([0.0])
    session: Any = FakeSession("s", running=True, finished_at=None)
    reg.start(session)
    gc.collect(0)
    keep = [[] for _ in range(gc.get_threshold()[0] // 2)]  # containers count as allocations
    assert gc.get_count()[0] >= len(keep) // 2  # below the threshold: none ran yet
    session.end(1.0)
    assert gc.get_count()[0] < 10
    del keep


def _young_passes(n: int) -> None:
    """``n`` middle-generation passes: each adds one to the oldest generation's count."""
    for _ in range(n):
        gc.collect(1)


def test_the_collector_owns_full_passes_and_gives_them_back() -> None:
    before = gc.get_threshold()
    first, second = Collector(), Collector()
    first.take_over()
    second.take_over()  # a second app in the same process
    assert gc.get_threshold()[:2] == before[:2]
    assert gc.get_threshold()[2] > 10**9  # the automatic collector never starts one
    first.give_back()
    assert gc.get_threshold()[2] > 10**9  # the other app still owns them
    second.give_back()
    assert gc.get_threshold() == before
    second.give_back()  # twice: nothing more
    assert gc.get_threshold() == before


def test_a_full_pass_waits_for_a_quiet_moment_or_its_longest_interval() -> None:
    now = [0.0]
    collector = Collector(quiet_open=8, quiet_every_s=60.0, longest_s=600.0, clock=lambda: now[0])
    due = gc.get_threshold()[2]
    assert not collector.full_due(0, 10**6)  # not taken over: the automatic collector's
    collector.take_over()
    try:
        now[0] = 61.0
        assert collector.full_due(8, due)  # quiet, and a minute since the last
        assert not collector.full_due(8, due - 1)  # the collector would not have run yet
        assert not collector.full_due(9, due)  # nine streams open: not quiet
        now[0] = 30.0
        assert not collector.full_due(0, due)  # quiet, but one ran half a minute ago
        now[0] = 600.0
        assert collector.full_due(2000, due)  # busy, but ten minutes without one
    finally:
        collector.give_back()


@contextlib.contextmanager
def _serving(open_streams: int, now: list[float]) -> Iterator[tuple[StreamRegistry, list[Any]]]:
    """A registry whose collector owns full passes, with ``open_streams`` running."""
    assert gc.get_threshold()[2] <= 10  # the default: due after 10 middle passes
    reg = StreamRegistry(resume_ttl_s=10.0, clock=lambda: now[0])
    reg.collector.take_over()
    try:
        sessions: list[Any] = [FakeSession(f"s{i}", running=True) for i in range(open_streams)]
        for session in sessions:
            reg.start(session)
        yield reg, sessions
    finally:
        reg.collector.give_back()


def test_a_stream_ending_with_many_open_never_walks_the_oldest_generation() -> None:
    now = [0.0]
    with _serving(12, now) as (reg, sessions):
        now[0] = 120.0
        gc.collect()
        _young_passes(10)
        counted = gc.get_count()[2]
        sessions[0].end(now[0])  # 11 still open: young passes only
        assert reg.collector.full_passes == 0
        assert gc.get_count()[2] >= counted
        for session in sessions[1:4]:
            session.end(now[0])  # 8 open: quiet, a full pass
        assert reg.collector.full_passes == 1
        assert gc.get_count()[2] <= 1
        for session in sessions[4:]:
            session.end(now[0])  # quiet, but the last full pass was just now
        assert reg.collector.full_passes == 1


def test_cyclic_garbage_in_the_oldest_generation_is_freed_within_the_longest_interval() -> None:
    now = [0.0]
    with _serving(100, now) as (reg, busy):

        class Node:
            def __init__(self) -> None:
                self.me = self

        node = Node()  # a cycle: once dropped, only the collector frees it
        gone = weakref.ref(node)
        gc.collect(1)
        gc.collect(1)  # it outlived two passes: now in the oldest generation
        del node
        gc.collect(1)
        assert gone() is not None  # the young passes do not see it
        _young_passes(10)
        now[0] = 599.0
        busy[0].end(now[0])
        assert gone() is not None  # 99 open and not yet due
        now[0] = 600.0
        busy[1].end(now[0])
        assert gone() is None
        assert reg.collector.full_passes == 1
