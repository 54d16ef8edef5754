"""ask_json: the gateway's own model asked for JSON, with the JSON guarantee, over real HTTP
on loopback against a scripted upstream."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from toolforge.api.app import PROMPTS_DIR
from toolforge.eval.scripted_upstream import ScriptedUpstream
from toolforge.runtime.model_json import JsonAnswer, ask_json
from toolforge.tools.task_analysis import DependencyReport
from toolforge.upstream.openai_compat import OpenAICompatUpstream

REPAIR = (PROMPTS_DIR / "repair.txt").read_text(encoding="utf-8")
EDGES = {"edges": [{"source": "A", "target": "B", "type": "blocks", "confidence": 0.7}]}


def say(text: str) -> dict[str, object]:
    return {"steps": [{"text": text}, {"finish": "stop"}]}


async def ask(scripts: list[dict[str, object]]) -> tuple[JsonAnswer, list[Any]]:
    async with ScriptedUpstream(scripts) as up, httpx.AsyncClient() as client:
        answer = await ask_json(
            OpenAICompatUpstream(client, up.base_url),
            model="m",
            prompt="which tasks depend on each other?",
            schema=DependencyReport,
            repair_template=REPAIR,
        )
        return answer, [orjson.loads(r.body) for r in up.requests]


async def test_valid_json_in_a_code_fence() -> None:
    answer, sent = await ask([say("```json\n" + orjson.dumps(EDGES).decode() + "\n```")])
    assert answer.value == DependencyReport.model_validate(EDGES)
    assert not answer.degraded and not answer.repaired
    assert len(sent) == 1 and sent[0]["temperature"] == 0.0


async def test_a_wrong_enum_gets_one_model_repair() -> None:
    bad = {"edges": [{"source": "A", "target": "B", "type": "parent", "confidence": 0.7}]}
    answer, sent = await ask([say(orjson.dumps(bad).decode()), say(orjson.dumps(EDGES).decode())])
    assert answer.repaired and not answer.degraded
    assert answer.value.edges[0].type == "blocks"
    repair_prompt = sent[1]["messages"][-1]["content"]
    assert "$.edges[0].type" in repair_prompt


async def test_two_bad_answers_degrade_to_a_valid_empty_report() -> None:
    answer, _ = await ask([say("I think A blocks B."), say("Sorry, no JSON today.")])
    assert answer.degraded and answer.value == DependencyReport(edges=[])
    assert answer.diagnostics["error"] == "schema_repair_failed"
