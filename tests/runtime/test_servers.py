"""ServerManager against real processes on loopback (a stand-in for llama-server's process
life: tests/runtime/fake_llama_server.py); the real llama-server is in tests/integration."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from toolforge.errors import ErrorCode, ServerError
from toolforge.runtime.server_manager import LlamaServerSpec, ServerManager, ServerState

FAKE = Path(__file__).with_name("fake_llama_server.py")


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[ServerManager]:
    async with httpx.AsyncClient() as client:
        manager = ServerManager(client, tmp_path / "logs", start_timeout_s=10, max_restarts=2)
        try:
            yield manager
        finally:
            await manager.aclose()


def spec(binary: Path, *args: str) -> LlamaServerSpec:
    return LlamaServerSpec(binary, Path("/models/m.gguf"), "m", ("--ctx-size", "8192", *args))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes: its exit status just has not been collected.
    return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


async def wait_for(predicate: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_start_polls_health_then_reads_props(manager: ServerManager, binary: Path) -> None:
    server = await manager.ensure(spec(binary, "--parallel", "2"), budget={"budget_tokens": 4096})
    assert server.state is ServerState.READY
    assert server.slot_n_ctx == 4096 and server.props["total_slots"] == 2
    assert server.ready_s is not None and server.ready_s >= 0.2  # waited out the 503s
    described = server.describe()
    assert described["state"] == "ready" and described["budget"] == {"budget_tokens": 4096}
    assert described["base_url"] == f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.base_url}/health")).status_code == 200


@pytest.mark.parametrize("nice", [0, 7])
async def test_the_server_runs_nice_below_the_gateway(
    binary: Path, tmp_path: Path, nice: int
) -> None:
    # LLAMA_NICE: the server's threads (which inherit it) yield the CPU to the gateway.
    async with httpx.AsyncClient() as client:
        manager = ServerManager(client, tmp_path / "logs", start_timeout_s=10, nice=nice)
        try:
            server = await manager.ensure(spec(binary))
            assert server.process is not None
            ours = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, server.process.pid) == min(ours + nice, 19)
        finally:
            await manager.aclose()


async def test_same_spec_is_reused_and_another_spec_starts_another(
    manager: ServerManager, binary: Path
) -> None:
    first = await manager.ensure(spec(binary))
    again = await manager.ensure(spec(binary))
    other = await manager.ensure(spec(binary, "--cache-type-k", "q8_0"))
    assert again is first and first.process is not None and again.process is first.process
    assert other is not first and other.port != first.port
    assert len(manager.servers()) == 2


async def test_stop_and_aclose_leave_nothing_running(manager: ServerManager, binary: Path) -> None:
    a = await manager.ensure(spec(binary))
    b = await manager.ensure(spec(binary, "--parallel", "3"))
    assert a.process is not None and b.process is not None
    pids = [a.process.pid, b.process.pid]
    await manager.stop(a)
    assert a.state is ServerState.STOPPED and not alive(pids[0]) and alive(pids[1])
    await manager.aclose()
    assert b.state is ServerState.STOPPED and not alive(pids[1])


async def test_a_crash_is_reported_then_restarted_on_the_same_port(
    manager: ServerManager, binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER_S", "0.5")
    monkeypatch.setenv("FAKE_CRASH_MARKER", str(tmp_path / "crashed-once"))
    seen: list[ServerState] = []
    manager._on_change = lambda server: seen.append(server.state)
    server = await manager.ensure(spec(binary))
    assert server.process is not None
    first_pid, port = server.process.pid, server.port
    await wait_for(lambda: server.restarts == 1 and server.state is ServerState.READY)
    assert server.process.pid != first_pid and server.port == port
    assert server.last_exit == 134 and "exited with status 134" in (server.last_error or "")
    assert ServerState.CRASHED in seen  # /v1/servers could see it crashed
    assert "crashing as asked" in server.log_path.read_text()


async def test_a_server_that_keeps_crashing_is_given_up(
    manager: ServerManager, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CRASH_AFTER_S", "0.3")
    server = await manager.ensure(spec(binary))
    await wait_for(lambda: server.state is ServerState.FAILED, within_s=20)
    assert server.restarts == 2 and "not restarted after 2 restarts" in (server.last_error or "")


async def test_exit_at_start_is_a_typed_error_with_the_log_tail(
    manager: ServerManager, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_EXIT_AT_START", "3")
    with pytest.raises(ServerError) as caught:
        await manager.ensure(spec(binary))
    assert caught.value.code is ErrorCode.SERVER_START_FAILED
    assert "exited with status 3" in caught.value.message
    assert "failing at start as asked" in caught.value.message  # the log's tail
    assert manager.servers()[0].state is ServerState.FAILED


async def test_never_healthy_times_out_and_kills_the_process(
    tmp_path: Path, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NEVER_HEALTHY", "1")
    async with httpx.AsyncClient() as client:
        manager = ServerManager(client, tmp_path / "logs", start_timeout_s=1)
        with pytest.raises(ServerError) as caught:
            await manager.ensure(spec(binary))
        server = manager.servers()[0]
        assert caught.value.code is ErrorCode.SERVER_START_FAILED
        assert "not healthy after 1 s (HTTP 503)" in caught.value.message
        assert server.process is not None and not alive(server.process.pid)
        await manager.aclose()


async def test_a_failed_server_starts_afresh_when_asked_again(
    manager: ServerManager, binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_EXIT_AT_START", "3")
    with pytest.raises(ServerError):
        await manager.ensure(spec(binary))
    monkeypatch.delenv("FAKE_EXIT_AT_START")
    server = await manager.ensure(spec(binary))
    assert server.state is ServerState.READY and len(manager.servers()) == 1


def test_argv_carries_the_decision_and_threads(binary: Path) -> None:
    s = LlamaServerSpec(binary, Path("/m.gguf"), "smol", ("--parallel", "2"), threads=2)
    argv = s.argv(8123)
    assert argv[0] == str(binary)
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--alias") + 1] == "smol"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # never exposed beyond loopback
    assert argv[-4:] == ["--parallel", "2", "--threads", "2"]
