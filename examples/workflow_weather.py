"""A workflow of Python tools, run in-process (docs/workflows.md).

    python examples/workflow_weather.py            # against a scripted model (no server)
    python examples/workflow_weather.py http://127.0.0.1:8080/v1   # any OpenAI-compatible

The model must look the city up before it asks for the forecast (a required step), and
the forecast's ``city_id`` must be an id the lookup returned (an argument-matched
prerequisite). The scripted model first tries to skip the lookup: the runner refuses the
call with a nudge (tier 1), and the model complies.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx
from pydantic import BaseModel

from toolforge import ToolDef, Workflow, WorkflowRunner
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.errors import WorkflowError
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream
from toolforge.log import configure_logging
from toolforge.upstream.openai_compat import OpenAICompatUpstream


class Lookup(BaseModel):
    city: str


def lookup(city: str) -> dict[str, Any]:
    """Find a city by name; returns its id for weather.forecast."""
    return {"cities": [{"id": f"{city.lower()}-1", "name": city}]}


async def forecast(city_id: str, days: int = 1) -> dict[str, Any]:
    """The forecast for a city id from cities.lookup."""
    return {"city_id": city_id, "days": days, "sky": "clear", "high_c": 21}


WORKFLOW = Workflow(
    "weather",
    [
        ToolDef("cities.lookup", lookup, Lookup),
        ToolDef(
            "weather.forecast",
            forecast,
            {
                "type": "object",
                "properties": {"city_id": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city_id"],
                "additionalProperties": False,
            },
            prerequisites=[{"tool": "cities.lookup", "match_arg": "city_id", "result_key": "id"}],
        ),
    ],
    required_steps=["cities.lookup"],
    terminal_tools="weather.forecast",
    instructions="Look the city up with cities.lookup, then call weather.forecast with its id.",
)


def _call(frame_id: str, name: str, args: str) -> Script:
    return Script.from_tokens([sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])


async def main(base_url: str | None) -> None:
    def show(frame: Any) -> None:
        if frame.event in ("tool.call", "tool.result", "step.nudge", "result.end", "error"):
            print(f"{frame.event:12} {frame.data}")

    async with (
        ScriptedUpstream(
            [
                _call("t1", "weather.forecast", '{"city_id": "oslo"}'),  # skips the lookup
                _call("t2", "cities.lookup", '{"city": "Oslo"}'),
                _call("t3", "weather.forecast", '{"city_id": "oslo-1", "days": 2}'),
            ]
        ) as scripted,
        httpx.AsyncClient(timeout=120) as client,
    ):
        model = OpenAICompatUpstream(client, base_url or scripted.base_url)
        runner = WorkflowRunner(model, on_chunk=show)
        try:
            result = await runner.run(WORKFLOW, "What's the weather in Oslo for two days?")
        except WorkflowError as exc:  # typed, with its context
            print(f"failed: {exc.code}: {exc.message}\n{exc.context}")
            return
        print(f"\n{result.tool} -> {result.value}")
        print(f"steps {result.completed_steps}, {result.iterations} turns, {result.nudges} nudge")


if __name__ == "__main__":
    configure_logging(level="WARNING", json=False)
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
