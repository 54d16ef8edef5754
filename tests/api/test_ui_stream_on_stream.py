"""The AI SDK's UI message stream from ``POST /v1/stream`` itself (docs/ui-stream.md, "On
/v1/stream"): asked with ``format=ui`` or with the ``Accept`` parameter, the request is
``/v1/ui/chat``'s and so is the answer; asked neither way, ``/v1/stream`` answers its own
frames, byte for byte as before; a wrong ``format`` or ``Accept`` version is refused by
name. A real gateway on loopback in front of the scripted upstream; the ``ai`` package
itself reads the stream in ``tests/node/ui-stream-on-stream.test.mjs``."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from tests.api.conftest import Harness, HarnessFactory
from tests.api.node_run import node_test
from tests.api.test_agui import approval_registry
from tests.api.test_auth import KEY_A, bearer
from tests.api.test_proxy import native_call
from tests.api.test_ui_stream_node import _CityArgs, _lookup
from toolforge.core.tool_specs import ToolSpec
from toolforge.eval.scripted_upstream import Script

ACCEPT_UI = "text/event-stream; x-vercel-ai-ui-message-stream=v1"
# The two ways of asking: (query string, headers).
ASKS: dict[str, tuple[str, dict[str, str]]] = {
    "query": ("?format=ui", {}),
    "accept": ("", {"Accept": ACCEPT_UI}),
    "accept-among-others": (
        "",
        {"Accept": 'application/json;q=0.5, text/event-stream; X-Vercel-AI-UI-Message-Stream="v1"'},
    ),
}


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


async def post(
    gw: Harness, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with gw.client.stream("POST", f"{gw.url}{path}", json=body, headers=headers) as r:
        return r.status_code, dict(r.headers), await r.aread()


def chunks(raw: bytes) -> list[dict[str, Any]]:
    """The UI stream's chunks as the SDK reads them (``data:`` lines, ``[DONE]`` last)."""
    blocks = [b for b in raw.decode().split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]", raw
    return [orjson.loads(b.removeprefix("data: ")) for b in blocks[:-1]]


def same_ids(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``values`` with each id (``messageId``, ``toolCallId``, ``approvalId``, ``id``)
    replaced by its order of first appearance: two runs' chunks compare whole."""
    seen: dict[str, str] = {}

    def named(chunk: dict[str, Any]) -> dict[str, Any]:
        return {
            k: seen.setdefault(v, f"id{len(seen)}") if k.endswith(("Id", "id")) else v
            for k, v in chunk.items()
        }

    return [named(c) for c in values]


@pytest.mark.parametrize("ask", list(ASKS))
async def test_asked_either_way_the_answer_is_ui_chats(
    make_gateway: HarnessFactory, ask: str
) -> None:
    ran: list[int] = []
    gw = await make_gateway(
        [
            native_call("book", {"table": 4}),
            native_call("respond", {"content": "Booked."}),
        ]
        * 2,
        tools=approval_registry(ran),
    )
    query, headers = ASKS[ask]
    answers: dict[str, list[list[dict[str, Any]]]] = {}
    for path in ("/v1/ui/chat", f"/v1/stream{query}"):
        body = {"id": "c1", "messages": [user("Book table 4.")], "trigger": "submit-message"}
        body["toolforge"] = {"server_tools": ["book"]}
        status, got, raw = await post(gw, path, body, headers)
        assert status == 200, raw
        assert got["x-vercel-ai-ui-message-stream"] == "v1"
        assert got["content-type"].startswith("text/event-stream")
        first = chunks(raw)
        asked = next(c for c in first if c["type"] == "tool-approval-request")
        answered = {
            "id": first[0]["messageId"],
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-book",
                    "toolCallId": asked["toolCallId"],
                    "state": "approval-responded",
                    "input": {"table": 4},
                    "approval": {"id": asked["approvalId"], "approved": True},
                }
            ],
        }
        body["messages"] = [user("Book table 4."), answered]
        status, _, raw = await post(gw, path, body, headers)
        assert status == 200, raw
        second = chunks(raw)
        assert second[0] == {"type": "start", "messageId": first[0]["messageId"]}
        answers[path] = [same_ids(first), same_ids(second)]
    ui_chat, on_stream = answers.values()
    assert on_stream == ui_chat
    assert ran == [4, 4]
    assert any(c["type"] == "tool-output-available" for c in on_stream[1])


def _steady(raw: bytes) -> bytes:
    """A ``/v1/stream`` answer without what differs from run to run: the stream id and
    the ``done`` frame's timings."""
    raw = re.sub(rb"s_[0-9a-f]{20}", b"s_ID", raw)
    return re.sub(rb'"metrics":\{[^}]*\}', b'"metrics":{}', raw)


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ("?reformat=ui&formats=ui", {}),
        ("", {"Accept": "text/event-stream"}),
        ("", {"Accept": "text/event-stream; charset=utf-8, application/json;q=0.1"}),
    ],
    ids=["other-parameters", "accept-sse", "accept-several"],
)
async def test_not_asked_v1_stream_answers_its_frames_as_before(
    make_gateway: HarnessFactory, query: str, headers: dict[str, str]
) -> None:
    gw = await make_gateway([Script.from_tokens(["Sunny ", "and warm."])] * 3)
    status, plain_headers, plain = await post(gw, "/v1/stream", {"input": "Weather?"})
    assert status == 200
    assert plain.startswith(b"id: 1\nevent: stream.begin\n")
    status, got, raw = await post(gw, f"/v1/stream{query}", {"input": "Weather?"}, headers)
    assert status == 200
    assert _steady(raw) == _steady(plain)
    assert "x-vercel-ai-ui-message-stream" not in got
    assert got["content-type"] == plain_headers["content-type"]
    # A UI message body is not taken for one without asking: /v1/stream's frames answer it.
    status, got, raw = await post(gw, "/v1/stream", {"messages": [user("Weather?")]}, headers)
    assert raw.startswith(b"id: 1\nevent: stream.begin\n"), raw
    assert "x-vercel-ai-ui-message-stream" not in got


@pytest.mark.parametrize(
    ("query", "headers", "field"),
    [
        ("?format=frames", {}, "format"),
        ("?format=UI", {}, "format"),
        ("?format=", {}, "format"),
        ("?format=ui&format=sse", {}, "format"),
        ("", {"Accept": "text/event-stream; x-vercel-ai-ui-message-stream=v2"}, "Accept"),
    ],
)
async def test_a_wrong_format_is_refused_by_name(
    make_gateway: HarnessFactory, query: str, headers: dict[str, str], field: str
) -> None:
    gw = await make_gateway()
    response = await gw.client.post(
        f"{gw.url}/v1/stream{query}", json={"messages": [user("Hi")]}, headers=headers
    )
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["retryable"] is False
    assert error["details"][0]["field"].startswith(field)
    assert f"invalid '{field}" in error["message"]
    assert gw.upstream.requests == []


async def test_a_key_holds_one_stream_and_the_approval_takes_no_second(
    make_gateway: HarnessFactory,
) -> None:
    ran: list[int] = []
    gw = await make_gateway(
        [native_call("book", {"table": 4}), native_call("respond", {"content": "Booked."})],
        tools=approval_registry(ran),
        api_keys=KEY_A,
        rate_limit_streams=1,
    )
    path = "/v1/stream?format=ui"
    body: dict[str, Any] = {
        "messages": [user("Book table 4.")],
        "toolforge": {"server_tools": ["book"]},
    }
    status, _, raw = await post(gw, path, body)
    assert status == 401, raw  # the key is checked as on every route
    status, _, raw = await post(gw, path, body, bearer(KEY_A))
    assert status == 200, raw
    first = chunks(raw)
    asked = next(c for c in first if c["type"] == "tool-approval-request")
    # The stream waits for its approval and holds the key's one stream.
    status, _, raw = await post(gw, path, body, bearer(KEY_A))
    assert status == 429, raw
    answered = {
        "id": first[0]["messageId"],
        "role": "assistant",
        "parts": [
            {
                "type": "tool-book",
                "toolCallId": asked["toolCallId"],
                "state": "approval-responded",
                "input": {"table": 4},
                "approval": {"id": asked["approvalId"], "approved": True},
            }
        ],
    }
    body["messages"] = [user("Book table 4."), answered]
    status, _, raw = await post(gw, path, body, bearer(KEY_A))
    assert status == 200, raw
    text = "".join(c["delta"] for c in chunks(raw) if c["type"] == "text-delta")
    assert text == "Booked." and ran == [4]
    assert len(gw.upstream.requests) == 2


async def test_the_ai_package_reads_v1_stream(make_gateway: HarnessFactory) -> None:
    ran: list[int] = []
    tools = approval_registry(ran)
    tools.register(
        ToolSpec(name="lookup", description="Looks up.", args_model=_CityArgs, fn=_lookup)
    )
    per_way = [  # one script per upstream request, in ui-stream-on-stream.test.mjs's order
        native_call("lookup", {"city": "Paris"}),
        native_call("respond", {"content": "Sunny in Paris."}),
        native_call("book", {"table": 4}),
        native_call("respond", {"content": "Booked."}),
    ]
    gw = await make_gateway(per_way * 2, tools=tools)
    await node_test("ui-stream-on-stream.test.mjs", gw.url, "ai")
    assert ran == [4, 4]
    assert len(gw.upstream.requests) == 8
    assert all(b"Weather in Paris?" in r.body for r in gw.upstream.requests)
