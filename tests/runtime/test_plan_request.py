"""One planner for every front door: the proxy's plain requests, its workflow runs and
``POST /v1/stream`` bodies plan as they did before they shared it (``golden/plans.json``:
each plan's first and last turn's request, its ``prompt.json`` record and what the session
reads, on a grammar upstream and on a native one)."""

from __future__ import annotations

import pytest

from tests.runtime import plan_cases
from tests.runtime.plan_cases import GOLDEN, KINDS, PROXY, PROXY_WORKFLOW, STREAM

GOLDEN_PLANS = plan_cases.orjson.loads(GOLDEN.read_bytes())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [*PROXY, *PROXY_WORKFLOW])
async def test_the_proxy_plans_as_before(kind: str, name: str) -> None:
    body = {**PROXY, **PROXY_WORKFLOW}[name]
    plan = await plan_cases.plan_proxy(plan_cases.planner(kind), body)
    got = plan_cases.snapshot(plan)
    # Byte for byte: prompt.json keeps its keys' order too.
    assert plan_cases.dumps(got) == plan_cases.dumps(GOLDEN_PLANS[f"{kind}/{name}"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(STREAM))
async def test_a_stream_body_plans_as_before(kind: str, name: str) -> None:
    plan = await plan_cases.plan_stream(plan_cases.planner(kind), STREAM[name])
    got = plan_cases.snapshot(plan)
    assert plan_cases.dumps(got) == plan_cases.dumps(GOLDEN_PLANS[f"{kind}/{name}"])
