"""Admission before the stream starts: with every upstream slot (UPSTREAM_MAX_CONNECTIONS)
held, the next request waits in a fair queue for ADMISSION_TIMEOUT_MS, then gets 503 with
Retry-After before any byte of a stream, in each front door's own error shape; a freed
slot goes to the oldest waiter; nothing stays held when a waiter gives up. Real HTTP on
loopback, in front of a scripted upstream whose streams last until cancelled.

What an attacker of this contract would try: an error frame after a 200 (the old pool
timeout), a refusal without Retry-After or in the wrong door's shape, a later waiter
overtaking an earlier one, slots or tasks left behind by refused or abandoned waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from tests.api.conftest import Harness, HarnessFactory
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.admission import Admission, AdmissionRefused

# A stream that runs until it is cancelled (50 s of paced tokens).
LONG = Script.from_tokens([f"w{i} " for i in range(1000)], delay_ms=50)


def _admission(gw: Harness) -> Admission:
    admission = gw.gateway.streams.admission
    assert admission is not None
    return admission


@contextlib.asynccontextmanager
async def _holding(gw: Harness, text: str) -> AsyncIterator[str]:
    """A stream started (its 200 read) and held open; cancelled on the way out."""
    async with gw.client.stream("POST", f"{gw.url}/v1/stream", json={"input": text}) as response:
        assert response.status_code == 200
        stream_id = response.headers["x-stream-id"]
        try:
            yield stream_id
        finally:
            await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/cancel")


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (the queue has no event to wait on)
            await asyncio.sleep(0.01)


def _metric(text: str, series: str) -> float:
    """One series' value in a /metrics body (``series``: the name with its labels)."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    raise AssertionError(f"{series} not in /metrics")


def _user_text(request_json: Any) -> str:
    return str(request_json["messages"][-1]["content"])


# Each front door's request, and how its refusal body names the code.
DOORS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/stream", {"input": "late"}),
    (
        "/v1/chat/completions",
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "late"}]},
    ),
    ("/v1/responses", {"model": "m", "input": "late", "stream": True}),
    (
        "/v1/agui",
        {
            "threadId": "t1",
            "runId": "r1",
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "late"}],
        },
    ),
    (
        "/v1/ui/chat",
        {
            "id": "c1",
            "trigger": "submit-message",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "late"}]}],
        },
    ),
]


async def test_at_the_limit_every_door_answers_503_with_retry_after_before_any_stream_byte(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([LONG], upstream_max_connections=1, admission_timeout_ms=300)
    async with _holding(gw, "first"):
        for path, body in DOORS:
            started = time.perf_counter()
            response = await gw.client.post(f"{gw.url}{path}", json=body)
            waited = time.perf_counter() - started
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == "1"
            assert response.headers["content-type"] == "application/json"  # no SSE at all
            error = orjson.loads(response.content)["error"]
            assert error["code"] == "UPSTREAM_UNAVAILABLE"
            assert "ADMISSION_TIMEOUT_MS" in error["message"]
            if path in ("/v1/chat/completions", "/v1/responses"):  # OpenAI's shape
                assert set(error) >= {"message", "type", "param", "code"}
            else:  # ToolForge's error object
                assert error["retryable"] is True
            # It waited its turn for the whole timeout, and not much longer.
            assert 0.29 <= waited < 3.0, (path, waited)
        assert len(gw.upstream.requests) == 1  # no refused request reached the upstream
        metrics = (await gw.client.get(f"{gw.url}/metrics")).text
    assert _metric(metrics, 'toolforge_admission_wait_seconds_count{outcome="refused"}') == 5
    assert _metric(metrics, "toolforge_admission_slots_in_use") == 1


async def test_a_freed_slot_goes_to_the_oldest_waiter(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [LONG, LONG, LONG], upstream_max_connections=1, admission_timeout_ms=20_000
    )
    admission = _admission(gw)

    async def start(text: str) -> tuple[str, httpx.Response]:
        request = gw.client.build_request("POST", f"{gw.url}/v1/stream", json={"input": text})
        response = await gw.client.send(request, stream=True)
        return text, response

    async with _holding(gw, "first") as first:
        second = asyncio.create_task(start("second"))
        await _until(lambda: admission.depth == 1)
        third = asyncio.create_task(start("third"))
        await _until(lambda: admission.depth == 2)
        metrics = (await gw.client.get(f"{gw.url}/metrics")).text
        assert _metric(metrics, "toolforge_admission_queue_depth") == 2
        assert _metric(metrics, "toolforge_admission_slots_in_use") == 1
        assert not second.done() and not third.done()  # no 200 while they wait
        await gw.client.post(f"{gw.url}/v1/streams/{first}/cancel")
        _, admitted = await asyncio.wait_for(second, 5)
        assert admitted.status_code == 200
        assert admission.depth == 1 and not third.done()  # the later one still waits
        await gw.client.post(f"{gw.url}/v1/streams/{admitted.headers['x-stream-id']}/cancel")
        await admitted.aclose()
        _, last = await asyncio.wait_for(third, 5)
        assert last.status_code == 200
        await gw.client.post(f"{gw.url}/v1/streams/{last.headers['x-stream-id']}/cancel")
        await last.aclose()
    assert [_user_text(r.json) for r in gw.upstream.requests] == ["first", "second", "third"]
    await gw.settle()
    metrics = (await gw.client.get(f"{gw.url}/metrics")).text
    assert _metric(metrics, 'toolforge_admission_wait_seconds_count{outcome="admitted"}') == 2
    assert _metric(metrics, 'toolforge_admission_wait_seconds_sum{outcome="admitted"}') > 0
    await _until(
        lambda: admission.active == 0 and admission.depth == 0
    )  # the slot goes back as the stream's task ends


async def test_nothing_is_left_held_by_waiters_that_give_up(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [LONG, Script.from_tokens(["ok"])], upstream_max_connections=1, admission_timeout_ms=400
    )
    admission = _admission(gw)
    async with _holding(gw, "first"):
        # Refused together, and one client that leaves before its refusal.
        with pytest.raises(httpx.ReadTimeout):
            await gw.client.post(f"{gw.url}/v1/stream", json={"input": "gone"}, timeout=0.1)
        refused = await asyncio.gather(
            *(gw.client.post(f"{gw.url}/v1/stream", json={"input": f"r{i}"}) for i in range(6))
        )
        assert [r.status_code for r in refused] == [503] * 6
        await _until(lambda: admission.depth == 0)
        assert admission.active == 1  # the holder's only
    await gw.settle()
    await _until(
        lambda: admission.active == 0 and admission.depth == 0
    )  # the slot goes back as the stream's task ends
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("stream:")]
    # The slot is really free: the next stream runs to its end.
    response = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "next"})
    assert response.status_code == 200 and "event: done" in response.text
    await gw.settle()
    await _until(lambda: admission.active == 0)  # the slot goes back as the stream's task ends
    assert [_user_text(r.json) for r in gw.upstream.requests] == ["first", "next"]


async def test_a_cancelled_waiter_leaves_the_queue_and_passes_a_handed_slot_on() -> None:
    admission = Admission(1, 10.0)
    await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    behind = asyncio.create_task(admission.acquire())
    await _until(lambda: admission.depth == 2)
    admission.release()  # handed to the first waiter ...
    waiter.cancel()  # ... cancelled before it ran: the slot goes on to the next one
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(behind, 1)
    assert admission.active == 1 and admission.depth == 0
    admission.release()
    assert admission.active == 0


async def test_no_wait_at_all_with_a_zero_timeout() -> None:
    admission = Admission(1, 0.0)
    await admission.acquire()
    with pytest.raises(AdmissionRefused) as refused:
        await admission.acquire()
    assert refused.value.http_status == 503 and refused.value.retry_after == 1
    admission.release()
    assert admission.active == 0 and admission.depth == 0
