"""AG-UI runs and AI SDK UI messages resumed on the other replica (docs/agui.md,
docs/ui-stream.md): two gateway processes sharing one Redis. A run that stops at an
approval on replica A is answered through replica B: the decision reaches A, and B writes
the rest of the run from A's mirrored frames, re-encoded into the format, as
``GET /v1/streams/{id}`` serves any stream on any replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from ag_ui.core import Event as AguiEvent
from ag_ui.core import EventType
from pydantic import TypeAdapter

from tests.api.test_proxy import native_call
from tests.replicas.conftest import Replica, ReplicaFactory, choose
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream

EVENT: TypeAdapter[Any] = TypeAdapter(AguiEvent)
MODEL = "native:guarded"  # a native call of the tool a person must approve, then a reply
EXTENSION = {"server_tools": ["guarded"]}


def _choose(request: Any) -> Script:
    """The replicas' scripts, plus ``native:guarded``: a native ``guarded`` call, then
    (its result in the messages) the answer through ``respond``."""
    if isinstance(request, dict) and request.get("model") == MODEL:
        answered = any(m.get("role") == "tool" for m in request.get("messages", []))
        if answered:
            return native_call("respond", {"content": "Launched."}, call_id="call_up_2")
        return native_call("guarded", {"what": "launch"})
    return choose(request)


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    async with ScriptedUpstream(script_for=_choose) as up:
        yield up


async def _post(replica: Replica, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
    async with replica.client.stream("POST", f"{replica.url}{path}", json=body) as response:
        raw = await response.aread()
        assert response.status_code == 200, raw
        return response.headers["x-stream-id"], raw


# -- AG-UI ------------------------------------------------------------------------------------


def _run_input(run_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "threadId": "t1",
        "runId": run_id,
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": "Launch it."}],
        "tools": [],
        "context": [],
        "forwardedProps": {"model": MODEL, "toolforge": EXTENSION},
        **extra,
    }


def _agui_events(raw: bytes) -> list[Any]:
    blocks = raw.decode().split("\n\n")
    return [EVENT.validate_python(orjson.loads(b[6:])) for b in blocks if b.startswith("data: ")]


@pytest.mark.parametrize("approve", [True, False], ids=["granted", "denied"])
async def test_an_agui_interrupt_on_a_is_resumed_through_b(
    replicas: ReplicaFactory, approve: bool
) -> None:
    a, b = await replicas()
    stream_id, raw = await _post(a, "/v1/agui", _run_input("r1"))
    first = _agui_events(raw)
    assert first[-1].type == EventType.RUN_FINISHED and first[-1].outcome.type == "interrupt"
    (interrupt,) = first[-1].outcome.interrupts
    resume = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"approve": approve}}]
    resumed_id, raw = await _post(b, "/v1/agui", _run_input("r2", resume=resume))
    assert resumed_id == stream_id
    second = _agui_events(raw)  # every event parses as ag-ui-protocol's own type
    assert second[0].type == EventType.RUN_STARTED and second[0].run_id == "r2"
    (result,) = [e for e in second if e.type == EventType.TOOL_CALL_RESULT]
    assert result.tool_call_id == interrupt.tool_call_id
    content = orjson.loads(result.content)
    if approve:
        assert content == {"done": "launch", "pid": a.proc.pid}  # it ran on A, the owner
    else:
        assert content["error"]["code"] == "TOOL_APPROVAL_DENIED"
    text = "".join(e.delta for e in second if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "Launched."
    assert second[-1].type == EventType.RUN_FINISHED and second[-1].outcome.type == "success"
    # nothing of the first run again: its call is not restated
    assert not any(e.type == EventType.TOOL_CALL_START for e in second)


async def test_an_agui_resume_of_an_unknown_stream_is_a_404_on_b(
    replicas: ReplicaFactory,
) -> None:
    _, b = await replicas()
    resume = [{"interruptId": "s_nope.t1.4", "status": "resolved", "payload": {"approve": True}}]
    answer = await b.client.post(f"{b.url}/v1/agui", json=_run_input("r2", resume=resume))
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "NOT_FOUND"


# -- the AI SDK UI message stream ---------------------------------------------------------------


def _ui_chunks(raw: bytes) -> list[dict[str, Any]]:
    blocks = [blk for blk in raw.decode().split("\n\n") if blk]
    assert blocks[-1] == "data: [DONE]"
    return [orjson.loads(blk.removeprefix("data: ")) for blk in blocks[:-1]]


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_a_ui_message_approval_on_a_is_answered_through_b(
    replicas: ReplicaFactory, approve: bool
) -> None:
    a, b = await replicas()
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Launch it."}]}
    body = {"messages": [user], "model": MODEL, "toolforge": EXTENSION}
    stream_id, raw = await _post(a, "/v1/ui/chat", body)
    first = _ui_chunks(raw)
    request = next(c for c in first if c["type"] == "tool-approval-request")
    message_id = first[0]["messageId"]
    answered = {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {
                "type": "tool-guarded",
                "toolCallId": request["toolCallId"],
                "state": "approval-responded",
                "input": {"what": "launch"},
                "approval": {"id": request["approvalId"], "approved": approve},
            }
        ],
    }
    resumed_id, raw = await _post(b, "/v1/ui/chat", {**body, "messages": [user, answered]})
    assert resumed_id == stream_id
    second = _ui_chunks(raw)
    assert second[0] == {"type": "start", "messageId": message_id}  # the same message goes on
    if approve:
        output = next(c for c in second if c["type"] == "tool-output-available")
        assert output["output"] == {"done": "launch", "pid": a.proc.pid}
    else:
        assert any(c["type"] == "tool-output-denied" for c in second)
    text = "".join(c["delta"] for c in second if c["type"] == "text-delta")
    assert text == "Launched."
    assert second[-1]["type"] == "finish"
