"""Limits on what one client may hold, tried as an attacker would on loopback: streams that
outlive their connection (``on_disconnect: "continue"``), a thousand model names, and a
key guessed over and over. A real gateway in front of a scripted upstream."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest

from tests.api.conftest import Harness, HarnessFactory, open_raw_stream, sentinel_reply
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script

KEY = "tf-key-limits-aaaaaaaaaaaa"
WRONG = "tf-key-limits-guessed-zzzz"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city, from the user's device.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# A stream that waits for the client's tool result: it runs with no upstream traffic, for
# as long as the test wants, and goes on after its client leaves.
LINGERING = {
    "input": "Weather in Oslo?",
    "client_tools": [WEATHER],
    "tools": [],
    "on_disconnect": "continue",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def calling_client_tool() -> Script:
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", "get_weather", '{"city": "Oslo"}')
    return Script.from_tokens(["Checking. ", call])


async def start_and_leave(gw: Harness) -> str:
    """Start a lingering stream, read until its tool call, hang up; its id."""
    reader, writer = await open_raw_stream(gw, LINGERING, headers=bearer(KEY), close=True)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    begin = await reader.readuntil(b"event: tool.call")
    writer.close()
    match = re.search(rb'"stream_id":"(s_[0-9a-f]+)"', begin)
    assert match is not None
    return match.group(1).decode()


async def post_stream(gw: Harness) -> int:
    async with gw.client.stream(
        "POST", f"{gw.url}/v1/stream", json=LINGERING, headers=bearer(KEY)
    ) as response:
        return response.status_code


async def test_streams_that_go_on_without_their_client_keep_their_slots(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [calling_client_tool(), calling_client_tool(), Script.from_tokens([sentinel_reply()])],
        api_keys=KEY,
        rate_limit_streams=2,
    )
    first = await start_and_leave(gw)
    second = await start_and_leave(gw)
    await asyncio.sleep(0.2)  # both responses have ended on the server's side
    for stream_id in (first, second):
        assert gw.gateway.registry.get(stream_id).running
    # Two still run: a third is refused, however often it is tried.
    for _ in range(3):
        third = await gw.client.post(f"{gw.url}/v1/stream", json=LINGERING, headers=bearer(KEY))
        assert third.status_code == 429 and third.json()["error"]["code"] == "RATE_LIMITED"
    # Resuming one of them is no new stream: allowed, and its end frees nothing.
    async with gw.client.stream(
        "GET", f"{gw.url}/v1/streams/{first}", headers=bearer(KEY)
    ) as resumed:
        assert resumed.status_code == 200
        async for line in resumed.aiter_lines():
            if line == "event: tool.call":
                break
    await asyncio.sleep(0.1)
    assert (
        await gw.client.post(f"{gw.url}/v1/stream", json={}, headers=bearer(KEY))
    ).status_code == 429
    # The first stream gets its result and ends: its slot comes back, and only then.
    answered = await gw.client.post(
        f"{gw.url}/v1/streams/{first}/tool_results/t1",
        json={"ok": True, "result": {"sky": "clear"}},
        headers=bearer(KEY),
    )
    assert answered.status_code == 200
    async with asyncio.timeout(10):
        await gw.gateway.registry.get(first).wait()
    await asyncio.sleep(0.05)  # the slot goes back right after the stream's end
    fourth = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "hi"}, headers=bearer(KEY))
    assert fourth.status_code == 200, fourth.text
    assert gw.gateway.registry.get(second).running
    gw.gateway.registry.get(second).cancel()


def _model_series(text: str) -> set[str]:
    return set(re.findall(r'toolforge_streams_total\{[^}]*model="([^"]*)"', text))


async def test_a_thousand_model_names_leave_metrics_bounded(
    make_gateway: HarnessFactory,
) -> None:
    # No scripts: every stream ends at once in an upstream error, still counted by model.
    gw = await make_gateway(model_id="served-model", metrics_models="second-model")

    async def streams(names: list[str]) -> None:
        sem = asyncio.Semaphore(16)

        async def one(name: str) -> None:
            async with sem:
                body = {"input": "hi", "mode": "sentinel", "model": name}
                response, _ = await gw.raw("POST", "/v1/stream", json=body)
                assert response.status_code == 200

        await asyncio.gather(*(one(n) for n in names))
        await gw.settle(timeout_s=60)

    await streams(["served-model", "second-model", "client-a", "client-b"])
    before = (await gw.client.get(f"{gw.url}/metrics")).text
    assert _model_series(before) == {"served-model", "second-model", "other"}
    await streams([f"client-{i:04d}" for i in range(1000)])
    after = (await gw.client.get(f"{gw.url}/metrics")).text
    assert _model_series(after) == {"served-model", "second-model", "other"}
    assert "client-0" not in after
    # The same series with bigger numbers: a few bytes more, not one series per name.
    assert len(after) - len(before) < 2_000, (len(before), len(after))


async def test_mode_probes_are_kept_for_the_most_recent_models_only(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(mode_cache_models=4)
    for i in range(20):
        body = {"input": "hi", "mode": "auto", "model": f"probe-{i}"}
        await gw.raw("POST", "/v1/stream", json=body)
    planner = gw.gateway.planner
    assert list(planner.modes) == [f"probe-{i}" for i in range(16, 20)]
    probes = len(gw.upstream.all_requests) - len(gw.upstream.requests)
    # A name seen again recently costs no probe; one pushed out is probed again.
    await gw.raw("POST", "/v1/stream", json={"input": "hi", "mode": "auto", "model": "probe-19"})
    assert len(gw.upstream.all_requests) - len(gw.upstream.requests) == probes
    assert list(planner.modes)[-1] == "probe-19"


def _failures(text: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'toolforge_auth_failures_total\{reason="(\w+)"\} ([0-9.e+]+)', text)
    }


async def test_failed_auth_is_counted_logged_without_the_key_and_throttled(
    make_gateway: HarnessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    gw = await make_gateway(
        api_keys=KEY,
        metrics_public=True,
        auth_failure_limit=3,
        auth_failure_window_s=3600,
        log_level="INFO",
    )
    tools = f"{gw.url}/v1/tools"
    assert (await gw.client.get(tools)).status_code == 401  # no key: counted, not throttled
    for _ in range(3):
        refused = await gw.client.get(tools, headers=bearer(WRONG))
        assert refused.status_code == 401
    # The limit reached: this address is refused, the right key too, until the window ends.
    for headers in (bearer(WRONG), bearer(KEY)):
        throttled = await gw.client.get(tools, headers=headers)
        assert throttled.status_code == 429
        assert throttled.json()["error"]["code"] == "RATE_LIMITED"
        assert 1 <= int(throttled.headers["retry-after"]) <= 3600
    streamed = await gw.client.post(f"{gw.url}/v1/stream", json={}, headers=bearer(KEY))
    assert streamed.status_code == 429  # the fast path too
    assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200  # never limited
    assert (await gw.client.get(f"{gw.url}/readyz")).status_code in (200, 503)
    counted = _failures((await gw.client.get(f"{gw.url}/metrics")).text)
    assert counted["missing"] == 1 and counted["wrong"] == 3 and counted["throttled"] == 3
    logs = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    failed = [e for e in logs if e.get("event") == "auth.failed"]
    assert [e["reason"] for e in failed] == ["missing", "wrong", "wrong", "wrong"]
    assert all(e["client"] == "127.0.0.1" and e["path"] == "/v1/tools" for e in failed)
    assert any(e.get("event") == "auth.throttled" for e in logs)
    assert not any(WRONG in str(e) or KEY in str(e) for e in logs)
