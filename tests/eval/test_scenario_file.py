"""Scenarios as data (``toolforge eval --scenarios FILE``): a file loads into scenarios that
behave as written, a bad file names every problem, and the CLI runs the shipped example
end to end through a real gateway."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import JsonArgs, PermanentToolError, ToolSpec
from toolforge.eval.qualify.scenario import Call
from toolforge.eval.qualify.scenario_file import (
    FileScenario,
    ScenarioFileError,
    load_scenarios,
    parse_scenarios,
)
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, Step

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "order_refund.yaml"


def example_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return doc


def tools_of(scenario: FileScenario) -> dict[str, ToolSpec[Any]]:
    return {spec.name: spec for spec in scenario.build_tools()}


async def call(spec: ToolSpec[Any], args: dict[str, Any]) -> object:
    return await spec.fn(JsonArgs(args))


# -- a good file ---------------------------------------------------------------------------


async def test_the_example_loads_and_its_tools_answer_by_argument_match() -> None:
    [scenario] = load_scenarios(EXAMPLE)
    tools = tools_of(scenario)
    assert list(tools) == ["find_order", "check_refund_policy", "issue_refund"]
    found = await call(tools["find_order"], {"order_id": "A-1042"})
    assert isinstance(found, dict) and found["paid"] == 48.5
    # Another `when` picks another fixture; a key the entry does not list does not matter.
    policy = tools["check_refund_policy"]
    assert await call(policy, {"order_id": "A-1043", "reason": "damaged"}) == {
        "eligible": False,
        "why": "delivered more than 30 days ago",
    }
    # Nothing matches: the default result, or the default error.
    assert (await call(policy, {"order_id": "A-1042", "reason": "changed_mind"}))["eligible"] is (
        False
    )
    with pytest.raises(PermanentToolError, match="no order with that id"):
        await call(tools["find_order"], {"order_id": "Z-1"})
    # The tool's parameters are its contract, as the model sees it.
    assert tools["issue_refund"].input_schema["required"] == ["order_id", "amount", "reason"]


async def test_the_first_matching_fixture_wins_and_an_error_entry_raises() -> None:
    doc = example_doc()
    find = doc["scenarios"][0]["tools"][0]
    find["results"] = [
        {"when": {"order_id": "A-1042"}, "error": "order A-1042 is locked"},
        {"when": {"order_id": "A-1042"}, "result": {"never": True}},
        {"when": {}, "result": {"any": "order"}},
    ]
    find.pop("default")
    [scenario] = parse_scenarios(doc)
    spec = tools_of(scenario)["find_order"]
    with pytest.raises(PermanentToolError, match="order A-1042 is locked"):
        await call(spec, {"order_id": "A-1042"})
    assert await call(spec, {"order_id": "B-2"}) == {"any": "order"}  # `when: {}` matches all


async def test_without_a_default_an_unmatched_call_is_an_error_the_model_reads() -> None:
    doc = example_doc()
    doc["scenarios"][0]["tools"][0].pop("default")
    [scenario] = parse_scenarios(doc)
    with pytest.raises(PermanentToolError, match="find_order has no result for these"):
        await call(tools_of(scenario)["find_order"], {"order_id": "A-9"})


async def test_fixture_results_are_copies_a_run_cannot_change() -> None:
    [scenario] = load_scenarios(EXAMPLE)
    first = await call(tools_of(scenario)["find_order"], {"order_id": "A-1042"})
    assert isinstance(first, dict)
    first["paid"] = 0
    again = await call(tools_of(scenario)["find_order"], {"order_id": "A-1042"})
    assert isinstance(again, dict) and again["paid"] == 48.5


def test_the_grader_checks_listed_args_the_schema_and_the_terminal_tool() -> None:
    [scenario] = load_scenarios(EXAMPLE)
    good = {"order_id": "A-1042", "amount": 48.5, "reason": "damaged"}
    ended = [Call("find_order", {}), Call("issue_refund", good)]
    assert scenario.grade(good, ended)
    assert scenario.grade({**good, "amount": 48.50}, ended)
    assert not scenario.grade({**good, "amount": 485}, ended)  # a wrong listed value
    assert not scenario.grade({**good, "order_id": "a-1042"}, ended)  # exact, not loose
    assert not scenario.grade({"order_id": "A-1042", "reason": "damaged"}, ended)  # missing
    assert not scenario.grade({**good, "reason": "changed_mind"}, ended)  # the schema says no
    # A number is not a boolean, and a boolean is not a number.
    doc = example_doc()
    doc["scenarios"][0]["grader"] = {"args": {"order_id": "A-1042", "amount": 1}}
    doc["scenarios"][0]["ideal_path"][-1]["args"]["amount"] = 1
    [ones] = parse_scenarios(doc)
    assert ones.grade({"order_id": "A-1042", "amount": 1.0}, ended)
    assert not ones.grade({"order_id": "A-1042", "amount": True}, ended)


def test_a_named_grader_tool_must_be_the_one_that_ended_the_run() -> None:
    doc = example_doc()
    s = doc["scenarios"][0]
    s["tools"].append(
        {"name": "escalate", "parameters": {"type": "object"}, "default": {"result": "ok"}}
    )
    s["workflow"]["terminal_tools"] = ["issue_refund", "escalate"]
    [scenario] = parse_scenarios(doc)
    args = {"order_id": "A-1042", "amount": 48.5, "reason": "damaged"}
    assert not scenario.grade(args, [Call("escalate", args)])
    assert scenario.grade(args, [Call("escalate", args, ok=False), Call("issue_refund", args)])


def test_the_scenario_maps_onto_the_runner_s_fields() -> None:
    [scenario] = load_scenarios(EXAMPLE)
    assert scenario.required_steps == ("find_order", "check_refund_policy")
    assert scenario.terminal_tools == ("issue_refund",)
    assert scenario.ideal_iterations == 3
    assert scenario.max_iterations == 6
    wf = scenario.workflow()
    assert wf["name"] == "eval.order_refund"
    assert wf["tools"] == ["find_order", "check_refund_policy", "issue_refund"]
    assert wf["instructions"].startswith("Call find_order first")  # the whole document
    assert wf["prerequisites"]["issue_refund"][0]["match_arg"] == "order_id"
    assert scenario.variant(name="other").workflow()["instructions"] == wf["instructions"]


def test_json_files_load_too(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(orjson.dumps(example_doc()))
    assert [s.name for s in load_scenarios(path)] == ["order_refund"]


# -- a bad file ----------------------------------------------------------------------------


def problems(doc: object) -> list[str]:
    with pytest.raises(ScenarioFileError) as caught:
        parse_scenarios(doc, source="f.yaml")
    return caught.value.problems


def test_each_problem_of_a_bad_file_is_a_line_naming_scenario_and_field() -> None:
    doc = example_doc()
    good = doc["scenarios"][0]
    missing = copy.deepcopy(good)
    missing["name"] = "missing_prompt"
    del missing["prompt"]
    missing["colour"] = "blue"
    bad_schema = copy.deepcopy(good)
    bad_schema["name"] = "bad_schema"
    bad_schema["tools"][1]["parameters"] = {"type": "nope"}
    both = copy.deepcopy(good)
    both["name"] = "both"
    both["tools"][2]["results"] = [{"when": {}, "result": 1, "error": "both"}]
    bad_grader = copy.deepcopy(good)
    bad_grader["name"] = "bad_grader"
    bad_grader["grader"]["tool"] = "send_email"
    bad_flow = copy.deepcopy(good)
    bad_flow["name"] = "bad_flow"
    bad_flow["workflow"]["terminal_tools"] = ["close_order"]
    doc["scenarios"] = [good, missing, bad_schema, both, bad_grader, bad_flow]
    lines = problems(doc)
    assert len(lines) == 6, lines
    by = {line.split(": ")[1]: line for line in lines if "bad_schema" not in line}
    assert all(line.startswith("f.yaml: scenario '") for line in lines)
    assert "f.yaml: scenario 'missing_prompt': prompt: Field required" in lines
    assert any("'missing_prompt': colour: Extra inputs are not permitted" in x for x in lines)
    assert any("'bad_schema': tools.1.parameters: " in x and "nope" in x for x in lines), lines
    assert any(
        "'both': tools.2.results.0: " in x and "exactly one of 'result' or 'error'" in x
        for x in lines
    ), lines
    assert "no tool 'send_email'" in by["scenario 'bad_grader'"]
    assert "grader.tool" in by["scenario 'bad_grader'"]
    assert by["scenario 'bad_flow'"] == (
        "f.yaml: scenario 'bad_flow': workflow: terminal_tools names 'close_order', "
        "which is not in 'tools'"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["scenarios"].append(s["scenarios"][0]), "name: another scenario"),
        (
            lambda s: s["scenarios"][0]["ideal_path"].insert(0, "lookup"),
            "ideal_path.0: no tool 'lookup'",
        ),
        (
            lambda s: s["scenarios"][0]["ideal_path"].pop(),
            "ideal_path: the last step must be a terminal tool",
        ),
        (
            lambda s: s["scenarios"][0]["ideal_path"][-1]["args"].update(amount=1),
            "ideal_path: its last step's arguments do not pass the grader",
        ),
        (
            lambda s: s["scenarios"][0]["ideal_path"][0]["args"].update(order_id=7),
            "ideal_path.0.args: not valid against find_order's parameters",
        ),
        (
            lambda s: s["scenarios"][0].update(grader={"tool": "issue_refund"}),
            "grader: Value error, give 'args', 'schema' or both",
        ),
        (
            lambda s: s["scenarios"][0]["grader"].update(schema={"type": 5}),
            "grader.schema: ",
        ),
        (
            lambda s: s["scenarios"][0]["grader"].update(tool="find_order"),
            "grader.tool: 'find_order' is not a terminal tool",
        ),
        (
            lambda s: s["scenarios"][0]["workflow"].update(max_iterations=500),
            "max_iterations",
        ),
        (lambda s: s.update(version=2), "f.yaml: version: Extra inputs are not permitted"),
        (
            lambda s: s["scenarios"][0].update(system="Be brief."),
            "'order_refund': system: Extra inputs are not permitted",
        ),
    ],
)
def test_a_bad_field_is_named(change: Any, expected: str) -> None:
    doc = example_doc()
    change(doc)
    lines = problems(doc)
    assert any(expected in line for line in lines), lines


def test_not_a_mapping_or_no_scenarios_is_one_clear_line() -> None:
    assert problems(["a", "list"])[0].startswith("f.yaml: (document): ")
    assert problems({"scenarios": []}) == [
        "f.yaml: scenarios: List should have at least 1 item after validation, not 0"
    ]


def test_a_file_that_is_not_yaml_or_json_is_one_line(tmp_path: Path) -> None:
    for name, text in (("s.yaml", "scenarios: [\n  - {name: x\n"), ("s.json", "{not json")):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ScenarioFileError) as caught:
            load_scenarios(path)
        [line] = caught.value.problems
        assert line.startswith(f"{path}: not valid {'JSON' if name.endswith('json') else 'YAML'}")


# -- the CLI, end to end -------------------------------------------------------------------


def eval_argv(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "toolforge.cli",
        "eval",
        "--scenarios",
        str(EXAMPLE),
        "--runs",
        "1",
        "--out",
        str(out),
        *extra,
    ]


def test_a_bad_file_exits_2_with_a_line_per_problem(tmp_path: Path) -> None:
    doc = example_doc()
    del doc["scenarios"][0]["prompt"]
    doc["scenarios"][0]["grader"]["tool"] = "nope"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    argv = eval_argv(tmp_path / "out", "--backend", "scripted:perfect")
    argv[argv.index(str(EXAMPLE))] = str(bad)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"toolforge eval: {bad}: scenario 'order_refund': prompt: Field required"
    ]
    del doc["scenarios"][0]["grader"]["tool"]
    doc["scenarios"][0]["prompt"] = "Refund A-1042."
    doc["scenarios"][0]["grader"]["args"] = {"order_id": "A-1042", "amount": 48.5}
    doc["scenarios"][0]["tools"][0]["parameters"] = {"type": "object", "required": 3}
    doc["scenarios"][0]["workflow"]["required_steps"] = ["ship_it"]
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 2, lines
    assert "tools.0.parameters: " in lines[0]
    assert "required_steps names 'ship_it'" in lines[1]
    assert not (tmp_path / "out").exists()


def test_the_cli_grades_the_example_s_ideal_path_correct(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    argv = eval_argv(out, "--backend", "scripted:perfect", "--mode", "sentinel", "native")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert len(runs) == 2
    assert all(r["scenario"] == "order_refund" and r["correct"] for r in runs), runs
    assert all(r["iterations"] == 3 and r["ideal_iterations"] == 3 for r in runs)
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert {v["score"] for v in summary["totals"].values()} == {1.0}


def turn(call_id: str, name: str, args: dict[str, Any]) -> Script:
    frame = sentinels.frame(FrameKind.TOOL_CALL, call_id, name, orjson.dumps(args).decode())
    return Script(steps=(Step(text=frame), Step(finish="stop")))


async def run_cli_against(up_turns: list[Script], out: Path) -> list[dict[str, Any]]:
    """``toolforge eval --scenarios`` against a scripted OpenAI-compatible server on
    loopback, the model's turns played from ``up_turns``."""
    async with ScriptedUpstream(scripts=up_turns) as up:
        argv = eval_argv(out, "--backend", up.base_url, "--mode", "sentinel")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=out.parent,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=240)
        assert proc.returncode == 0, stderr.decode()
        assert len(up.requests) == len(up_turns)  # every turn reached the model
    return [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]


async def test_the_cli_grades_a_wrong_terminal_argument_incorrect(tmp_path: Path) -> None:
    """A model that follows the workflow and refunds the wrong amount completes the run,
    but the grader says it is not correct; the same turns with the right amount are."""
    steps = [
        turn("c1", "find_order", {"order_id": "A-1042"}),
        turn("c2", "check_refund_policy", {"order_id": "A-1042", "reason": "damaged"}),
    ]
    wrong = {"order_id": "A-1042", "amount": 4.85, "reason": "damaged"}
    [run] = await run_cli_against([*steps, turn("c3", "issue_refund", wrong)], tmp_path / "w")
    assert run["completed"] and run["terminal"] == "issue_refund"
    assert not run["correct"]
    right = {**wrong, "amount": 48.5}
    [run] = await run_cli_against([*steps, turn("c3", "issue_refund", right)], tmp_path / "r")
    assert run["completed"] and run["correct"]
