"""Input content through the official ``openai`` SDK: every content type goes on to an
upstream that takes it, as its Chat Completions part, and is refused by its place in
``input`` where the upstream cannot take it (``UPSTREAM_KIND``'s default or
``UPSTREAM_INPUT``), before any model call."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.api.conftest import SDK, HarnessFactory
from tests.api.test_responses import sent
from toolforge.eval.scripted_upstream import Script

IMAGE = "data:image/png;base64,iVBORw0KGgo="
FILE = "data:application/pdf;base64,JVBERi0xLjQ="
INPUT: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What are these?"},
            {"type": "input_image", "image_url": IMAGE, "detail": "low"},
            {"type": "input_file", "file_data": FILE, "filename": "menu.pdf"},
        ],
    }
]


async def test_every_content_type_goes_on_to_an_upstream_that_takes_it(
    make_gateway: HarnessFactory, sdk: SDK
) -> None:
    gw = await make_gateway([Script.from_tokens(["A heart and a menu."])])
    done = await sdk(gw).responses.create(model="m", input=INPUT)
    assert done.output_text == "A heart and a menu."
    assert sent(gw)["messages"][0]["content"] == [
        {"type": "text", "text": "What are these?"},
        {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}},
        {"type": "file", "file": {"file_data": FILE, "filename": "menu.pdf"}},
    ]


@pytest.mark.parametrize(
    ("settings", "param", "kind"),
    [
        ({"upstream_kind": "llama_server"}, "input[1].content[1]", "input_image"),
        ({"upstream_kind": "anthropic"}, "input[1].content[1]", "input_image"),
        ({"upstream_input": "text,image"}, "input[1].content[2]", "input_file"),
    ],
)
async def test_content_an_upstream_cannot_take_is_refused_by_name(
    make_gateway: HarnessFactory, sdk: SDK, settings: dict[str, Any], param: str, kind: str
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])], **settings)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk(gw).responses.create(
            model="m", input=[{"role": "user", "content": "Hello."}, *INPUT], stream=True
        )
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
    done = await sdk(gw).responses.create(
        model="m", input=[{**INPUT[0], "content": INPUT[0]["content"][:2]}]
    )
    assert done.output_text == "A heart."
    assert sent(gw)["messages"][0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": IMAGE, "detail": "low"},
    }
