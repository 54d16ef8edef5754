"""API keys, per-key tools and rate limits, stream owners and CORS (docs/security.md): a real
gateway on loopback, every route taken from the app itself, so a route added later without
the check fails here."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from httpx_sse import aconnect_sse
from openai import AsyncOpenAI
from starlette.routing import BaseRoute, Mount, Route

from tests.api.conftest import Harness, HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.api.auth import (
    KeyRing,
    allowed_tools,
    exposure_warning,
    is_loopback,
    load_keys,
)
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.errors import ToolForgeError
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.ratelimit import MemoryRateLimiter, RateLimit
from toolforge.settings import Settings

KEY_A = "tf-key-aaaaaaaaaaaaaaaaaaaa"
KEY_B = "tf-key-bbbbbbbbbbbbbbbbbbbb"
WRONG = "tf-key-not-one-of-them-zzzz"
PUBLIC = {"/healthz", "/readyz"}
UI = {"/", "/ui/index.html", "/sdk/index.html"}  # static files: a browser sends no header
OPENAI_PATHS = {
    "/v1/chat/completions",
    "/v1/models",
    "/v1/responses",
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel",
    "/v1/responses/{response_id}/input_items",
    "/v1/responses/{rest:path}",  # an unknown path or method there: OpenAI's 404/405
}

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city, from the user's device.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CLIENT_TOOL_BODY = {"input": "Weather in Oslo?", "client_tools": [WEATHER], "tools": []}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def calling_client_tool() -> Script:
    call = sentinels.frame(FrameKind.TOOL_CALL, "t1", "get_weather", '{"city": "Oslo"}')
    return Script.from_tokens(["Checking. ", call])


def every_route(gw: Harness) -> list[tuple[str, str]]:
    """(method, path template) of every route the app serves, docs and included routers'
    routes too (FastAPI keeps an included router as one entry with its own routes)."""
    out: list[tuple[str, str]] = []

    def walk(routes: Sequence[BaseRoute], prefix: str) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)
            if included is not None:
                walk(included.routes, prefix + route.include_context.prefix)  # type: ignore[attr-defined]
            elif isinstance(route, APIRoute | Route) and route.methods:
                out.extend((m, prefix + route.path) for m in sorted(route.methods - {"HEAD"}))
            elif isinstance(route, APIWebSocketRoute):  # its handshake is an HTTP GET
                out.append(("GET", prefix + route.path))
            elif isinstance(route, Mount):  # static files (the web UI): one file under it
                out.append(("GET", f"{prefix}{route.path}/index.html"))
            else:
                raise AssertionError(f"a route this test cannot enumerate: {route!r}")

    walk(gw.app.routes, "")
    assert len(out) >= 15
    return out


def concrete(path: str, stream_id: str) -> str:
    path = path.replace("{stream_id}", stream_id)
    return re.sub(r"\{[^}]+\}", "x1", path)


async def started_stream(gw: Harness, key: str) -> str:
    """A finished stream of ``key`` (kept for resume within RESUME_TTL_S)."""
    events = await gw.stream({"input": "hi"}, headers=bearer(key))
    assert_well_formed(events)
    stream_id: str = events[0].data["stream_id"]
    await gw.settle()
    return stream_id


async def test_every_route_refuses_no_key_and_a_wrong_key(make_gateway: HarnessFactory) -> None:
    # A wrong key on every route is past the failure throttle (tests/api/test_client_limits.py).
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply()])], api_keys=KEY_A, auth_failure_limit=0
    )
    stream_id = await started_stream(gw, KEY_A)
    routes = every_route(gw)
    assert ("POST", "/v1/stream") in routes and ("POST", "/v1/chat/completions") in routes
    assert ("GET", "/metrics") in routes and ("GET", "/openapi.json") in routes
    assert {p for _, p in routes} >= UI
    # Outside the UI's files, a path under its mounts is no way around the key.
    assert (await gw.client.post(f"{gw.url}/ui/index.html")).status_code == 401
    assert (await gw.client.get(f"{gw.url}/uix/v1/tools")).status_code == 401
    for method, template in routes:
        path = concrete(template, stream_id)
        for headers in ({}, bearer(WRONG), {"Authorization": KEY_A}, {"Authorization": "Basic x"}):
            response = await gw.client.request(method, f"{gw.url}{path}", headers=headers, json={})
            if template in PUBLIC:
                assert response.status_code == 200, (method, path)
                continue
            if template in UI:  # no key needed (whether the SDK is built here or not)
                assert response.status_code not in (401, 403, 429), (method, path)
                continue
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["code"] == "UNAUTHORIZED", (method, path)
            if template in OPENAI_PATHS:  # OpenAI's shape: the SDKs raise AuthenticationError
                assert error["type"] == "authentication_error" and "param" in error
            else:
                assert error["retryable"] is False
    # The same routes with the key: none is refused for want of one.
    for method, template in routes:
        path = concrete(template, stream_id)
        response = await gw.client.request(method, f"{gw.url}{path}", headers=bearer(KEY_A))
        assert response.status_code not in (401, 403, 429), (method, path, response.text)


async def test_a_streams_follow_up_calls_only_from_the_key_that_started_it(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], api_keys=f"{KEY_A},{KEY_B}")
    stream_id = await started_stream(gw, KEY_A)
    follow_ups = [(m, t) for m, t in every_route(gw) if t.startswith("/v1/streams/{stream_id}")]
    assert {t for _, t in follow_ups} == {
        "/v1/streams/{stream_id}",
        "/v1/streams/{stream_id}/cancel",
        "/v1/streams/{stream_id}/pause",
        "/v1/streams/{stream_id}/resume",
        "/v1/streams/{stream_id}/approvals/{call_id}",
        "/v1/streams/{stream_id}/tool_results/{call_id}",
    }
    bodies = {"approvals": {"approve": True}, "tool_results": {"ok": True, "result": 1}}
    for method, template in follow_ups:
        path = concrete(template, stream_id)
        body = next((b for k, b in bodies.items() if k in template), None)
        other = await gw.client.request(method, f"{gw.url}{path}", headers=bearer(KEY_B), json=body)
        assert other.status_code == 403, (method, path, other.text)
        assert other.json()["error"]["code"] == "FORBIDDEN"
        own = await gw.client.request(method, f"{gw.url}{path}", headers=bearer(KEY_A), json=body)
        assert own.status_code in (200, 404), (method, path, own.text)  # 404: no such call
    # The resume with the right key replays the stream.
    replay = await gw.client.get(f"{gw.url}/v1/streams/{stream_id}", headers=bearer(KEY_A))
    assert "event: done" in replay.text


async def test_a_client_tool_result_from_another_key_is_refused_and_the_owner_is_heard(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [calling_client_tool(), Script.from_tokens([sentinel_reply("Sunny.")])],
        api_keys=f"{KEY_A},{KEY_B}",
    )
    events: list[Event] = []
    async with aconnect_sse(
        gw.client, "POST", f"{gw.url}/v1/stream", json=CLIENT_TOOL_BODY, headers=bearer(KEY_A)
    ) as source:
        stream_id = ""
        async for sse in source.aiter_sse():
            event = Event(sse.id, sse.event, orjson.loads(sse.data))
            events.append(event)
            if event.event == "stream.begin":
                stream_id = event.data["stream_id"]
            if event.event == "tool.call":
                url = f"{gw.url}/v1/streams/{stream_id}/tool_results/t1"
                answer = {"ok": True, "result": {"sky": "clear"}}
                other = await gw.client.post(url, json=answer, headers=bearer(KEY_B))
                assert other.status_code == 403
                cancel = f"{gw.url}/v1/streams/{stream_id}/cancel"
                assert (await gw.client.post(cancel, headers=bearer(KEY_B))).status_code == 403
                own = await gw.client.post(url, json=answer, headers=bearer(KEY_A))
                assert own.status_code == 200
    assert_well_formed(events)
    (result,) = [e.data for e in events if e.event == "tool.result"]
    assert result["ok"] is True and result["result"] == {"sky": "clear"}


async def test_past_runs_are_the_keys_own(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply("one")]), Script.from_tokens([sentinel_reply("two")])],
        api_keys=f"{KEY_A},{KEY_B}",
    )
    mine = await started_stream(gw, KEY_A)
    theirs = await started_stream(gw, KEY_B)
    listed = await gw.client.get(f"{gw.url}/v1/runs", headers=bearer(KEY_A))
    assert [r["stream_id"] for r in listed.json()["runs"]] == [mine]
    own = await gw.client.get(f"{gw.url}/v1/runs/{mine}", headers=bearer(KEY_A))
    assert own.status_code == 200 and own.json()["prompt"]["owner"].startswith("key-")
    other = await gw.client.get(f"{gw.url}/v1/runs/{theirs}", headers=bearer(KEY_A))
    assert other.status_code == 404 and other.json()["error"]["code"] == "NOT_FOUND"


async def test_idempotency_keys_are_per_api_key(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply("one")]), Script.from_tokens([sentinel_reply("two")])],
        api_keys=f"{KEY_A},{KEY_B}",
    )
    key = {"Idempotency-Key": "trip-1"}
    _, first = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=bearer(KEY_A) | key)
    _, again = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=bearer(KEY_A) | key)
    _, other = await gw.raw("POST", "/v1/stream", json={"input": "x"}, headers=bearer(KEY_B) | key)
    assert first == again  # A's replay
    assert b'"answer":"two"' in other.replace(b" ", b"")  # B's own stream, not A's replay
    assert len(gw.upstream.requests) == 2


async def test_the_fast_path_serves_a_right_key(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply("ok")])], api_keys=KEY_A)
    refused = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "hi"})
    assert refused.status_code == 401 and len(gw.upstream.requests) == 0
    events = await gw.stream({"input": "hi"}, headers=bearer(KEY_A))
    assert_well_formed(events)
    assert len(gw.upstream.requests) == 1


async def test_the_openai_sdk_raises_authentication_error(make_gateway: HarnessFactory) -> None:
    reply = Script.from_tokens(["Hello", "!"])
    gw = await make_gateway([reply], api_keys=KEY_A)
    messages: Any = [{"role": "user", "content": "hi"}]
    async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=WRONG, max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as raised:
            await wrong.chat.completions.create(model="m", messages=messages)
        assert raised.value.code == "UNAUTHORIZED"
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="m", messages=messages, stream=True)
    async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0) as right:
        completion = await right.chat.completions.create(model="m", messages=messages)
        assert completion.choices[0].message.content == "Hello!"
    assert len(gw.upstream.requests) == 1


async def test_metrics_can_be_public(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(api_keys=KEY_A, metrics_public=True)
    assert (await gw.client.get(f"{gw.url}/metrics")).status_code == 200
    assert (await gw.client.get(f"{gw.url}/v1/tools")).status_code == 401


def _keys_file(tmp_path: Path, keys: list[dict[str, Any]], suffix: str = ".json") -> Path:
    path = tmp_path / f"keys{suffix}"
    path.write_text(json.dumps({"keys": keys}))
    return path


async def test_a_keys_tool_allowlist_bounds_what_is_shown_and_what_runs(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    booking = sentinels.frame(
        FrameKind.TOOL_CALL, "t1", "bookings.create", '{"place_id": "x", "time": "19:00"}'
    )
    keys = _keys_file(
        tmp_path,
        [
            {"name": "search-only", "key": KEY_A, "tools": ["places.search"]},
            {"name": "all", "sha256": hashlib.sha256(KEY_B.encode()).hexdigest()},
        ],
    )
    gw = await make_gateway(
        [Script.from_tokens([booking]), Script.from_tokens([sentinel_reply("done")])],
        api_keys_file=keys,
    )
    listed = await gw.client.get(f"{gw.url}/v1/tools", headers=bearer(KEY_A))
    assert [t["name"] for t in listed.json()["tools"]] == ["places.search"]
    listed_b = await gw.client.get(f"{gw.url}/v1/tools", headers=bearer(KEY_B))
    assert [t["name"] for t in listed_b.json()["tools"]] == ["places.search", "bookings.create"]
    hidden = await gw.client.get(f"{gw.url}/v1/schemas/bookings.create", headers=bearer(KEY_A))
    assert hidden.status_code == 404
    asked = await gw.client.post(
        f"{gw.url}/v1/stream",
        json={"input": "book", "tools": ["bookings.create"]},
        headers=bearer(KEY_A),
    )
    assert asked.status_code == 403 and "bookings.create" in asked.json()["error"]["message"]
    # Shown: only places.search; a call to bookings.create (guessed) does not run.
    events = await gw.stream({"input": "book a table", "profile": "demo"}, headers=bearer(KEY_A))
    assert_well_formed(events)
    system = orjson.loads(gw.upstream.requests[0].body)["messages"][0]["content"]
    assert "- places.search:" in system and "- bookings.create" not in system
    (result,) = [e.data for e in events if e.event == "tool.result"]
    assert result["ok"] is False and result["error"]["code"] == "TOOL_NOT_ALLOWED"
    # The proxy's server_tools: the same allowlist (OpenAI's shape: PermissionDeniedError).
    async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0) as sdk:
        with pytest.raises(openai.PermissionDeniedError):
            await sdk.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "book"}],
                extra_body={"toolforge": {"server_tools": ["bookings.create"]}},
            )


async def test_a_keys_tool_allowlist_bounds_the_workflows_it_may_run(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    """A workflow names its own tools: a key that may not use one of them may not run it,
    over /v1/stream and the proxy alike, named or inline, and does not see it listed."""
    search = sentinels.frame(FrameKind.TOOL_CALL, "t1", "places.search", '{"query": "pizza"}')
    answer = sentinels.frame(FrameKind.TOOL_CALL, "t2", "respond", '{"content": "Bella Napoli."}')
    keys = _keys_file(tmp_path, [{"name": "search-only", "key": KEY_A, "tools": ["places.search"]}])
    gw = await make_gateway(
        [Script.from_tokens([search]), Script.from_tokens([answer])], api_keys_file=keys
    )
    listed = await gw.client.get(f"{gw.url}/v1/workflows", headers=bearer(KEY_A))
    assert [w["name"] for w in listed.json()["workflows"]] == ["find_and_answer"]
    inline = {
        "name": "sneaky",
        "tools": ["places.search", "bookings.create"],
        "terminal_tools": ["bookings.create"],
    }
    for workflow in ("book_a_table", inline):
        asked = await gw.client.post(
            f"{gw.url}/v1/stream",
            json={"input": "book", "workflow": workflow, "mode": "sentinel"},
            headers=bearer(KEY_A),
        )
        assert asked.status_code == 403, workflow
        assert "bookings.create" in asked.json()["error"]["message"]
        async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0) as sdk:
            with pytest.raises(openai.PermissionDeniedError):
                await sdk.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "book"}],
                    extra_body={"toolforge": {"workflow": workflow}},
                )
    assert gw.upstream is not None and gw.upstream.requests == []
    # A workflow of tools the key may use runs.
    events = await gw.stream(
        {"input": "pizza?", "workflow": "find_and_answer", "mode": "sentinel"},
        headers=bearer(KEY_A),
    )
    assert_well_formed(events)
    assert [e.data["reason"] for e in events if e.event == "done"] == ["stop"]


async def test_an_allowlist_naming_a_tool_the_gateway_lacks_still_serves(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    keys = _keys_file(
        tmp_path, [{"name": "a", "key": KEY_A, "tools": ["places.search", "gone.tool"]}]
    )
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])], api_keys_file=keys)
    events = await gw.stream({"input": "hi"}, headers=bearer(KEY_A))
    assert_well_formed(events)
    system = orjson.loads(gw.upstream.requests[0].body)["messages"][0]["content"]
    assert "- places.search:" in system and "gone.tool" not in system


async def test_requests_per_window_get_429_with_retry_after(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(api_keys=KEY_A, rate_limit_requests=3, rate_limit_window_s=3600)
    statuses = [
        (await gw.client.get(f"{gw.url}/v1/tools", headers=bearer(KEY_A))).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 200]
    limited = await gw.client.get(f"{gw.url}/v1/tools", headers=bearer(KEY_A))
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(limited.headers["retry-after"]) <= 3600
    streamed = await gw.client.post(f"{gw.url}/v1/stream", json={}, headers=bearer(KEY_A))
    assert streamed.status_code == 429  # the fast path counts too
    async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY_A, max_retries=0) as sdk:
        with pytest.raises(openai.RateLimitError):
            await sdk.models.list()
    assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200  # never limited


async def test_concurrent_streams_per_key(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(
        [calling_client_tool(), Script.from_tokens([sentinel_reply("Sunny.")])] * 2,
        api_keys=f"{KEY_A},{KEY_B}",
        rate_limit_streams=1,
    )
    async with aconnect_sse(
        gw.client, "POST", f"{gw.url}/v1/stream", json=CLIENT_TOOL_BODY, headers=bearer(KEY_A)
    ) as source:
        stream_id = ""
        async for sse in source.aiter_sse():
            data = orjson.loads(sse.data)
            if sse.event == "stream.begin":
                stream_id = data["stream_id"]
            if sse.event == "tool.call":  # the stream is open, waiting for the client
                second = await gw.client.post(
                    f"{gw.url}/v1/stream", json={"input": "x"}, headers=bearer(KEY_A)
                )
                assert second.status_code == 429 and second.headers["retry-after"] == "1"
                async with gw.client.stream(
                    "GET", f"{gw.url}/v1/streams/{stream_id}", headers=bearer(KEY_A)
                ) as resume:  # a resume follows a stream that holds its slot already
                    assert resume.status_code == 200
                other = gw.client.post(  # another key has its own streams
                    f"{gw.url}/v1/stream", json=CLIENT_TOOL_BODY, headers=bearer(KEY_B)
                )
                other_response = await asyncio.wait_for(other, 10)
                assert other_response.status_code == 200
                # A follow-up call is not a stream: the owner may still answer.
                answer = await gw.client.post(
                    f"{gw.url}/v1/streams/{stream_id}/tool_results/t1",
                    json={"ok": True, "result": {"sky": "clear"}},
                    headers=bearer(KEY_A),
                )
                assert answer.status_code == 200
    await gw.settle()
    after = await gw.client.get(f"{gw.url}/v1/streams/{stream_id}", headers=bearer(KEY_A))
    assert after.status_code == 200  # the first stream ended: its slot is back


async def test_cors_preflight_and_headers_reach_the_fast_path(make_gateway: HarnessFactory) -> None:
    origin = "https://app.example.com"
    gw = await make_gateway(
        [Script.from_tokens([sentinel_reply()])],
        api_keys=KEY_A,
        cors_origins=f"{origin}, https://other.example.com",
    )
    for path in ("/v1/stream", "/v1/chat/completions", "/v1/tools"):
        preflight = await gw.client.options(
            f"{gw.url}{path}",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
            },
        )
        assert preflight.status_code == 200, (path, preflight.text)  # before the key check
        assert preflight.headers["access-control-allow-origin"] == origin
        allowed = preflight.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "idempotency-key" in allowed
    denied = await gw.client.options(
        f"{gw.url}/v1/stream",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert denied.status_code == 400 and "access-control-allow-origin" not in denied.headers
    refused = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "hi"}, headers={"Origin": origin}
    )
    assert refused.status_code == 401  # a browser can read why
    assert refused.headers["access-control-allow-origin"] == origin
    response, body = await gw.raw(
        "POST", "/v1/stream", json={"input": "hi"}, headers=bearer(KEY_A) | {"Origin": origin}
    )
    assert response.status_code == 200 and b"event: done" in body
    assert response.headers["access-control-allow-origin"] == origin
    assert "x-stream-id" in response.headers["access-control-expose-headers"].lower()
    evil = await gw.client.get(
        f"{gw.url}/v1/tools", headers=bearer(KEY_A) | {"Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in evil.headers


async def test_without_cors_origins_there_are_no_cors_headers(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway()
    response = await gw.client.get(
        f"{gw.url}/v1/tools", headers={"Origin": "https://app.example.com"}
    )
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


async def test_without_keys_every_route_is_open(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    assert (await gw.client.get(f"{gw.url}/v1/tools")).status_code == 200
    assert gw.app.access is None  # type: ignore[attr-defined]


# -- keys, the ring and the limiter, without HTTP ------------------------------------------


def test_keys_from_the_environment_and_a_file(tmp_path: Path) -> None:
    digest_b = hashlib.sha256(KEY_B.encode()).hexdigest()
    toml = tmp_path / "keys.toml"
    toml.write_text(
        '[[keys]]\nname = "ci"\nkey = "tf-key-ccccccccccccccccccc"\ntools = ["places.search"]\n'
        "[keys.rate_limit]\nrequests = 5\n"
    )
    keys = load_keys(
        Settings(
            api_keys=f" {KEY_A} , sha256:{digest_b} ",
            api_keys_file=toml,
            rate_limit_requests=100,
            rate_limit_streams=2,
        )
    )
    assert [k.name for k in keys][2] == "ci"
    assert all(KEY_A not in repr(k) for k in keys)  # stored as digests only
    ring = KeyRing(keys)
    a, b, ci = (ring.match(k) for k in (KEY_A, KEY_B, "tf-key-ccccccccccccccccccc"))
    assert a is not None and b is not None and ci is not None
    assert a.limit == RateLimit(requests=100, window_s=60.0, streams=2)
    assert ci.limit == RateLimit(requests=5, window_s=60.0, streams=2)  # its own requests
    assert ci.tools == frozenset({"places.search"}) and a.tools is None
    assert ring.match(WRONG) is None and ring.match("") is None


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"api_keys": "short"}, "shorter than 16"),
        ({"api_keys": "sha256:abc"}, "64 hex digits"),
        ({"api_keys": f"{KEY_A},{KEY_A}"}, "twice"),
    ],
)
def test_unusable_keys_stop_the_start_up(settings: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ToolForgeError) as raised:
        load_keys(Settings(**settings))
    assert raised.value.code == "KEYS_INVALID" and fragment in raised.value.message


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "x"},  # no secret
        {"name": "x", "key": KEY_A, "sha256": "0" * 64},  # two
        {"name": "x", "key": KEY_A, "color": "red"},  # unknown field
        {"name": "bad name", "key": KEY_A},
    ],
)
def test_a_bad_keys_file_is_a_typed_error(tmp_path: Path, entry: dict[str, Any]) -> None:
    with pytest.raises(ToolForgeError) as raised:
        load_keys(Settings(api_keys_file=_keys_file(tmp_path, [entry])))
    assert raised.value.code == "KEYS_INVALID"


def test_a_missing_keys_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ToolForgeError, match="API_KEYS_FILE"):
        load_keys(Settings(api_keys_file=tmp_path / "nope.json"))


def test_create_app_refuses_unusable_keys() -> None:
    from toolforge.api.app import create_app

    with pytest.raises(ToolForgeError):
        create_app(Settings(api_keys="short"))


async def test_memory_limiter_windows_and_streams() -> None:
    now = [100.0]
    limiter = MemoryRateLimiter(clock=lambda: now[0])
    limit = RateLimit(requests=2, window_s=10, streams=2)
    assert [await limiter.hit("k", limit) for _ in range(2)] == [0.0, 0.0]
    assert await limiter.hit("k", limit) == pytest.approx(10.0)  # window [100, 110)
    assert await limiter.hit("other", limit) == 0.0  # per key
    now[0] = 109.5
    assert await limiter.hit("k", limit) == pytest.approx(0.5)
    now[0] = 110.0  # the next window
    assert await limiter.hit("k", limit) == 0.0
    assert await limiter.open_stream("k", limit) and await limiter.open_stream("k", limit)
    assert not await limiter.open_stream("k", limit)
    await limiter.close_stream("k")
    assert await limiter.open_stream("k", limit)
    for _ in range(2):
        await limiter.close_stream("k")
    assert limiter._streams == {}  # nothing left behind


def test_allowed_tools() -> None:
    ring = KeyRing(load_keys(Settings(api_keys=KEY_A)))
    everything = ring.match(KEY_A)
    assert allowed_tools(everything, None, ["a", "b"]) is None
    assert allowed_tools(None, ["a"], ["a", "b"]) == ["a"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.4", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_serving_beyond_loopback_without_keys_warns(tmp_path: Path) -> None:
    assert exposure_warning("127.0.0.1", Settings()) is None
    warning = exposure_warning("0.0.0.0", Settings())
    assert warning is not None and "API_KEYS" in warning
    assert exposure_warning("0.0.0.0", Settings(api_keys=KEY_A)) is None
    keys = _keys_file(tmp_path, [{"name": "a", "key": KEY_A}])
    assert exposure_warning("0.0.0.0", Settings(api_keys_file=keys)) is None


def test_the_cli_binds_loopback_by_default_and_warns_beyond_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolforge import cli

    served: list[str] = []
    monkeypatch.setattr(cli, "run", lambda app, *, host, port: served.append(host))
    monkeypatch.setattr(cli, "create_app", lambda settings, on_ready: None)
    monkeypatch.delenv("API_KEYS", raising=False)
    monkeypatch.delenv("API_KEYS_FILE", raising=False)
    cli.main(["serve", "--upstream", "http://127.0.0.1:9/v1"])
    assert served == ["127.0.0.1"] and "WARNING" not in capsys.readouterr().err
    cli.main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--host", "0.0.0.0"])
    assert served[-1] == "0.0.0.0" and "with no API keys" in capsys.readouterr().err
