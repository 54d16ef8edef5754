"""The compiler never blocks the right answer: for every core scenario, each call of its
ideal path is admitted by the grammar the workflow compiles for that turn (the scenario's
own workflow and provenance, the tools' real results fed back), and a made-up value is
not. Checked with the test GBNF matcher, offline."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from tests.core.gbnf_matcher import parse
from toolforge.core.events import FrameKind
from toolforge.core.gbnf import FrameGrammar, TurnIds
from toolforge.core.protocol import sentinels
from toolforge.core.steps import WorkflowPolicy
from toolforge.core.workflow import parse_workflow
from toolforge.eval.qualify.catalog import CORE
from toolforge.eval.qualify.scenario import Scenario


def _call(name: str, args: Any) -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, "t1", name, orjson.dumps(args).decode())


def _run(spec: Any, args: Any) -> tuple[bool, Any]:
    try:
        value = asyncio.run(spec.fn(spec.args_model.model_validate(args)))
    except Exception as exc:  # the scenario's tool refused: a failed call
        return False, str(exc)
    return True, value


@pytest.mark.parametrize("scenario", CORE, ids=lambda s: s.name)
def test_every_ideal_call_is_admitted_by_its_turns_grammar(scenario: Scenario) -> None:
    specs = {spec.name: spec for spec in scenario.build_tools()}
    schemas = {name: spec.input_schema for name, spec in specs.items()}
    workflow = parse_workflow(scenario.workflow(), known_tools=list(schemas))
    policy = WorkflowPolicy(workflow, schemas=schemas)
    grammar = FrameGrammar(tools=schemas, result=("R", {"type": "object"}), max_tokens=512)
    policy.begin_turn([{"role": "user", "content": scenario.prompt}])
    for turn, (name, args) in enumerate(scenario.ideal_path):
        hints = policy.hints()
        g = parse(
            grammar.for_turn(
                TurnIds("t1", (), "r1"),
                narrowed=hints.narrowed,
                allow_result=hints.allow_result,
                free_text=hints.free_text,
            )
        )
        assert g.accepts(_call(name, args)), f"turn {turn + 1}: {name}({args}) refused"
        ok, value = _run(specs[name], args)
        envelope = {"ok": ok, "data": value if ok else None}
        if not ok:
            envelope["errors"] = [{"code": "TOOL_FAILED", "message": value, "retryable": False}]
        policy.record(name, args, envelope)
        policy.end_batch()
        policy.begin_turn([])
