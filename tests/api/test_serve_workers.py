"""``serve_workers``' sockets: a worker's share of the port takes connections only once the
worker can serve, and closes with the worker.

The workers here are small asyncio servers that answer each connection with their index
(``loop.create_server(sock=...)``, as uvicorn serves a socket it is given); the second one
starts serving only after a delay, as a worker whose app is slow to start. The supervisor
is the real one, in a process of its own (it installs signal handlers).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOW_START_S = 4.0


def _answering_worker(sock: socket.socket, index: int) -> None:
    """Worker ``index``: answers each connection with its index; worker 1 starts serving
    ``SLOW_START_S`` late, worker 2 never (it exits at once)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(str(index).encode())
        await writer.drain()
        writer.close()

    async def main() -> None:
        if index == 1:
            await asyncio.sleep(SLOW_START_S)
        server = await asyncio.start_server(answer, sock=sock)
        async with server:
            await server.serve_forever()

    if index == 2:
        time.sleep(SLOW_START_S)
        raise SystemExit(3)
    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _supervise(port: int, workers: int) -> subprocess.Popen[bytes]:
    code = (
        "import sys; from toolforge.api.serve import serve_workers; "
        "from tests.api.test_serve_workers import _answering_worker; "
        f"sys.exit(serve_workers(_answering_worker, workers={workers}, "
        f"host='127.0.0.1', port={port}))"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE)


def _ask(port: int, timeout: float) -> str:
    """The index of the worker that answers a new connection ('' when the connection is
    refused or reset)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            return conn.recv(8).decode()
    except (ConnectionRefusedError, ConnectionResetError):
        return ""


@pytest.fixture
def port() -> int:
    return _free_port()


@pytest.fixture
def supervised(port: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def _first_answer(port: int, limit_s: float) -> str:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        answer = _ask(port, timeout=1.0)
        if answer:
            return answer
        time.sleep(0.05)
    raise AssertionError(f"no worker answered on port {port} within {limit_s} s")


def test_a_worker_still_starting_is_given_no_connection(
    port: int, supervised: list[subprocess.Popen[bytes]]
) -> None:
    supervised.append(_supervise(port, 2))
    assert _first_answer(port, 30) == "0"
    # Worker 1 is still starting: every new connection is worker 0's, at once (a socket
    # listening early would hold about half of them until worker 1 came up).
    started = time.monotonic()
    answers = [_ask(port, timeout=1.0) for _ in range(40)]
    assert time.monotonic() - started < SLOW_START_S - 1, "the probe ran past the slow start"
    assert answers == ["0"] * 40
    # Once worker 1 serves, the kernel spreads new connections over both.
    deadline = time.monotonic() + 30
    seen: Counter[str] = Counter()
    while seen["1"] == 0 and time.monotonic() < deadline:
        seen[_ask(port, timeout=1.0)] += 1
    assert seen["1"] > 0, f"worker 1 never answered: {dict(seen)}"
    # The supervisor kept no copy of the workers' sockets: each closes with its worker.
    assert _sockets_on(supervised[0].pid, port) == set()


def _sockets_on(pid: int, port: int) -> set[str]:
    """The inodes of process ``pid``'s sockets bound to local ``port``."""
    inodes = {
        os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:[") : -1]
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
    }
    bound = {
        line.split()[9]
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        if os.path.exists(table)
        for line in Path(table).read_text().splitlines()[1:]
        if line.split()[1].endswith(f":{port:04X}")
    }
    return inodes & bound


def test_a_port_in_use_fails_before_any_worker_starts(
    port: int, supervised: list[subprocess.Popen[bytes]]
) -> None:
    with socket.create_server(("127.0.0.1", port)) as taken:
        busy = _supervise(port, 2)
        supervised.append(busy)
        assert busy.wait(30) != 0
        assert busy.stderr is not None
        assert b"Address already in use" in busy.stderr.read()
        taken.close()
    supervised.append(_supervise(port, 2))
    assert _first_answer(port, 30) == "0"


def test_a_worker_that_exits_stops_the_others_and_the_port(
    port: int, supervised: list[subprocess.Popen[bytes]]
) -> None:
    """Worker 2 exits before it serves: the supervisor stops the others and exits with its
    code, and nothing listens on the port afterwards."""
    proc = _supervise(port, 3)
    supervised.append(proc)
    assert _first_answer(port, 30) in {"0", "1"}
    assert proc.wait(60) == 3
    assert proc.stderr is not None
    assert b"exited with 3" in proc.stderr.read()
    assert _ask(port, timeout=1.0) == ""
    assert not any(
        f":{port:04X} " in line and line.split()[3] == "0A"  # 0A: LISTEN
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        if os.path.exists(table)
        for line in Path(table).read_text().splitlines()[1:]
    )
