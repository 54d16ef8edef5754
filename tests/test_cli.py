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
        [sys.executable, "-m", "toolforge.cli", "serve", "--port", str(port),
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
        assert "server" not in health.headers  # no banner for scanners
        assert "date" in health.headers  # HTTP/1.1 origin servers send one
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
        [sys.executable, "-m", "toolforge.cli", "serve", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for flag in ("--host", "--port", "--upstream", "--model"):
        assert flag in out.stdout


def test_obtain_with_a_remote_upstream_obtains_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "UPSTREAM_BASE_URL": "http://127.0.0.1:9/v1",
           "TOOLFORGE_CACHE_DIR": str(tmp_path)}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and "nothing to obtain" in out.stdout
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing downloaded


def test_obtain_finds_a_cached_backend_without_building(tmp_path: Path) -> None:
    binary = tmp_path / "llama.cpp" / "11434.0.0" / "bin" / "llama-server"
    model = tmp_path / "models" / "0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for path in (binary, model):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"cached")
    env = {k: v for k, v in os.environ.items() if k not in ("UPSTREAM_BASE_URL", "GROQ_BASE_URL")}
    env["TOOLFORGE_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert str(binary) in out.stdout and str(model) in out.stdout
    assert "downloading" not in out.stdout and "building" not in out.stdout


def test_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"toolforge {version('toolforge')}"


def test_help_shows_defaults_and_environment_variables() -> None:
    serve = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "serve", "--help"], capture_output=True, text=True
    ).stdout
    assert "(127.0.0.1" in serve and "(8000)" in serve and "API_KEYS" in serve
    for name in ("UPSTREAM_BASE_URL", "MODEL_ID", "LOG_FORMAT", "HTTPS_PROXY", "OTEL_"):
        assert name in serve
    obtain = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain", "--help"], capture_output=True, text=True
    ).stdout
    for name in ("TOOLFORGE_CACHE_DIR", "LLAMA_SERVER_BIN", "LOCAL_MODEL_PATH"):
        assert name in obtain


def test_obtain_explains_why_only_when_it_has_work(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("UPSTREAM_BASE_URL", "GROQ_BASE_URL")}
    env["TOOLFORGE_CACHE_DIR"] = str(tmp_path)
    env["PATH"] = str(tmp_path / "empty-bin")  # no compiler: it stops before any download
    out = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain", "--why", "WHY-LINE"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == "WHY-LINE"
    assert "C++ compiler" in out.stderr and "apt install g++" in out.stderr
    assert "downloading" not in out.stdout
    binary = tmp_path / "llama.cpp" / "11434.0.0" / "bin" / "llama-server"
    model = tmp_path / "models" / "0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for path in (binary, model):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"cached")
    out = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain", "--why", "WHY-LINE"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0 and "WHY-LINE" not in out.stdout


def test_the_readme_and_the_cli_give_the_same_build_estimate() -> None:
    from toolforge.runtime.local_backend import BUILD_ESTIMATE

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert BUILD_ESTIMATE in readme
    assert "10-20 minutes" not in readme
    obtain = subprocess.run(
        [sys.executable, "-m", "toolforge.cli", "obtain", "--help"], capture_output=True, text=True
    ).stdout
    assert BUILD_ESTIMATE in " ".join(obtain.split())
