"""What the public sees, probed as an attacker would on loopback: ``/readyz`` without a key,
a flood of ``/readyz``, URLs with credentials, and an upstream that repeats the key it was
sent. Every test runs a real gateway in front of a scripted upstream (tests/api/conftest)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.api.conftest import HarnessFactory
from toolforge.core.redact import REDACTED, public_url, redact_text, remember_secrets
from toolforge.eval.scripted_upstream import Script

KEY = "tf-key-public-aaaaaaaaaaaa"
WRONG = "tf-key-public-not-a-key-zz"
# No sk-/Bearer shape: only redaction by value can recognise it.
UPSTREAM_KEY = "tf-upstream-loopback-7c1d9a44e0b2"
PASSWORD = "hunter2-loopback-pw"
MODELS_OK = {"/v1/models": Script(end="status", status=200, body='{"data": []}')}


def dead_port() -> int:
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://probe:{PASSWORD}@", 1)


def models_requests(gw: object) -> int:
    upstream = gw.upstream  # type: ignore[attr-defined]
    return sum(1 for r in upstream.all_requests if r.path == "/v1/models")


async def test_readyz_with_keys_tells_the_public_ready_or_not_only(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(routes=MODELS_OK, api_keys=KEY, upstream_api_key=UPSTREAM_KEY)
    base = gw.upstream.base_url
    await gw.app.state.readiness.check()  # the URL below is the scripted upstream's
    public = await gw.client.get(f"{gw.url}/readyz")
    assert public.status_code == 200 and public.json() == {"status": "ready"}
    host = base.removeprefix("http://").split("/")[0]
    for leak in (host, "127.0.0.1", "/v1", UPSTREAM_KEY, "upstream"):
        assert leak not in public.text
    # A wrong key is no way to the details, and no 401 for a probe with an old key.
    wrong = await gw.client.get(f"{gw.url}/readyz", headers=bearer(WRONG))
    assert wrong.status_code == 200 and wrong.json() == {"status": "ready"}
    keyed = await gw.client.get(f"{gw.url}/readyz", headers=bearer(KEY))
    details = keyed.json()
    assert keyed.status_code == 200 and details["status"] == "ready"
    assert details["upstream"] == base.rstrip("/") + "/models"
    assert UPSTREAM_KEY not in keyed.text


async def test_readyz_unavailable_says_only_that_to_the_public(
    make_gateway: HarnessFactory,
) -> None:
    unused_tcp_port = dead_port()
    dead = f"http://scout:{PASSWORD}@127.0.0.1:{unused_tcp_port}/v1"
    gw = await make_gateway(api_keys=KEY, upstream_base_url=dead)
    public = await gw.client.get(f"{gw.url}/readyz")
    assert public.status_code == 503 and public.json() == {"status": "unavailable"}
    keyed = await gw.client.get(f"{gw.url}/readyz", headers=bearer(KEY))
    assert keyed.status_code == 503
    details = keyed.json()
    assert details["reason"] == "ConnectError"
    assert details["upstream"] == f"http://127.0.0.1:{unused_tcp_port}/v1/models"
    assert PASSWORD not in keyed.text and "scout" not in keyed.text


async def test_a_flood_of_readyz_makes_one_upstream_request_per_interval(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(routes=MODELS_OK, api_keys=KEY, readyz_cache_s=3.0)
    url = f"{gw.url}/readyz"
    answers = await asyncio.gather(*(gw.client.get(url) for _ in range(50)))
    assert {a.status_code for a in answers} == {200}
    assert models_requests(gw) == 1  # concurrent callers shared one check
    for _ in range(50):  # and sequential ones within the interval read the cached answer
        assert (await gw.client.get(url)).status_code == 200
    assert models_requests(gw) == 1
    await asyncio.sleep(3.2)
    answers = await asyncio.gather(*(gw.client.get(url) for _ in range(50)))
    assert {a.status_code for a in answers} == {200}
    assert models_requests(gw) == 2


async def test_without_keys_readyz_keeps_its_details_but_no_credentials(
    make_gateway: HarnessFactory,
) -> None:
    answering = await make_gateway(routes=MODELS_OK)  # its upstream serves this test
    url = with_userinfo(answering.upstream.base_url)
    gw = await make_gateway(upstream_base_url=url)
    body = (await gw.client.get(f"{gw.url}/readyz")).json()
    assert body["status"] == "ready"
    assert PASSWORD not in str(body) and "probe:" not in str(body)
    assert body["upstream"].startswith("http://127.0.0.1:")
    servers = await gw.client.get(f"{gw.url}/v1/servers")
    assert servers.status_code == 200
    assert PASSWORD not in servers.text and "probe:" not in servers.text
    assert servers.json()["upstream"]["base_url"] == public_url(url)


def _read_tree(root: Path) -> str:
    return "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file()
    )


async def test_an_upstream_401_that_repeats_the_key_leaks_it_nowhere(
    make_gateway: HarnessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    echo = (
        '{"error": {"message": "Incorrect API key provided: '
        + UPSTREAM_KEY
        + '. You can find your API key at https://example.com/keys", "type": "invalid_key"}}'
    )
    refusal = Script(end="status", status=401, body=echo)
    gw = await make_gateway(
        [refusal, refusal, refusal],
        upstream_api_key=UPSTREAM_KEY,
        log_level="DEBUG",
    )
    response, raw = await gw.raw("POST", "/v1/stream", json={"input": "hi", "mode": "sentinel"})
    assert response.status_code == 200
    frames = raw.decode()
    assert "event: error" in frames and "HTTP 401" in frames and REDACTED in frames
    # The whole key and any piece long enough to use: nowhere in the frames.
    for piece in (UPSTREAM_KEY, UPSTREAM_KEY[:16], UPSTREAM_KEY[-16:]):
        assert piece not in frames
    # The OpenAI-compatible proxy's error body, non-streamed.
    completion = await gw.client.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert completion.status_code >= 400
    assert UPSTREAM_KEY not in completion.text and UPSTREAM_KEY[:16] not in completion.text
    await gw.settle()
    stored = _read_tree(gw.artifacts)
    assert "HTTP 401" in stored and UPSTREAM_KEY not in stored
    # The upstream did receive the key (it is used, only never shown).
    assert any(UPSTREAM_KEY in str(r.headers) for r in gw.upstream.all_requests)
    logs = capsys.readouterr().err
    assert "upstream" in logs and UPSTREAM_KEY not in logs and UPSTREAM_KEY[:16] not in logs


async def test_a_url_with_credentials_is_shown_without_them_in_errors_and_logs(
    make_gateway: HarnessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    unused_tcp_port = dead_port()
    dead = f"http://scout:{PASSWORD}@127.0.0.1:{unused_tcp_port}/v1"
    gw = await make_gateway(upstream_base_url=dead, log_level="DEBUG")
    _response, raw = await gw.raw("POST", "/v1/stream", json={"input": "hi", "mode": "sentinel"})
    frames = raw.decode()
    assert "UPSTREAM_UNAVAILABLE" in frames and f"127.0.0.1:{unused_tcp_port}" in frames
    assert PASSWORD not in frames and "scout:" not in frames
    await gw.settle()
    assert PASSWORD not in _read_tree(gw.artifacts)
    assert PASSWORD not in capsys.readouterr().err


def test_remembered_secrets_are_replaced_by_value_and_idempotently() -> None:
    secret = "tf-remembered-5b1f0c33aa"
    remember_secrets([secret, "short", None])
    text = f"the key {secret}, url-encoded tf-remembered-5b1f0c33aa too, short stays"
    once = redact_text(text)
    assert secret not in once and "short stays" in once
    assert redact_text(once) == once
    assert public_url("https://u:p@h.example/v1?key=abc&x=1") == (
        f"https://h.example/v1?key={REDACTED}&x=1"
    )
    assert (
        redact_text("see https://u:pw@h.example/v1 now")
        == f"see https://{REDACTED}@h.example/v1 now"
    )
