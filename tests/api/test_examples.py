"""The examples in examples/ run as a user runs them: a subprocess, its output read.

``workflow_weather.py`` needs no server (its scripted model); ``openai_workflow.py`` is
pointed at a real gateway on loopback, in front of the scripted upstream."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.api.conftest import HarnessFactory
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def _run(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_the_python_workflow_example_runs() -> None:
    code, out = await _run(str(EXAMPLES / "workflow_weather.py"))
    assert code == 0, out
    assert "step.nudge" in out  # the scripted model skipped the lookup once
    assert "weather.forecast -> {'city_id': 'oslo-1'" in out
    assert "steps ['cities.lookup', 'weather.forecast'], 3 turns, 1 nudge" in out


def _call(frame_id: str, name: str, args: str) -> Script:
    return Script.from_tokens([sentinels.frame(FrameKind.TOOL_CALL, frame_id, name, args)])


async def test_the_openai_workflow_example_books_through_the_proxy(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(
        [
            _call("t1", "bookings.create", '{"place_id": "7", "time": "19:00", "party_size": 2}'),
            _call("t2", "places.search", '{"query": "pizza"}'),
            _call(
                "t3",
                "bookings.create",
                '{"place_id": "bella-napoli", "time": "19:00", "party_size": 2}',
            ),
        ]
    )
    code, out = await _run(str(EXAMPLES / "openai_workflow.py"), f"{gw.url}/v1")
    assert code == 0, out
    assert "bookings.create  " in out and "-> STEP_REQUIRED" in out
    assert "booked: {" in out and "'place_id': 'bella-napoli'" in out
    assert "steps ['places.search', 'bookings.create'], 3 turns, 1 nudges" in out


async def test_the_openai_workflow_example_reports_a_failed_workflow(
    make_gateway: HarnessFactory,
) -> None:
    book = '{"place_id": "7", "time": "19:00", "party_size": 2}'
    gw = await make_gateway([_call(f"t{i}", "bookings.create", book) for i in range(1, 5)])
    code, out = await _run(str(EXAMPLES / "openai_workflow.py"), f"{gw.url}/v1")
    assert code == 1, out
    assert "the workflow failed: STEP_ENFORCEMENT_EXHAUSTED" in out
    assert "pending_steps" in out
