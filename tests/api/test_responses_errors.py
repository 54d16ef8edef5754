"""Every refusal of the Responses API before its stream, in the API's error shape
(``{"error": {"message", "type", "param", "code"}}``), whoever answers it: the access
check (401, 429), the request's shape checked ahead of FastAPI (413, 415), FastAPI's own
parameter checks, the route. The official ``openai`` SDK raises its typed exception with
the gateway's message; no model is asked anything."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import Harness, HarnessFactory
from toolforge.eval.scripted_upstream import Script

KEY = "tf-key-aaaaaaaaaaaaaaaaaaaa"
WRONG = "tf-key-not-the-right-one-zz"

Client = Callable[[Harness, str], AsyncOpenAI]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    made: list[AsyncOpenAI] = []

    def make(gw: Harness, key: str) -> AsyncOpenAI:
        sdk = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=10)
        made.append(sdk)
        return sdk

    yield make
    for sdk in made:
        await sdk.close()


def openai_shaped(body: Any) -> dict[str, Any]:
    """The body's error, checked to be OpenAI's shape."""
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("stream", [False, True])
async def test_a_wrong_key_is_an_authentication_error(
    make_gateway: HarnessFactory, client: Client, stream: bool
) -> None:
    gw = await make_gateway([Script.from_tokens(["Hi."])], api_keys=KEY)
    with pytest.raises(openai.AuthenticationError) as caught:
        await client(gw, WRONG).responses.create(model="m", input="Hi", stream=stream)
    assert caught.value.status_code == 401
    assert "the API key is not one this gateway knows" in caught.value.message
    error = openai_shaped(caught.value.response.json())
    assert error["type"] == "authentication_error" and error["code"] == "UNAUTHORIZED"
    with pytest.raises(openai.AuthenticationError):
        await client(gw, WRONG).responses.retrieve("resp_any")
    assert gw.upstream.requests == []
    # the right key gets in
    done = await client(gw, KEY).responses.create(model="m", input="Hi")
    assert done.output_text == "Hi."


async def test_no_key_is_an_authentication_error(
    make_gateway: HarnessFactory, client: Client
) -> None:
    gw = await make_gateway(api_keys=KEY)
    with pytest.raises(openai.AuthenticationError) as caught:
        # the SDK wants a key: it is given one, and told to send no Authorization header
        await client(gw, "unsent").responses.create(
            model="m", input="Hi", extra_headers={"Authorization": openai.omit}
        )
    assert "this gateway needs an API key" in caught.value.message
    raw = await gw.client.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "Hi"})
    assert raw.status_code == 401 and raw.headers["www-authenticate"] == "Bearer"
    assert openai_shaped(raw.json())["type"] == "authentication_error"
    listed = await gw.client.get(f"{gw.url}/v1/responses/resp_x/input_items")
    assert listed.status_code == 401 and openai_shaped(listed.json())
    assert gw.upstream.requests == []


async def test_too_many_requests_is_a_rate_limit_error(
    make_gateway: HarnessFactory, client: Client
) -> None:
    gw = await make_gateway(
        [Script.from_tokens(["Hi."])],
        api_keys=KEY,
        rate_limit_requests=1,
        rate_limit_window_s=3600,
    )
    sdk = client(gw, KEY)
    await sdk.responses.create(model="m", input="Hi")
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk.responses.create(model="m", input="Again")
    assert caught.value.response.headers["retry-after"]
    assert openai_shaped(caught.value.response.json())["type"] == "rate_limit_error"
    assert len(gw.upstream.requests) == 1


async def test_a_body_too_large_is_413(make_gateway: HarnessFactory, client: Client) -> None:
    gw = await make_gateway(max_body_bytes=1024)
    with pytest.raises(openai.APIStatusError) as caught:
        await client(gw, "unused").responses.create(model="m", input="x" * 4096)
    assert caught.value.status_code == 413
    assert openai_shaped(caught.value.response.json())["code"] == "BODY_TOO_LARGE"
    assert gw.upstream.requests == []


async def test_a_body_that_is_not_json_is_415(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    response = await gw.client.post(
        f"{gw.url}/v1/responses",
        content=b'{"model": "m", "input": "Hi"}',
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 415
    error = openai_shaped(response.json())
    assert error["type"] == "invalid_request_error" and "application/json" in error["message"]
    assert gw.upstream.requests == []


async def test_a_bad_query_parameter_is_named(make_gateway: HarnessFactory, client: Client) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.BadRequestError) as caught:
        await client(gw, "unused").responses.input_items.list("resp_x", limit=0)
    error = openai_shaped(caught.value.response.json())
    assert error["param"] == "limit" and "'limit'" in error["message"]
