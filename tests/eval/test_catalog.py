"""The scenario catalog: every ideal path runs on the scenario's own tools and passes its
grader; the stateful variants refuse a guessed id; the workflows are well formed."""

from __future__ import annotations

from typing import Any

import pytest

from toolforge.core.tool_specs import ToolError, ToolSpec, validate_args
from toolforge.core.workflow import parse_workflow
from toolforge.eval.qualify.ablation import PRESETS
from toolforge.eval.qualify.catalog import (
    ALL_SCENARIOS,
    COMPACTION_CHAIN,
    CORE,
    STATEFUL,
    by_name,
    select,
)
from toolforge.eval.qualify.scenario import Call, Scenario

SEED_CORE = {
    "basic_2step",
    "sequential_3step",
    "compaction_stress",
    "error_recovery",
    "tool_selection",
    "argument_fidelity",
    "sequential_reasoning",
    "conditional_routing",
    "data_gap_recovery",
    "phase2_compaction",
    "relevance_detection",
}


async def call(specs: dict[str, ToolSpec[Any]], name: str, args: dict[str, Any]) -> object:
    spec = specs[name]
    return await spec.fn(validate_args(spec, args))


async def replay(s: Scenario) -> tuple[list[Call], object]:
    specs = {t.name: t for t in s.build_tools()}
    calls: list[Call] = []
    result: object = None
    for name, args in s.ideal_path:
        result = await call(specs, name, dict(args))
        calls.append(Call(name, args))
    return calls, result


def test_the_core_is_seed_001s_eleven() -> None:
    assert {s.name for s in CORE} == SEED_CORE
    assert len(STATEFUL) == len(CORE)
    assert len(COMPACTION_CHAIN) == 4
    names = [s.name for s in ALL_SCENARIOS]
    assert len(names) == len(set(names))
    assert {"structured_order", "sentinel_in_result"} <= set(names)


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=lambda s: s.name)
async def test_the_ideal_path_runs_and_passes_the_grader(scenario: Scenario) -> None:
    calls, _ = await replay(scenario)
    terminal_name, terminal_args = scenario.ideal_path[-1]
    assert terminal_name in scenario.terminal_tools
    assert scenario.grade(terminal_args, calls)
    assert scenario.ideal_iterations == len(scenario.ideal_path)


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=lambda s: s.name)
def test_the_workflow_is_well_formed(scenario: Scenario) -> None:
    wf = scenario.workflow()
    tools = set(wf["tools"])
    assert set(wf["required_steps"]) <= tools
    assert set(wf["terminal_tools"]) <= tools
    assert not set(wf["required_steps"]) & set(wf["terminal_tools"])
    for target, needs in wf["prerequisites"].items():
        assert target in tools
        for need in needs:
            assert (need if isinstance(need, str) else need["tool"]) in tools
    steps = {n for n, _ in scenario.ideal_path}
    assert set(wf["required_steps"]) <= steps


@pytest.mark.parametrize("scenario", CORE, ids=lambda s: s.name)
def test_a_wrong_terminal_argument_fails_the_grader(scenario: Scenario) -> None:
    _name, args = scenario.ideal_path[-1]
    wrong = {k: ("nonsense" if isinstance(v, str) else -1) for k, v in args.items()}
    calls = [Call(n, a) for n, a in scenario.ideal_path]
    assert not scenario.grade(wrong, calls)


async def test_stateful_variants_refuse_a_skipped_lookup() -> None:
    s = by_name("argument_fidelity_stateful")
    specs = {t.name: t for t in s.build_tools()}
    with pytest.raises(ToolError, match="call find_entity first"):
        await call(specs, "get_entity_details", {"entity_id": 42})
    await call(specs, "find_entity", {"name": "Acme"})
    assert await call(specs, "get_entity_details", {"entity_id": 42})
    # Fresh state every build: a new run starts gated again.
    fresh = {t.name: t for t in s.build_tools()}
    with pytest.raises(ToolError):
        await call(fresh, "get_entity_details", {"entity_id": 42})


async def test_tools_are_deterministic_and_errors_carry_a_hint() -> None:
    s = by_name("error_recovery")
    specs = {t.name: t for t in s.build_tools()}
    with pytest.raises(ToolError, match="ORD-1234"):
        await call(specs, "get_order", {"order_id": "7781"})
    a = await call(specs, "get_order", {"order_id": "ORD-7781"})
    b = await call(specs, "get_order", {"order_id": "ord-7781"})
    assert a == b


async def test_unknown_arguments_are_an_argument_error() -> None:
    specs = {t.name: t for t in by_name("basic_2step").build_tools()}
    with pytest.raises(ToolError):
        validate_args(specs["get_weather"], {"city": "Paris", "units": "C"})


def test_relevance_detection_fails_a_run_that_called_a_distractor() -> None:
    s = by_name("relevance_detection")
    args = {"answer": "Shakespeare"}
    assert s.grade(args, [Call("answer", args)])
    assert not s.grade(args, [Call("get_weather", {"city": "Paris"}), Call("answer", args)])


def test_the_sentinel_scenario_result_holds_sentinels() -> None:
    from toolforge.core.protocol import sentinels
    from toolforge.eval.qualify.catalog import NOTE_WITH_SENTINELS

    assert sentinels.SENTINEL_RE.search(NOTE_WITH_SENTINELS)


def test_compaction_chain_budgets_tighten() -> None:
    budgets = [s.budget_tokens for s in COMPACTION_CHAIN]
    assert budgets[0] is None
    assert budgets[1] > budgets[2] > budgets[3]  # type: ignore[operator]


def test_select() -> None:
    assert [s.name for s in select()] == [s.name for s in CORE]
    assert {s.name for s in select(tags=["compaction"])} >= {
        "compaction_stress",
        "phase2_compaction",
        "compaction_chain_p1",
    }
    assert [s.name for s in select(["basic_2step"])] == ["basic_2step"]
    with pytest.raises(KeyError, match="known"):
        select(["nope"])


@pytest.mark.parametrize("ablation", sorted(PRESETS))
def test_every_preset_leaves_every_scenarios_workflow_valid(ablation: str) -> None:
    # A preset that turns a feature off must not leave a field that names it (no_steps with
    # the audit's min_calls was refused as WORKFLOW_INVALID before any run).
    for scenario in ALL_SCENARIOS:
        doc = PRESETS[ablation].apply(scenario.workflow())
        parse_workflow(doc, known_tools=scenario.tool_names())
