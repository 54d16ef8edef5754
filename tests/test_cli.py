"""``toolforge serve`` starts a real gateway process with the flags it was given."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_starts_the_gateway_with_flags(tmp_path: Path) -> None:
    port, dead = _free_port(), _free_port()
    env = {**os.environ, "ARTIFACTS_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port),
         "--upstream", f"http://127.0.0.1:{dead}/v1", "--model", "flag-model"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "the gateway did not start in 30 s"
                time.sleep(0.1)
        assert health.json() == {"status": "ok"}
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 503 and f":{dead}/v1" in ready.json()["upstream"]
        with httpx.stream(
            "POST", f"http://127.0.0.1:{port}/v1/stream", json={"input": "x"}, timeout=10
        ) as response:
            body = response.read().decode()
        assert '"model":"flag-model"' in body and "UPSTREAM_UNAVAILABLE" in body
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_help_lists_the_serve_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for flag in ("--host", "--port", "--upstream", "--model"):
        assert flag in out.stdout
