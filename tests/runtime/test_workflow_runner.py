"""The workflow runner's Python API (docs/workflows.md): Python callables as tools, a real upstream
adapter over real HTTP to the scripted model on loopback, callbacks, typed exceptions
with their context, cancellation and multi-turn use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from pydantic import BaseModel

from toolforge import ToolDef, Workflow, WorkflowRunner
from toolforge.core.context import MESSAGE_OVERHEAD_TOKENS, chars_per_token, count_text
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.errors import (
    ErrorCode,
    StepEnforcementError,
    ToolExecutionError,
    ToolForgeError,
    WorkflowCancelledError,
)
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream
from toolforge.upstream.openai_compat import OpenAICompatUpstream


class Lookup(BaseModel):
    city: str


def lookup(city: str) -> dict[str, Any]:
    """The cities a name may mean, with their ids."""
    return {"cities": [{"id": f"{city.lower()}-1", "name": city}]}


calls: list[dict[str, Any]] = []


async def forecast(city_id: str, days: int = 1) -> dict[str, Any]:
    calls.append({"city_id": city_id, "days": days})
    if days > 3:
        raise ValueError("at most 3 days")
    return {"city_id": city_id, "sky": "clear", "days": days}


FORECAST_SCHEMA = {
    "type": "object",
    "properties": {"city_id": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city_id"],
    "additionalProperties": False,
}


def weather() -> Workflow:
    return Workflow(
        "weather",
        [
            ToolDef("cities.lookup", lookup, Lookup),
            ToolDef(
                "weather.forecast",
                forecast,
                FORECAST_SCHEMA,
                description="The forecast for a city id.",
                prerequisites=[
                    {"tool": "cities.lookup", "match_arg": "city_id", "result_key": "id"}
                ],
            ),
        ],
        required_steps=["cities.lookup"],
        terminal_tools="weather.forecast",
        instructions="Look the city up, then get its forecast.",
        max_tool_errors=1,
    )


def call(frame_id: str, name: str, args: str) -> Script:
    return Script.from_tokens([sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])


@pytest.fixture
async def model() -> AsyncIterator[tuple[ScriptedUpstream, OpenAICompatUpstream]]:
    async with ScriptedUpstream([]) as upstream, httpx.AsyncClient() as client:
        yield upstream, OpenAICompatUpstream(client, upstream.base_url, first_byte_s=5, idle_s=5)
    calls.clear()


def scripted(scripted_upstream: ScriptedUpstream, *scripts: Script) -> None:
    for script in scripts:
        scripted_upstream.add(script)


def bergen(upstream: ScriptedUpstream) -> None:
    """The model looks Bergen up, then asks for its forecast."""
    scripted(
        upstream,
        call("t1", "cities.lookup", '{"city": "Bergen"}'),
        call("t2", "weather.forecast", '{"city_id": "bergen-1"}'),
    )


async def test_a_workflow_runs_in_process_with_callbacks(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    scripted(
        upstream,
        call("t1", "cities.lookup", '{"city": "Oslo"}'),
        call("t2", "weather.forecast", '{"city_id": "oslo-1", "days": 2}'),
    )
    chunks: list[str] = []
    messages: list[dict[str, Any]] = []

    async def on_chunk(frame: Any) -> None:
        chunks.append(frame.event)

    runner = WorkflowRunner(adapter, on_chunk=on_chunk, on_message=messages.append)
    result = await runner.run(weather(), "Weather in Oslo?")
    assert result.tool == "weather.forecast"
    assert result.value == {"city_id": "oslo-1", "sky": "clear", "days": 2}
    assert result.completed_steps == ["cities.lookup", "weather.forecast"]
    assert result.iterations == 2 and result.nudges == 0
    assert chunks[0] == "stream.begin" and chunks[-1] == "done"
    assert chunks.count("tool.call") == 2 and "result.end" in chunks
    # The history the model was sent, beyond our system prompt and the user's message:
    assert [m["role"] for m in messages] == ["assistant", "user"]
    assert "oslo-1" in messages[1]["content"]
    system = orjson.loads(upstream.requests[0].body)["messages"][0]["content"]
    assert "weather.forecast" in system and "Look the city up" in system


async def test_premature_terminal_calls_raise_a_typed_error_with_context(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    scripted(
        upstream,
        *[call(f"t{i}", "weather.forecast", '{"city_id": "x"}') for i in range(1, 5)],
    )
    nudges: list[int] = []
    runner = WorkflowRunner(
        adapter,
        on_chunk=lambda f: nudges.append(f.data["tier"]) if f.event == "step.nudge" else None,
    )
    with pytest.raises(StepEnforcementError) as caught:
        await runner.run(weather(), "Weather in Oslo?")
    assert caught.value.code is ErrorCode.STEP_ENFORCEMENT_EXHAUSTED
    assert caught.value.context["pending_steps"] == ["cities.lookup"]
    assert caught.value.context["iterations"] == 4
    assert nudges == [1, 2, 3, 3]
    assert not calls  # never ran


async def test_a_raising_tool_is_fed_back_then_exhausts(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    scripted(
        upstream,
        call("t1", "cities.lookup", '{"city": "Oslo"}'),
        call("t2", "weather.forecast", '{"city_id": "oslo-1", "days": 9}'),
        call("t3", "weather.forecast", '{"city_id": "oslo-1", "days": 8}'),
    )
    with pytest.raises(ToolExecutionError) as caught:
        await WorkflowRunner(adapter).run(weather(), "Weather in Oslo for 9 days?")
    assert caught.value.code is ErrorCode.TOOL_ERRORS_EXHAUSTED
    assert caught.value.context["completed_steps"] == ["cities.lookup"]
    # The model saw the exception's message, so it could have corrected itself.
    third = orjson.loads(upstream.requests[2].body)["messages"][-1]["content"]
    assert "ValueError: at most 3 days" in third


async def test_a_bad_argument_against_a_json_schema_goes_back_to_the_model(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    scripted(
        upstream,
        call("t1", "cities.lookup", '{"city": "Oslo"}'),
        call("t2", "weather.forecast", '{"city_id": "oslo-1", "days": "two"}'),
        call("t3", "weather.forecast", '{"city_id": "oslo-1"}'),
    )
    result = await WorkflowRunner(adapter).run(weather(), "Weather in Oslo?")
    assert result.value == {"city_id": "oslo-1", "sky": "clear", "days": 1}
    second = orjson.loads(upstream.requests[2].body)["messages"][-1]["content"]
    assert "TOOL_ARGS_INVALID" in second


async def test_a_cancel_event_ends_the_run_with_its_context(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    scripted(
        upstream,
        call("t1", "cities.lookup", '{"city": "Oslo"}'),
        Script.from_tokens(["thinking "] * 200, delay_ms=20),
    )
    cancel = asyncio.Event()

    def on_chunk(frame: Any) -> None:
        if frame.event == "tool.result":
            asyncio.get_running_loop().call_later(0.2, cancel.set)

    runner = WorkflowRunner(adapter, on_chunk=on_chunk)
    with pytest.raises(WorkflowCancelledError) as caught:
        await asyncio.wait_for(runner.run(weather(), "Weather?", cancel_event=cancel), 10)
    assert caught.value.context["completed_steps"] == ["cities.lookup"]
    assert caught.value.context["iterations"] == 2
    async with asyncio.timeout(5):
        await upstream.wait_connections_closed()


async def test_initial_messages_continue_a_conversation(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    bergen(upstream)
    earlier = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Clear skies in Oslo."},
    ]
    seen: list[dict[str, Any]] = []
    runner = WorkflowRunner(adapter, on_message=seen.append)
    result = await runner.run(weather(), "And in Bergen?", initial_messages=earlier)
    assert result.value["city_id"] == "bergen-1"  # type: ignore[index]
    sent = orjson.loads(upstream.requests[0].body)["messages"]
    assert sent[1:] == [*earlier, {"role": "user", "content": "And in Bergen?"}]
    assert all(m not in seen for m in sent)  # on_message: only what this run added
    # The next turn of a multi-turn conversation starts from this run's messages.
    assert result.messages[: len(sent) - 1] == sent[1:]


def test_a_workflow_of_python_tools_is_validated() -> None:
    with pytest.raises(Exception, match="WORKFLOW_INVALID"):
        Workflow("w", [ToolDef("a", lookup, Lookup)], terminal_tools="b")
    grounded = Workflow("w", [ToolDef("a", lookup, Lookup, grounded=["city"])], terminal_tools="a")
    assert grounded.definition.grounded == {"a": ("city",)}
    with pytest.raises(ValueError, match="mode"):
        WorkflowRunner(OpenAICompatUpstream(httpx.AsyncClient(), "http://x/v1"), mode="magic")


# -- context compaction in the Python runner (the workflow's settings, the model's budget) ---


def _tokens(messages: list[dict[str, Any]]) -> int:
    return chars_per_token(count_text(messages)) + MESSAGE_OVERHEAD_TOKENS * len(messages)


def atlas(**settings: Any) -> Workflow:
    """Cities looked up one by one (each result long), then one forecast."""

    def lookup_long(city: str) -> dict[str, Any]:
        return {"cities": [{"id": f"{city.lower()}-1", "name": city, "about": "x" * 2400}]}

    return Workflow(
        "atlas",
        [
            ToolDef("cities.lookup", lookup_long, Lookup),
            ToolDef("weather.forecast", forecast, FORECAST_SCHEMA),
        ],
        required_steps=["cities.lookup"],
        terminal_tools="weather.forecast",
        **settings,
    )


def atlas_script(upstream: ScriptedUpstream) -> None:
    scripted(
        upstream,
        *(call(f"t{i}", "cities.lookup", f'{{"city": "{c}"}}') for i, c in enumerate("ABC", 1)),
        call("t9", "weather.forecast", '{"city_id": "c-1"}'),
    )


async def test_the_workflows_budget_compacts_the_runners_history(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    atlas_script(upstream)
    await WorkflowRunner(adapter).run(atlas(), "Weather where?")
    dry = [orjson.loads(r.body)["messages"] for r in upstream.requests]
    upstream.requests.clear()
    trigger = (_tokens(dry[1]) + _tokens(dry[2])) // 2
    budget = trigger * 4 // 3 + 1
    atlas_script(upstream)
    seen: list[Any] = []
    runner = WorkflowRunner(adapter, on_chunk=seen.append)
    result = await runner.run(atlas(budget_tokens=budget, keep_recent=1), "Weather where?")
    assert result.value == {"city_id": "c-1", "sky": "clear", "days": 1}
    begin = seen[0].data
    assert begin["budget_tokens"] == budget and begin["budget_source"] == "workflow"
    compacted = [f.data for f in seen if f.event == "context.compacted"]
    assert compacted and compacted[0]["phase"] == 1  # truncating the first result is enough
    sent = [orjson.loads(r.body)["messages"] for r in upstream.requests]
    assert sent[:2] == dry[:2]
    assert _tokens(sent[2]) < _tokens(dry[2]) and "[truncated:" in str(sent[2])
    assert result.completed_steps == ["cities.lookup", "weather.forecast"]


async def test_a_long_earlier_conversation_is_compacted_before_the_first_turn(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    bergen(upstream)
    earlier: list[dict[str, Any]] = [{"role": "user", "content": "Tell me about Norway."}]
    for i in range(6):
        earlier += [
            {"role": "assistant", "content": f"Part {i}: " + "y" * 2000},
            {"role": "user", "content": f"Go on ({i})."},
        ]
    seen: list[Any] = []
    runner = WorkflowRunner(adapter, on_chunk=seen.append, budget_tokens=2000)
    workflow = atlas(compaction="sliding", keep_recent=1)
    result = await runner.run(workflow, "Now: weather in Bergen?", initial_messages=earlier)
    assert result.value["city_id"] == "bergen-1"  # type: ignore[index]
    begin = seen[0].data
    assert begin["budget_tokens"] == 2000 and begin["budget_source"] == "manual"
    assert seen[1].event == "context.compacted"  # before the first request went out
    first = orjson.loads(upstream.requests[0].body)["messages"]
    assert _tokens(first) <= 1500
    # The opening (system prompt, the first user message) and the last earlier iteration
    # with the new question stay; the parts between went.
    assert first[1]["content"].startswith("Tell me about Norway.")
    assert first[-1]["content"] == "Now: weather in Bergen?"
    assert first[-3]["content"].startswith("Part 5: ")
    assert not any(str(m["content"]).startswith("Part 0: ") for m in first)


async def test_an_earlier_conversation_over_a_budget_that_nothing_can_fit_is_refused(
    model: tuple[ScriptedUpstream, OpenAICompatUpstream],
) -> None:
    upstream, adapter = model
    earlier = [{"role": "user", "content": "z" * 20_000}]
    runner = WorkflowRunner(adapter, budget_tokens=1000)
    with pytest.raises(ToolForgeError) as caught:
        await runner.run(atlas(), "And the weather?", initial_messages=earlier)
    assert caught.value.code == ErrorCode.CONTEXT_BUDGET_EXCEEDED
    assert not upstream.requests  # nothing was sent
