"""``toolforge serve --workers 2`` with Redis: two processes on one port, each a replica of
its own. A stream started on one worker is resumed, cancelled and approved through the
other; without Redis (or without an upstream URL) the command refuses to start.

Which worker answers a connection is the kernel's choice; a kept-alive connection stays
with the worker that accepted it. Each test therefore holds clients of one connection each
and opens new ones until two of them name different replicas in ``/readyz``'s details.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.replicas.conftest import (
    ROOT,
    RedisServer,
    _end,
    _wait_port,
    assert_whole,
    choose,
    free_port,
    read_sse,
    tool_turns,
)
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step

PROPOSE_ARGS = '{"key": "guest.name", "value": "Ada", "reason": "the user said so"}'


def _script(request: Any) -> Script:
    """``propose``: the workspace pack's facts.propose, then a reply; else as the
    replicas' upstream (``slow:N:MS``)."""
    if isinstance(request, dict) and request.get("model") == "propose":
        done = any("Result of tool call" in str(m.get("content")) for m in request["messages"])
        call, reply = tool_turns("facts.propose", PROPOSE_ARGS)
        text = reply if done else call
        return Script(steps=tuple(Step(text=text[i : i + 6]) for i in range(0, len(text), 6)))
    return choose(request)


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream(script_for=_script) as up:
        yield up


def _command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from toolforge.cli import main; main()", "serve", *args]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def two_workers(
    redis_server: RedisServer, upstream: ScriptedUpstream, tmp_path: Path
) -> Iterator[Served]:
    port = free_port()
    log = tmp_path / "serve.log"
    environ = {
        **os.environ,
        "UPSTREAM_BASE_URL": upstream.base_url,
        "REDIS_URL": redis_server.url,
        "ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "TOOL_PACKS": "demo,workspace",
        "LOG_LEVEL": "WARNING",
        "UPSTREAM_PRECONNECT": "false",
        "KEEPALIVE_TIMEOUT_S": "120",  # a test's client keeps its worker for the test
        "PING_INTERVAL_S": "1",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            _command("--port", str(port), "--workers", "2"),
            cwd=ROOT,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        _wait_port(port, proc, "toolforge serve --workers 2", log)
        yield Served(f"http://127.0.0.1:{port}", proc, log)
    finally:
        _end(proc)


async def _replica(client: httpx.AsyncClient, served: Served) -> str:
    """The replica (worker) this client's connection reaches, once it can serve.

    Each try waits 5 s at most, and a try that times out closes its connection, so the
    next one may reach the other worker. Thirty seconds without an answer fail with what
    each try got and the workers' log."""
    tries: list[str] = []
    started = time.monotonic()
    try:
        async with asyncio.timeout(30):
            while True:
                at = time.monotonic() - started
                try:
                    answer = await client.get(f"{served.url}/readyz", timeout=5)
                except httpx.TransportError as exc:
                    tries.append(f"{at:.1f} s: {exc!r}")
                else:
                    if answer.status_code == 200:
                        return str(answer.json()["replica"])
                    tries.append(f"{at:.1f} s: {answer.status_code} {answer.text[:200]}")
                await asyncio.sleep(0.1)
    except TimeoutError:
        log = served.log.read_text(errors="replace")[-4000:]
        raise AssertionError(
            "no worker answered /readyz in 30 s; tries:\n" + "\n".join(tries) + f"\nlog:\n{log}"
        ) from None


class Pinned:
    """Clients of one connection each, opened until one reaches the worker wanted."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self._opened: list[httpx.AsyncClient] = []

    async def client(self, *, on: str | None = None, not_on: str | None = None) -> Any:
        """``(replica, client)``: a client whose connection reaches replica ``on`` (any
        when None) and not ``not_on``."""
        async with asyncio.timeout(60):
            while True:
                client = httpx.AsyncClient(
                    timeout=30, limits=httpx.Limits(max_connections=1, keepalive_expiry=120)
                )
                self._opened.append(client)
                replica = await _replica(client, self.served)
                if (on is None or replica == on) and replica != not_on:
                    return replica, client

    async def aclose(self) -> None:
        for client in self._opened:
            await client.aclose()


@contextlib.asynccontextmanager
async def _pinned(served: Served) -> AsyncIterator[Pinned]:
    pinned = Pinned(served)
    try:
        yield pinned
    finally:
        await pinned.aclose()


def _body(model: str, **fields: Any) -> dict[str, Any]:
    return {"input": "x", "model": model, "mode": "sentinel", **fields}


def _text(events: list[Event]) -> str:
    return "".join(e.data["chunk"] for e in events if e.event == "text.delta")


async def test_a_stream_on_one_worker_is_resumed_cancelled_and_approved_through_the_other(
    two_workers: Served,
) -> None:
    url = two_workers.url
    async with _pinned(two_workers) as pinned:
        # Resumed: read 10 frames on one worker, leave, read the rest through the other.
        replica_a, a = await pinned.client()
        first = await read_sse(
            a,
            "POST",
            f"{url}/v1/stream",
            json=_body("slow:60:5", on_disconnect="continue"),
            until=lambda e: int(e.id) >= 10,
        )
        stream_id = first[0].data["stream_id"]
        replica_b, b = await pinned.client(not_on=replica_a)
        rest = await read_sse(
            b, "GET", f"{url}/v1/streams/{stream_id}", headers={"Last-Event-ID": first[-1].id}
        )
        whole = first + rest
        assert_whole(whole)
        assert _text(whole) == "".join(f"w{i} " for i in range(60))

        # Cancelled: a long stream read on B's worker, stopped through A's.
        seen: list[Event] = []
        going = asyncio.Event()

        async def on_event(event: Event) -> None:
            seen.append(event)
            if int(event.id) >= 3:
                going.set()

        reading = asyncio.create_task(
            read_sse(b, "POST", f"{url}/v1/stream", json=_body("slow:5000:5"), on_event=on_event)
        )
        await asyncio.wait_for(going.wait(), 10)
        _, other = await pinned.client(not_on=replica_b)
        cancelled = await other.post(f"{url}/v1/streams/{seen[0].data['stream_id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["cancelled"] is True
        events = await asyncio.wait_for(reading, 10)
        assert_whole(events)
        assert events[-1].data["reason"] == "cancelled"

        # Approved: the workspace pack's confirming call waits on one worker; the other
        # answers it.
        replica_c, c = await pinned.client()
        _, approver = await pinned.client(not_on=replica_c)
        answers: list[httpx.Response] = []

        async def approve(event: Event) -> None:
            if event.event == "stream.begin":
                approve.stream_id = event.data["stream_id"]  # type: ignore[attr-defined]
            if event.event == "tool.call" and event.data.get("needs_approval"):
                sid = approve.stream_id  # type: ignore[attr-defined]
                answers.append(
                    await approver.post(
                        f"{url}/v1/streams/{sid}/approvals/{event.data['id']}",
                        json={"approve": True},
                    )
                )

        events = await asyncio.wait_for(
            read_sse(c, "POST", f"{url}/v1/stream", json=_body("propose"), on_event=approve), 20
        )
        assert_whole(events)
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        assert answer.json()["approved"] is True
        results = [e.data for e in events if e.event == "tool.result"]
        assert [r["ok"] for r in results] == [True, True]
        assert events[-1].data["reason"] == "stop"
        # Each command went through a connection that stayed on the other worker.
        assert await _replica(approver, two_workers) != replica_c
        assert await _replica(b, two_workers) == replica_b


@pytest.mark.parametrize(
    ("environ", "needs"),
    [
        ({"UPSTREAM_BASE_URL": "http://127.0.0.1:9/v1"}, "REDIS_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:9/0"}, "UPSTREAM_BASE_URL"),
    ],
)
def test_more_than_one_worker_is_refused_without_what_it_needs(
    environ: dict[str, str], needs: str, tmp_path: Path
) -> None:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "UPSTREAM_BASE_URL", "GROQ_BASE_URL")
    }
    done = subprocess.run(
        _command("--port", str(free_port()), "--workers", "2"),
        cwd=ROOT,
        env={**clean, "ARTIFACTS_DIR": str(tmp_path), **environ},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    message = done.stderr.decode()
    assert f"--workers 2 needs {needs}" in message and "docs/deployment.md" in message
    assert "Traceback" not in message


def test_workers_must_be_a_positive_number(tmp_path: Path) -> None:
    done = subprocess.run(
        _command("--workers", "0"), cwd=ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert b"at least 1" in done.stderr


def test_the_ready_detail_names_no_replica_without_redis() -> None:
    from toolforge.runtime.readiness import Readiness

    assert "replica" not in Readiness(True, "u").details(0.0)
    assert Readiness(True, "u", replica="r_1").details(0.0)["replica"] == "r_1"
    assert orjson.dumps(Readiness(True, "u").details(0.0))
