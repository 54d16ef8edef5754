"""Images and documents over ``POST /v1/agui``: a user message's ``image`` and
``document`` parts (the ``ag-ui-protocol`` package's types) go on to an upstream that
takes them as Chat Completions parts, and are refused by their place in ``messages``
where the upstream cannot take them (``UPSTREAM_KIND``'s default or ``UPSTREAM_INPUT``),
before any model call: the proxy's check. Raw HTTP here, and @ag-ui/client's
``HttpAgent`` itself (tests/node/agui-content.test.mjs)."""

from __future__ import annotations

from typing import Any

import pytest
from ag_ui.core import EventType, RunAgentInput

from tests.api.conftest import HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_agui import run, run_input, types
from tests.api.test_responses import sent
from toolforge.eval.scripted_upstream import Script

PNG, PDF = "iVBORw0KGgo=", "JVBERi0xLjQ="
TEXT = {"type": "text", "text": "What are these?"}
IMAGE = {"type": "image", "source": {"type": "data", "value": PNG, "mimeType": "image/png"}}
IMAGE_URL = {"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}
DOCUMENT = {
    "type": "document",
    "source": {"type": "data", "value": PDF, "mimeType": "application/pdf"},
    "metadata": {"filename": "menu.pdf"},
}
DOCUMENT_ID = {"type": "document", "source": {"type": "file", "value": "file-abc123"}}


def asking(*parts: dict[str, Any]) -> dict[str, Any]:
    """A run whose one user message holds ``parts``, checked against the package's model."""
    body = run_input([{"id": "u1", "role": "user", "content": list(parts)}])
    RunAgentInput.model_validate(body)
    return body


def user_content(gw: Any) -> Any:
    return next(m for m in sent(gw)["messages"] if m["role"] == "user")["content"]


async def test_images_and_documents_go_on_as_chat_completions_parts(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script.from_tokens(["A heart and a menu."])])
    events = await run(gw, asking(TEXT, IMAGE, IMAGE_URL, DOCUMENT, DOCUMENT_ID))
    assert types(events)[-1] == "RUN_FINISHED"
    said = [e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT]
    assert "".join(said) == "A heart and a menu."
    assert user_content(gw) == [
        TEXT,
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {
            "type": "file",
            "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "menu.pdf"},
        },
        {"type": "file", "file": {"file_id": "file-abc123"}},
    ]


async def test_text_parts_alone_go_on_as_a_string(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([Script.from_tokens(["Hi."])], upstream_kind="llama_server")
    await run(gw, asking(TEXT, {"type": "text", "text": " Twice."}))
    assert user_content(gw) == "What are these? Twice."


@pytest.mark.parametrize(
    ("settings", "parts", "param", "kind"),
    [
        ({"upstream_kind": "llama_server"}, (TEXT, IMAGE), "messages[0].content[1]", "image"),
        ({"upstream_kind": "anthropic"}, (TEXT, DOCUMENT), "messages[0].content[1]", "document"),
        (
            {"upstream_kind": "llama_server", "upstream_input": "text,image"},
            (TEXT, IMAGE, DOCUMENT),
            "messages[0].content[2]",
            "document",
        ),
    ],
)
async def test_a_part_the_upstream_cannot_take_is_refused_by_name(
    make_gateway: HarnessFactory,
    settings: dict[str, Any],
    parts: tuple[dict[str, Any], ...],
    param: str,
    kind: str,
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])], **settings)
    response = await gw.client.post(f"{gw.url}/v1/agui", json=asking(*parts))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["details"][0]["field"] == param
    assert f"'{param}'" in error["message"] and kind in error["message"]
    assert gw.upstream.requests == []  # refused before any model call


@pytest.mark.parametrize(
    ("part", "needle"),
    [
        ({"type": "audio", "source": IMAGE["source"]}, "'audio'"),
        ({"type": "image", "source": {"type": "file", "value": "file-1"}}, "file handle"),
        ({"type": "document", "source": {"type": "url", "value": "https://x/a.pdf"}}, "URL"),
    ],
)
async def test_a_part_chat_completions_cannot_carry_is_refused_by_name(
    make_gateway: HarnessFactory, part: dict[str, Any], needle: str
) -> None:
    gw = await make_gateway([Script.from_tokens(["Seen."])])
    response = await gw.client.post(f"{gw.url}/v1/agui", json=asking(TEXT, part))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["details"][0]["field"] == "messages[0].content[1]"
    assert needle in error["message"]
    assert gw.upstream.requests == []


@pytest.mark.parametrize("takes_images", [False, True])
async def test_the_ag_ui_client_sends_an_image(
    make_gateway: HarnessFactory, takes_images: bool
) -> None:
    settings = {"upstream_input": "text,image"} if takes_images else {}
    gw = await make_gateway(
        [Script.from_tokens(["A heart."])], upstream_kind="llama_server", **settings
    )
    await node_test(
        "agui-content.test.mjs",
        gw.url,
        "@ag-ui/client",
        {"TOOLFORGE_TAKES_IMAGES": "1" if takes_images else "0"},
    )
    if not takes_images:
        assert gw.upstream.requests == []
        return
    assert user_content(gw) == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]
