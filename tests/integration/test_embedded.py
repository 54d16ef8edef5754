"""The embedded default on the real llama-server: servers, decisions, crashes, streams."""

from __future__ import annotations

import asyncio
import os
import signal

import orjson
from httpx_sse import aconnect_sse

from tests.integration.conftest import Live
from toolforge.runtime.server_manager import ServerState


async def test_servers_report_the_managed_server_and_the_cpu_decision(live: Live) -> None:
    body = (await live.client.get(f"{live.url}/v1/servers")).json()
    assert body["upstream"]["managed"] is True and body["upstream"]["kind"] == "llama_server"
    assert body["upstream"]["model"] == "SmolLM2-135M-Instruct"
    (server,) = body["servers"]
    assert server["state"] == "ready" and server["backend"] == "llama-server"
    assert server["total_slots"] == 2 and server["slot_n_ctx"] == 4096  # full on a CPU
    # LLAMA_NICE's default: the server runs 10 below the gateway's CPU priority.
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, server["pid"]) == min(ours + 10, 19)
    budget = body["budget"]
    assert budget["device"] == "cpu" and budget["budget_tokens"] == 4096
    assert "no NVIDIA GPU" in budget["reason"]
    assert body["nvml"]["gpu"] is None and body["nvml"]["reason"]
    ready = await live.client.get(f"{live.url}/readyz")
    assert ready.status_code == 200


async def test_a_crash_mid_stream_ends_it_with_an_error_and_the_server_comes_back(
    live: Live,
) -> None:
    (server,) = live.gateway.servers.servers()  # type: ignore[union-attr]
    assert server.process is not None
    pid = server.process.pid
    body = {
        "input": "Write a very long story about a lighthouse keeper.",
        "mode": "sentinel",
        "sampling": {"max_tokens": 400, "temperature": 0.8, "seed": 1},
    }
    names: list[str] = []
    errors: list[dict[str, object]] = []
    async with aconnect_sse(live.client, "POST", f"{live.url}/v1/stream", json=body) as sse:
        async for event in sse.aiter_sse():
            names.append(event.event)
            if event.event == "text.delta" and names.count("text.delta") == 3:
                os.kill(pid, signal.SIGKILL)  # the server dies while it generates
            if event.event == "error":
                errors.append(orjson.loads(event.data))
    assert names[-2:] == ["error", "done"]
    assert str(errors[0]["code"]).startswith("UPSTREAM_")
    for _ in range(200):  # the manager notices and restarts it on the same port
        if server.state is ServerState.READY and server.restarts == 1:
            break
        await asyncio.sleep(0.05)
    assert server.restarts == 1 and server.state is ServerState.READY
    assert server.process.pid != pid and server.last_exit == -signal.SIGKILL
    again = await live.stream({"input": "Say hello.", "mode": "sentinel",
                               "sampling": {"max_tokens": 8}})  # fmt: skip
    assert again[-1].event == "done" and "error" not in [e.event for e in again]
