"""Planning a stream: one function builds every plan (:meth:`StreamPlanner.build`), whichever
front door asked.

Each door turns its body into one neutral value, a :class:`PlanRequest`, with a small
adapter: :func:`stream_request` for a ``POST /v1/stream`` body (and the WebSocket's
``start``), ``completion_plan.completion_request`` for the proxy's plain request,
``completion_plan.plan_workflow_completion`` for its workflow runs, and the Python
runner's own. The request's ``turn`` is the ask of its mode strategy, which decides the
mode and shapes the turn: the request fields every turn carries, the grammar or the
upstream's tools, the prompt, the mode's part of the record (``prompt.json``).
:class:`StreamTurn` (the stream body's, the runner's, a workflow run's) decides the mode
(``auto`` probes the upstream once per model and caches the answer, docs/protocol.md),
shapes the request's schemas and tools once per combination (:class:`PlanShape`, so a
repeated request costs a dict lookup) and hands the rest to the mode's
:class:`TurnShaping`; the proxy's ``CompletionTurn`` hands it to its
``CompletionShaping``. The planner adds the workflow's policy and budgets and freezes
it all in a :class:`StreamPlan`. The planner has no ``if mode == ...`` and no ``if door
== ...``. Routes only parse the body and hand it here.

A body is read through a protocol (:class:`StreamAsk`, which ``toolforge.api.models.
StreamRequest`` satisfies): runtime does not import the HTTP layer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import httpx

from toolforge.core.context import ContextPolicy, workflow_context
from toolforge.core.engine import (
    ConstrainedMode,
    ConversationConfig,
    Mode,
    NativeMode,
    ReaderLimits,
    mode_named,
)
from toolforge.core.gbnf import FrameGrammar, decoding_gaps
from toolforge.core.native_tools import to_openai_tools
from toolforge.core.prompt import build_messages, render_system_prompt, render_workflow_prompt
from toolforge.core.schemas import (
    ANY,
    CompiledSchema,
    SchemaRegistry,
    compile_schema,
    is_compiled,
)
from toolforge.core.steps import Compactor, WorkflowNudges, WorkflowPolicy
from toolforge.core.tool_specs import ToolRegistry, ToolSpec
from toolforge.core.workflow import (
    RESPOND,
    RESPOND_TOOL,
    WorkflowCaps,
    WorkflowDef,
    parse_workflow,
)
from toolforge.errors import ErrorCode, RequestError
from toolforge.log import MODE_SELECTED, get_logger
from toolforge.upstream.base import PROFILES, ChatRequest
from toolforge.upstream.probe import ModeDecision, probe_tool_mode

__all__ = [
    "DEFAULT_MAX_TOOL_CALLS",
    "PlanRequest",
    "PlanShape",
    "PlannerConfig",
    "SessionLimits",
    "ShapedTurn",
    "StreamAsk",
    "StreamPlan",
    "StreamPlanner",
    "StreamTurn",
    "TurnAsk",
    "TurnShaping",
    "stream_request",
    "turn_shaping",
]

log = get_logger(__name__)

_SHAPE_CACHE_MAX: Final = 256  # combinations are few in practice; never grow unbounded
_ASKED: Final = {
    mode: ModeDecision(mode, "asked for by the request") for mode in ("sentinel", "native")
}


DisconnectPolicy = Literal["grace", "cancel", "continue"]


# A stream's tool calls when its request names no limit.
DEFAULT_MAX_TOOL_CALLS: Final = 8


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Everything a session needs, resolved from the HTTP request (:meth:`StreamPlanner.plan`).

    Frozen once built: what a front door adds after planning (the API key that owns the
    stream, :func:`toolforge.api.auth.own`) makes a new plan. A frozen dataclass's
    ``__init__`` costs an ``object.__setattr__`` per field (about 4 µs a stream here,
    beside the 1.9 ms a request costs the gateway): the price of a value nothing can
    change under the session."""

    stream_id: str
    chat: ChatRequest
    mode: Mode
    # "cancel" for plans no client can resume (the OpenAI-compatible proxy); a
    # POST /v1/stream body says "grace" unless it asks otherwise.
    on_disconnect: DisconnectPolicy = "cancel"
    # The context-budget decision behind the upstream (docs/servers.md), when the gateway made one;
    # its budget_tokens goes in stream.begin, the whole decision in metrics.json.
    budget: Mapping[str, Any] | None = None
    prompt_record: Mapping[str, Any] = field(default_factory=dict)
    # Schemas the model may use in OBJECT / RESULT frames, by name ("Any" included).
    schemas: Mapping[str, CompiledSchema] = field(default_factory=dict)
    # The RESULT frame's schema, whatever name the model writes in it (docs/protocol.md).
    result_schema: str | None = None
    # Every registered schema: an OBJECT frame naming one the request did not declare is
    # still held to it; only a name nobody registered falls back to Any.
    registered: Mapping[str, CompiledSchema] = field(default_factory=dict)
    tools_allow: tuple[str, ...] | None = None  # None: every model-facing tool
    approval_tools: frozenset[str] = frozenset()  # their calls wait for an approval
    # docs/tools.md: tool -> the hidden tool the gateway confirms its proposals with.
    confirmations: Mapping[str, str] = field(default_factory=dict)
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    idempotency_key: str | None = None
    # The OpenAI-compatible proxy's: functions the client runs itself (docs/proxy.md).
    client_tools: frozenset[str] = frozenset()
    # POST /v1/stream's client_tools (docs/tools.md): the stream waits at their calls for the
    # client's result; their arguments are checked against these schemas first.
    awaited_tools: Mapping[str, CompiledSchema] = field(default_factory=dict)
    # Context compaction (docs/context.md): the budget, its source and the strategy; None: no
    # budget is known, the prompt is never measured.
    context: ContextPolicy | None = None
    # The API key that started the stream (its name; docs/security.md): only it may resume, cancel
    # or answer the stream. None: the gateway runs without keys.
    owner: str | None = None
    # A workflow run (docs/workflows.md): its policy, fresh for this stream (it counts steps).
    workflow: WorkflowPolicy | None = None
    # Measure (and compact) the first turn's prompt too (ConversationConfig.fit_first_turn):
    # the Python runner's initial_messages.
    fit_first_turn: bool = False

    def engine_config(
        self, limits: SessionLimits, *, runs_tools: bool, repair_template: str
    ) -> ConversationConfig:
        """The turn engine's configuration for this plan, under a session's ``limits``:
        built here, next to the fields it reads, so a field the engine needs is added to
        the plan and its engine configuration together."""
        return ConversationConfig(
            stream_id=self.stream_id,
            request=self.chat,
            mode=self.mode,
            schemas=self.schemas,
            result_schema=self.result_schema,
            registered=self.registered,
            max_tool_calls=self.max_tool_calls,
            runs_tools=runs_tools,
            approval_tools=self.approval_tools,
            confirmations=self.confirmations,
            budget_tokens=self.budget["budget_tokens"] if self.budget else None,
            limits=ReaderLimits(limits.max_frame_bytes, limits.max_json_depth),
            frame_timeout_s=limits.frame_timeout_s,
            repair_retries=limits.repair_retries,
            repair_template=repair_template,
            client_tools=self.client_tools,
            awaited_tools=self.awaited_tools,
            context=self.context,
            fit_first_turn=self.fit_first_turn,
            # A workflow's policy (None: a plain stream); compaction's step hint is its too.
            workflow=self.workflow,
        )


@dataclass(frozen=True, slots=True)
class SessionLimits:
    queue_max_frames: int = 128
    # Frames may be written from the producer's step while the client keeps up (the relay).
    stream_relay: bool = True
    max_frame_bytes: int = 64 * 1024
    max_json_depth: int = 16
    frame_timeout_s: float = 15.0
    repair_retries: int = 1
    client_tool_timeout_s: float = 120.0
    # How long a dropped client's stream waits for a resume (on_disconnect "grace").
    disconnect_grace_s: float = 10.0
    # How long a client's pause may hold the model before the stream resumes by itself.
    pause_max_s: float = 60.0


class InlineSchemaAsk(Protocol):
    """An inline object schema of the body: ``{"name", "schema"}``."""

    @property
    def name(self) -> str: ...
    @property
    def schema_(self) -> dict[str, Any]: ...


class ClientToolAsk(Protocol):
    """A client-side tool of the body: ``{"name", "description", "parameters"}``."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...


class SamplingAsk(Protocol):
    def model_dump(self, *, exclude_none: bool = ...) -> dict[str, Any]: ...


class StreamAsk(Protocol):
    """What the planner reads of a ``POST /v1/stream`` body (docs/protocol.md)."""

    @property
    def mode(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def tools(self) -> Sequence[str] | None: ...
    @property
    def result_schema(self) -> str: ...
    @property
    def object_schemas(self) -> Sequence[str | InlineSchemaAsk]: ...
    @property
    def client_tools(self) -> Sequence[ClientToolAsk]: ...
    @property
    def sampling(self) -> SamplingAsk | None: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def max_tool_calls(self) -> int: ...
    @property
    def on_disconnect(self) -> DisconnectPolicy: ...
    @property
    def workflow(self) -> str | Mapping[str, Any] | None: ...
    def chat_messages(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """The settings planning reads (``toolforge.settings.Settings``, as the app resolved them)."""

    model_id: str
    upstream_kind: str
    upstream_base_url: str | None = None
    upstream_api_key: str | None = None
    max_json_depth: int = 16
    mode_cache_models: int = 64  # MODE_CACHE_MODELS: the probes kept, least recently used out


@dataclass(frozen=True, slots=True)
class PlanShape:
    """What a request's schemas, tools and mode make of its plan, apart from its messages
    and sampling: the same for every request that names the same registered schemas and
    tools, so it is built once per combination (:attr:`StreamPlanner.shapes`)."""

    schemas: Mapping[str, CompiledSchema]
    visible: Sequence[ToolSpec[Any]]
    system: str
    extra: Mapping[str, Any]  # native mode: the upstream's own tools
    registered: Mapping[str, CompiledSchema]  # every schema the request can name
    approval_tools: frozenset[str]
    confirmations: Mapping[str, str]  # docs/tools.md: visible tool -> its confirming tool
    # For the prompt record (artifacts): the schema documents and the tools' descriptions.
    schema_docs: Mapping[str, Any]
    tool_dicts: Sequence[Mapping[str, Any]]
    # The request's client-side tools, their parameters compiled (none: cached shapes).
    client_schemas: Mapping[str, CompiledSchema] = field(default_factory=dict)


async def compile_off_loop(schemas: Sequence[tuple[object, str, bool]]) -> None:
    """Compile a request's inline schemas (schema, name, needs a fallback) in a worker
    thread, into ``compile_schema``'s cache, where planning then finds them. A schema
    of 64 KB costs up to ~200 ms to check; the event loop keeps serving meanwhile (the
    worker gives up the GIL every few ms), and requests' schemas are checked one at a
    time. Errors are raised as ``compile_schema``'s. Schemas compiled already (a client
    sending the same tools again) cost no thread hop."""
    todo = [(s, n, f) for s, n, f in schemas if not is_compiled(s, name=n, fallback=f)]
    if not todo:
        return

    def compile_all() -> None:
        for schema, name, fallback in todo:
            compile_schema(schema, name=name, fallback=fallback)

    await asyncio.get_running_loop().run_in_executor(_COMPILER, compile_all)


# One thread: schemas are pure-Python work that holds the GIL, so every extra thread
# compiling at once would take the event loop's share of it, not add throughput.
_COMPILER: Final = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="schemas")


@dataclass(frozen=True, slots=True)
class TurnShaping:
    """How one mode shapes a stream's turns, as the planner asks it (the planner has no
    ``if mode == ...``): the request fields every turn carries, the engine's strategy
    (with constrained mode's grammar), and what holds the model to a legal turn before
    validation (``prompt.json``'s ``constraint``, docs/workflows.md)."""

    name: str
    constraint: str
    # The upstream's own function calling: the tools go in the request (native mode).
    sends_tools: bool = False
    # A grammar holds the frames: the schemas' decoding gaps are recorded (constrained).
    grammar: bool = False

    def extra(self, tool_dicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The request fields every turn of a stream with these tools carries."""
        if self.sends_tools and tool_dicts:
            return {"tools": to_openai_tools(tool_dicts), "tool_choice": "auto"}
        return {}

    def engine_mode(
        self,
        *,
        tools: Mapping[str, Mapping[str, Any]],
        result: tuple[str, Mapping[str, Any]],
        objects: Mapping[str, Mapping[str, Any]],
        max_depth: int,
        max_tokens: int | None,
    ) -> Mode:
        """The turn engine's strategy; constrained mode's grammar (docs/protocol.md) holds
        the frames the model is shown, sized to the turn's ``max_tokens`` so a looping
        model still closes its frame in time."""
        if not self.grammar:
            return mode_named(self.name)
        return ConstrainedMode(
            FrameGrammar(
                tools=tools,
                result=result,
                objects=objects,
                max_depth=max_depth,
                max_tokens=max_tokens,
            )
        )


@dataclass(frozen=True, slots=True)
class _OllamaNative(TurnShaping):
    """Native mode on Ollama, which has no ``tool_choice``: a workflow's compiled turn goes
    as the call's JSON Schema in ``format``."""

    def engine_mode(self, **_: Any) -> Mode:
        return NativeMode(schema_format=True)


_SHAPINGS: Final[Mapping[str, TurnShaping]] = {
    "sentinel": TurnShaping("sentinel", "validation"),
    "constrained": TurnShaping("constrained", "gbnf", grammar=True),
    "native": TurnShaping("native", "tool_choice", sends_tools=True),
}
_OLLAMA_NATIVE: Final = _OllamaNative("native", "format", sends_tools=True)


def turn_shaping(mode: str, upstream_kind: str) -> TurnShaping:
    """The :class:`TurnShaping` of ``mode`` on an upstream of ``upstream_kind``."""
    if mode == "native" and upstream_kind == "ollama":
        return _OLLAMA_NATIVE
    return _SHAPINGS[mode]


class TurnAsk(Protocol):
    """A door's ask of its turns, and the mode strategy it chooses: how the one planner
    (:meth:`StreamPlanner.build`) gets a stream's turn shaped. :class:`StreamTurn` for the
    stream body, the Python runner and the proxy's workflow runs (shaped by a
    :class:`TurnShaping`); ``toolforge.runtime.completion_plan.CompletionTurn`` for the
    proxy's plain request (shaped by its ``CompletionShaping``)."""

    async def shape(
        self,
        planner: StreamPlanner,
        request: PlanRequest,
        stream_id: str,
        workflow: WorkflowDef | None,
    ) -> ShapedTurn: ...


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """One stream's ask, whichever front door it came through: the neutral value the one
    planner reads (:meth:`StreamPlanner.build`). Each door turns its body into one with a
    small adapter (:func:`stream_request` for ``POST /v1/stream``,
    ``completion_plan.completion_request`` for the proxy, the Python runner's own); what
    only one mode strategy reads is that strategy's ask, ``turn``."""

    turn: TurnAsk
    messages: Sequence[Mapping[str, Any]]
    model: str | None = None  # None: the gateway's model
    # The sampling the door asks for explicitly (temperature, seed, max_tokens, top_p,
    # stop): it wins over the profile's.
    sampling: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None  # a named sampling profile (PROFILES)
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    on_disconnect: DisconnectPolicy = "cancel"
    workflow: str | Mapping[str, Any] | None = None  # a name or an inline definition
    # The door's own request fields every turn forwards (the upstream's parameters).
    extra: Mapping[str, Any] = field(default_factory=dict)
    # What the door adds to the plan's record (prompt.json), after the mode's own.
    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ShapedTurn:
    """What a mode strategy makes of a :class:`PlanRequest` (:meth:`TurnAsk.shape`): the
    first turn's request, the engine's strategy, the mode's part of the record, and the
    schemas and tools the session holds the model to. The planner adds the rest (the
    workflow's policy, the budgets) and freezes it all in a :class:`StreamPlan`."""

    chat: ChatRequest
    mode: Mode
    record: dict[str, Any]
    schemas: Mapping[str, CompiledSchema]
    result_schema: str | None
    registered: Mapping[str, CompiledSchema]
    tools_allow: tuple[str, ...]
    approval_tools: frozenset[str]
    confirmations: Mapping[str, str]
    # The tools shown (name, description, input_schema): a workflow's policy checks them.
    tool_dicts: Sequence[Mapping[str, Any]] = ()
    client_tools: frozenset[str] = frozenset()
    awaited_tools: Mapping[str, CompiledSchema] = field(default_factory=dict)
    # Whether the gateway's context compaction applies (the proxy's plain request: no).
    compacts: bool = True


@dataclass(frozen=True, slots=True)
class StreamTurn:
    """The ask of a ``POST /v1/stream`` body's turns (the Python runner's and the proxy's
    workflow runs' too): the mode (``auto``: probed once per model), the registry's tools
    shown, the schemas, the client's own tools. Shaped by the mode's :class:`TurnShaping`."""

    mode: str = "auto"
    tools: Sequence[str] | None = None  # None: every model-facing tool
    result_schema: str = "AssistantReply"
    object_schemas: Sequence[str | InlineSchemaAsk] = ()
    client_tools: Sequence[ClientToolAsk] = ()

    async def shape(
        self,
        planner: StreamPlanner,
        request: PlanRequest,
        stream_id: str,
        workflow: WorkflowDef | None,
    ) -> ShapedTurn:
        await compile_off_loop(
            [(t.parameters, f"{t.name}.parameters", False) for t in self.client_tools]
            + [
                (item.schema_, item.name, True)
                for item in self.object_schemas
                if not isinstance(item, str)
            ]
        )
        decision = await planner.decide_mode(self.mode, request.model)
        mode = decision.mode
        shaping = turn_shaping(mode, planner.config.upstream_kind)
        shape = planner._shape(self, shaping, workflow)
        messages = build_messages(shape.system, request.messages)
        chat = planner.chat_request(
            request,
            messages,
            {**shape.extra, **request.extra} if request.extra else shape.extra,
        )
        record: dict[str, Any] = {
            "model": chat.model,
            "mode": mode,
            "requested_mode": self.mode,
            "mode_reason": decision.reason,
            "messages": messages,
            "sampling": {
                "temperature": chat.temperature,
                "seed": chat.seed,
                "max_tokens": chat.max_tokens,
                "top_p": chat.top_p,
            },
            "result_schema": self.result_schema,
            "schemas": shape.schema_docs,
            "tools": shape.tool_dicts,
            # What the grammar could not hold the model to; validation checks it after.
            "validated_after_decoding": {
                name: found
                for name, schema in [
                    *((t["name"], t["input_schema"]) for t in shape.tool_dicts),
                    *shape.schema_docs.items(),
                ]
                if (found := decoding_gaps(schema))
            }
            if shaping.grammar
            else {},
            "max_tool_calls": request.max_tool_calls,
            # What holds the model to a legal turn before validation (docs/workflows.md).
            "constraint": shaping.constraint,
        }
        objects = [item if isinstance(item, str) else item.name for item in self.object_schemas]
        schemas = shape.schemas
        engine_mode = shaping.engine_mode(
            tools={t["name"]: t["input_schema"] for t in shape.tool_dicts},
            result=(self.result_schema, schemas[self.result_schema].schema),
            objects={name: schemas[name].schema for name in objects},
            max_depth=planner.config.max_json_depth,
            max_tokens=chat.max_tokens,
        )
        return ShapedTurn(
            chat=chat,
            mode=engine_mode,
            record=record,
            schemas=schemas,
            result_schema=self.result_schema,
            registered=shape.registered,
            tools_allow=tuple(t.name for t in shape.visible),
            approval_tools=shape.approval_tools,
            confirmations=shape.confirmations,
            tool_dicts=shape.tool_dicts,
            awaited_tools=shape.client_schemas,
        )


def stream_request(req: StreamAsk) -> PlanRequest:
    """A ``POST /v1/stream`` body as a :class:`PlanRequest`."""
    return PlanRequest(
        turn=StreamTurn(
            mode=req.mode,
            tools=req.tools,
            result_schema=req.result_schema,
            object_schemas=req.object_schemas,
            client_tools=req.client_tools,
        ),
        messages=req.chat_messages(),
        model=req.model,
        sampling={} if req.sampling is None else req.sampling.model_dump(exclude_none=True),
        profile=req.profile,
        max_tool_calls=req.max_tool_calls,
        on_disconnect=req.on_disconnect,
        workflow=req.workflow,
    )


@dataclass(slots=True)
class StreamPlanner:
    """Plans streams for one app: owns the mode probes and the shape cache."""

    config: PlannerConfig
    client: httpx.AsyncClient
    schemas: SchemaRegistry
    tools: ToolRegistry
    system_template: str
    # The context-budget decision behind the upstream (docs/servers.md), when the gateway made one.
    budget: Mapping[str, Any] | None = None
    # Context compaction for every stream (toolforge.runtime.context.context_policy).
    context: ContextPolicy | None = None
    # mode=auto: one probe per model, shared by concurrent first requests, then cached;
    # in use order (a dict keeps insertion order), bounded by mode_cache_models.
    modes: dict[str, asyncio.Future[ModeDecision]] = field(default_factory=dict)
    # By (result schema, object schema names, tool names, mode).
    shapes: dict[tuple[object, ...], PlanShape] = field(default_factory=dict)
    # The registered workflows (workflows/, docs/workflows.md) and the corrections they send.
    workflows: Mapping[str, WorkflowDef] = field(default_factory=dict)
    workflow_nudges: WorkflowNudges = field(default_factory=WorkflowNudges)
    workflow_template: str = ""  # prompts/workflow.txt: the workflow's part of the prompt
    # What a workflow sent inline may ask for (registered ones are the operator's).
    inline_caps: WorkflowCaps = field(default_factory=WorkflowCaps)

    async def plan(
        self,
        req: StreamAsk,
        stream_id: str,
        idempotency_key: str | None,
        *,
        workflow: WorkflowDef | None = None,
    ) -> StreamPlan:
        """The plan of a ``POST /v1/stream`` body (the stream route and the WebSocket's
        ``start``): the body as a :class:`PlanRequest` (:func:`stream_request`), built by
        :meth:`build`. ``workflow``: the body's workflow, resolved already by a caller that
        checked it (an API key's tools)."""
        return await self.build(stream_request(req), stream_id, idempotency_key, workflow=workflow)

    async def build(
        self,
        request: PlanRequest,
        stream_id: str,
        idempotency_key: str | None = None,
        *,
        workflow: WorkflowDef | None = None,
        compactor: Compactor | None = None,
        fit_first_turn: bool = False,
    ) -> StreamPlan:
        """The plan of one stream, whichever door asked: the one function that builds every
        plan. The request's mode strategy (``request.turn``) decides the mode and shapes the
        turn (the request fields every turn carries, the grammar or the tools, the prompt,
        the mode's record); then the workflow's policy and budgets, the door's record, and
        the plan, frozen.

        ``workflow``: the request's workflow, resolved already (:meth:`workflow_for`) by a
        caller that checked or changed it; by default ``request.workflow`` is resolved here.
        ``compactor``: the Python runner's own compaction hook for the workflow's policy;
        ``fit_first_turn``: the first turn's prompt may be over the budget already (a
        conversation brought in).

        Every front door plans here: ``POST /v1/stream`` (:meth:`plan`), the proxy's plain
        requests and workflow runs (and the other wire formats', through them;
        ``toolforge.runtime.completion_plan``) and the Python runner
        (:class:`toolforge.runtime.workflow_runner.WorkflowRunner`)."""
        if workflow is None:
            workflow = self.workflow_for(request.workflow)
        turn = await request.turn.shape(self, request, stream_id, workflow)
        prompt_record = turn.record
        max_tool_calls = request.max_tool_calls
        policy: WorkflowPolicy | None = None
        context = self.context if turn.compacts else None
        if workflow is not None:
            # The workflow's own compaction, keep_recent and budget_tokens (docs/context.md).
            context = workflow_context(
                context,
                strategy=workflow.compaction,
                keep_recent=workflow.keep_recent,
                budget_tokens=workflow.budget_tokens,
            )
            prompt_record["workflow"] = workflow.to_dict()
            # The workflow's own budgets bound it; the stream's call limit must not cut in.
            max_tool_calls = workflow.tool_call_limit(max_tool_calls)
            policy = WorkflowPolicy(
                workflow,
                schemas={t["name"]: t["input_schema"] for t in turn.tool_dicts},
                nudges=self.workflow_nudges,
                compactor=compactor,
            )
        if request.record:
            prompt_record.update(request.record)
        return StreamPlan(
            stream_id=stream_id,
            chat=turn.chat,
            mode=turn.mode,
            on_disconnect=request.on_disconnect,
            budget=self.budget,
            prompt_record=prompt_record,
            schemas=turn.schemas,
            result_schema=turn.result_schema,
            registered=turn.registered,
            tools_allow=turn.tools_allow,
            approval_tools=turn.approval_tools,
            confirmations=turn.confirmations,
            max_tool_calls=max_tool_calls,
            idempotency_key=idempotency_key,
            client_tools=turn.client_tools,
            awaited_tools=turn.awaited_tools,
            context=context,
            workflow=policy,
            fit_first_turn=fit_first_turn,
        )

    def chat_request(
        self, request: PlanRequest, messages: Sequence[Mapping[str, Any]], extra: Mapping[str, Any]
    ) -> ChatRequest:
        """The first turn's request, as every mode makes it: the request's model (or the
        gateway's), ``messages`` and ``extra`` as the mode shaped them, the profile's
        sampling, then the request's own (explicit sampling wins over the profile)."""
        chat = ChatRequest(
            model=request.model or self.config.model_id, messages=messages, extra=extra
        )
        if request.profile is not None:
            chat = PROFILES[request.profile].apply(chat)
        if request.sampling:
            chat = dataclasses.replace(chat, **request.sampling)
        return chat

    def workflow_for(self, asked: str | Mapping[str, Any] | None) -> WorkflowDef | None:
        """The request's ``workflow``: a registered name, or an inline definition (checked
        like a file: WORKFLOW_INVALID, 422); an unknown name is WORKFLOW_NOT_FOUND (404)."""
        return None if asked is None else self.resolve_workflow(asked)

    def resolve_workflow(self, asked: str | Mapping[str, Any]) -> WorkflowDef:
        """A registered workflow by name, or an inline definition, checked (see
        :meth:`workflow_for`)."""
        if isinstance(asked, str):
            found = self.workflows.get(asked)
            if found is None:
                known = ", ".join(sorted(self.workflows)) or "(none)"
                raise RequestError(
                    ErrorCode.WORKFLOW_NOT_FOUND,
                    f"no workflow named {asked!r}; registered: {known} (GET /v1/workflows), "
                    "or send the definition inline",
                    http_status=404,
                )
            return found
        return parse_workflow(
            asked, known_tools=self.tools.names(), source="request", caps=self.inline_caps
        )

    # -- the mode -------------------------------------------------------------------------

    async def decide_mode(self, asked: str, model: str | None) -> ModeDecision:
        """The mode ``asked``: as asked, or for ``auto`` probed once per ``model`` and cached
        (docs/protocol.md).

        ``constrained`` needs an upstream that takes GBNF grammars: one the settings call a
        llama-server (``UPSTREAM_KIND``, the managed default), or one the probe finds is.
        """
        named = _ASKED.get(asked)
        if named is not None:
            if asked == "native" and self.config.upstream_base_url is not None:
                # Asked for by name, native mode still needs a template that shows the model
                # its tools: where the upstream says it has none, the model would never see
                # them and every turn would end without a call.
                probed = await self._probe(model or self.config.model_id)
                if probed.native_tools is False:
                    raise RequestError(
                        ErrorCode.MODE_UNAVAILABLE,
                        "mode 'native' needs a chat template that renders tools, and this "
                        f"model's has none ({probed.reason}); use 'auto' or "
                        f"'{probed.mode}'",
                        http_status=422,
                    )
            return named
        if asked == "constrained" and self.config.upstream_kind == "llama_server":
            return ModeDecision(
                "constrained", "asked for by the request (UPSTREAM_KIND=llama_server)", grammar=True
            )
        decision = await self._probe(model or self.config.model_id)
        if asked == "auto":
            return decision
        if decision.grammar:
            return ModeDecision("constrained", "asked for by the request", grammar=True)
        raise RequestError(
            ErrorCode.MODE_UNAVAILABLE,
            "mode 'constrained' needs an upstream that takes GBNF grammars (llama-server), "
            "and this upstream does not answer /props like one; use 'sentinel' (any "
            "OpenAI-compatible upstream) or 'auto', or set UPSTREAM_KIND=llama_server if it "
            "is a llama-server behind a proxy",
            http_status=422,
        )

    async def probe(self, model: str) -> ModeDecision:
        """What ``auto`` picks for ``model`` (whether it takes grammars, for the proxy)."""
        return await self._probe(model)

    async def _probe(self, model: str) -> ModeDecision:
        """What ``auto`` picks for ``model``: probed once, shared by concurrent first requests."""
        config = self.config
        probe = self.modes.get(model)
        if probe is None:  # the first request for this model probes; the others wait for it
            if config.upstream_kind == "anthropic":  # no OpenAI endpoint to probe
                return ModeDecision(
                    "native", "UPSTREAM_KIND=anthropic: the Messages API's tool use"
                )
            if config.upstream_base_url is None:  # an injected adapter: nothing to ask
                llama = config.upstream_kind == "llama_server"
                return ModeDecision(
                    "constrained" if llama else "sentinel",
                    f"no upstream URL to probe; UPSTREAM_KIND={config.upstream_kind}",
                    grammar=llama,
                )
            key = config.upstream_api_key
            probe = asyncio.ensure_future(
                probe_tool_mode(
                    self.client,
                    config.upstream_base_url,
                    model,
                    headers={"Authorization": f"Bearer {key}"} if key else None,
                    llama_server=config.upstream_kind == "llama_server",
                )
            )
            self.modes[model] = probe
            while len(self.modes) > config.mode_cache_models:  # a client may name any model
                del self.modes[next(iter(self.modes))]  # the least recently used
            decision = await asyncio.shield(probe)
            log.info(MODE_SELECTED, model=model, mode=decision.mode, reason=decision.reason)
            return decision
        self.modes[model] = self.modes.pop(model)  # the most recently used now
        return await asyncio.shield(probe)

    # -- the shape ------------------------------------------------------------------------

    def _shape(
        self, req: StreamTurn, shaping: TurnShaping, workflow: WorkflowDef | None = None
    ) -> PlanShape:
        """The request's :class:`PlanShape`: cached unless it has inline schemas (those are
        the caller's own, checked and compiled per request). A workflow's tools are the
        ones shown, ``respond`` included, and its instructions follow the system prompt."""
        key: tuple[object, ...] | None = None
        asked_tools = req.tools
        if workflow is not None:
            asked_tools = [t for t in workflow.tools if t != RESPOND]
        if not req.client_tools and all(isinstance(item, str) for item in req.object_schemas):
            tools_named = tuple(asked_tools) if asked_tools is not None else None
            named = None if workflow is None else workflow.name
            key = (req.result_schema, tuple(req.object_schemas), tools_named, shaping, named)
            if workflow is not None and workflow.source == "request":
                key = None  # an inline definition: the caller's own, shaped per request
        if key is not None:
            cached = self.shapes.get(key)
            if cached is not None:
                return cached
        # Schemas: the result schema, the object schemas (registered names or inline ones,
        # checked against the metaschema: a bad one is a 422), and Any.
        registry = self.schemas.scoped()
        schemas: dict[str, CompiledSchema] = {ANY: registry.get(ANY)}
        schemas[req.result_schema] = registry.get(req.result_schema)
        for item in req.object_schemas:
            if isinstance(item, str):
                schemas[item] = registry.get(item)
            else:
                schemas[item.name] = registry.register_inline(item.name, item.schema_)
        # Tools: what the model is shown is what may run (docs/tools.md).
        tools = self.tools
        for name in asked_tools or ():
            tools.check_allowed(name)  # unknown or internal tool names are the caller's error
        visible = tools.visible(asked_tools)
        tool_dicts = [t.to_dict() for t in visible]
        if workflow is not None and workflow.uses_respond:
            tool_dicts.append(dict(RESPOND_TOOL))
        # Client-side tools are shown like the registry's (docs/tools.md), under their own names.
        client_schemas: dict[str, CompiledSchema] = {}
        for tool in req.client_tools:
            if tool.name in client_schemas or tools.get(tool.name) is not None:
                raise RequestError(
                    ErrorCode.BAD_REQUEST,
                    f"client tool {tool.name!r} has the name of another tool; rename it",
                    http_status=422,
                )
            client_schemas[tool.name] = compile_schema(
                tool.parameters, name=f"{tool.name}.parameters", fallback=False
            )
            tool_dicts.append(
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                    "executor": "client",
                }
            )
        # The upstream's own function calling, in native mode (docs/protocol.md).
        extra = shaping.extra(tool_dicts) if visible else {}
        system = render_system_prompt(
            self.system_template,
            result_schema=req.result_schema,
            schemas={name: c.schema for name, c in schemas.items() if name != ANY},
            tools=[
                {
                    "name": t["name"],
                    "description": t["description"],
                    "input_schema": t["input_schema"],
                }
                for t in tool_dicts
            ],
            # A workflow's turns are compiled (the legal tools, narrowed arguments): its
            # prompt names the calls; a plain request's prompt teaches the schemas.
            signatures=workflow is not None,
        )
        if workflow is not None:
            system += render_workflow_prompt(self.workflow_template, workflow)
        shape = PlanShape(
            schemas=schemas,
            visible=visible,
            system=system,
            extra=extra,
            registered=registry.all(),
            # Any registered tool's call waits for approval if its spec says so, visible or
            # not: the executor then refuses a call it may not run.
            approval_tools=frozenset(t.name for t in tools if t.needs_approval),
            confirmations={t.name: t.confirm_with for t in visible if t.confirm_with},
            schema_docs={name: c.schema for name, c in schemas.items()},
            tool_dicts=tool_dicts,
            client_schemas=client_schemas,
        )
        if key is not None:
            if len(self.shapes) >= _SHAPE_CACHE_MAX:
                self.shapes.clear()
            self.shapes[key] = shape
        return shape
