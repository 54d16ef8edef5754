"""Without keys, only same-machine clients get in; every POST's body is bounded.

Attacks as a web page would make them against a gateway on loopback with no keys: a
cross-origin ``text/plain`` POST (no preflight), a DNS-rebinding page (its own host name in
``Host``); and as any client: a huge body on the routes FastAPI serves, JSON nested deeper
than the gateway can write. A real gateway on loopback, real HTTP."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest

from tests.api.conftest import HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.api.json_depth import depth_exceeds
from toolforge.api.request_guard import HostAllowlist, split_host
from toolforge.eval.scripted_upstream import Script

KEY = "tf-key-aaaaaaaaaaaaaaaaaaaa"
EVIL = "https://evil.example"
STREAM_BODY = orjson.dumps({"input": "Book a table"})
CHAT_BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


# -- JSON only ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",  # what a cross-origin page may send without a preflight
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",  # an HTML form
        "multipart/form-data; boundary=x",
        None,  # no type at all
        "application/jsonx",
    ],
)
async def test_a_post_that_is_not_json_is_415_and_reaches_nothing(
    make_gateway: HarnessFactory, content_type: str | None
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    headers = {"Origin": EVIL}
    if content_type is not None:
        headers["Content-Type"] = content_type
    for path, body in (("/v1/stream", STREAM_BODY), ("/v1/chat/completions", CHAT_BODY)):
        response = await gw.client.post(f"{gw.url}{path}", content=body, headers=headers)
        assert response.status_code == 415, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "BAD_REQUEST" and "application/json" in error["message"]
        assert "access-control-allow-origin" not in response.headers  # CORS is off
    assert gw.upstream.requests == []  # no model was asked anything


async def test_the_proxy_answers_415_in_openai_shape(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(
        f"{gw.url}/v1/chat/completions", content=CHAT_BODY, headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_follow_up_posts_must_be_json_too(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    for tail in ("tool_results/t1", "approvals/t1", "cancel"):
        response = await gw.client.post(
            f"{gw.url}/v1/streams/s_x/{tail}",
            content=b'{"ok": true, "approve": true}',
            headers={"Content-Type": "text/plain"},
        )
        assert response.status_code == 415, tail


async def test_json_with_parameters_and_a_bodiless_cancel_pass(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    response, body = await gw.raw(
        "POST",
        "/v1/stream",
        content=STREAM_BODY,
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert response.status_code == 200 and b"event: done" in body
    cancel = await gw.client.post(f"{gw.url}/v1/streams/s_none/cancel")  # no body, no type
    assert cancel.status_code == 404  # past the guard: the stream does not exist


async def test_with_keys_a_post_must_still_be_json(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(api_keys=KEY)
    response = await gw.client.post(
        f"{gw.url}/v1/stream",
        content=STREAM_BODY,
        headers={"Content-Type": "text/plain", "Authorization": f"Bearer {KEY}"},
    )
    assert response.status_code == 415


# -- the Host allowlist ---------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "rebind.attacker.test:8000",  # a rebinding page: its name, resolving to 127.0.0.1
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "10.0.0.5:8000",
        "localhost:abc",
        "",
    ],
)
async def test_a_foreign_host_is_refused(make_gateway: HarnessFactory, host: str) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    for method, path in (("POST", "/v1/stream"), ("GET", "/v1/tools"), ("GET", "/")):
        response = await gw.client.request(
            method, f"{gw.url}{path}", content=STREAM_BODY if method == "POST" else None,
            headers={"Host": host, "Content-Type": "application/json"},
        )  # fmt: skip
        assert response.status_code == 403, (host, path, response.text)
        assert response.json()["error"]["code"] == "FORBIDDEN"
        assert "ALLOWED_HOSTS" in response.json()["error"]["message"]
    proxy = await gw.client.post(
        f"{gw.url}/v1/chat/completions",
        content=CHAT_BODY,
        headers={"Host": host, "Content-Type": "application/json"},
    )
    assert proxy.status_code == 403 and proxy.json()["error"]["code"] == "FORBIDDEN"
    assert gw.upstream.requests == []


async def test_a_request_without_host_is_refused(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    _, port = gw.url.rsplit(":", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    writer.write(b"GET /v1/tools HTTP/1.0\r\n\r\n")
    await writer.drain()
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    assert response.startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8000",
        "127.0.0.1",
        "127.0.0.1:1",
        "[::1]",
        "[::1]:8000",
        "LOCALHOST.",
    ],
)
async def test_loopback_names_pass(make_gateway: HarnessFactory, host: str) -> None:
    gw = await make_gateway()
    response = await gw.client.get(f"{gw.url}/v1/tools", headers={"Host": host})
    assert response.status_code == 200


async def test_health_probes_answer_any_host(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.get(f"{gw.url}/healthz", headers={"Host": "10.1.2.3:8000"})
    assert response.status_code == 200


async def test_allowed_hosts_widens_the_list(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(allowed_hosts="gw.internal, *.corp.example, pinned.example:8443")
    expected = {
        "gw.internal": 200,
        "gw.internal:8000": 200,
        "a.corp.example": 200,
        "b.a.corp.example:1": 200,
        "corp.example": 403,
        "pinned.example:8443": 200,
        "pinned.example:8000": 403,
        "localhost:8000": 200,  # the loopback names stay
        "evil.example": 403,
    }
    got = {}
    for host in expected:
        got[host] = (await gw.client.get(f"{gw.url}/v1/tools", headers={"Host": host})).status_code
    assert got == expected


async def test_allowed_hosts_star_lets_every_host_in(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(allowed_hosts="*")
    response = await gw.client.get(f"{gw.url}/v1/tools", headers={"Host": "anything.example"})
    assert response.status_code == 200


async def test_with_keys_the_host_is_checked_only_when_allowed_hosts_is_set(
    make_gateway: HarnessFactory,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Host": "gateway.example.com"}
    keyed = await make_gateway(api_keys=KEY)
    assert (await keyed.client.get(f"{keyed.url}/v1/tools", headers=auth)).status_code == 200
    pinned = await make_gateway(api_keys=KEY, allowed_hosts="api.example.com")
    assert (await pinned.client.get(f"{pinned.url}/v1/tools", headers=auth)).status_code == 403
    auth["Host"] = "api.example.com"
    assert (await pinned.client.get(f"{pinned.url}/v1/tools", headers=auth)).status_code == 200


async def test_cors_stays_off_without_cors_origins(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    preflight = await gw.client.options(
        f"{gw.url}/v1/stream",
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert "access-control-allow-origin" not in preflight.headers
    tools = await gw.client.get(f"{gw.url}/v1/tools", headers={"Origin": EVIL})
    assert tools.status_code == 200 and "access-control-allow-origin" not in tools.headers


async def test_the_web_ui_and_a_whole_stream_still_work(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    page = await gw.client.get(f"{gw.url}/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    events = await gw.stream({"input": "Book a table"}, headers={"Origin": gw.url})
    assert_well_formed(events)
    assert events[-1].data["reason"] == "stop"


# -- every POST's body ----------------------------------------------------------------


@pytest.mark.parametrize("tail", ["tool_results/t1", "approvals/t1", "cancel"])
async def test_a_20_mb_follow_up_body_is_413(make_gateway: HarnessFactory, tail: str) -> None:
    gw = await make_gateway()
    body = b'{"ok": true, "result": "' + b"a" * (20 * 1024 * 1024) + b'"}'
    response = await gw.client.post(
        f"{gw.url}/v1/streams/s_x/{tail}",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "BODY_TOO_LARGE"


async def test_a_chunked_body_without_length_is_refused_at_the_limit(
    make_gateway: HarnessFactory,
) -> None:
    """No Content-Length to refuse on: the 413 comes once MAX_BODY_BYTES have arrived,
    while the client is still sending, not after 20 MB."""
    gw = await make_gateway(max_body_bytes=64 * 1024)
    _, port = gw.url.rsplit(":", 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
    try:
        writer.write(
            b"POST /v1/streams/s_x/tool_results/t1 HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"a" * 16384
        sent = 0
        head = b""
        while sent < 20 * 1024 * 1024 and not head:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.01):
                    head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert sent <= 64 * 1024 + 8 * len(chunk)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def test_a_follow_up_body_within_the_limit_is_read_whole(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(max_body_bytes=64 * 1024)
    response = await gw.client.post(
        f"{gw.url}/v1/streams/s_x/tool_results/t1",
        json={"ok": True, "result": "a" * 60_000},
    )
    assert response.status_code == 404  # the body was valid; the stream does not exist


# -- depth ----------------------------------------------------------------------------


async def test_300_deep_json_is_refused_at_parse_time(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    nested = deep(300)
    stream = await gw.client.post(
        f"{gw.url}/v1/stream",
        content=b'{"messages": [{"role": "user", "content": "hi", "x": %s}]}' % nested,
        headers={"Content-Type": "application/json"},
    )
    assert stream.status_code == 422
    assert stream.json()["error"]["code"] == "BAD_REQUEST"
    assert "MAX_REQUEST_DEPTH" in stream.json()["error"]["message"]
    # The proxy answers every caller error as OpenAI does: 400, invalid_request_error.
    chat = await gw.client.post(
        f"{gw.url}/v1/chat/completions",
        content=b'{"model": "m", "messages": [{"role": "user", "content": %s}]}' % nested,
        headers={"Content-Type": "application/json"},
    )
    assert chat.status_code == 400
    assert chat.json()["error"]["type"] == "invalid_request_error"
    assert "MAX_REQUEST_DEPTH" in chat.json()["error"]["message"]
    follow_up = await gw.client.post(
        f"{gw.url}/v1/streams/s_x/tool_results/t1",
        content=b'{"ok": true, "result": %s}' % nested,
        headers={"Content-Type": "application/json"},
    )
    assert follow_up.status_code == 422
    assert gw.upstream.requests == []  # nothing started: no internal error mid-stream


async def test_a_deep_but_allowed_schema_still_streams(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens([sentinel_reply()])])
    schema: dict[str, object] = {"type": "string"}
    for _ in range(25):  # 50 levels of objects: under the default 64
        schema = {"type": "object", "properties": {"a": schema}}
    body = {
        "input": "Weather?",
        "tools": [],
        "client_tools": [{"name": "w", "description": "d", "parameters": schema}],
    }
    events = await gw.stream(body)
    assert events[-1].event == "done" and events[-1].data["reason"] == "stop"


# -- the pieces, as tables -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("localhost", ("localhost", "")),
        ("LocalHost:8000", ("localhost", "8000")),
        ("[::1]:80", ("[::1]", "80")),
        ("[::1]", ("[::1]", "")),
        ("example.com.", ("example.com", "")),
        ("::1", None),  # an IPv6 address must be bracketed
        ("[::1", None),
        ("[::1]x", None),
        ("host:", None),
        ("host:80x", None),
        ("user@host", None),
        ("", None),
    ],
)
def test_split_host(value: str, expected: tuple[str, str] | None) -> None:
    assert split_host(value) == expected


def test_allowed_hosts_entries_that_are_not_hosts_are_refused() -> None:
    with pytest.raises(ValueError, match="not a host name"):
        HostAllowlist.parse("ok.example, bad/host")


@pytest.mark.parametrize(
    ("value", "limit", "exceeds"),
    [
        ({}, 1, False),
        ({"a": {}}, 1, True),
        ([[1, [2]]], 3, False),
        ([[1, [[]]]], 3, True),
        ({"a": [{"b": [1, 2]}], "c": 1}, 4, False),
        ("scalar", 1, False),
    ],
)
def test_depth_table(value: object, limit: int, exceeds: bool) -> None:
    assert depth_exceeds(value, limit) is exceeds
