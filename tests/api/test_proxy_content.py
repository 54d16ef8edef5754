"""Input content through the proxy, with the official ``openai`` SDK: an image or file
part goes on unchanged to an upstream that takes it, and is refused by its place in
``messages`` where the upstream cannot take it (``UPSTREAM_KIND``'s default or
``UPSTREAM_INPUT``), before any model call: the same check as the Responses API's."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.api.conftest import SDK, HarnessFactory
from tests.api.test_responses import sent
from toolforge.eval.scripted_upstream import Script

IMAGE = "data:image/png;base64,iVBORw0KGgo="
FILE = "data:application/pdf;base64,JVBERi0xLjQ="
PARTS: list[Any] = [
    {"type": "text", "text": "What are these?"},
    {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}},
    {"type": "file", "file": {"file_data": FILE, "filename": "menu.pdf"}},
]
MESSAGES: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": PARTS},
]


@pytest.mark.parametrize("stream", [False, True])
async def test_parts_go_on_unchanged_to_an_upstream_that_takes_them(
    make_gateway: HarnessFactory, sdk: SDK, stream: bool
) -> None:
    gw = await make_gateway([Script.from_tokens(["A heart and a menu."])])
    if stream:
        chunks = await sdk(gw).chat.completions.create(model="m", messages=MESSAGES, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        done = await sdk(gw).chat.completions.create(model="m", messages=MESSAGES)
        text = done.choices[0].message.content or ""
    assert text == "A heart and a menu."
    assert sent(gw)["messages"][1]["content"] == PARTS


@pytest.mark.parametrize(
    ("settings", "messages", "param", "kind"),
    [
        ({"upstream_kind": "llama_server"}, MESSAGES, "messages[1].content[1]", "image_url"),
        (
            {"upstream_kind": "llama_server"},
            [{"role": "user", "content": [PARTS[0], PARTS[2]]}],
            "messages[0].content[1]",
            "file",
        ),
        ({"upstream_kind": "anthropic"}, MESSAGES, "messages[1].content[1]", "image_url"),
        ({"upstream_input": "text,image"}, MESSAGES, "messages[1].content[2]", "file"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_part_the_upstream_cannot_take_is_refused_by_name(
    make_gateway: HarnessFactory,
    sdk: SDK,
    settings: dict[str, Any],
    messages: list[Any],
    param: str,
    kind: str,
    stream: bool,
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])], **settings)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).chat.completions.create(model="m", messages=messages, stream=stream)
    error = caught.value.response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert f"'{param}'" in caught.value.message and kind in caught.value.message
    assert gw.upstream.requests == []  # refused before any model call


async def test_a_llama_server_declared_multimodal_is_sent_images(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway(
        [Script.from_tokens(["A heart."])],
        upstream_kind="llama_server",
        upstream_input="text,image",
    )
    messages = [{"role": "user", "content": PARTS[:2]}]
    done = await sdk(gw).chat.completions.create(model="m", messages=messages)
    assert done.choices[0].message.content == "A heart."
    assert sent(gw)["messages"][0]["content"] == PARTS[:2]


async def test_the_stream_route_takes_no_content_parts(make_gateway: HarnessFactory) -> None:
    """``POST /v1/stream`` reads a message's content as a string: parts are a 422 that
    names the field, never passed on or dropped."""
    gw = await make_gateway([Script.from_tokens(["Seen."])], upstream_kind="llama_server")
    async with httpx.AsyncClient(base_url=gw.url) as client:
        reply = await client.post("/v1/stream", json={"messages": MESSAGES[1:]})
    assert reply.status_code == 422
    assert "messages.0.content" in reply.text
    assert gw.upstream.requests == []
