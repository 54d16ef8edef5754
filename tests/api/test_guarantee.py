"""The JSON guarantee through the gateway: valid, repaired locally, repaired by the model
once, or degraded to a minimal schema-valid object with diagnostics; the stream goes on."""

from __future__ import annotations

from typing import Any

import orjson

from tests.api.conftest import HarnessFactory, assert_well_formed, frames
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script


def result_frame(body: str, fid: str = "r1", schema: str = "AssistantReply") -> str:
    return sentinels.frame(FrameKind.RESULT, fid, schema, body)


def object_frame(body: str, fid: str = "o1", schema: str = "Action") -> str:
    return sentinels.frame(FrameKind.OBJECT, fid, schema, body)


def tokens(text: str, size: int = 4) -> Script:
    return Script.from_tokens([text[i : i + size] for i in range(0, len(text), size)])


def end_of(events: list[Any], event: str = "result.end") -> dict[str, Any]:
    (data,) = [e.data for e in frames(events) if e.event == event]
    return data


async def test_valid_result_passes_untouched(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([tokens(result_frame('{"answer":"ok","citations":["a"]}'))])
    end = end_of(await gw.stream())
    assert end["value"] == {"answer": "ok", "citations": ["a"]}
    assert (end["repaired"], end["degraded"]) == (False, False)
    assert len(gw.upstream.requests) == 1


async def test_syntax_is_repaired_locally_without_asking_the_model(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([tokens(result_frame("{'answer': 'ok', 'citations': [],}"))])
    events = await gw.stream()
    assert_well_formed(events)
    end = end_of(events)
    assert end["value"] == {"answer": "ok", "citations": []}
    assert (end["repaired"], end["degraded"]) == (True, False)
    assert len(gw.upstream.requests) == 1  # no model repair call


async def test_missing_required_key_is_repaired_by_one_model_call(
    make_gateway: HarnessFactory,
) -> None:
    fixed = '{"answer": "Two places are open.", "citations": []}'
    gw = await make_gateway([tokens(result_frame('{"citations": []}')), tokens(fixed)])
    events = await gw.stream()
    end = end_of(events)
    assert end["value"] == {"answer": "Two places are open.", "citations": []}
    assert (end["repaired"], end["degraded"]) == (True, False)
    repair = gw.upstream.requests[1].json
    assert repair["temperature"] == 0
    prompt = repair["messages"][-1]["content"]
    assert "answer" in prompt and '{"citations": []}' in prompt  # errors and the bad JSON
    assert [e.event for e in frames(events)][-1] == "done"


async def test_unrepairable_becomes_degraded_with_diagnostics(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([tokens(result_frame('{"citations": 7}')), tokens("sorry, I can't")])
    events = await gw.stream()
    assert_well_formed(events)
    end = end_of(events)
    assert (end["repaired"], end["degraded"]) == (False, True)
    value = end["value"]
    assert value["diagnostics"]["error"] == "schema_repair_failed"
    paths = {e["path"] for e in value["diagnostics"]["last_validator_errors"]}
    assert paths & {"$", "$.answer", "$.citations"}
    assert isinstance(value["answer"], str)  # still a valid AssistantReply
    assert end_of(events, "done")["reason"] == "stop"  # the stream went on
    stream_id = frames(events)[0].data["stream_id"]
    await gw.settle()
    run = gw.artifacts / "runs" / stream_id
    records = [orjson.loads(line) for line in (run / "frames.ndjson").read_bytes().splitlines()]
    marked = [r for r in records if r.get("degraded")]
    assert [r["event"] for r in marked] == ["result.end"]
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    assert metrics["degraded_frames"] == 1


async def test_enum_and_union_violations_in_an_object(make_gateway: HarnessFactory) -> None:
    bad = '{"mode": "fly", "target": {"kind": "place"}}'
    fixed = '{"mode": "search", "target": {"kind": "place", "id": "p1"}}'
    text = object_frame(bad) + result_frame('{"answer": "done"}')
    gw = await make_gateway([tokens(text), tokens(fixed)])
    events = await gw.stream({"input": "x", "object_schemas": ["Action"]})
    end = end_of(events, "json.end")
    assert end["value"] == {"mode": "search", "target": {"kind": "place", "id": "p1"}}
    assert end["repaired"] is True
    prompt = gw.upstream.requests[1].json["messages"][-1]["content"]
    assert "$.mode" in prompt  # the validator errors name the path
    assert end_of(events)["value"]["answer"] == "done"


async def test_repair_retries_zero_degrades_without_a_model_call(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([tokens(result_frame("{}"))], repair_retries=0)
    end = end_of(await gw.stream())
    assert end["degraded"] is True and len(gw.upstream.requests) == 1


async def test_inline_object_schema(make_gateway: HarnessFactory) -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "integer"}},
        "required": ["x"],
        "additionalProperties": False,
    }
    text = object_frame('{"x": 3}', schema="Point") + result_frame('{"answer": "a"}')
    gw = await make_gateway([tokens(text)])
    events = await gw.stream(
        {"input": "x", "object_schemas": [{"name": "Point", "schema": schema}]}
    )
    assert end_of(events, "json.end")["value"] == {"x": 3}
    assert "Point:" in gw.upstream.requests[0].json["messages"][0]["content"]


async def test_bad_and_unknown_schemas_are_422(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway()
    bad = await gw.client.post(
        f"{gw.url}/v1/stream",
        json={"input": "x", "object_schemas": [{"name": "P", "schema": {"type": "nope"}}]},
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_SCHEMA"
    unknown = await gw.client.post(
        f"{gw.url}/v1/stream", json={"input": "x", "result_schema": "Nope"}
    )
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "UNKNOWN_SCHEMA"
    assert not gw.upstream.requests


async def test_a_large_damaged_body_is_repaired_off_the_event_loop(
    make_gateway: HarnessFactory,
) -> None:
    # Over 8 KB, the local repair runs in a worker thread; the outcome is the same.
    citations = ", ".join(f"'c{i}'" for i in range(2000))
    body = "{'answer': 'ok', 'citations': [" + citations + "],}"
    gw = await make_gateway([tokens(result_frame(body), size=64)])
    end = end_of(await gw.stream())
    assert (end["repaired"], end["degraded"]) == (True, False)
    assert end["value"]["citations"][1999] == "c1999"
