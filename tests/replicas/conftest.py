"""Two gateway processes and a real ``redis-server`` on loopback (docs/deployment.md).

- ``redis_server``: Debian's ``redis-server`` on a free 127.0.0.1 port, without
  persistence, killed after the test (``make test`` installs the package when missing; a
  test fails with that instruction otherwise, it is never skipped).
- ``upstream``: the scripted upstream, in the test's own event loop, chosen by the
  request's ``model`` (:func:`choose`), so either replica gets the same script.
- ``replicas``: starts gateway processes (``tests.replicas.replica``: ``toolforge serve``
  with the tests' tools) in front of both, each with its own artifacts directory; every
  process is ended after the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
from httpx_sse import aconnect_sse

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} in 30 s:\n{log.read_text()}")


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# -- Redis ---------------------------------------------------------------------------------


class RedisServer:
    """A ``redis-server`` process of this test's own."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = workdir / "redis.log"
        self._args = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--logfile",
            str(self.log),
        ]
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self._args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait_port(self.port, proc, "redis-server", self.log)
        return proc

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def keys(self, pattern: str = "tf:*") -> list[str]:
        with contextlib.closing(self.client()) as client:
            return sorted(k.decode() for k in client.scan_iter(pattern, count=1000))

    def kill(self) -> None:
        """SIGKILL: Redis gone at once, connections reset."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def restart(self) -> None:
        """SIGKILL, then a new ``redis-server`` on the same port: Redis back, empty (no
        persistence), its scripts forgotten."""
        self.kill()
        self.proc = self._start()

    def pause(self) -> None:
        """SIGSTOP: Redis accepts nothing and answers nothing (a hung server)."""
        self.proc.send_signal(signal.SIGSTOP)

    def unpause(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        _end(self.proc)


def redis_binary() -> str:
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if binary is None:
        pytest.fail(
            "redis-server is not installed: `make test` installs Debian's redis-server package "
            "when it can (root and apt-get); else install it (apt-get install redis-server)"
        )
    return binary


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(redis_binary(), tmp_path)
    try:
        yield server
    finally:
        server.stop()


# -- the upstream ----------------------------------------------------------------------------


def tool_turns(name: str, args: str) -> tuple[str, str]:
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", name, args)
    reply = sentinels.frame(FrameKind.RESULT, "r1", "AssistantReply", '{"answer": "Done."}')
    return "Calling. " + call, "Here. " + reply


def _tools_done(request: dict[str, Any]) -> int:
    return sum(
        1
        for m in request.get("messages", [])
        if isinstance(m, dict) and str(m.get("content", "")).startswith("Result of tool call")
    )


def choose(request: Any) -> Script:
    """The script for a chat request, by its ``model``:

    - ``slow:N:MS``: N tokens ``w{i} ``, MS apart;
    - ``tool:NAME:MS``: a call of tool NAME (``wait`` with ``ms``, ``guarded``, or the
      client tool ``get_weather``), then, once its result is in the messages, a reply.
    """
    if not isinstance(request, dict) or "messages" not in request:
        return Script(end="status", status=200, body='{"object":"list","data":[]}')
    kind, *args = str(request.get("model", "")).split(":")
    if kind == "slow":
        n, ms = int(args[0]), float(args[1])
        return Script.from_tokens([f"w{i} " for i in range(n)], delay_ms=ms)
    if kind == "tool":
        name = args[0]
        arguments = {
            "wait": f'{{"ms": {args[1] if len(args) > 1 else 300}}}',
            "guarded": '{"what": "launch"}',
            "get_weather": '{"city": "Oslo"}',
        }[name]
        call, reply = tool_turns(name, arguments)
        text = reply if _tools_done(request) else call
        return Script(steps=tuple(Step(text=text[i : i + 6]) for i in range(0, len(text), 6)))
    raise ValueError(f"no script for model {request.get('model')!r}")


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream(script_for=choose) as up:
        yield up


# -- the replicas ------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    artifacts: Path
    log: Path
    client: httpx.AsyncClient = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    async def stream(
        self, body: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> list[Event]:
        return await read_sse(
            self.client, "POST", f"{self.url}/v1/stream", json=body, headers=dict(headers or {})
        )

    async def resume(self, stream_id: str, last_id: str) -> list[Event]:
        return await read_sse(
            self.client,
            "GET",
            f"{self.url}/v1/streams/{stream_id}",
            headers={"Last-Event-ID": last_id},
        )

    async def metric(self, name: str) -> float:
        text = (await self.client.get(f"{self.url}/metrics")).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name}")


async def read_sse(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    until: Callable[[Event], bool] | None = None,
    on_event: Callable[[Event], Awaitable[None]] | None = None,
    **kwargs: Any,
) -> list[Event]:
    """The events of one SSE response (pings left out); ``until``: drop the connection
    right after the first event it accepts."""
    events: list[Event] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            if sse.event == "ping":
                continue
            event = Event(sse.id, sse.event, orjson.loads(sse.data))
            events.append(event)
            if on_event is not None:
                await on_event(event)
            if until is not None and until(event):
                break
    return events


def assert_whole(events: list[Event]) -> None:
    """Ids 1..n, each once, in order; exactly one ``done``, last."""
    assert [int(e.id) for e in events] == list(range(1, len(events) + 1)), [e.id for e in events]
    assert [e.event for e in events].count("done") == 1 and events[-1].event == "done"


def _spawn_replica(port: int, environ: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out_file:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.replicas.replica", "--port", str(port)],
            cwd=ROOT,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=out_file,
        )


ReplicaFactory = Callable[..., Awaitable[list[Replica]]]


@pytest.fixture
async def replicas(
    redis_server: RedisServer, upstream: ScriptedUpstream, tmp_path: Path
) -> AsyncIterator[ReplicaFactory]:
    started: list[Replica] = []

    async def start(n: int = 2, **env: str) -> list[Replica]:
        out = []
        for _ in range(n):
            name = "ABCDEFGH"[len(started)]
            port = free_port()
            artifacts = Path(tempfile.mkdtemp(prefix=f"replica{name}-", dir=tmp_path))
            log = artifacts.parent / f"replica{name}.log"
            environ = {
                **os.environ,
                "UPSTREAM_BASE_URL": upstream.base_url,
                "REDIS_URL": redis_server.url,
                "ARTIFACTS_DIR": str(artifacts),
                "LOG_LEVEL": "WARNING",
                "UPSTREAM_PRECONNECT": "false",
                "REPLICA_TTL_S": "1",
                "PING_INTERVAL_S": "1",
                **env,
            }
            proc = _spawn_replica(port, environ, log)
            await asyncio.to_thread(_wait_port, port, proc, f"replica {name}", log)
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(30.0), limits=httpx.Limits(max_connections=None)
            )
            replica = Replica(name, port, proc, artifacts, log, client)
            started.append(replica)
            out.append(replica)
        return out

    try:
        yield start
    finally:
        for replica in started:
            await replica.client.aclose()
            await asyncio.to_thread(_end, replica.proc)
