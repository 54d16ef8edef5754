"""MCP tool sources through the whole stream: a real MCP server (tests/tools/
mcp_fixture_server.py, written with the ``mcp`` package) started by the test, over stdio
and streamable HTTP, in front of a scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.api.conftest import HarnessFactory, assert_well_formed, frames, sentinel_reply
from tests.api.test_tools import _wait_for_event
from toolforge.api.app import create_app
from toolforge.core.events import FrameKind
from toolforge.core.mcp import parse_mcp_servers
from toolforge.core.protocol import sentinels
from toolforge.core.tool_rules import ToolConfigError
from toolforge.core.tool_specs import PermanentToolError
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.mcp import McpServerSource, McpSources
from toolforge.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ["-m", "tests.tools.mcp_fixture_server"]
ALL_TOOLS = {"echo", "add", "fail", "sleep", "pid", "crash", "env"}


def call(fid: str, name: str, args: object) -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, fid, name, orjson.dumps(args).decode())


def tokens(text: str, size: int = 7) -> Script:
    return Script.from_tokens([text[i : i + size] for i in range(0, len(text), size)])


def named(events: list[Any], event: str) -> list[dict[str, Any]]:
    return [e.data for e in frames(events) if e.event == event]


def stdio_servers(**extra: Any) -> str:
    entry = {"command": sys.executable, "args": FIXTURE, "env": {}, "cwd": str(ROOT), **extra}
    return orjson.dumps({"mcpServers": {"fixture": entry}}).decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def http_fixture_server(port: int | None = None) -> Iterator[str]:
    port = port or _free_port()
    proc = subprocess.Popen(
        [sys.executable, *FIXTURE, "--http", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = 30.0
        while deadline > 0:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("the MCP fixture server exited") from None
                deadline -= 0.1
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(params=["stdio", "http"])
def mcp_servers(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "stdio":
        yield stdio_servers()
        return
    with http_fixture_server() as url:
        yield orjson.dumps(
            {"mcpServers": {"fixture": {"url": url, "headers": {"X-Test": "1"}}}}
        ).decode()


def sources(gw: Any) -> McpSources:
    found = gw.app.state.mcp_sources
    assert isinstance(found, McpSources)
    return found


async def test_tools_are_listed_with_their_source_and_schemas(
    make_gateway: HarnessFactory, mcp_servers: str
) -> None:
    gw = await make_gateway([], mcp_servers=mcp_servers)
    listed = (await gw.client.get(f"{gw.url}/v1/tools")).json()["tools"]
    by_name = {t["name"]: t for t in listed}
    # Seven tools over four pages of two: the listing's nextCursor was followed.
    assert {n.removeprefix("fixture.") for n in by_name if n.startswith("fixture.")} == ALL_TOOLS
    echo = by_name["fixture.echo"]
    assert echo["source"] == "mcp:fixture" and echo["available"] is True
    assert echo["input_schema"]["required"] == ["text"]
    assert echo["output_allowlist"] == []  # the MCP default: nothing kept in logs
    assert by_name["fixture.add"]["idempotent"] is True  # from the idempotentHint
    assert by_name["places.search"]["source"] == "pack:demo"
    source = sources(gw).get("fixture")
    assert source is not None and source.protocol_version == "2026-07-28"


async def test_a_call_mid_stream_then_the_model_resumes(
    make_gateway: HarnessFactory, mcp_servers: str, tmp_path: Path
) -> None:
    first = "Adding. " + call("t1", "fixture.add", {"a": 2, "b": 3}) + " dropped"
    gw = await make_gateway(
        [tokens(first), tokens(sentinel_reply("It is 5."))], mcp_servers=mcp_servers
    )
    events = await gw.stream({"input": "2+3?"})
    assert_well_formed(events)
    (result,) = named(events, "tool.result")
    assert result["ok"] is True and result["result"] == {"sum": 5}, result
    # The server's own payload (raw) never reaches the client's frames.
    sent = orjson.dumps([e.data for e in events]).decode()
    assert "structuredContent" not in sent and "serverInfo" not in sent
    resumed = gw.upstream.requests[1].json["messages"][-1]["content"]
    assert "fixture.add" in resumed and '"sum":5' in resumed
    await gw.settle()
    stream_id = named(events, "stream.begin")[0]["stream_id"]
    logs = orjson.loads((gw.artifacts / "runs" / stream_id / "tool_logs.json").read_bytes())
    (record,) = logs
    # The server's output is not in the artifacts (allowlist []), nor its raw payload.
    assert record["name"] == "fixture.add" and record["result"] == {}
    assert "raw" not in record and "structuredContent" not in orjson.dumps(logs).decode()


async def test_bad_arguments_are_refused_before_the_server_sees_them(
    make_gateway: HarnessFactory,
) -> None:
    first = call("t1", "fixture.echo", {"text": "", "extra": 1})
    gw = await make_gateway([tokens(first), tokens(sentinel_reply())], mcp_servers=stdio_servers())
    events = await gw.stream({"input": "echo"})
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["attempts"] == 0
    assert result["error"]["code"] == "TOOL_ARGS_INVALID"
    message = result["error"]["message"]
    assert "$.text" in message and "minLength" in message and "additionalProperties" in message


async def test_an_is_error_result_is_an_error_the_model_reads(
    make_gateway: HarnessFactory, mcp_servers: str
) -> None:
    gw = await make_gateway(
        [tokens(call("t1", "fixture.fail", {})), tokens(sentinel_reply())],
        mcp_servers=mcp_servers,
    )
    events = await gw.stream({"input": "try"})
    assert_well_formed(events)
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["attempts"] == 1  # not retried
    assert result["error"]["code"] == "TOOL_FAILED"
    assert "the widget is broken (code 7)" in result["error"]["message"]
    resumed = gw.upstream.requests[1].json["messages"][-1]["content"]
    assert "the widget is broken (code 7)" in resumed
    assert named(events, "done")[0]["reason"] == "stop"


async def test_a_slow_tool_times_out(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [tokens(call("t1", "fixture.sleep", {"seconds": 10})), tokens(sentinel_reply())],
        mcp_servers=stdio_servers(timeout_s=0.5, retries=0),
    )
    started = asyncio.get_running_loop().time()
    events = await gw.stream({"input": "wait"})
    assert asyncio.get_running_loop().time() - started < 5
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["error"]["code"] == "TOOL_TIMEOUT"
    # The session survives a timed-out call: the next call works.
    gw.upstream.add(tokens(call("t2", "fixture.echo", {"text": "still here"})))
    gw.upstream.add(tokens(sentinel_reply()))
    events = await gw.stream({"input": "again"})
    (result,) = named(events, "tool.result")
    assert result["ok"] is True and result["result"] == {"text": "still here"}


async def test_a_crashed_server_is_restarted_and_its_tools_come_back(
    make_gateway: HarnessFactory,
) -> None:
    scripts = [
        tokens(call("t1", "fixture.pid", {})),
        tokens(sentinel_reply()),
        tokens(call("t2", "fixture.crash", {})),
        tokens(sentinel_reply()),
        tokens(call("t3", "fixture.pid", {})),
        tokens(sentinel_reply()),
    ]
    gw = await make_gateway(scripts, mcp_servers=stdio_servers(retries=0))
    (before,) = named(await gw.stream({"input": "pid"}), "tool.result")
    first_pid = before["result"]["pid"]
    events = await gw.stream({"input": "crash"})
    assert_well_formed(events)
    (crashed,) = named(events, "tool.result")
    assert crashed["ok"] is False and crashed["error"]["code"] == "TOOL_UNAVAILABLE"
    assert "restarted" in crashed["error"]["message"]
    source = sources(gw).get("fixture")
    assert source is not None
    await source.wait_available(30)
    assert source.restarts == 1
    tools = (await gw.client.get(f"{gw.url}/v1/tools")).json()["tools"]
    assert all(t["available"] for t in tools if t["source"] == "mcp:fixture")
    (after,) = named(await gw.stream({"input": "pid"}), "tool.result")
    assert after["ok"] is True and after["result"]["pid"] != first_pid


async def test_tools_are_marked_unavailable_while_the_server_is_down(
    make_gateway: HarnessFactory,
) -> None:
    with http_fixture_server() as url:
        servers = orjson.dumps({"mcpServers": {"web": {"url": url, "retries": 0}}}).decode()
        gw = await make_gateway(
            [tokens(call("t1", "web.echo", {"text": "hi"})), tokens(sentinel_reply())],
            mcp_servers=servers,
        )
    # The HTTP server is gone: the call finds it down, and the listing says so.
    events = await gw.stream({"input": "echo"})
    (result,) = named(events, "tool.result")
    assert result["ok"] is False and result["error"]["code"] == "TOOL_UNAVAILABLE"
    tools = (await gw.client.get(f"{gw.url}/v1/tools")).json()["tools"]
    echo = next(t for t in tools if t["name"] == "web.echo")
    assert echo["available"] is False and "web" in echo["unavailable_reason"]
    # The server comes back on its port: the session is opened again, the tools return.
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    source = sources(gw).get("web")
    assert source is not None
    with http_fixture_server(port):
        await source.wait_available(30)
        gw.upstream.add(tokens(call("t2", "web.echo", {"text": "back"})))
        gw.upstream.add(tokens(sentinel_reply()))
        (result,) = named(await gw.stream({"input": "echo"}), "tool.result")
        assert result["ok"] is True and result["result"] == {"text": "back"}


@contextlib.asynccontextmanager
async def lifespan_of(settings: Settings) -> AsyncIterator[Any]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


async def test_a_schema_outside_the_subset_is_refused_at_start_up(tmp_path: Path) -> None:
    entry = {"command": sys.executable, "args": [*FIXTURE, "--bad-schema"], "cwd": str(ROOT)}
    settings = Settings(
        upstream_base_url="http://127.0.0.1:9/v1",
        artifacts_dir=tmp_path,
        log_level="WARNING",
        mcp_servers=orjson.dumps({"mcpServers": {"fixture": entry}}).decode(),
    )
    with pytest.raises(ToolConfigError) as caught:
        async with lifespan_of(settings):
            pass
    assert caught.value.code == "TOOL_CONFIG_INVALID"
    assert "fixture.union" in caught.value.message and "'oneOf'" in caught.value.message


async def test_a_config_file_and_bad_configs(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(stdio_servers(tools=["echo"]))
    settings = Settings(
        upstream_base_url="http://127.0.0.1:9/v1",
        artifacts_dir=tmp_path,
        log_level="WARNING",
        tool_packs="agent",
        mcp_config=config,
    )
    async with lifespan_of(settings) as app:
        names = app.state.gateway.executor.registry.names()
        assert names == ["time.now", "fixture.echo"]  # only the tools asked for
    for bad, why in [
        ('{"servers": {}}', "mcpServers"),
        ('{"mcpServers": {"a.b": {"command": "x"}}}', "server name"),
        ('{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}', "either"),
        ('{"mcpServers": {"a": {"command": "/nonexistent/mcp-server"}}}', "could not start"),
    ]:
        settings = Settings(
            upstream_base_url="http://127.0.0.1:9/v1", artifacts_dir=tmp_path, mcp_servers=bad
        )
        with pytest.raises(ToolConfigError, match=why):
            async with lifespan_of(settings):
                pass


async def test_an_unreachable_http_server_is_a_start_up_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    settings = Settings(
        upstream_base_url="http://127.0.0.1:9/v1",
        artifacts_dir=tmp_path,
        mcp_servers=orjson.dumps({"mcpServers": {"gone": {"url": url}}}).decode(),
        mcp_start_timeout_s=10,
    )
    with pytest.raises(ToolConfigError, match=r"'gone'.*could not start"):
        async with lifespan_of(settings):
            pass


async def test_a_stdio_server_gets_an_explicit_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UPSTREAM_API_KEY", "sk-gateway-secret-0123456789")
    config = parse_mcp_servers(stdio_servers(env={"FIXTURE_MODE": "on"}), where="test")
    source = McpServerSource("fixture", config["fixture"])
    await source.start(30)
    try:
        given = await source.call("env", {"name": "FIXTURE_MODE"})
        leaked = await source.call("env", {"name": "UPSTREAM_API_KEY"})
        assert given.data == {"value": "on"} and leaked.data == {"value": None}
        assert given.raw is not None and given.raw["structuredContent"] == {"value": "on"}
    finally:
        await source.aclose()


async def test_approvals_apply_to_mcp_tools(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [tokens(call("t1", "fixture.add", {"a": 1, "b": 1})), tokens(sentinel_reply())],
        mcp_servers=stdio_servers(needs_approval=["add"]),
    )
    reading = asyncio.create_task(gw.stream({"input": "1+1"}))
    await gw.upstream.wait_for_requests(1)
    stream_id = next(s for s, sess in gw.gateway.registry._sessions.items() if sess.running)
    await _wait_for_event(gw, stream_id, "tool.call")
    answer = await gw.client.post(
        f"{gw.url}/v1/streams/{stream_id}/approvals/t1", json={"approve": True}
    )
    assert answer.json()["approved"] is True
    events = await reading
    (tool_call,) = named(events, "tool.call")
    assert tool_call["needs_approval"] is True
    (result,) = named(events, "tool.result")
    assert result["ok"] is True and result["result"] == {"sum": 2}
    # The server's idempotentHint makes the tool idempotent (the Idempotency-Key cache).
    assert gw.gateway.executor.registry.get("fixture.add").idempotent  # type: ignore[union-attr]


async def test_the_listing_is_fetched_again_when_its_ttl_runs_out() -> None:
    now = [1000.0]
    entry = {"command": sys.executable, "args": [*FIXTURE, "--shrink"], "cwd": str(ROOT)}
    config = parse_mcp_servers({"mcpServers": {"fixture": entry}}, where="test")
    source = McpServerSource("fixture", config["fixture"], clock=lambda: now[0])
    await source.start(30)
    try:
        # The fixture's listing says ttlMs 60000: within it, the start-up listing holds.
        assert (await source.call("echo", {"text": "a"})).data == {"text": "a"}
        now[0] += 61
        with pytest.raises(PermanentToolError, match="no longer offers 'echo'"):
            await source.call("echo", {"text": "b"})
        assert (await source.call("add", {"a": 1, "b": 2})).data == {"sum": 3}
    finally:
        await source.aclose()
