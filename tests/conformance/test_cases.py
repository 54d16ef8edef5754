"""Data-driven conformance cases: each file in cases/ is a request, the upstream's
scripts, what the client does, and what must come back. Adding a case needs no code.

Case format (JSON):
    name, category, description
    request     the POST /v1/stream body
    settings    gateway settings for this case (optional)
    upstream    scripts for the scripted upstream, one per upstream request, in order
                (app/eval/scripted_upstream.py's format; a step may also say
                "repeat": n, and "fill": {"char", "size"} instead of "text")
    client      {"mode": "read_all"} (default) | {"mode": "stall", "stall_ms", "rcvbuf"}
                | {"mode": "cancel_then_resume", "after_frames"}
    expect      done_reason, upstream_requests, upstream_closed, sequence (the order of
                these events among the frames), frames (each must match some frame, as
                a subset), count ({event: n}), metrics_min / metrics_max (metrics.json)

Every case is also checked against the protocol invariants: ids 1..n, stream.begin first,
exactly one done last, no tool.call without its tool.result after it, every json.end /
result.end value valid against its schema, and artifacts equal to what the client got.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.core.guarantee import validate
from app.core.schemas import builtin_registry
from tests.api.conftest import (
    Event,
    Harness,
    HarnessFactory,
    assert_well_formed,
    frames,
    open_raw_stream,
)

CASES = {
    p.stem: orjson.loads(p.read_bytes())
    for p in sorted((Path(__file__).parent / "cases").glob("*.json"))
}


def _expand(script: dict[str, Any]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for step in script.get("steps", []):
        step = dict(step)
        times = step.pop("repeat", 1)
        fill = step.pop("fill", None)
        if fill is not None:
            step["text"] = fill["char"] * fill["size"]
        steps.extend([step] * times)
    return {**script, "steps": steps}


def _matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _matches(v, actual[k]) for k, v in expected.items()
        )
    return bool(expected == actual)


def _parse_sse(body: bytes) -> list[Event]:
    events: list[Event] = []
    for block in body.split(b"\n\n"):
        fields = dict(line.split(": ", 1) for line in block.decode().split("\n") if ": " in line)
        if "event" in fields:
            events.append(
                Event(fields.get("id", ""), fields["event"], orjson.loads(fields["data"]))
            )
    return events


async def _stall_client(
    gw: Harness, body: dict[str, Any], stall_ms: int, rcvbuf: int
) -> list[Event]:
    reader, writer = await open_raw_stream(gw, body, rcvbuf=rcvbuf, close=True)
    await asyncio.sleep(stall_ms / 1000)
    raw = b""
    while chunk := await reader.read(1 << 16):
        raw += chunk
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    body_bytes = b""
    while chunked:  # de-chunk the HTTP/1.1 body
        size_line, _, rest = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body_bytes += rest[:size]
        chunked = rest[size + 2 :]
    return _parse_sse(body_bytes)


async def _cancel_then_resume(gw: Harness, body: dict[str, Any], after: int) -> list[Event]:
    got: list[Event] = []
    async with gw.client.stream("POST", f"{gw.url}/v1/stream", json=body) as response:
        stream_id = response.headers["x-stream-id"]
        buffer = b""
        async for chunk in response.aiter_bytes():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n\n")
            got += [e for e in _parse_sse(b"\n\n".join(complete) + b"\n\n") if e.event != "ping"]
            if len(got) >= after:
                cancel = await gw.client.post(f"{gw.url}/v1/streams/{stream_id}/cancel")
                assert cancel.json()["cancelled"] is True
                break
    rest = await gw.stream_get(stream_id, got[-1].id)
    return got + rest


def test_there_are_cases_and_each_is_named_after_its_file() -> None:
    assert CASES
    for stem, case in CASES.items():
        assert case["name"] == stem and case["category"] and case["description"]


@pytest.mark.parametrize("name", sorted(CASES))
async def test_case(name: str, make_gateway: HarnessFactory) -> None:
    case = CASES[name]
    expect = case["expect"]
    gw = await make_gateway([_expand(s) for s in case["upstream"]], **case.get("settings", {}))
    client = case.get("client", {"mode": "read_all"})
    if client["mode"] == "stall":
        events = await _stall_client(gw, case["request"], client["stall_ms"], client["rcvbuf"])
    elif client["mode"] == "cancel_then_resume":
        events = await _cancel_then_resume(gw, case["request"], client["after_frames"])
    else:
        events = await gw.stream(case["request"])
    numbered = frames(events)

    # -- the protocol invariants, on every case -----------------------------------------
    assert_well_formed(events)
    names = [e.event for e in numbered]
    for i, name in enumerate(names):
        if name == "tool.call":
            assert "tool.result" in names[i + 1 :], "a tool.call without its tool.result"
    registry = builtin_registry()
    schemas = {
        e.data["id"]: e.data["schema"]
        for e in numbered
        if e.event in ("json.begin", "result.begin")
    }
    for e in numbered:
        if e.event in ("json.end", "result.end"):
            name = schemas[e.data["id"]]
            if name in registry:
                assert validate(registry.get(name), e.data["value"]) == [], (name, e.data)
    await gw.settle(upstream_closed=bool(expect.get("upstream_closed")))
    run = gw.artifacts / "runs" / numbered[0].data["stream_id"]
    written = [orjson.loads(line) for line in (run / "frames.ndjson").read_bytes().splitlines()]
    assert [{"id": r["id"], "event": r["event"], "data": r["data"]} for r in written] == [
        {"id": int(e.id), "event": e.event, "data": e.data} for e in numbered
    ]

    # -- the case's own expectations ------------------------------------------------------
    if "done_reason" in expect:
        assert numbered[-1].data["reason"] == expect["done_reason"]
    if "upstream_requests" in expect:
        assert len(gw.upstream.requests) == expect["upstream_requests"]
    if "sequence" in expect:
        wanted = set(expect["sequence"])
        assert [n for n in names if n in wanted] == expect["sequence"]
    for wanted_frame in expect.get("frames", []):
        assert any(
            e.event == wanted_frame["event"] and _matches(wanted_frame["data"], e.data)
            for e in numbered
        ), f"no frame matches {wanted_frame}"
    for event, n in expect.get("count", {}).items():
        assert names.count(event) == n
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    for key, low in expect.get("metrics_min", {}).items():
        assert metrics[key] >= low, (key, metrics[key])
    for key, high in expect.get("metrics_max", {}).items():
        assert metrics[key] <= high, (key, metrics[key])
