"""Scenarios as data: ``toolforge eval --scenarios FILE`` (YAML or JSON; docs/eval.md,
"Your own scenarios").

A file lets a user qualify a model on their own workflow without writing Python. Each
scenario in it is mapped onto the catalog's :class:`~.scenario.Scenario`, so the runner,
the ablations, the metrics and the reports treat it exactly like a built-in one:

* each tool is a JSON-Schema tool (:class:`~toolforge.core.tool_specs.JsonArgs`, as an MCP
  server's) whose result is a fixture: the first ``results`` entry whose ``when`` matches
  the arguments (every listed key equal, as JSON), else ``default``; an ``error`` entry is
  a :class:`~toolforge.core.tool_specs.PermanentToolError` the model has to deal with;
* the workflow is the inline workflow document of docs/workflows.md, checked by the
  gateway's own :func:`~toolforge.core.workflow.parse_workflow` with the caps an eval run's
  gateway applies to inline workflows, so a file that loads is one the gateway accepts;
* the grader compares the terminal call's arguments with ``grader.args`` (exactly, on the
  listed keys) and/or checks them against ``grader.schema``.

Loading checks everything it can before a run starts and reports every problem at once,
one line each, naming the scenario and the field path (:class:`ScenarioFileError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolforge.core.schemas import CompiledSchema, compile_schema
from toolforge.core.tool_specs import JsonArgs, PermanentToolError, ToolSpec
from toolforge.core.workflow import WorkflowCaps, WorkflowDef, parse_workflow
from toolforge.errors import RequestError
from toolforge.eval.qualify.scenario import Call, Scenario
from toolforge.settings import Settings

__all__ = ["FileScenario", "ScenarioFileError", "load_scenarios", "parse_scenarios"]

_NAME = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
_MAX_SCENARIOS: Final = 256  # a file is a suite, not a data set; keeps a typo'd file readable


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Outcome(_Strict):
    """A fixture's answer: ``result`` (any JSON, ``null`` included) or ``error``."""

    result: Any = None
    error: Annotated[str, Field(min_length=1, max_length=4096)] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> _Outcome:
        given = {"result", "error"} & self.model_fields_set
        if len(given) != 1:
            raise ValueError("give exactly one of 'result' or 'error'")
        return self


class _Fixture(_Outcome):
    when: dict[str, Any]


class _ToolDoc(_Strict):
    name: _NAME
    description: Annotated[str, Field(max_length=8192)] = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    results: list[_Fixture] = Field(default_factory=list)
    default: _Outcome | None = None


class _StepDoc(_Strict):
    tool: _NAME
    args: dict[str, Any] = Field(default_factory=dict)


class _GraderDoc(_Strict):
    tool: _NAME | None = None
    args: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _something(self) -> _GraderDoc:
        if self.args is None and self.schema_ is None:
            raise ValueError("give 'args', 'schema' or both")
        return self


class _ScenarioDoc(_Strict):
    name: _NAME
    description: Annotated[str, Field(max_length=4000)] = ""
    tags: list[_NAME] = Field(default_factory=list)
    prompt: Annotated[str, Field(min_length=1)]
    tools: Annotated[list[_ToolDoc], Field(min_length=1, max_length=64)]
    workflow: dict[str, Any]
    ideal_path: Annotated[list[_NAME | _StepDoc], Field(min_length=1)]
    grader: _GraderDoc


class _FileDoc(_Strict):
    scenarios: Annotated[list[Any], Field(min_length=1, max_length=_MAX_SCENARIOS)]


class ScenarioFileError(Exception):
    """A scenario file that cannot run: ``problems`` holds one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True, slots=True, kw_only=True)
class FileScenario(Scenario):
    """A :class:`Scenario` from a file: its workflow is the file's whole document (the
    instructions, retries and compaction it sets included), not only the fields a built-in
    scenario sets."""

    workflow_doc: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def workflow(self) -> dict[str, Any]:
        return dict(orjson.loads(orjson.dumps(self.workflow_doc)))

    def variant(self, **changes: Any) -> FileScenario:
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        return FileScenario(**fields)


def load_scenarios(path: Path) -> list[FileScenario]:
    """The scenarios of the YAML or JSON file at ``path`` (``.json``: JSON, else YAML)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioFileError([f"{path}: cannot read it ({exc})"]) from None
    try:
        doc = orjson.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        reason = " ".join(str(exc).split())
        raise ScenarioFileError([f"{path}: not valid {kind}: {reason}"]) from None
    return parse_scenarios(doc, source=str(path))


def parse_scenarios(
    doc: object, *, source: str = "scenarios", caps: WorkflowCaps | None = None
) -> list[FileScenario]:
    """``doc`` (a parsed file) as scenarios, or :class:`ScenarioFileError` listing every
    problem. ``caps``: the inline-workflow caps of the gateway the runs go through (by
    default this process's settings, which is what an eval run's gateway uses)."""
    try:
        top = _FileDoc.model_validate(doc)
    except ValidationError as exc:
        raise ScenarioFileError(_pydantic_lines(source, exc)) from None
    caps = caps or _caps()
    problems: list[str] = []
    out: list[FileScenario] = []
    seen: set[str] = set()
    for i, raw in enumerate(top.scenarios):
        label = _label(i, raw)
        try:
            parsed = _ScenarioDoc.model_validate(raw)
        except ValidationError as exc:
            problems += _pydantic_lines(f"{source}: {label}", exc)
            continue
        if parsed.name in seen:
            problems.append(f"{source}: {label}: name: another scenario has this name")
        seen.add(parsed.name)
        found: list[str] = []
        scenario = _build(parsed, caps, found)
        problems += (f"{source}: {label}: {p}" for p in found)
        if scenario is not None:
            out.append(scenario)
    if problems:
        raise ScenarioFileError(problems)
    return out


def _caps() -> WorkflowCaps:
    s = Settings()
    return WorkflowCaps(
        max_iterations=s.inline_workflow_max_iterations,
        max_tool_calls=s.inline_workflow_max_tool_calls,
        max_budget_tokens=s.inline_workflow_max_budget_tokens,
    )


def _label(i: int, raw: object) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    return f"scenario {name!r}" if isinstance(name, str) else f"scenarios[{i}]"


def _pydantic_lines(where: str, exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        # Union branches add their type names to the path; the user wrote neither.
        loc = [str(p) for p in err["loc"] if not _is_type_tag(p)]
        path = ".".join(loc) or "(document)"
        lines.append(f"{where}: {path}: {err['msg']}")
    return list(dict.fromkeys(lines))


def _is_type_tag(part: object) -> bool:
    return isinstance(part, str) and (part in ("str", "_StepDoc") or part.startswith("constrained"))


def _schema(
    schema: Mapping[str, Any], name: str, where: str, found: list[str]
) -> CompiledSchema | None:
    try:
        return compile_schema(schema, name=name, fallback=False)
    except RequestError as exc:
        found.append(f"{where}: {exc.message}")
        return None


def _build(doc: _ScenarioDoc, caps: WorkflowCaps, found: list[str]) -> FileScenario | None:
    params: dict[str, CompiledSchema | None] = {}
    for i, t in enumerate(doc.tools):
        if t.name in params:
            found.append(f"tools.{i}.name: another tool has the name {t.name!r}")
        params[t.name] = _schema(
            t.parameters, f"{t.name}.parameters", f"tools.{i}.parameters", found
        )
    workflow = _workflow(doc, caps, found)
    grader = doc.grader
    terminal = sorted(workflow.terminal_tools) if workflow else []
    if grader.tool is not None and grader.tool not in params:
        found.append(f"grader.tool: no tool {grader.tool!r}; tools: {', '.join(params)}")
    elif grader.tool is not None and workflow and grader.tool not in workflow.terminal_tools:
        found.append(
            f"grader.tool: {grader.tool!r} is not a terminal tool of the workflow "
            f"({', '.join(terminal)})"
        )
    grade_schema = None
    if grader.schema_ is not None:
        grade_schema = _schema(grader.schema_, f"{doc.name}.grader", "grader.schema", found)
    path = tuple(
        (step, {}) if isinstance(step, str) else (step.tool, dict(step.args))
        for step in doc.ideal_path
    )
    for i, (name, args) in enumerate(path):
        compiled = params.get(name)
        if name not in params:
            found.append(f"ideal_path.{i}: no tool {name!r}; tools: {', '.join(params)}")
        elif compiled is not None and args and not compiled.is_valid(args):
            found.append(f"ideal_path.{i}.args: not valid against {name}'s parameters")
    if workflow and path[-1][0] not in workflow.terminal_tools:
        found.append(f"ideal_path: the last step must be a terminal tool ({', '.join(terminal)})")
    if found or workflow is None:
        return None
    grade = _Grade(grader.tool, grader.args, grade_schema, frozenset(workflow.terminal_tools))
    last_name, last_args = path[-1]
    if last_args and not grade(last_args, [Call(last_name, last_args)]):
        found.append("ideal_path: its last step's arguments do not pass the grader")
        return None
    body = dict(doc.workflow)
    body.setdefault("name", f"eval.{doc.name}")
    body.setdefault("tools", [t.name for t in doc.tools])
    tools = tuple(doc.tools)
    return FileScenario(
        name=doc.name,
        tags=frozenset(doc.tags),
        description=doc.description,
        prompt=doc.prompt,
        build_tools=lambda: [_tool(t) for t in tools],
        required_steps=workflow.required_steps,
        terminal_tools=tuple(workflow.terminal_tools),
        prerequisites={k: tuple(p.to_dict() for p in v) for k, v in workflow.prerequisites.items()},
        ideal_path=path,
        grade=grade,
        budget_tokens=workflow.budget_tokens,
        max_iterations=workflow.max_iterations,
        keep_recent=workflow.keep_recent,
        workflow_doc=body,
    )


def _workflow(doc: _ScenarioDoc, caps: WorkflowCaps, found: list[str]) -> WorkflowDef | None:
    body = dict(doc.workflow)
    body.setdefault("name", f"eval.{doc.name}")
    body.setdefault("tools", [t.name for t in doc.tools])
    try:
        # Only the file's own tools exist for it (and the built-in respond).
        return parse_workflow(
            body, known_tools=[t.name for t in doc.tools], source="workflow", caps=caps
        )
    except RequestError as exc:
        # The gateway's message names its own source and the workflow; here the line
        # already names the scenario, so it keeps only the problem.
        problem = exc.message.removeprefix("workflow in workflow: ")
        problem = problem.replace(f"{body['name']!r} (workflow): ", "", 1)
        found.append(f"workflow: {problem}")
        return None


@dataclass(frozen=True, slots=True)
class _Grade:
    """The file's grader: the terminal call (``tool``, when named) with ``args`` on the
    listed keys and valid against ``schema``."""

    tool: str | None
    args: Mapping[str, Any] | None
    schema: CompiledSchema | None
    terminal: frozenset[str]

    def __call__(self, terminal_args: Mapping[str, Any], calls: Sequence[Call]) -> bool:
        if self.tool is not None:
            ended = next((c.name for c in calls if c.ok and c.name in self.terminal), None)
            if ended != self.tool:
                return False
        if self.args is not None:
            for key, want in self.args.items():
                if key not in terminal_args or not _same(terminal_args[key], want):
                    return False
        return self.schema is None or self.schema.is_valid(dict(terminal_args))


def _same(a: object, b: object) -> bool:
    """JSON equality: ``1`` and ``1.0`` are the same number, ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        b, option=orjson.OPT_SORT_KEYS
    ) or (isinstance(a, int | float) and isinstance(b, int | float) and a == b)


def _matches(when: Mapping[str, Any], args: Mapping[str, Any]) -> bool:
    return all(key in args and _same(args[key], want) for key, want in when.items())


def _tool(doc: _ToolDoc) -> ToolSpec[JsonArgs]:
    """A fresh fixture-backed tool: deterministic, never retried, idempotent."""

    async def run(args: JsonArgs) -> object:
        given = args.root
        outcome: _Outcome | None = next((f for f in doc.results if _matches(f.when, given)), None)
        outcome = outcome or doc.default
        if outcome is None:
            raise PermanentToolError(f"{doc.name} has no result for these arguments")
        if outcome.error is not None:
            raise PermanentToolError(outcome.error)
        return orjson.loads(orjson.dumps(outcome.result))

    return ToolSpec(
        name=doc.name,
        description=doc.description,
        args_model=JsonArgs,
        json_schema=doc.parameters,
        fn=run,
        retries=0,
        retry_delay_s=0.0,
        idempotent=True,
        source="eval:file",
    )
