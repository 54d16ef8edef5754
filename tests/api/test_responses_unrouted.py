"""A path under ``/v1/responses`` that no route serves, or a method a route does not take,
is answered in OpenAI's error shape (404, or 405 with ``Allow``), as every other refusal
of the Responses API is: the official SDK raises ``NotFoundError`` with the gateway's
message, not Starlette's plain ``{"detail": ...}``."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import SDK, HarnessFactory
from tests.api.test_responses_errors import openai_shaped


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses/resp_1/nothing"),
        ("POST", "/v1/responses/resp_1/cancel/again"),
        ("DELETE", "/v1/responses/resp_1/input_items/x"),
    ],
)
async def test_an_unknown_sub_path_is_a_404_in_openai_shape(
    make_gateway: HarnessFactory, method: str, path: str
) -> None:
    gw = await make_gateway()
    async with httpx.AsyncClient(base_url=gw.url) as client:
        reply = await client.request(method, path, json={} if method == "POST" else None)
    assert reply.status_code == 404
    error = openai_shaped(reply.json())
    assert error["type"] == "invalid_request_error" and error["code"] == "NOT_FOUND"
    assert f"{method} {path}" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/responses", "POST"),
        ("PUT", "/v1/responses", "POST"),
        ("PUT", "/v1/responses/resp_1", "DELETE, GET"),
        ("GET", "/v1/responses/resp_1/cancel", "POST"),
        ("POST", "/v1/responses/resp_1/input_items", "GET"),
    ],
)
async def test_a_wrong_method_is_a_405_in_openai_shape(
    make_gateway: HarnessFactory, method: str, path: str, allow: str
) -> None:
    gw = await make_gateway()
    async with httpx.AsyncClient(base_url=gw.url) as client:
        reply = await client.request(method, path, json={} if method in ("POST", "PUT") else None)
    assert reply.status_code == 405
    assert reply.headers["allow"] == allow
    error = openai_shaped(reply.json())
    assert error["type"] == "invalid_request_error" and error["code"] == "BAD_REQUEST"
    assert f"{method} is not a method of {path}" in error["message"]


async def test_the_sdk_raises_not_found_with_the_gateways_message(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk(gw).get("/responses/resp_1/nothing", cast_to=object)
    assert "no route GET /v1/responses/resp_1/nothing" in caught.value.message
    openai_shaped(caught.value.response.json())
    # the routes themselves are still served
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk(gw).responses.retrieve("resp_missing")
    assert "no stored response 'resp_missing'" in missing.value.message
