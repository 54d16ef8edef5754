"""Shutting the server down while streams run: each ends with ``done`` (reason
``shutdown``), its artifacts are written, and the process exits without waiting for the
model (app/api/serve.py)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import orjson
import pytest
from httpx_sse import aconnect_sse

from toolforge.api.app import create_app
from toolforge.eval.loopback import serve
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step
from toolforge.settings import Settings

Seen = list[tuple[str, dict[str, object]]]
STALLED = Script(steps=(Step(text="a"),), end="hang")  # one token, then silence


async def _read_until_done(
    url: str, seen_text: asyncio.Event
) -> list[tuple[str, dict[str, object]]]:
    events: list[tuple[str, dict[str, object]]] = []
    async with (
        httpx.AsyncClient(timeout=30) as client,
        aconnect_sse(client, "POST", f"{url}/v1/stream", json={"input": "x"}) as source,
    ):
        async for sse in source.aiter_sse():
            events.append((sse.event, orjson.loads(sse.data)))
            if sse.event == "text.delta":
                seen_text.set()
    return events


async def test_shutdown_ends_a_running_stream_with_done(tmp_path: Path) -> None:
    async with ScriptedUpstream([STALLED]) as upstream:
        settings = Settings(
            upstream_base_url=upstream.base_url,
            artifacts_dir=tmp_path,
            upstream_idle_timeout_s=60,  # the model would hold the stream for a minute
            log_level="WARNING",
        )
        app = create_app(settings)
        seen_text = asyncio.Event()
        async with asyncio.timeout(10):
            async with serve(app) as url:
                reader = asyncio.create_task(_read_until_done(url, seen_text))
                await seen_text.wait()
            # serve() set should_exit and waited for uvicorn to stop: the stream ended.
            events = await reader
    names = [name for name, _ in events if name != "ping"]
    assert names == ["stream.begin", "text.delta", "done"]
    assert events[-1][1]["reason"] == "shutdown"
    (run,) = (p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    assert metrics["reason"] == "shutdown"


def _foreground_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_ends_streams_then_the_process(tmp_path: Path, sig: int) -> None:
    """``toolforge serve`` on SIGTERM or Ctrl-C: the client gets ``done``, then the
    process exits, without a traceback."""
    async with ScriptedUpstream([STALLED]) as upstream:
        port = _free_port()
        env = {**os.environ, "ARTIFACTS_DIR": str(tmp_path), "UPSTREAM_IDLE_TIMEOUT_S": "60"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "toolforge.cli", "serve", "--port", str(port),
            "--upstream", upstream.base_url,
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            # As a foreground process: a suite started in the background (`make test &`)
            # runs with SIGINT ignored, which a child inherits, and Ctrl-C is not tested.
            preexec_fn=_foreground_signals,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            async with asyncio.timeout(30):
                while True:
                    try:
                        _, writer = await asyncio.open_connection("127.0.0.1", port)
                        writer.close()
                        break
                    except OSError:
                        assert proc.returncode is None
                        await asyncio.sleep(0.1)
            seen_text = asyncio.Event()
            reader = asyncio.create_task(_read_until_done(url, seen_text))
            async with asyncio.timeout(10):
                await seen_text.wait()
                proc.send_signal(sig)
                events = await reader
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert events[-1][0] == "done" and events[-1][1]["reason"] == "shutdown"
    # uvicorn re-raises the signal once shut down: SIGTERM then ends the process as the
    # signal does; SIGINT exits 130, as shells expect after Ctrl-C.
    assert code in (0, -signal.SIGTERM) if sig == signal.SIGTERM else code == 130
    assert proc.stderr is not None
    assert b"Traceback" not in await proc.stderr.read()


async def test_the_app_owns_full_collections_while_it_serves(tmp_path: Path) -> None:
    """While serving, the automatic collector starts no full pass (the stream registry's
    collector does, when cheap); the thresholds are as before once the app has stopped."""
    before = gc.get_threshold()
    async with ScriptedUpstream([Script(steps=(Step(text="a"),))]) as upstream:
        settings = Settings(
            upstream_base_url=upstream.base_url, artifacts_dir=tmp_path, log_level="WARNING"
        )
        app = create_app(settings)
        async with serve(app) as url, httpx.AsyncClient(timeout=10) as client:
            assert gc.get_threshold()[:2] == before[:2]
            assert gc.get_threshold()[2] > 10**9
            reply = await client.post(f"{url}/v1/stream", json={"input": "x"})
            assert reply.status_code == 200 and "event: done" in reply.text
    assert gc.get_threshold() == before
