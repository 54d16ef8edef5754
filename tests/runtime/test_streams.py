"""StreamRegistry: lookups, expiry and idempotency records, with an injected clock."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import RequestError
from app.runtime.streams import StreamRegistry


class FakeSession:
    def __init__(self, sid: str, *, running: bool = False, finished_at: float | None = 0.0) -> None:
        self.id = sid
        self.running = running
        self.finished_at = finished_at

    def start(self) -> None:
        pass


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


def test_full_sweeps_are_rate_limited_but_reclaim_memory() -> None:
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
