"""Two gateway processes sharing one Redis (docs/deployment.md): a stream started on replica A is
resumed, cancelled, approved, fed a client tool result and replayed through replica B;
the tool limit holds across both; Redis dying and a replica dying end nothing in a hang."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.replicas.conftest import (
    RedisServer,
    Replica,
    ReplicaFactory,
    assert_whole,
    read_sse,
)
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import ScriptedUpstream
from toolforge.runtime.cluster import RedisCluster, RedisRateLimiter, RedisUnavailable

SENTINEL = {"mode": "sentinel"}


def body(model: str, **fields: Any) -> dict[str, Any]:
    return {"input": "x", "model": model, **SENTINEL, **fields}


def text_of(events: list[Event]) -> str:
    return "".join(e.data["chunk"] for e in events if e.event == "text.delta")


def words(n: int) -> str:
    return "".join(f"w{i} " for i in range(n))


async def read_some(replica: Replica, model: str, n: int) -> list[Event]:
    """Start a stream that outlives its client on ``replica``; read ``n`` frames, leave."""
    return await read_sse(
        replica.client,
        "POST",
        f"{replica.url}/v1/stream",
        json=body(model, on_disconnect="continue"),
        until=lambda e: int(e.id) >= n,
    )


def two_clusters(url: str) -> tuple[RedisCluster, RedisCluster]:
    """Two replicas' views of one Redis, without servers around them."""
    one, two = (
        RedisCluster(url, timeout_s=0.5, flush_s=0, replica_ttl_s=1, resume_ttl_s=1)
        for _ in range(2)
    )
    return one, two


async def test_a_stream_started_on_a_resumes_on_b_exactly_once(replicas: ReplicaFactory) -> None:
    a, b = await replicas()
    first = await read_some(a, "slow:80:5", 10)
    stream_id = first[0].data["stream_id"]
    rest = await b.resume(stream_id, first[-1].id)
    whole = first + rest
    assert_whole(whole)
    assert text_of(whole) == words(80)
    assert whole[-1].data["reason"] == "stop"
    # Once it has ended, B replays any part of it again, the same frames.
    again = await b.resume(stream_id, "3")
    assert [(e.id, e.event, e.data) for e in again] == [(e.id, e.event, e.data) for e in whole[3:]]


async def test_a_proxy_stream_started_on_a_resumes_on_b(replicas: ReplicaFactory) -> None:
    """``POST /v1/chat/completions`` starts its stream the way ``/v1/stream`` does: B
    serves it from the resume buffer while A still streams it, frame for frame."""
    a, b = await replicas()
    request = {
        "model": "slow:60:5",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
    }
    async with a.client.stream("POST", f"{a.url}/v1/chat/completions", json=request) as answer:
        assert answer.status_code == 200
        stream_id = answer.headers["x-stream-id"]
        chunks = answer.aiter_lines()
        first = [line async for line in _take(chunks, 4)]  # the proxy stream is under way
        assert any(line.startswith("data: ") for line in first)
        resumed = await b.resume(stream_id, "0")  # live on A, read through B
        rest = [line async for line in chunks]
    assert_whole(resumed)
    assert resumed[0].data["stream_id"] == stream_id
    assert text_of(resumed) == words(60)
    assert resumed[-1].data["reason"] == "stop"
    assert rest[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in rest
    # A stream B does not run, started by a key-less client of A: B takes its cancel too.
    again = await b.client.post(f"{b.url}/v1/streams/{stream_id}/cancel")
    assert again.status_code == 200 and again.json()["cancelled"] is False


async def _take(lines: Any, n: int) -> Any:
    for _ in range(n):
        yield await anext(lines)


async def test_an_unknown_stream_is_a_404_on_every_replica(replicas: ReplicaFactory) -> None:
    a, b = await replicas()
    for replica in (a, b):
        for method, path in [
            ("GET", "/v1/streams/s_nope"),
            ("POST", "/v1/streams/s_nope/cancel"),
        ]:
            response = await replica.client.request(method, replica.url + path)
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "NOT_FOUND"


async def test_cancel_through_b_stops_the_model_on_a_within_100_ms(
    replicas: ReplicaFactory, upstream: ScriptedUpstream
) -> None:
    a, b = await replicas()
    seen: list[Event] = []
    started = asyncio.Event()

    async def on_event(event: Event) -> None:
        seen.append(event)
        if int(event.id) >= 5:
            started.set()

    reader = asyncio.create_task(
        read_sse(
            a.client, "POST", f"{a.url}/v1/stream", json=body("slow:2000:5"), on_event=on_event
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    stream_id = seen[0].data["stream_id"]
    assert upstream.open_connections == 1
    t0 = time.perf_counter()
    response = await b.client.post(f"{b.url}/v1/streams/{stream_id}/cancel")
    async with asyncio.timeout(5):
        await upstream.wait_connections_closed()
    elapsed_ms = (time.perf_counter() - t0) * 1000
    assert response.status_code == 200, response.text
    assert response.json() == {"stream_id": stream_id, "cancelled": True, "reason": "cancelled"}
    assert elapsed_ms < 100, f"the model on A stopped {elapsed_ms:.0f} ms after the cancel"
    whole = await asyncio.wait_for(reader, 5)
    assert_whole(whole)
    assert whole[-1].data["reason"] == "cancelled"
    # Cancelling an ended stream through B: nothing to cancel, as on A.
    again = await b.client.post(f"{b.url}/v1/streams/{stream_id}/cancel")
    assert again.json()["cancelled"] is False


async def test_an_approval_posted_to_b_reaches_a(replicas: ReplicaFactory) -> None:
    a, b = await replicas()
    answers: list[httpx.Response] = []

    async def on_event(event: Event) -> None:
        if event.event == "stream.begin":
            on_event.stream_id = event.data["stream_id"]  # type: ignore[attr-defined]
        if event.event == "tool.call":
            assert event.data["needs_approval"] is True
            sid = on_event.stream_id  # type: ignore[attr-defined]
            url = f"{b.url}/v1/streams/{sid}/approvals"
            answers.append(await b.client.post(f"{url}/nope", json={"approve": True}))
            answers.append(await b.client.post(f"{url}/t1", json={"approve": True}))

    events = await read_sse(
        a.client, "POST", f"{a.url}/v1/stream", json=body("tool:guarded"), on_event=on_event
    )
    assert_whole(events)
    unknown, approved = answers
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NOT_FOUND"
    assert "waiting: t1" in unknown.json()["error"]["message"]  # A's own answer
    assert approved.status_code == 200 and approved.json()["approved"] is True
    (result,) = [e.data for e in events if e.event == "tool.result"]
    assert result["ok"] is True and result["result"]["pid"] == a.proc.pid
    assert events[-1].data["reason"] == "stop"


async def test_a_command_sent_before_a_s_first_mirror_write_still_reaches_a(
    replicas: ReplicaFactory,
) -> None:
    """A stream's first frames reach its client before A's mirror writes the stream to
    Redis (within REDIS_FLUSH_MS, here 300 ms): a resume and an approval sent to B at
    once wait that window out, rather than answer 404 for a stream that exists."""
    a, b = await replicas(REDIS_FLUSH_MS="300")
    answers: list[httpx.Response] = []
    resumed: list[asyncio.Task[list[Event]]] = []

    async def on_event(event: Event) -> None:
        if event.event == "stream.begin":
            on_event.stream_id = event.data["stream_id"]  # type: ignore[attr-defined]
            resumed.append(asyncio.create_task(b.resume(event.data["stream_id"], "0")))
        if event.event == "tool.call":
            sid = on_event.stream_id  # type: ignore[attr-defined]
            url = f"{b.url}/v1/streams/{sid}/approvals/t1"
            answers.append(await b.client.post(url, json={"approve": True}))

    events = await asyncio.wait_for(
        read_sse(
            a.client, "POST", f"{a.url}/v1/stream", json=body("tool:guarded"), on_event=on_event
        ),
        20,
    )
    assert_whole(events)
    (approved,) = answers
    assert approved.status_code == 200, approved.text
    assert events[-1].data["reason"] == "stop"
    on_b = await asyncio.wait_for(resumed[0], 20)
    assert [e.id for e in on_b if e.id] == [e.id for e in events if e.id]


async def test_a_client_tool_result_posted_to_b_reaches_a(replicas: ReplicaFactory) -> None:
    a, b = await replicas()
    weather = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    answers: list[httpx.Response] = []

    async def on_event(event: Event) -> None:
        if event.event == "stream.begin":
            on_event.stream_id = event.data["stream_id"]  # type: ignore[attr-defined]
        if event.event == "tool.call":
            assert event.data["executor"] == "client"
            sid = on_event.stream_id  # type: ignore[attr-defined]
            url = f"{b.url}/v1/streams/{sid}/tool_results/t1"
            answers.append(await b.client.post(url, json={"ok": True, "result": {"temp_c": 21}}))
            answers.append(await b.client.post(url, json={"ok": True, "result": {"temp_c": 0}}))
            bad = await b.client.post(url, json={"ok": True, "extra": 1})
            answers.append(bad)

    events = await read_sse(
        a.client,
        "POST",
        f"{a.url}/v1/stream",
        json=body("tool:get_weather", client_tools=[weather], tools=[]),
        on_event=on_event,
    )
    assert_whole(events)
    accepted, duplicate, bad = answers
    assert accepted.status_code == 200 and accepted.json()["accepted"] is True
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "CONFLICT"
    assert bad.status_code == 422  # refused by B itself, before any routing
    (result,) = [e.data for e in events if e.event == "tool.result"]
    assert result["ok"] is True and result["result"] == {"temp_c": 21}


async def test_an_idempotent_replay_on_b_is_a_s_stream_byte_for_byte(
    replicas: ReplicaFactory,
) -> None:
    a, b = await replicas()
    key = {"Idempotency-Key": "order-42"}
    request = body("slow:30:2")
    async with a.client.stream("POST", f"{a.url}/v1/stream", json=request, headers=key) as r:
        original = b"".join([chunk async for chunk in r.aiter_raw()])
        stream_id = r.headers["x-stream-id"]
    assert original.count(b"event: done") == 1
    await asyncio.sleep(0.1)  # A's mirror flushes within REDIS_FLUSH_MS
    async with b.client.stream("POST", f"{b.url}/v1/stream", json=request, headers=key) as r:
        replayed = b"".join([chunk async for chunk in r.aiter_raw()])
        assert r.headers["idempotent-replayed"] == "true"
        assert r.headers["x-stream-id"] == stream_id
    assert replayed == original
    # The same key with another body: 422 on B as on A.
    other = await b.client.post(f"{b.url}/v1/stream", json=body("slow:3:0"), headers=key)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"


async def test_an_idempotency_key_in_flight_on_a_is_a_409_on_b(replicas: ReplicaFactory) -> None:
    a, b = await replicas()
    key = {"Idempotency-Key": "busy"}
    request = body("slow:400:5")
    reader = asyncio.create_task(
        read_sse(a.client, "POST", f"{a.url}/v1/stream", json=request, headers=key)
    )
    await asyncio.sleep(0.3)
    response = await b.client.post(f"{b.url}/v1/stream", json=request, headers=key)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "IDEMPOTENCY_IN_FLIGHT"
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def test_fifteen_tool_calls_across_both_replicas_run_at_most_ten_at_a_time(
    replicas: ReplicaFactory,
) -> None:
    a, b = await replicas(TOOL_CONCURRENCY="10")
    runs = [(a if i % 2 else b).stream(body("tool:wait:600")) for i in range(15)]
    results = await asyncio.gather(*runs)
    spans = []
    pids = set()
    for events in results:
        assert_whole(events)
        (result,) = [e.data for e in events if e.event == "tool.result"]
        assert result["ok"] is True, result
        spans.append((result["result"]["started"], result["result"]["ended"]))
        pids.add(result["result"]["pid"])
    assert pids == {a.proc.pid, b.proc.pid}
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    # Each replica alone would let all of its 7 or 8 run, 15 in all; the shared limit
    # lets 10 run (a loaded machine may start them a little apart: at least 8 at once).
    assert 8 <= peak <= 10, spans


async def test_redis_killed_mid_stream(replicas: ReplicaFactory, redis_server: RedisServer) -> None:
    a, b = await replicas(REDIS_TIMEOUT_MS="300")
    killed = asyncio.Event()

    async def on_event(event: Event) -> None:
        if int(event.id) == 10:
            redis_server.kill()
            killed.set()

    events = await read_sse(
        a.client, "POST", f"{a.url}/v1/stream", json=body("slow:150:5"), on_event=on_event
    )
    assert killed.is_set()
    assert_whole(events)  # the running stream finished, every frame
    assert text_of(events) == words(150) and events[-1].data["reason"] == "stop"
    # What needs Redis: a typed 503, fast.
    for replica in (a, b):
        t0 = time.perf_counter()
        keyed = await replica.client.post(
            f"{replica.url}/v1/stream", json=body("slow:3:0"), headers={"Idempotency-Key": "k1"}
        )
        assert keyed.status_code == 503, keyed.text
        assert keyed.json()["error"]["code"] == "REDIS_UNAVAILABLE"
        assert keyed.json()["error"]["retryable"] is True
        other = await replica.client.get(f"{replica.url}/v1/streams/s_elsewhere")
        assert other.status_code == 503 and other.json()["error"]["code"] == "REDIS_UNAVAILABLE"
        assert time.perf_counter() - t0 < 2.0
    # What does not: a plain stream still runs, and the stream A ran resumes on A.
    plain = await b.stream(body("slow:5:0"))
    assert_whole(plain)
    stream_id = events[0].data["stream_id"]
    rest = await a.resume(stream_id, "140")
    assert [e.id for e in rest] == [str(i) for i in range(141, len(events) + 1)]


async def test_a_hung_redis_is_a_503_within_the_timeout(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    (a,) = await replicas(1, REDIS_TIMEOUT_MS="300")
    redis_server.pause()
    try:
        t0 = time.perf_counter()
        keyed = await a.client.post(
            f"{a.url}/v1/stream", json=body("slow:3:0"), headers={"Idempotency-Key": "k2"}
        )
        elapsed = time.perf_counter() - t0
        assert keyed.status_code == 503 and keyed.json()["error"]["code"] == "REDIS_UNAVAILABLE"
        assert elapsed < 1.5, elapsed
        plain = await a.stream(body("slow:5:0"))  # the mirror waits for Redis; not the stream
        assert_whole(plain)
    finally:
        redis_server.unpause()


async def test_replica_a_killed_mid_stream_ends_in_stream_lost_on_b(
    replicas: ReplicaFactory, redis_server: RedisServer
) -> None:
    a, b = await replicas()
    first = await read_some(a, "slow:2000:5", 20)
    stream_id = first[0].data["stream_id"]
    await asyncio.sleep(0.05)
    a.kill()
    t0 = time.perf_counter()
    rest = await asyncio.wait_for(b.resume(stream_id, first[-1].id), 10)
    assert time.perf_counter() - t0 < 5
    whole = first + rest
    assert_whole(whole)
    assert [e.event for e in whole[-2:]] == ["error", "done"]
    assert whole[-2].data["code"] == "STREAM_LOST" and whole[-2].data["retryable"] is True
    assert whole[-1].data["reason"] == "error"
    assert text_of(whole) == words(len(text_of(whole).split()))  # nothing skipped
    # A second reader, from the start: the same frames, the same end.
    again = await b.resume(stream_id, "0")
    assert [(e.id, e.event) for e in again] == [(e.id, e.event) for e in whole]
    # An idempotent replay of a lost stream: the same end, not a hang. (No key here.)
    assert redis_server.keys(f"tf:s:{stream_id}:*")


@dataclass(frozen=True)
class Limit:
    """The auth layer's RateLimit, as the limiter reads it."""

    requests: int = 0
    window_s: float = 60.0
    streams: int = 0


async def test_per_key_rate_limits_are_shared_by_the_replicas(redis_server: RedisServer) -> None:
    one, two = two_clusters(redis_server.url)
    await one.start(_noop)
    await two.start(_noop)
    try:
        limiters = [RedisRateLimiter(one), RedisRateLimiter(two)]
        limit = Limit(requests=3, window_s=60, streams=2)
        waits = [await limiters[i % 2].hit("key-a", limit) for i in range(5)]
        assert waits[:3] == [0, 0, 0]
        assert all(0 < w <= 60 for w in waits[3:])  # the Retry-After: when the window turns
        assert await limiters[1].hit("key-b", limit) == 0  # another key, its own count
        # Concurrent streams: two across both replicas, then none until one closes.
        assert await limiters[0].open_stream("key-a", limit)
        assert await limiters[1].open_stream("key-a", limit)
        assert not await limiters[0].open_stream("key-a", limit)
        await limiters[1].close_stream("key-a")
        assert await limiters[0].open_stream("key-a", limit)
        # A replica that dies with streams open gives them back when its leases run out
        # (REPLICA_TTL_S, 1 s here); a living one keeps its own (the heartbeat renews).
        await one.aclose()
        assert not await limiters[1].open_stream("key-a", limit)
        await asyncio.sleep(1.6)
        assert await limiters[1].open_stream("key-a", limit)
        assert await limiters[1].open_stream("key-a", limit)
        assert not await limiters[1].open_stream("key-a", limit)
        redis_server.kill()
        with pytest.raises(RedisUnavailable):
            await limiters[1].hit("key-a", limit)
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_replica_stopped_mid_stream_leaves_its_end_in_the_buffer(
    replicas: ReplicaFactory,
) -> None:
    a, b = await replicas()
    first = await read_some(a, "slow:2000:5", 10)
    stream_id = first[0].data["stream_id"]
    a.proc.terminate()  # SIGTERM: a deploy, a scale-down
    # uvicorn shuts down gracefully, then raises the signal again on its way out.
    assert await asyncio.to_thread(a.proc.wait, 15) in (0, -15)
    rest = await asyncio.wait_for(b.resume(stream_id, first[-1].id), 10)
    whole = first + rest
    assert_whole(whole)
    assert "error" not in [e.event for e in whole]
    assert whole[-1].data["reason"] == "shutdown"


async def _noop(stream_id: str, command: dict[str, Any]) -> dict[str, Any]:
    return {}


async def test_the_global_tool_slots_are_served_in_arrival_order_across_replicas(
    redis_server: RedisServer,
) -> None:
    one, two = two_clusters(redis_server.url)
    await one.start(_noop)
    await two.start(_noop)
    try:
        held = await one.slots.acquire(1)
        assert held is not None
        order: list[str] = []

        async def wait(cluster: RedisCluster, name: str) -> None:
            token = await cluster.slots.acquire(1)
            assert token is not None
            order.append(name)
            await asyncio.sleep(0.05)
            cluster.slots.release(token)

        waiters = []
        for cluster, name in [(two, "first"), (one, "second"), (two, "third")]:
            waiters.append(asyncio.create_task(wait(cluster, name)))
            await asyncio.sleep(0.05)  # queued in this order
        assert order == []
        one.slots.release(held)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert order == ["first", "second", "third"]
        # A waiter cancelled while queued leaves the queue: the next one is not stuck.
        held = await one.slots.acquire(1)
        assert held is not None
        stuck = asyncio.create_task(two.slots.acquire(1))
        await asyncio.sleep(0.05)
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)
        later = asyncio.create_task(two.slots.acquire(1))
        one.slots.release(held)
        assert await asyncio.wait_for(later, 2) is not None
    finally:
        await one.aclose()
        await two.aclose()


async def test_an_idempotency_key_is_claimed_once_across_replicas(
    redis_server: RedisServer,
) -> None:
    one, two = two_clusters(redis_server.url)
    try:
        claims = await asyncio.gather(
            one.idempotency.claim("k", "hash-a", "s_one"),
            two.idempotency.claim("k", "hash-b", "s_two"),
        )
        winner = [c for c in claims if c is None]
        assert len(winner) == 1
        (lost,) = [c for c in claims if c is not None]
        assert lost in {("hash-a", "s_one"), ("hash-b", "s_two")}
    finally:
        await one.aclose()
        await two.aclose()


async def test_without_redis_a_tool_slot_falls_back_to_the_replica_s_own_gate() -> None:
    from tests.replicas.conftest import free_port

    cluster = RedisCluster(
        f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        timeout_s=0.3,
        flush_s=0,
        replica_ttl_s=1,
        resume_ttl_s=1,
    )
    gate = cluster.gate(2)
    try:
        t0 = time.perf_counter()
        await gate.acquire()
        await gate.acquire()
        assert time.perf_counter() - t0 < 1.0  # refused at once: no wait for the timeout
        assert gate.active == 2 and gate.would_wait()  # the local limit still holds
        third = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.05)
        assert not third.done() and gate.depth == 1
        gate.release()
        await asyncio.wait_for(third, 2)
        gate.release()
        gate.release()
        assert gate.active == 0
        with pytest.raises(RedisUnavailable) as caught:
            await cluster.idempotency.claim("k", "h", "s_x")
        assert caught.value.http_status == 503
        assert caught.value.to_dict()["code"] == "REDIS_UNAVAILABLE"
    finally:
        await cluster.aclose()


async def test_redis_state_is_built_only_when_redis_url_is_set() -> None:
    from toolforge.api.app import _cluster
    from toolforge.settings import Settings

    assert _cluster(Settings(redis_url=None)) is None
    cluster = _cluster(
        Settings(redis_url="redis://127.0.0.1:1/0", redis_timeout_ms=250, redis_flush_ms=2)
    )
    assert cluster is not None
    try:
        assert cluster.conn.timeout_s == 0.25 and cluster.buffers.flush_s == 0.002
    finally:
        await cluster.aclose()


KEY_A = "tf-key-aaaaaaaaaaaaaaaaaaaa"
KEY_B = "tf-key-bbbbbbbbbbbbbbbbbbbb"


async def test_a_command_through_b_is_refused_from_another_api_key(
    replicas: ReplicaFactory, upstream: ScriptedUpstream
) -> None:
    """docs/security.md across replicas: a follow-up call forwarded to the replica that runs the
    stream carries the caller's key name, and that replica refuses another key's."""
    a, b = await replicas(API_KEYS=f"{KEY_A},{KEY_B}")
    seen: list[Event] = []
    started = asyncio.Event()

    async def on_event(event: Event) -> None:
        seen.append(event)
        if int(event.id) >= 5:
            started.set()

    reader = asyncio.create_task(
        read_sse(
            a.client,
            "POST",
            f"{a.url}/v1/stream",
            json=body("slow:2000:5"),
            headers={"Authorization": f"Bearer {KEY_A}"},
            on_event=on_event,
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    stream_id = seen[0].data["stream_id"]
    cancel = f"{b.url}/v1/streams/{stream_id}/cancel"
    nobody = await b.client.post(cancel)
    assert nobody.status_code == 401
    other = await b.client.post(cancel, headers={"Authorization": f"Bearer {KEY_B}"})
    assert other.status_code == 403, other.text
    assert other.json()["error"]["code"] == "FORBIDDEN"
    # A resume on B reads the stream's buffer in Redis: only the key that started it.
    resume = f"{b.url}/v1/streams/{stream_id}"
    stolen = await b.client.get(resume, headers={"Authorization": f"Bearer {KEY_B}"})
    assert stolen.status_code == 403, stolen.text
    assert stolen.json()["error"]["code"] == "FORBIDDEN"
    own = await b.client.post(cancel, headers={"Authorization": f"Bearer {KEY_A}"})
    assert own.status_code == 200, own.text
    assert own.json()["cancelled"] is True
    whole = await asyncio.wait_for(reader, 5)
    assert whole[-1].data["reason"] == "cancelled"
    replayed = await read_sse(b.client, "GET", resume, headers={"Authorization": f"Bearer {KEY_A}"})
    assert [e.id for e in replayed] == [e.id for e in whole]  # the owner's key reads it all


async def test_a_keys_rate_limit_is_shared_by_the_replicas(
    replicas: ReplicaFactory, upstream: ScriptedUpstream
) -> None:
    """With REDIS_URL and keys, the per-key request limit counts on Redis: 3 requests in
    the window, spread over two replicas, and the 4th is refused on either."""
    a, b = await replicas(API_KEYS=KEY_A, RATE_LIMIT_REQUESTS="3", RATE_LIMIT_WINDOW_S="60")
    auth = {"Authorization": f"Bearer {KEY_A}"}
    codes = [(await r.client.get(f"{r.url}/v1/tools", headers=auth)).status_code for r in (a, b, a)]
    assert codes == [200, 200, 200]
    refused = await b.client.get(f"{b.url}/v1/tools", headers=auth)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert (await a.client.get(f"{a.url}/v1/tools", headers=auth)).status_code == 429
