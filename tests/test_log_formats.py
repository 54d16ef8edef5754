"""One log format per mode, whoever logs: the gateway's structlog events, and the stdlib's
records (uvicorn, httpx, asyncio) through structlog's ProcessorFormatter. Console lines on
a terminal, JSON lines otherwise, LOG_FORMAT to choose; and no raw uvicorn line left in
the output of a real ``toolforge serve``."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import structlog

from toolforge.log import configure_logging, get_logger, logs_are_json


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def _json_lines(text: str) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def test_stdlib_records_become_the_same_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request %s", "received.")
    logging.getLogger("some.library").info("token=%s", "Bearer sk-abcdef0123456789abcdef")
    get_logger("toolforge.test").info("stream.started", stream_id="s_1")
    uvicorn, library, ours = _json_lines(capsys.readouterr().err)
    assert uvicorn["event"] == "Invalid HTTP request received."
    assert uvicorn["logger"] == "uvicorn.error" and uvicorn["level"] == "warning"
    assert "timestamp" in uvicorn and set(uvicorn) == set(ours) - {"stream_id"}
    assert "sk-abcdef" not in str(library["event"])  # redacted like our own events
    assert ours["logger"] == "toolforge.test"


def test_stdlib_exceptions_are_structured(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=True)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    (line,) = _json_lines(capsys.readouterr().err)
    assert line["level"] == "error"
    assert "RuntimeError" in orjson.dumps(line["exception"]).decode()


def test_console_mode_renders_console_lines_for_both(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(json=False)
    logging.getLogger("uvicorn.error").warning("from uvicorn")
    get_logger("toolforge.test").warning("from.us", n=1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and not logs_are_json()
    for line in lines:
        assert not line.startswith("{")
        assert "warning" in line
    assert "from uvicorn" in lines[0] and "uvicorn.error" in lines[0]


def test_auto_is_console_on_a_terminal_and_json_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, secondary = pty.openpty()
    try:
        with open(secondary, "w", closefd=False) as tty:
            monkeypatch.setattr(sys, "stderr", tty)
            configure_logging()
            assert not logs_are_json()
        monkeypatch.setattr(sys, "stderr", io.StringIO())
        configure_logging()
        assert logs_are_json()
    finally:
        os.close(primary)
        os.close(secondary)


def test_configuring_again_keeps_one_root_handler() -> None:
    for _ in range(3):
        configure_logging(json=True)
    ours = [h for h in logging.getLogger().handlers if type(h).__name__ == "_StderrHandler"]
    assert len(ours) == 1


def test_httpx_request_lines_are_off_unless_debug() -> None:
    configure_logging(level="INFO", json=True)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    configure_logging(level="DEBUG", json=True)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)


# ------------------------------------------------------------------ a real toolforge serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_and_poke(tmp_path: Path, **env: str) -> str:
    """Serve against a dead upstream, send uvicorn a malformed request (it logs a warning
    of its own) and a stream (the gateway logs), stop; the process's stderr."""
    port, dead = _free_port(), _free_port()
    environ = {**os.environ, "ARTIFACTS_DIR": str(tmp_path), **env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolforge.cli", "serve", "--port", str(port),
        "--upstream", f"http://127.0.0.1:{dead}/v1",
        env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(300):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                assert proc.returncode is None
                await asyncio.sleep(0.1)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")  # uvicorn: "Invalid HTTP request received."
        await writer.drain()
        await reader.read()
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"input": "x"}'
        writer.write(
            b"POST /v1/stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        await reader.read()
        writer.close()
    finally:
        proc.terminate()
        async with asyncio.timeout(20):
            _, stderr = await proc.communicate()
    return stderr.decode()


async def test_serve_writes_only_json_lines_when_stderr_is_not_a_terminal(
    tmp_path: Path,
) -> None:
    err = await _serve_and_poke(tmp_path, LOG_FORMAT="auto")
    lines = _json_lines(err)  # raises on any line that is not JSON
    loggers = {line.get("logger") for line in lines}
    events = {line.get("event") for line in lines}
    assert "uvicorn.error" in loggers, err  # uvicorn's own warning, as JSON
    assert "Invalid HTTP request received." in events
    assert "gateway.ready" in events and "stream.finished" in events


async def test_log_format_console_forces_console_lines(tmp_path: Path) -> None:
    err = await _serve_and_poke(tmp_path, LOG_FORMAT="console")
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and not any(line.lstrip().startswith("{") for line in lines), err
    assert any("Invalid HTTP request received." in line for line in lines)
    assert any("ToolForge is serving on" in line for line in lines)  # the human banner
