"""Files over the UI message stream (``POST /v1/ui/chat``): a user message's ``file``
parts go on to an upstream that takes them, an image (by its ``mediaType``) as
``image_url``, another file as ``file``, and are refused by their place in ``messages``
where the upstream cannot take them (``UPSTREAM_KIND``'s default or ``UPSTREAM_INPUT``),
before any model call: the proxy's check. Raw HTTP here, and the ``ai`` package's
``DefaultChatTransport`` itself (tests/node/ui-stream-content.test.mjs)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_responses import sent
from tests.api.test_ui_stream import chat, kinds
from toolforge.eval.scripted_upstream import Script

IMAGE = "data:image/png;base64,iVBORw0KGgo="
PDF = "data:application/pdf;base64,JVBERi0xLjQ="
TEXT = {"type": "text", "text": "What are these?"}
IMAGE_PART = {"type": "file", "mediaType": "image/png", "url": IMAGE}
PDF_PART = {"type": "file", "mediaType": "application/pdf", "url": PDF, "filename": "menu.pdf"}


def asking(*parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "c1",
        "messages": [{"id": "u1", "role": "user", "parts": list(parts)}],
        "trigger": "submit-message",
    }


def user_content(gw: Any) -> Any:
    return next(m for m in sent(gw)["messages"] if m["role"] == "user")["content"]


async def test_files_go_on_as_chat_completions_parts(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["A heart and a menu."])])
    chunks = await chat(gw, asking(TEXT, IMAGE_PART, PDF_PART))
    assert kinds(chunks)[-1] == "finish"
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said == "A heart and a menu."
    assert user_content(gw) == [
        TEXT,
        {"type": "image_url", "image_url": {"url": IMAGE}},
        {"type": "file", "file": {"file_data": PDF, "filename": "menu.pdf"}},
    ]


@pytest.mark.parametrize(
    ("settings", "parts", "param", "kind"),
    [
        ({"upstream_kind": "llama_server"}, (TEXT, IMAGE_PART), "messages[0].parts[1]", "image"),
        ({"upstream_kind": "anthropic"}, (TEXT, PDF_PART), "messages[0].parts[1]", "file"),
        (
            {"upstream_kind": "llama_server", "upstream_input": "text,image"},
            (TEXT, IMAGE_PART, {"type": "step-start"}, PDF_PART),
            "messages[0].parts[3]",
            "file",
        ),
    ],
)
async def test_a_file_the_upstream_cannot_take_is_refused_by_name(
    make_gateway: HarnessFactory,
    settings: dict[str, Any],
    parts: tuple[dict[str, Any], ...],
    param: str,
    kind: str,
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])], **settings)
    response = await gw.client.post(f"{gw.url}/v1/ui/chat", json=asking(*parts))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["details"][0]["field"] == param
    assert f"'{param}'" in error["message"] and kind in error["message"]
    assert gw.upstream.requests == []  # refused before any model call


@pytest.mark.parametrize(
    ("part", "needle"),
    [
        ({"type": "file", "mediaType": "application/pdf", "url": "https://x/a.pdf"}, "data: URL"),
        ({"type": "file", "mediaType": "image/png"}, "'url'"),
    ],
)
async def test_a_file_chat_completions_cannot_carry_is_refused_by_name(
    make_gateway: HarnessFactory, part: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])])
    response = await gw.client.post(f"{gw.url}/v1/ui/chat", json=asking(TEXT, part))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["details"][0]["field"] == "messages[0].parts[1]"
    assert needle in error["message"]
    assert gw.upstream.requests == []


@pytest.mark.parametrize("takes_images", [False, True])
async def test_the_ai_package_sends_an_image(
    make_gateway: HarnessFactory, takes_images: bool
) -> None:
    settings = {"upstream_input": "text,image"} if takes_images else {}
    gw = await make_gateway(
        [Script.from_tokens(["A heart."])], upstream_kind="llama_server", **settings
    )
    await node_test(
        "ui-stream-content.test.mjs",
        gw.url,
        "ai",
        {"TOOLFORGE_TAKES_IMAGES": "1" if takes_images else "0"},
    )
    if not takes_images:
        assert gw.upstream.requests == []
        return
    assert user_content(gw) == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": IMAGE}},
    ]
