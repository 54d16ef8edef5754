"""``toolforge mcp-serve``: ToolForge's packs as an MCP server, checked with the ``mcp``
package's own client over stdio and streamable HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from toolforge.cli import main; main()", "mcp-serve"]


def env(**extra: str) -> dict[str, str]:
    return {"LOG_LEVEL": "WARNING", "TOOL_PACKS": "demo,agent", **extra}


async def exercise(client: Client) -> None:
    listed = await client.list_tools()
    names = {t.name for t in listed.tools}
    assert {"places.search", "bookings.create", "time.now"} <= names
    search = next(t for t in listed.tools if t.name == "places.search")
    assert search.input_schema["properties"]["query"]["type"] == "string"
    found = await client.call_tool("places.search", {"query": "pizza", "open_at": "19:00"})
    assert not found.is_error and found.structured_content is not None
    assert any(p["id"] == "trattoria-roma" for p in found.structured_content["places"])
    # Validation runs as in the gateway: the error is a result the model can read.
    bad = await client.call_tool("places.search", {"query": ""})
    assert bad.is_error and "TOOL_ARGS_INVALID" in bad.content[0].text  # type: ignore[union-attr]
    unknown = await client.call_tool("nope.nothing", {})
    assert unknown.is_error and "TOOL_NOT_FOUND" in unknown.content[0].text  # type: ignore[union-attr]


async def test_mcp_serve_over_stdio() -> None:
    params = StdioServerParameters(command=CLI[0], args=CLI[1:], env=env(), cwd=str(ROOT))
    async with Client(params) as client:
        assert client.protocol_version == "2026-07-28"
        await exercise(client)


async def test_mcp_serve_speaks_the_handshake_era_too() -> None:
    params = StdioServerParameters(command=CLI[0], args=CLI[1:], env=env(), cwd=str(ROOT))
    async with Client(params, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        await exercise(client)


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*CLI, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, **env()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError("toolforge mcp-serve exited")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_mcp_serve_over_streamable_http() -> None:
    with http_server() as url:
        async with Client(url) as client:
            await exercise(client)


def test_mcp_serve_refuses_a_bad_pack() -> None:
    done = subprocess.run(
        CLI,
        cwd=ROOT,
        env={**os.environ, **env(TOOL_PACKS="nope")},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1 and "unknown pack 'nope'" in done.stderr
