"""/openapi.json describes POST /v1/stream: its body (unknown fields refused), its events
(the typed frames' union, each described) and its error body (docs/protocol.md)."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator

from tests.api.conftest import HarnessFactory
from toolforge.core.protocol.frames import EVENTS, TextDelta
from toolforge.eval.scripted_upstream import Script

COMPONENTS = "#/components/schemas/"


def validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for one component, its references resolved inside ``document``."""
    return Draft202012Validator({**document, "$ref": f"{COMPONENTS}{name}"})


async def fetch(make_gateway: HarnessFactory) -> dict[str, Any]:
    gw = await make_gateway([Script.from_tokens(["x"])])
    response = await gw.client.get(f"{gw.url}/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


async def test_the_stream_body_is_the_request_schema(make_gateway: HarnessFactory) -> None:
    document = await fetch(make_gateway)
    body = document["paths"]["/v1/stream"]["post"]["requestBody"]
    assert body["required"] is True
    assert body["content"]["application/json"]["schema"] == {"$ref": f"{COMPONENTS}StreamRequest"}
    request = validator(document, "StreamRequest")
    assert document["components"]["schemas"]["StreamRequest"]["additionalProperties"] is False
    assert request.is_valid({"input": "pizza?", "mode": "sentinel", "sampling": {"seed": 1}})
    assert request.is_valid({"messages": [{"role": "user", "content": "hi", "name": "ann"}]})
    assert not request.is_valid({"input": "pizza?", "inptu": "typo"})
    assert not request.is_valid({"input": "pizza?", "sampling": {"temprature": 0.5}})
    assert not request.is_valid({"input": "pizza?", "mode": "psychic"})


async def test_the_stream_answers_every_event_described(make_gateway: HarnessFactory) -> None:
    document = await fetch(make_gateway)
    ok = document["paths"]["/v1/stream"]["post"]["responses"]["200"]
    assert ok["content"]["text/event-stream"]["schema"] == {"$ref": f"{COMPONENTS}StreamEvent"}
    union = document["components"]["schemas"]["StreamEvent"]
    assert set(union["discriminator"]["mapping"]) == set(EVENTS)
    for event, cls in EVENTS.items():
        assert f"- `{event}`: " in ok["description"]
        assert document["components"]["schemas"][cls.__name__]["description"]
    resume = document["paths"]["/v1/streams/{stream_id}"]["get"]["responses"]["200"]
    assert resume["content"] == ok["content"]
    events = validator(document, "StreamEvent")
    assert events.is_valid({"id": 2, "event": "text.delta", "data": TextDelta("hi").data})
    assert events.is_valid({"event": "ping", "data": {}})
    assert not events.is_valid({"id": 2, "event": "text.delta", "data": {"text": "hi"}})
    assert not events.is_valid({"id": 2, "event": "ping", "data": {}})  # pings have no id


async def test_errors_before_the_stream_are_the_gateways_error_body(
    make_gateway: HarnessFactory,
) -> None:
    document = await fetch(make_gateway)
    responses = document["paths"]["/v1/stream"]["post"]["responses"]
    assert {"409", "413", "422"} <= set(responses)
    errors = validator(document, "ErrorResponse")
    gw = await make_gateway([])
    response = await gw.client.post(f"{gw.url}/v1/stream", json={"input": "x", "bogus": 1})
    assert response.status_code == 422
    assert errors.is_valid(response.json()), response.json()
    assert not errors.is_valid({"detail": [{"loc": ["body"], "msg": "FastAPI's shape"}]})


async def test_the_proxy_body_is_described(make_gateway: HarnessFactory) -> None:
    document = await fetch(make_gateway)
    post = document["paths"]["/v1/chat/completions"]["post"]
    schema = post["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": f"{COMPONENTS}ChatCompletionRequest"}
    request = validator(document, "ChatCompletionRequest")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert request.is_valid(body)
    assert request.is_valid({**body, "toolforge": {"guardrails": {"json": False}}})
    assert not request.is_valid({**body, "frobnicate": 1})
    assert "/v1/models" in document["paths"]
