"""``toolforge eval --backend anthropic``: the eval's frontier baseline through the Anthropic
Messages adapter, against a loopback server that speaks the documented wire format (the
stream events of tests/upstream/fixtures/anthropic) and plays a model that follows the
scenario's ideal path. No network here: the real API is the same adapter with a real key.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from toolforge.eval.loopback import serve
from toolforge.eval.qualify.catalog import select

KEY = "sk-ant-test-key"


def _event(kind: str, **data: Any) -> bytes:
    body = orjson.dumps({"type": kind, **data}).decode()
    return f"event: {kind}\ndata: {body}\n\n".encode()


def _tool_use(n: int, name: str, args: dict[str, Any]) -> Iterator[bytes]:
    """One assistant message: a sentence, then one tool_use block whose input arrives in
    pieces, as Anthropic streams it."""
    usage = {"input_tokens": 50, "output_tokens": 1}
    message = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "fake"}
    yield _event("message_start", message={**message, "content": [], "usage": usage})
    yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    yield _event(
        "content_block_delta", index=0, delta={"type": "text_delta", "text": "Let me do that."}
    )
    yield _event("content_block_stop", index=0)
    call = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
    yield _event("content_block_start", index=1, content_block=call)
    text = orjson.dumps(args).decode()
    for i in range(0, len(text), 7):
        piece = {"type": "input_json_delta", "partial_json": text[i : i + 7]}
        yield _event("content_block_delta", index=1, delta=piece)
    yield _event("content_block_stop", index=1)
    yield _event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 20})
    yield _event("message_stop")


def fake_messages_api(scenario: str, seen: list[dict[str, Any]]) -> FastAPI:
    """POST /v1/messages: the n-th call of the ideal path, n = the tool results so far."""
    (chosen,) = select([scenario], None)
    app = FastAPI()

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        if request.headers.get("x-api-key") != KEY or not request.headers.get("anthropic-version"):
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return JSONResponse({"type": "error", "error": error}, status_code=401)
        body = await request.json()
        seen.append(body)
        done = sum(
            1
            for m in body["messages"]
            if isinstance(m["content"], list)
            for block in m["content"]
            if block.get("type") == "tool_result"
        )
        name, args = chosen.ideal_path[min(done, len(chosen.ideal_path) - 1)]
        return StreamingResponse(_tool_use(done, name, dict(args)), media_type="text/event-stream")

    return app


async def _eval(
    tmp_path: Path, url: str, key: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "toolforge.cli", "eval", "--backend", f"anthropic:{url}",
            "--model", "claude-fake", "--scenario", "basic_2step", "--mode", "native",
            "--runs", "2", "--out", str(tmp_path / "eval"), *extra]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANTHROPIC_API_KEY": key}
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, check=False, cwd=tmp_path, env=env
    )


async def test_the_eval_runs_a_scenario_through_the_messages_api(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    async with serve(fake_messages_api("basic_2step", seen)) as url:
        done = await _eval(tmp_path, url, KEY)
    assert done.returncode == 0, done.stderr
    summary = orjson.loads((tmp_path / "eval" / "summary.json").read_bytes())
    (total,) = summary["totals"].values()
    assert total == {"runs": 2, "correct": 2, "scenarios": 1, "score": 1.0}
    assert summary["provenance"]["backend"].startswith("anthropic:")
    # The adapter's conversion, as the API requires it: the system prompt apart, the tools
    # with input_schema, each tool_use answered by a tool_result in a user turn.
    last = seen[-1]
    assert last["model"] == "claude-fake" and isinstance(last.get("system"), str | list)
    # The workflow's compiled turn: the lookup is done, so only the report is offered, and
    # Anthropic's tool_choice names it.
    first = seen[0]
    assert [t["name"] for t in first["tools"]] == ["get_weather"]
    assert [t["name"] for t in last["tools"]] == ["report_weather"]
    assert last["tool_choice"] == {"type": "tool", "name": "report_weather"}
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["user", "assistant", "user"]
    (result,) = [b for b in last["messages"][2]["content"] if b["type"] == "tool_result"]
    assert result["tool_use_id"] == "toolu_0" and "sunny" in orjson.dumps(result).decode()


async def test_a_wrong_key_or_none_stops_the_batch_with_a_clear_message(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    (tmp_path / "none").mkdir()
    async with serve(fake_messages_api("basic_2step", seen)) as url:
        wrong = await _eval(tmp_path, url, "sk-ant-wrong")
        missing = await _eval(tmp_path / "none", url, "")
    assert seen == []  # neither got past the key check
    assert missing.returncode != 0 and "needs ANTHROPIC_API_KEY" in missing.stderr
    assert wrong.returncode != 0
    assert "refused the credentials" in wrong.stderr and "HTTP 401" in wrong.stderr
    assert "authentication_error" in wrong.stderr
