"""Real streams against the committed frame schemas: every event a client receives (pings
included) validates against ``schemas/frames/<event>.json`` and decodes to the typed frame
whose ``data`` is exactly what was sent."""

from __future__ import annotations

import functools

import orjson
from jsonschema import Draft202012Validator

from tests.api.conftest import HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import PING_BYTES, decode
from toolforge.eval.loopback import Event
from toolforge.eval.scripted_upstream import Script, Step
from toolforge.tools.export_schemas import SCHEMAS_DIR

ACTION = {"mode": "search", "target": {"kind": "place", "id": "p1"}}
SEARCH = {"query": "pizza", "radius_km": 5, "open_at": "19:00"}


@functools.cache
def committed(event: str) -> Draft202012Validator:
    return Draft202012Validator(
        orjson.loads((SCHEMAS_DIR / "frames" / f"{event}.json").read_bytes())
    )


def assert_valid(events: list[Event]) -> None:
    for e in events:
        errors = [error.message for error in committed(e.event).iter_errors(e.data)]
        assert not errors, (e.event, e.data, errors)
        if e.event != "ping":
            assert decode(e.event, e.data).data == e.data


async def test_every_event_of_real_streams_matches_its_committed_schema(
    make_gateway: HarnessFactory,
) -> None:
    first = (
        "Looking. "
        + sentinels.frame(FrameKind.OBJECT, "o1", "Action", orjson.dumps(ACTION).decode())
        + sentinels.frame(FrameKind.TOOL_CALL, "t1", "places.search", orjson.dumps(SEARCH).decode())
    )
    broken = "oops " + sentinels.end(FrameKind.RESULT, "r9")
    gw = await make_gateway(
        [
            Script(steps=(Step(text=first[:20]), Step(text=first[20:], delay_ms=150))),
            Script.from_tokens([sentinel_reply()]),
            Script.from_tokens([broken]),
        ],
        ping_interval_s=0.03,
    )
    tools = await gw.stream({"input": "Find pizza", "object_schemas": ["Action"]})
    error = await gw.stream({"input": "again"})
    assert_well_formed(tools)
    assert_well_formed(error)
    seen = {e.event for e in tools + error}
    assert seen >= {"stream.begin", "text.delta", "json.end", "tool.call", "tool.result"}
    assert seen >= {"result.delta", "result.end", "ping", "error", "done"}
    assert_valid(tools + error)
    await gw.settle()


def test_the_ping_bytes_match_the_ping_schema() -> None:
    event, data = PING_BYTES.rstrip(b"\n").split(b"\n")
    assert event == b"event: ping"
    assert_valid([Event("", "ping", orjson.loads(data.removeprefix(b"data: ")))])
