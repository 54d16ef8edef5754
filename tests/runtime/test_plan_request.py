"""One planner for every front door. Each door's body becomes a plan request that one
function (``StreamPlanner.build``) turns into a plan; the proxy's plain requests, its
workflow runs and ``POST /v1/stream`` bodies plan as they did before they shared it
(``golden/plans.json``: each plan's first and last turn's request, its ``prompt.json``
record and what the session reads, on a grammar upstream and on a native one)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.runtime import plan_cases
from tests.runtime.plan_cases import GOLDEN, KINDS, PROXY, PROXY_WORKFLOW, STREAM, USER
from toolforge.api.models import StreamRequest
from toolforge.core.chat import ChatRequest
from toolforge.core.engine import NativeMode
from toolforge.core.workflow import WorkflowDef
from toolforge.runtime.planner import (
    DEFAULT_MAX_TOOL_CALLS,
    PlanRequest,
    ShapedTurn,
    StreamPlan,
    StreamPlanner,
    StreamTurn,
    stream_request,
)
from toolforge.runtime.workflow_runner import runner_request

GOLDEN_PLANS = plan_cases.loads(GOLDEN.read_bytes())


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


# -- three doors, one planner -------------------------------------------------------------

TABLE = [{"role": "user", "content": "A table for two at Noma at 19:00"}]


def _first_turn(plan: StreamPlan) -> ChatRequest:
    return plan.mode.turn_request(plan.chat, plan.chat.messages, seen_ids=set(), tools_left=True)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_workflow_run_plans_alike_through_every_door(kind: str) -> None:
    """The stream body, the proxy body and the Python runner's run of one workflow become
    plan requests that the one planner turns into the same turn: its request (messages,
    sampling, grammar), its engine mode, its call limit and its policy."""
    p = plan_cases.planner(kind)
    body = StreamRequest.model_validate(
        {"messages": TABLE, "workflow": "book_a_table", "sampling": {"temperature": 0}}
    )
    via_stream = await p.build(stream_request(body), "s_0123456789")
    via_proxy = await plan_cases.plan_proxy(
        p, {"messages": TABLE, "temperature": 0, "toolforge": {"workflow": "book_a_table"}}
    )
    definition = p.resolve_workflow("book_a_table")
    via_runner = await p.build(
        runner_request("auto", "m", {"temperature": 0, "seed": None}, TABLE),
        "s_0123456789",
        workflow=definition,
    )
    turns = [_first_turn(plan) for plan in (via_stream, via_proxy, via_runner)]
    assert turns[0] == turns[1] == turns[2]
    if kind == "llama_server":
        assert "grammar" in turns[0].extra  # the workflow's compiled turn
    assert {plan.mode.name for plan in (via_stream, via_proxy, via_runner)} == {
        "constrained" if kind == "llama_server" else "sentinel"
    }
    assert via_stream.max_tool_calls == via_proxy.max_tool_calls == via_runner.max_tool_calls
    assert all(plan.workflow is not None for plan in (via_stream, via_proxy, via_runner))
    # The proxy's door adds its own to the record; the mode's part is the same.
    proxy_record = dict(via_proxy.prompt_record)
    assert proxy_record.pop("api") == "chat.completions"
    for door_only in ("guardrails", "request_extra", "user", "metadata"):
        proxy_record.pop(door_only)
    assert proxy_record == via_stream.prompt_record == via_runner.prompt_record


@pytest.mark.parametrize("kind", KINDS)
async def test_the_doors_agree_on_the_model_sampling_and_call_limit(kind: str) -> None:
    """A plain stream body and a plain proxy body with the same messages and sampling ask
    the upstream with the same model and sampling, and allow the same number of tool
    calls when they name no limit: one documented default, DEFAULT_MAX_TOOL_CALLS."""
    p = plan_cases.planner(kind)
    sampling = {"temperature": 0.3, "seed": 5, "max_tokens": 99, "top_p": 0.8}
    stream = await p.plan(
        StreamRequest.model_validate({"messages": USER, "sampling": sampling}), "s_1", None
    )
    proxy = await plan_cases.plan_proxy(p, {"messages": USER, **sampling})
    runner = await p.build(
        runner_request("sentinel", "m", sampling, USER),
        "s_2",
        workflow=p.resolve_workflow("book_a_table"),
    )
    for field in ("model", "temperature", "seed", "max_tokens", "top_p"):
        assert getattr(stream.chat, field) == getattr(proxy.chat, field)
        assert getattr(stream.chat, field) == getattr(runner.chat, field)
    assert stream.max_tool_calls == proxy.max_tool_calls == DEFAULT_MAX_TOOL_CALLS
    assert PlanRequest(StreamTurn(), USER).max_tool_calls == DEFAULT_MAX_TOOL_CALLS
    # A client's plan is the stream body's (resumable); the proxy's ends with its client.
    assert (stream.on_disconnect, proxy.on_disconnect) == ("grace", "cancel")


async def test_a_plan_request_and_its_plan_are_frozen() -> None:
    request = stream_request(StreamRequest.model_validate({"messages": USER}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.model = "other"  # type: ignore[misc]
    plan = await plan_cases.planner("openai").build(request, "s_0123456789")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_tool_calls = 64  # type: ignore[misc]


@dataclasses.dataclass(frozen=True, slots=True)
class _EchoTurn:
    """A mode strategy of a door the planner has never heard of."""

    async def shape(
        self,
        planner: StreamPlanner,
        request: PlanRequest,
        stream_id: str,
        workflow: WorkflowDef | None,
    ) -> ShapedTurn:
        chat = planner.chat_request(request, list(request.messages), {"echo": True})
        return ShapedTurn(
            chat=chat,
            mode=NativeMode(),
            record={"mode": "native", "door": "echo"},
            schemas={},
            result_schema=None,
            registered={},
            tools_allow=(),
            approval_tools=frozenset(),
            confirmations={},
            compacts=False,
        )


async def test_the_planner_builds_a_plan_for_any_turn_strategy() -> None:
    """``build`` knows no door: the request's strategy shapes the turn, the planner adds
    the door's record after the mode's, the call limit, and freezes the plan."""
    p = plan_cases.planner("openai")
    request = PlanRequest(
        _EchoTurn(),
        USER,
        sampling={"temperature": 0.5},
        max_tool_calls=2,
        record={"api": "echo"},
    )
    plan = await p.build(request, "s_0123456789", "k")
    assert plan.chat.model == "m" and plan.chat.temperature == 0.5
    assert plan.chat.extra == {"echo": True}
    assert plan.prompt_record == {"mode": "native", "door": "echo", "api": "echo"}
    assert (plan.max_tool_calls, plan.idempotency_key, plan.context) == (2, "k", None)
