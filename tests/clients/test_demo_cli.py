"""``toolforge demo`` against a real gateway on loopback (scripted upstream): the timeline
in plain text when stdout is not a terminal, in colour when it is (a real pty), and the
errors a user meets (no gateway, an upstream that is down)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import socket
import sys

from tests.api.conftest import HarnessFactory
from tests.clients.conftest import DEMO_INPUT, demo_workflow_scripts
from toolforge.timeline import DEMO_BODY, Timeline, run_demo, use_color

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIMES = re.compile(r"\d+\.\d ms")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def demo_in_process(url: str, *, color: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(run_demo, url, out=out, err=err, color=color)
    return code, out.getvalue(), err.getvalue()


async def test_the_demo_timeline_in_plain_text(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(demo_workflow_scripts())
    code, out, err = await demo_in_process(gw.url, color=False)
    assert code == 0 and err == ""
    assert "\x1b[" not in out
    assert DEMO_INPUT in out.splitlines()[0] and '"workflow": "book_a_table"' in out
    lines = [TIMES.sub("T", line).strip() for line in out.splitlines()[1:]]
    labels = [line.split()[1] for line in lines]
    assert labels == [
        "stream", "text", "tool.call", "tool.result", "text", "tool.call", "tool.result",
        "result", "done",
    ]  # fmt: skip
    assert lines[0].startswith("T  stream ") and "mode sentinel" in lines[0]
    assert 'places.search {"query":"pizza","radius_km":2,"open_at":"19:00"}' in lines[2]
    assert re.search(r"t1 places\.search ok in T: \{.*\"count\"", lines[3])
    assert "bookings.create" in lines[5] and "t2 bookings.create ok in T" in lines[6]
    assert "Let me look." in lines[1]
    # The workflow's terminal tool ends the stream: its result is the RESULT frame.
    assert re.search(r'r1 bookings\.create \{"booking_id":"bk_\w+","status":"confirmed"', lines[7])
    assert re.search(r"done\s+stop  first token T  total T  .*\d+ frames  usage", lines[8])


async def test_the_demo_timeline_in_colour(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(demo_workflow_scripts() * 2)
    _, plain, _ = await demo_in_process(gw.url, color=False)
    code, coloured, _ = await demo_in_process(gw.url, color=True)
    assert code == 0
    assert "\x1b[1;33mtool.call" in coloured and "\x1b[1;32mresult" in coloured
    # The same timeline under the colours (stream ids and timings aside).
    # ids, timings, counts (chunks coalesce), and the padding that right-aligns a timing
    # (a slow run's "1004 ms" is one character wider than "998 ms")
    same = re.compile(r"s_[0-9a-f]+|\d+(\.\d+)?| +")
    assert same.sub("", ANSI.sub("", coloured)) == same.sub("", plain)


async def test_the_command_draws_plain_text_into_a_pipe_and_colour_onto_a_tty(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(demo_workflow_scripts() * 2)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    command = [sys.executable, "-m", "toolforge.cli", "demo", "--url", gw.url]
    piped = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(piped.communicate(), 60)
    assert piped.returncode == 0, err.decode()
    assert b"\x1b[" not in out and b"tool.call" in out and b"done" in out

    leader, follower = os.openpty()
    try:
        on_tty = await asyncio.create_subprocess_exec(
            *command, stdout=follower, stderr=asyncio.subprocess.PIPE, env=env
        )
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = await asyncio.to_thread(os.read, leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        await asyncio.wait_for(on_tty.wait(), 60)
    finally:
        os.close(leader)
    assert on_tty.returncode == 0
    drawn = b"".join(chunks)
    assert b"\x1b[1;33mtool.call" in drawn and b"\x1b[1mdone" in drawn


def test_no_colour_when_no_color_is_set() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    os.environ.pop("NO_COLOR", None)
    assert use_color("auto", Tty()) is True
    assert use_color("auto", io.StringIO()) is False
    assert use_color("always", io.StringIO()) is True and use_color("never", Tty()) is False
    os.environ["NO_COLOR"] = "1"
    try:
        assert use_color("auto", Tty()) is False
    finally:
        del os.environ["NO_COLOR"]


async def test_no_gateway_is_a_clear_message_and_exit_1() -> None:
    code, _, err = await demo_in_process(f"http://127.0.0.1:{_dead_port()}", color=False)
    assert code == 1 and "cannot reach a gateway" in err and "toolforge serve" in err


async def test_an_upstream_that_is_down_draws_the_error_frame(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(upstream_base_url=f"http://127.0.0.1:{_dead_port()}/v1")
    code, out, _ = await demo_in_process(gw.url, color=False)
    assert code == 1
    assert re.search(r"error\s+UPSTREAM_UNAVAILABLE: .* \(retryable\)", out)
    assert re.search(r"done\s+error", out)


def test_every_frame_kind_has_a_line() -> None:
    out = io.StringIO()
    timeline = Timeline(out, color=False)
    timeline.event("step.nudge", {"kind": "retry", "tier": 2, "message": "Call a tool.",
                                  "call_id": "t3"})  # fmt: skip
    timeline.event(
        "context.compacted",
        {"phase": 1, "tokens_before": 900, "tokens_after": 400, "budget_tokens": 512,
         "messages_before": 9, "messages_after": 3},
    )  # fmt: skip
    timeline.event("reasoning.delta", {"chunk": "hmm\nok"})
    timeline.event("tool.call", {"id": "t4", "name": "ask", "args": {}, "executor": "client",
                                 "needs_approval": True})  # fmt: skip
    timeline.event("tool.result", {"id": "t4", "name": "ask", "ok": False, "duration_ms": 1.5,
                                   "error": {"code": "TOOL_APPROVAL_DENIED", "message": "no"},
                                   "attempts": 0, "cached": False,
                                   "performance_warning": False})  # fmt: skip
    timeline.event("json.begin", {"id": "o2", "schema": "Point"})
    timeline.event("json.end", {"id": "o2", "value": {"x": "y" * 500}, "degraded": True})
    timeline.event("something.new", {"a": 1})
    timeline.event("ping", {})
    text = out.getvalue()
    assert "nudge         retry tier 2 (call t3): Call a tool." in text
    assert "compacted     phase 1: 900 -> 400 tokens (budget 512), 9 -> 3 messages" in text
    assert "reasoning     hmm\n" + " " * 28 + "ok" in text
    assert "t4 ask {}  (client, needs approval)" in text
    assert "t4 ask failed in 1.5 ms: TOOL_APPROVAL_DENIED: no" in text
    assert "…  (degraded)" in text  # long values are cut
    assert 'something.new  {"a":1}' in text
    assert "o2 Point {" in text
    assert timeline.frames == 8
    assert DEMO_BODY["workflow"] == "book_a_table"
