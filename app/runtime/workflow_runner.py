"""The workflow runner in Python (docs/workflows.md): ``from toolforge import Workflow, ToolDef,
WorkflowRunner``.

It runs a workflow in-process, with Python callables as tools, against any upstream
adapter (:class:`toolforge.upstream.base.Upstream`: OpenAI-compatible, llama-server,
Ollama, or a test double). It is not a second loop: each run is one
:class:`~toolforge.runtime.session.StreamSession` driving the same turn engine and the same
:class:`~toolforge.core.steps.WorkflowPolicy` as ``POST /v1/stream``, so a workflow behaves
the same over HTTP and in Python. What this module adds is the Python surface:

* :class:`ToolDef`: a callable (sync or async, called with keyword arguments), its
  parameters (a pydantic model or a JSON Schema), its prerequisites;
* :class:`Workflow`: tools, required steps, terminal tools and the budgets, validated
  like a definition file (``WORKFLOW_INVALID``);
* :class:`WorkflowRunner`: ``await runner.run(workflow, "user message")`` returns a
  :class:`WorkflowResult`, or raises the typed :class:`~toolforge.errors.WorkflowError`
  subclass of the failure (``StepEnforcementError``, ``PrerequisiteError``,
  ``ToolCallError``, ``ToolExecutionError``, ``MaxIterationsError``,
  ``WorkflowCancelledError``) with its ``context``; any other failure (the upstream's, a
  framing violation) is the :class:`~toolforge.errors.ToolForgeError` it was.

Callbacks: ``on_chunk(frame)`` for each frame of the run as it happens (the SSE stream's
frames, typed); ``on_message(message)`` for each message the conversation adds to the
history the model is sent (``initial_messages`` are not repeated). Either may be async.
``compactor``: the hook where context compaction plugs in (``toolforge.core.steps.
Compactor``): called before every turn with the messages and the step hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any, Final

import httpx
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, model_validator

from toolforge.core.context import ContextPolicy, strategy_named
from toolforge.core.decisions import WorkflowSummary
from toolforge.core.protocol.frames import Frame
from toolforge.core.schemas import builtin_registry
from toolforge.core.steps import Compactor, WorkflowNudges, WorkflowPolicy
from toolforge.core.tool_specs import PermanentToolError, ToolError, ToolRegistry, ToolSpec
from toolforge.core.workflow import RESPOND, WorkflowDef, parse_workflow
from toolforge.errors import ErrorCode, ToolForgeError, WorkflowError, workflow_error
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.frame_log import decode_frames
from toolforge.runtime.planner import (
    PlannerConfig,
    PlanRequest,
    SessionLimits,
    StreamPlanner,
    StreamTurn,
)
from toolforge.runtime.session import StreamSession
from toolforge.upstream.base import Upstream

__all__ = ["ToolDef", "Workflow", "WorkflowResult", "WorkflowRunner"]

Callback = Callable[[Any], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool of a Python workflow: ``fn(**arguments)`` (sync or async) returns its result
    (JSON-able). ``parameters``: a pydantic model, or a JSON Schema of the arguments.
    ``prerequisites``: tool names, or ``{"tool", "match_arg", "result_key"?}`` (see
    :mod:`toolforge.core.workflow`). ``grounded``: string arguments the model must write
    from the user's own words (constrained mode's grammar holds them to it). An exception
    ``fn`` raises goes back to the model as the call's error (``TOOL_FAILED`` with its
    message), so that it can correct itself."""

    name: str
    fn: Callable[..., Any]
    parameters: type[BaseModel] | Mapping[str, Any]
    description: str = ""
    prerequisites: Sequence[str | Mapping[str, str]] = ()
    grounded: Sequence[str] = ()
    timeout_s: float | None = None

    def spec(self) -> ToolSpec[Any]:
        """The registry's tool for this definition."""
        model = self.parameters if isinstance(self.parameters, type) else _schema_model(self)
        fn = self.fn

        async def run(args: BaseModel) -> object:
            kwargs = args.model_dump(exclude_unset=not isinstance(self.parameters, type))
            try:
                result = fn(**kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except ToolError:
                raise
            except Exception as exc:  # fed back to the model (docs/workflows.md: self-correction)
                raise PermanentToolError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc
            return result

        return ToolSpec(
            name=self.name,
            description=self.description or (inspect.getdoc(fn) or ""),
            args_model=model,
            fn=run,
            timeout_s=self.timeout_s,
            retries=0,
        )


def _schema_model(tool: ToolDef) -> type[BaseModel]:
    """A pydantic model that checks arguments against a JSON Schema and reports it."""
    schema = dict(tool.parameters)  # type: ignore[arg-type]
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _valid(cls, value: Any) -> Any:
            errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
            if errors:
                where = "/".join(str(p) for p in errors[0].path) or "(arguments)"
                raise ValueError(f"{where}: {errors[0].message}")
            return value

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(schema)

    Arguments.__name__ = f"{tool.name}_arguments"
    return Arguments


class Workflow:
    """A workflow of Python tools (docs/workflows.md), validated like a definition file."""

    def __init__(
        self,
        name: str,
        tools: Sequence[ToolDef],
        *,
        terminal_tools: str | Sequence[str],
        required_steps: Sequence[str] = (),
        instructions: str = "",
        description: str = "",
        max_iterations: int = 10,
        max_retries_per_step: int = 3,
        max_tool_errors: int = 2,
        rescue: bool = True,
        narrow: bool = True,
        respond: bool = False,
        compaction: str = "tiered",
        keep_recent: int = 2,
        budget_tokens: int | None = None,
        provenance: Mapping[str, Mapping[str, Any]] | None = None,
        max_calls: Mapping[str, int] | None = None,
        min_calls: Mapping[str, int] | None = None,
    ) -> None:
        self.tools = {tool.name: tool for tool in tools}
        terminals = [terminal_tools] if isinstance(terminal_tools, str) else list(terminal_tools)
        names = [*self.tools, *([RESPOND] if respond else [])]
        doc = {
            "name": name,
            "description": description,
            "tools": names,
            "required_steps": list(required_steps),
            "terminal_tools": terminals,
            "prerequisites": {
                t.name: [p if isinstance(p, str) else dict(p) for p in t.prerequisites]
                for t in tools
                if t.prerequisites
            },
            "max_iterations": max_iterations,
            "max_retries_per_step": max_retries_per_step,
            "max_tool_errors": max_tool_errors,
            "rescue": rescue,
            "narrow": narrow,
            "compaction": compaction,
            "keep_recent": keep_recent,
            "budget_tokens": budget_tokens,
            "grounded": {t.name: list(t.grounded) for t in tools if t.grounded},
            "provenance": {tool: dict(args) for tool, args in (provenance or {}).items()},
            "max_calls": dict(max_calls or {}),
            "min_calls": dict(min_calls or {}),
            "instructions": instructions,
        }
        self.definition: WorkflowDef = parse_workflow(doc, known_tools=self.tools, source="python")

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True, slots=True)
class WorkflowResult:
    """A finished run: the terminal tool and its result, the steps, and the record."""

    tool: str
    value: object
    completed_steps: list[str]
    iterations: int
    nudges: int
    frames: list[Frame] = field(repr=False)
    messages: list[Mapping[str, Any]] = field(repr=False)
    usage: Mapping[str, object] | None = None


def _text(name: str) -> str:
    return (files("toolforge.prompts") / f"{name}.txt").read_text(encoding="utf-8")


class WorkflowRunner:
    """Runs workflows against ``upstream`` (see the module docstring).

    ``mode``: ``sentinel`` (any OpenAI-compatible upstream), ``constrained`` (a
    llama-server: each turn's grammar, narrowed by argument-matched prerequisites) or
    ``native`` (the upstream's own tool calls). ``sampling``: ``ChatRequest`` fields
    (``temperature``, ``seed``, ``max_tokens``, ``top_p``). ``budget_tokens``: the model's
    context (its server's ``n_ctx``): with it, or with the workflow's own
    ``budget_tokens``, every turn's prompt is measured (the upstream's ``tokenize`` when
    it has one, characters / 4 otherwise) and compacted with the workflow's
    ``compaction`` over 75 % of the budget, as over HTTP (docs/context.md).
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        model: str = "default",
        mode: str = "sentinel",
        sampling: Mapping[str, Any] | None = None,
        on_chunk: Callback | None = None,
        on_message: Callback | None = None,
        compactor: Compactor | None = None,
        limits: SessionLimits | None = None,
        tool_timeout_s: float = 30.0,
        budget_tokens: int | None = None,
    ) -> None:
        if mode not in ("sentinel", "constrained", "native"):
            raise ValueError(f"mode must be sentinel, constrained or native, not {mode!r}")
        self.upstream = upstream
        self.model = model
        self.mode = mode
        self.sampling = dict(sampling or {})
        self.on_chunk = on_chunk
        self.on_message = on_message
        self.compactor = compactor
        self.limits = limits or SessionLimits()
        self.tool_timeout_s = tool_timeout_s
        self.budget_tokens = budget_tokens
        self._system = _text("system")
        self._workflow_prompt = _text("workflow")
        self._repair = _text("repair")
        self._nudges = _nudges()

    async def run(
        self,
        workflow: Workflow,
        user_message: str | None = None,
        *,
        initial_messages: Sequence[Mapping[str, Any]] = (),
        cancel_event: asyncio.Event | None = None,
    ) -> WorkflowResult:
        """Run ``workflow`` on ``initial_messages`` (an earlier conversation, OpenAI-style)
        then ``user_message``; the terminal tool's result, or the typed error."""
        conversation = [dict(m) for m in initial_messages]
        if user_message is not None:
            conversation.append({"role": "user", "content": user_message})
        if not conversation:
            raise ValueError("give a user_message, initial_messages or both")
        session, policy = await self._session(workflow, conversation, bool(initial_messages))
        frames: list[Frame] = []
        seen = len(conversation) + 1  # our system prompt, then the caller's messages
        watcher = asyncio.create_task(_cancel_on(cancel_event, session)) if cancel_event else None
        session.start()
        log = session.log
        cursor = 0
        try:
            while True:
                fresh = log.encoded_after(cursor)
                cursor += len(fresh)
                for frame in decode_frames(fresh):
                    frames.append(frame)
                    history = policy.summary().messages
                    while seen < len(history):
                        await _call(self.on_message, history[seen])
                        seen += 1
                    await _call(self.on_chunk, frame)
                if log.closed and cursor >= log.last_id:
                    break
                await log.wait()
            await session.wait()
            for message in policy.summary().messages[seen:]:
                await _call(self.on_message, message)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if session.running:
                session.cancel("cancelled")
                await session.wait()
        return _outcome(workflow, session, policy.summary(), frames)

    def _planner(self, workflow: Workflow) -> StreamPlanner:
        """The gateway's planner over this workflow's tools: the runner plans its streams
        as ``POST /v1/stream`` does (one planner for every front door). The mode is always
        asked for by name, so the planner never probes the upstream over HTTP."""
        return StreamPlanner(
            config=PlannerConfig(
                model_id=self.model,
                # constrained mode is asked for on an upstream the caller says takes grammars
                upstream_kind="llama_server" if self.mode == "constrained" else "openai",
            ),
            client=_NO_PROBES,
            schemas=builtin_registry(),
            tools=ToolRegistry(tool.spec() for tool in workflow.tools.values()),
            system_template=self._system,
            context=None
            if self.budget_tokens is None
            else ContextPolicy(strategy_named("none"), self.budget_tokens, "manual"),
            workflow_nudges=self._nudges,
            workflow_template=self._workflow_prompt,
        )

    async def _session(
        self, workflow: Workflow, conversation: list[dict[str, Any]], history: bool
    ) -> tuple[StreamSession, WorkflowPolicy]:
        definition = workflow.definition
        planner = self._planner(workflow)
        plan = await planner.build(
            runner_request(self.mode, self.model, self.sampling, conversation),
            f"wf_{uuid.uuid4().hex[:20]}",
            workflow=definition,
            compactor=self.compactor,
            # A conversation brought in (initial_messages) may be over the budget already.
            fit_first_turn=history,
        )
        assert plan.workflow is not None  # a workflow's plan carries its policy
        executor = ToolExecutor(planner.tools, default_timeout_s=self.tool_timeout_s)
        session = StreamSession(
            plan,
            upstream=self.upstream,
            limits=self.limits,
            artifacts=None,
            executor=executor,
            repair_template=self._repair,
        )
        return session, plan.workflow


def runner_request(
    mode: str, model: str, sampling: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]
) -> PlanRequest:
    """A runner's run as a plan request (one planner for every front door): the workflow
    names the tools; the caller's messages as they are; the mode asked for by name; the
    sampling given (``None``: the upstream's default)."""
    return PlanRequest(
        turn=StreamTurn(mode=mode),
        messages=messages,
        model=model,
        sampling={k: v for k, v in sampling.items() if v is not None},
    )


# The planner's HTTP client is for mode probes, which a runner never makes (its mode is
# asked for by name): a client with no transport to speak of.
_NO_PROBES: Final = httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: httpx.Response(404)))


def _nudges() -> WorkflowNudges:
    return WorkflowNudges(
        step=(
            _text("workflow_nudge_step_1").strip(),
            _text("workflow_nudge_step_2").strip(),
            _text("workflow_nudge_step_3").strip(),
        ),
        prerequisite=_text("workflow_nudge_prerequisite").strip(),
        matched=_text("workflow_nudge_matched").strip(),
        retry=_text("proxy_nudge_required").strip(),
        unknown=_text("proxy_nudge_unknown").strip(),
    )


async def _call(callback: Callback | None, value: object) -> None:
    if callback is None:
        return
    result = callback(value)
    if inspect.isawaitable(result):
        await result


async def _cancel_on(event: asyncio.Event, session: StreamSession) -> None:
    await event.wait()
    session.cancel("cancelled")


def _usage(done: Mapping[str, object]) -> Mapping[str, object] | None:
    usage = done.get("usage")
    return usage if isinstance(usage, Mapping) else None


def _outcome(
    workflow: Workflow,
    session: StreamSession,
    summary: WorkflowSummary,
    frames: list[Frame],
) -> WorkflowResult:
    """The result, or the failure as its typed exception."""
    done = frames[-1].data if frames else {}
    context = summary.to_dict()
    if session.reason in ("cancelled", "shutdown", "client_disconnected"):
        raise workflow_error(
            ErrorCode.WORKFLOW_CANCELLED,
            f"workflow {workflow.name!r} was cancelled after {summary.iterations} model turns",
            context={**context, "messages": list(summary.messages)},
        )
    if summary.failure is not None:
        raise summary.failure
    errors = [f.data for f in frames if f.event == "error"]
    if errors:
        error = errors[0]
        raise ToolForgeError(ErrorCode(str(error["code"])), str(error["message"]))
    if not summary.finished:  # cannot happen: a workflow ends at its terminal tool or fails
        raise WorkflowError(ErrorCode.INTERNAL, "the run ended without a result", context=context)
    return WorkflowResult(
        tool=summary.result_tool or "",
        value=summary.result,
        completed_steps=list(summary.completed_steps),
        iterations=summary.iterations,
        nudges=summary.nudges,
        frames=frames,
        messages=list(summary.messages[1:]),
        usage=_usage(done),
    )
