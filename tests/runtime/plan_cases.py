"""Requests through every front door and the plans they make, as values a golden file can
hold: the proxy's plain requests (tools, none, a forced call, parallel calls, a JSON answer,
server tools, guardrails off) on a grammar upstream and on a native one, the proxy's
workflow run, and ``POST /v1/stream`` bodies. ``tests/runtime/test_plan_request.py``
compares the plans of today's planner with ``golden/plans.json``, captured before the
three doors shared one planner; ``python -m tests.runtime.plan_cases`` rewrites it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from toolforge.api.app import _Prompts
from toolforge.api.models import ChatCompletionRequest, StreamRequest
from toolforge.core.engine.completion import CompletionMode
from toolforge.core.schemas import builtin_registry
from toolforge.runtime import completion_plan
from toolforge.runtime.planner import PlannerConfig, StreamPlan, StreamPlanner
from toolforge.runtime.workflows import bundled_workflows_dir, load_workflows
from toolforge.settings import Settings
from toolforge.tools import load_packs

GOLDEN = Path(__file__).parent / "golden" / "plans.json"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ORDER = {
    "type": "function",
    "function": {
        "name": "refund",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "pattern": "^ORD-[0-9]+$"},
                "amount": {"type": "number"},
                "note": {"type": "string"},
            },
            "required": ["order_id", "amount"],
        },
    },
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
REFUND = [
    {"role": "developer", "content": "You are a support agent."},
    {"role": "user", "content": "Refund 12.50 on order ORD-7781 please."},
]
ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
            "required": ["city", "temp_c"],
        },
    },
}

# The proxy's plain requests (no workflow): name -> body.
PROXY: Final[dict[str, dict[str, Any]]] = {
    "tools": {"messages": USER, "tools": [WEATHER, ORDER]},
    "no_tools": {"messages": USER, "temperature": 0.2, "seed": 7, "max_tokens": 64},
    "forced": {
        "messages": REFUND,
        "tools": [WEATHER, ORDER],
        "tool_choice": {"type": "function", "function": {"name": "refund"}},
    },
    "required": {"messages": USER, "tools": [WEATHER], "tool_choice": "required"},
    "none": {"messages": USER, "tools": [WEATHER], "tool_choice": "none"},
    "parallel": {"messages": REFUND, "tools": [WEATHER, ORDER], "parallel_tool_calls": True},
    "serial": {"messages": REFUND, "tools": [WEATHER, ORDER], "parallel_tool_calls": False},
    "json_schema": {"messages": USER, "response_format": ANSWER, "max_completion_tokens": 200},
    "json_schema_tools": {"messages": USER, "tools": [WEATHER], "response_format": ANSWER},
    "json_object": {"messages": USER, "response_format": {"type": "json_object"}},
    "server_tools": {
        "messages": [{"role": "user", "content": "Find a cafe in Oslo"}],
        "tools": [WEATHER],
        "toolforge": {"server_tools": ["places.search"], "max_tool_calls": 3},
    },
    "guards_off": {
        "messages": REFUND,
        "tools": [ORDER],
        "toolforge": {"guardrails": {"respond": False, "provenance": False, "json": False}},
        "response_format": {"type": "json_object"},
    },
    "no_grammar": {
        "messages": REFUND,
        "tools": [ORDER],
        "toolforge": {"guardrails": {"grammar": False}},
    },
    "forwarded": {
        "messages": [{"role": "system", "content": "Be brief."}, *USER],
        "tools": [WEATHER],
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "reasoning_effort": "low",
        "stop": "END",
        "top_p": 0.9,
        "user": "u-1",
        "metadata": {"team": "a"},
    },
}
# The proxy's workflow runs.
PROXY_WORKFLOW: Final[dict[str, dict[str, Any]]] = {
    "workflow": {
        "messages": [{"role": "user", "content": "A table for two at Noma at 19:00"}],
        "temperature": 0,
        "toolforge": {"workflow": "book_a_table"},
    },
    "workflow_no_grammar": {
        "messages": [{"role": "user", "content": "A table for two at Noma at 19:00"}],
        "toolforge": {"workflow": "book_a_table", "guardrails": {"grammar": False}},
    },
}
# POST /v1/stream bodies.
STREAM: Final[dict[str, dict[str, Any]]] = {
    "stream_plain": {"messages": USER, "mode": "auto"},
    "stream_tools": {
        "input": "Find a cafe in Oslo",
        "tools": ["places.search"],
        "sampling": {"temperature": 0.1, "max_tokens": 300},
        "max_tool_calls": 3,
    },
    "stream_native": {"messages": USER, "mode": "native", "tools": ["places.search"]},
    "stream_sentinel": {
        "messages": USER,
        "mode": "sentinel",
        "object_schemas": [{"name": "Point", "schema": {"type": "object"}}],
        "client_tools": [
            {"name": "ask_user", "description": "Ask.", "parameters": {"type": "object"}}
        ],
        "profile": "demo",
        "on_disconnect": "continue",
    },
    "stream_workflow": {"messages": USER, "workflow": "book_a_table"},
}
KINDS: Final = ("llama_server", "openai")


def planner(kind: str) -> StreamPlanner:
    """The gateway's planner (as ``create_app`` builds it) on an upstream of ``kind`` with
    no URL: no probe, ``llama_server`` takes grammars, ``openai`` does not."""
    prompts = _Prompts.load()
    tools = load_packs(Settings())
    return StreamPlanner(
        PlannerConfig(model_id="m", upstream_kind=kind),
        client=httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: httpx.Response(404))),
        schemas=builtin_registry(),
        tools=tools,
        system_template=prompts.system,
        workflows=load_workflows(bundled_workflows_dir(), known_tools=tools.names()),
        workflow_nudges=prompts.workflow_nudges,
        workflow_template=prompts.workflow,
    )


def _turn(plan: StreamPlan, *, tools_left: bool) -> dict[str, Any]:
    asked = plan.mode.turn_request(
        plan.chat, plan.chat.messages, seen_ids=set(), tools_left=tools_left
    )
    return dataclasses.asdict(asked)


def snapshot(plan: StreamPlan) -> dict[str, Any]:
    """What a plan decides, as JSON: its first turn's request (tools left, and spent), its
    record (``prompt.json``) and the fields the session reads."""
    mode = plan.mode
    out: dict[str, Any] = {
        "mode": mode.name,
        "first_turn": _turn(plan, tools_left=True),
        "final_turn": _turn(plan, tools_left=False),
        "prompt_record": plan.prompt_record,
        "on_disconnect": plan.on_disconnect,
        "schemas": {name: dict(s.schema) for name, s in plan.schemas.items()},
        "result_schema": plan.result_schema,
        "registered": sorted(plan.registered),
        "tools_allow": plan.tools_allow,
        "approval_tools": sorted(plan.approval_tools),
        "confirmations": dict(plan.confirmations),
        "max_tool_calls": plan.max_tool_calls,
        "idempotency_key": plan.idempotency_key,
        "client_tools": sorted(plan.client_tools),
        "awaited_tools": sorted(plan.awaited_tools),
        "workflow": plan.workflow is not None,
        "fit_first_turn": plan.fit_first_turn,
    }
    if isinstance(mode, CompletionMode):
        out["completion"] = {
            "tools": {name: dict(s.schema) for name, s in mode.tools.items()},
            "choice": mode.choice,
            "forced": mode.forced,
            "guards": dataclasses.asdict(mode.guards),
            "answer": None if mode.answer is None else dict(mode.answer.schema),
            "repair_grammar": mode.repair_grammar,
            "id_prefix": mode.id_prefix,
            "offers_respond": mode.offers_respond,
        }
    return out


async def plan_proxy(p: StreamPlanner, body: Mapping[str, Any]) -> StreamPlan:
    """The plan the proxy's route makes of ``body``."""
    req = ChatCompletionRequest.model_validate({"model": "m", **body})
    prompts = _Prompts.load()
    workflow = req.toolforge.workflow
    if workflow is not None:
        run = p.resolve_workflow(workflow)
        return await completion_plan.plan_workflow_completion(p, req, "s_0123456789", run)
    return await completion_plan.plan_completion(
        p,
        req,
        "s_0123456789",
        tools_template=prompts.proxy_tools,
        nudges=prompts.proxy_nudges,
    )


async def plan_stream(p: StreamPlanner, body: Mapping[str, Any]) -> StreamPlan:
    """The plan ``POST /v1/stream`` makes of ``body``."""
    return await p.plan(StreamRequest.model_validate(body), "s_0123456789", "key-1")


async def capture() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        p = planner(kind)
        for name, body in {**PROXY, **PROXY_WORKFLOW}.items():
            out[f"{kind}/{name}"] = snapshot(await plan_proxy(p, body))
        for name, body in STREAM.items():
            out[f"{kind}/{name}"] = snapshot(await plan_stream(p, body))
    return out


def loads(data: bytes) -> Any:
    return orjson.loads(data)


def dumps(value: Any) -> bytes:
    """``value`` as the golden file holds it: the checkout's own path (a registered
    workflow's ``source``) written as ``<repo>``, so any clone compares equal."""
    raw = orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n"
    return raw.replace(_REPO, b"<repo>")


# The checkout's path as JSON writes it (the golden file is the same in every clone).
_REPO: Final = orjson.dumps(str(Path(__file__).resolve().parents[2]))[1:-1]


if __name__ == "__main__":
    GOLDEN.write_bytes(dumps(asyncio.run(capture())))
