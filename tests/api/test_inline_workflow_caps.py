"""Inline workflows are the client's, so they are capped: iterations, the tool calls those
allow and the context budget. Over a cap is a typed 422 that names it, on /v1/stream and
on the OpenAI-compatible proxy, before the model is asked anything; the operator's
registered workflows are not capped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.api.conftest import HarnessFactory
from toolforge.core.workflow import WorkflowCaps, parse_workflow
from toolforge.runtime.workflows import load_workflows

TOOLS = ["places.search", "bookings.create"]


def inline(**fields: Any) -> dict[str, Any]:
    return {"name": "client_made", "tools": TOOLS, "terminal_tools": ["bookings.create"], **fields}


def stream_body(workflow: object) -> dict[str, Any]:
    return {"input": "Book a table for 2.", "workflow": workflow, "mode": "sentinel"}


@pytest.mark.parametrize(
    ("settings", "workflow", "cap"),
    [
        ({}, inline(max_iterations=100), "INLINE_WORKFLOW_MAX_ITERATIONS"),
        ({}, inline(max_iterations=17), "INLINE_WORKFLOW_MAX_ITERATIONS"),
        (
            {"inline_workflow_max_tool_calls": 20},
            inline(max_iterations=6),  # 24 tool calls at 4 a turn
            "INLINE_WORKFLOW_MAX_TOOL_CALLS",
        ),
        ({}, inline(budget_tokens=10**12), "INLINE_WORKFLOW_MAX_BUDGET_TOKENS"),
        (
            {"inline_workflow_max_budget_tokens": 4096},
            inline(budget_tokens=4097),
            "INLINE_WORKFLOW_MAX_BUDGET_TOKENS",
        ),
        (
            {"inline_workflow_max_iterations": 2},
            inline(),  # the default 10 iterations are over a cap of 2
            "INLINE_WORKFLOW_MAX_ITERATIONS",
        ),
    ],
)
async def test_an_inline_workflow_over_a_cap_is_a_422_naming_it(
    make_gateway: HarnessFactory, settings: dict[str, Any], workflow: dict[str, Any], cap: str
) -> None:
    gw = await make_gateway([], **settings)
    response = await gw.client.post(f"{gw.url}/v1/stream", json=stream_body(workflow))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "WORKFLOW_INVALID" and cap in error["message"], error
    proxied = await gw.client.post(
        f"{gw.url}/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "Book a table."}],
            "toolforge": {"workflow": workflow},
        },
    )
    assert proxied.status_code in (400, 422), proxied.text
    assert cap in proxied.text
    assert gw.upstream.requests == []  # refused before any model call


async def test_an_inline_workflow_within_the_caps_runs(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway([], inline_workflow_max_iterations=3)
    events = await gw.stream(stream_body(inline(max_iterations=3, budget_tokens=4096)))
    begin = events[0]
    assert begin.event == "stream.begin", events
    assert not [e for e in events if e.event == "error" and "INLINE" in str(e.data)]


def test_registered_workflows_are_the_operators_and_not_capped(tmp_path: Path) -> None:
    doc = inline(max_iterations=100, budget_tokens=10**6)
    (tmp_path / "big.json").write_bytes(orjson.dumps(doc))
    loaded = load_workflows(tmp_path, known_tools=TOOLS)
    assert loaded["client_made"].max_iterations == 100
    with pytest.raises(Exception, match="INLINE_WORKFLOW_MAX_ITERATIONS"):
        parse_workflow(doc, known_tools=TOOLS, caps=WorkflowCaps())


@pytest.mark.parametrize(
    ("iterations", "requested", "limit"), [(2, 8, 8), (5, 8, 20), (30, 0, 120)]
)
def test_one_tool_call_limit_for_every_front_door(
    iterations: int, requested: int, limit: int
) -> None:
    """The stream body, the proxy and the Python runner all take a workflow's tool-call
    limit from ``WorkflowDef.tool_call_limit``: the request's, lifted to four a turn."""
    definition = parse_workflow(inline(max_iterations=iterations), known_tools=TOOLS)
    assert definition.tool_call_limit(requested) == limit
