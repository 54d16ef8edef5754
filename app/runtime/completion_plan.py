"""The proxy's turn: a validated ``POST /v1/chat/completions`` body as a plan request for the
one planner (:meth:`toolforge.runtime.planner.StreamPlanner.build`), and the mode strategy
that shapes its turn into a plan whose mode is the proxy's
(:class:`toolforge.core.engine.completion.CompletionMode`), docs/workflows.md.

:func:`completion_request` is the door's adapter (a plain request: its
:class:`CompletionTurn`); :func:`plan_workflow_completion` plans a request that runs a
workflow as ``POST /v1/stream`` plans one. A plain request's turn decides, once per
request:

* the mode: ``constrained`` when the upstream takes GBNF grammars (llama-server; the
  planner's probe, cached per model) and the grammar guardrail is on, else ``native``
  (the upstream's own ``tools``);
* what the model is offered: the client's functions, the registry's ``server_tools``, and
  ``respond`` (the answer as a call) when tools are present and ``tool_choice`` is auto;
* the mode's :class:`CompletionShaping`: in constrained mode, the grammar of a call
  (``{"name", "arguments"}`` whose arguments have the function's schema, or a list of
  them when ``parallel_tool_calls``) or of the JSON answer, and a system message that
  describes the functions (llama-server gets no ``tools`` then: the grammar and the
  prompt are the whole contract); in native mode, the upstream's ``tools``,
  ``tool_choice`` and ``response_format``;
* sampling and the rest, forwarded as given.

The body is read through :class:`CompletionAsk` (``toolforge.api.models.ChatCompletionRequest``
satisfies it): runtime does not import the HTTP layer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from toolforge.core.compiler import clean_schema
from toolforge.core.engine.completion import RESPOND, CompletionMode, Guards, Nudges
from toolforge.core.gbnf import decoding_gaps, json_value_grammar
from toolforge.core.messages import content_text
from toolforge.core.native_tools import to_openai_tools
from toolforge.core.protocol.frames import ModeName
from toolforge.core.provenance import Held, narrow_properties, said_in
from toolforge.core.relevance import named_in
from toolforge.core.schemas import CompiledSchema, compile_schema
from toolforge.core.workflow import WorkflowDef
from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.planner import (
    PlanRequest,
    ShapedTurn,
    StreamPlan,
    StreamPlanner,
    StreamTurn,
    compile_off_loop,
)

__all__ = [
    "CompletionAsk",
    "CompletionShaping",
    "CompletionTurn",
    "ShapedCompletion",
    "call_schema",
    "completion_request",
    "plan_completion",
    "plan_workflow_completion",
]

_ANY_OBJECT: Final[Mapping[str, Any]] = {"type": "object"}
_RESPOND_TEXT: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"content": {"type": "string"}},
    "required": ["content"],
    "additionalProperties": False,
}
_RESPOND_DESCRIPTION: Final = (
    "Answer the user directly, in plain text, when no other function fits."
)
# The grammar's strings and arrays are sized from max_tokens; without one, this many.
_GRAMMAR_TOKENS: Final = 1024
_MAX_PARALLEL: Final = 8


class _FunctionAsk(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str | None: ...
    @property
    def parameters(self) -> dict[str, Any] | None: ...


class _ToolAsk(Protocol):
    @property
    def function(self) -> _FunctionAsk: ...


class CompletionAsk(Protocol):
    """What the planner reads of a ``POST /v1/chat/completions`` body."""

    model: str
    messages: list[dict[str, Any]]
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: str | list[str] | None
    max_tokens: int | None
    max_completion_tokens: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    parallel_tool_calls: bool | None
    user: str | None
    metadata: dict[str, str] | None

    @property
    def reasoning_effort(self) -> str | None: ...
    @property
    def tools(self) -> Sequence[_ToolAsk] | None: ...
    @property
    def tool_choice_name(self) -> str: ...
    @property
    def tool_choice(self) -> Any: ...
    @property
    def response_format(self) -> Any: ...
    @property
    def toolforge(self) -> Any: ...


def call_schema(functions: Mapping[str, Mapping[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """The JSON Schema of a reply that calls one of ``functions`` (name -> parameters):
    ``{"name": <one of them>, "arguments": <its parameters>}``, or a list of such calls
    when ``parallel``. The constrained grammar is this schema's (toolforge.core.gbnf)."""
    one = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, params in functions.items()
        ]
    }
    if not parallel:
        return one
    return {
        "anyOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": _MAX_PARALLEL}]
    }


@dataclass(frozen=True, slots=True)
class CompletionTurn:
    """The ask of a proxy request's turn with no workflow (``toolforge.runtime.planner.
    TurnAsk``): what the client offers the model and asks of the answer. Its mode is
    ``constrained`` when the upstream takes GBNF grammars (the planner's probe, cached per
    model) and the grammar guardrail is on, else ``native``; that mode's
    :class:`CompletionShaping` shapes the turn."""

    functions: Mapping[str, Mapping[str, Any]]  # the client's: name -> parameters
    descriptions: Mapping[str, str]  # the client's functions' descriptions
    server_tools: Sequence[str]  # toolforge.server_tools: the registry's, run here
    choice: str  # auto, none, required, or function (forced)
    forced: str | None  # tool_choice {"type": "function", ...}: its name
    parallel: bool | None  # parallel_tool_calls, as asked (None: not said)
    response_format: Any  # the body's response_format (type, json_schema), or None
    guards: Guards
    guard_record: tuple[tuple[str, bool], ...]  # the switches, for prompt.json
    tools_template: str  # prompts/proxy_tools.txt: constrained mode's function listing
    nudges: Nudges
    user: str | None = None
    metadata: Mapping[str, str] | None = None

    async def shape(
        self,
        planner: StreamPlanner,
        request: PlanRequest,
        stream_id: str,
        workflow: WorkflowDef | None,
    ) -> ShapedTurn:
        guards = self.guards
        model = request.model or planner.config.model_id
        grammar_ok = guards.grammar and (await planner.probe(model)).grammar
        shaping = _CONSTRAINED if grammar_ok else _NATIVE

        # What the model is offered: the client's functions, then the registry's server tools.
        client = self.functions
        descriptions = dict(self.descriptions)
        server: dict[str, Mapping[str, Any]] = {}
        registry = planner.tools
        for name in self.server_tools:
            registry.check_allowed(name)  # unknown or internal tool names are the caller's error
            spec = registry.get(name)
            assert spec is not None
            if name in client:
                raise _bad(f"server tool {name!r} has the name of one of the request's tools")
            server[name] = spec.input_schema
            descriptions[name] = spec.description
        choice = self.choice
        forced = self.forced
        offered = {**client, **server} if choice != "none" else {}
        fmt = self.response_format
        await compile_off_loop(
            [(params, f"{name}.parameters", False) for name, params in offered.items()]
            + (
                [(fmt.json_schema.schema_ or {}, fmt.json_schema.name, True)]
                if fmt is not None and fmt.type == "json_schema"
                else []
            )
        )
        compiled: dict[str, CompiledSchema] = {
            name: compile_schema(params, name=f"{name}.parameters", fallback=False)
            for name, params in offered.items()
        }

        # The answer: text, any JSON object, or a schema's JSON (response_format).
        answer: CompiledSchema | None = None
        if fmt is not None and fmt.type == "json_object":
            answer = compile_schema(_ANY_OBJECT, name="json_object")
        elif fmt is not None and fmt.type == "json_schema":
            answer = compile_schema(fmt.json_schema.schema_ or {}, name=fmt.json_schema.name)

        # The relevance guard: where the last message is the user's and names an offered
        # function, the turn is a call (respond left out of the grammar); constrained mode
        # only, where the grammar and not the model's own training decides (docs/proxy.md).
        named: dict[str, list[str]] = {}
        if (
            shaping is _CONSTRAINED
            and guards.relevance
            and guards.respond
            and choice == "auto"
            and offered
            and request.messages
            and request.messages[-1].get("role") == "user"
        ):
            last = request.messages[-1]
            named = named_in(
                content_text(last.get("content"), " "),
                {name: descriptions.get(name) or "" for name in offered},
            )
        mode = CompletionMode(
            name=shaping.name,
            tools=compiled,
            choice=choice,  # type: ignore[arg-type]
            forced=forced,
            guards=guards,
            answer=answer if guards.json else None,
            nudges=self.nudges,
            id_prefix=f"call_{stream_id[2:]}_",
        )
        respond_params = dict(answer.schema) if answer is not None else _RESPOND_TEXT
        callable_ = dict(offered)
        if mode.offers_respond:
            callable_[RESPOND] = respond_params
            descriptions[RESPOND] = _RESPOND_DESCRIPTION
        if forced is not None:
            callable_ = {forced: offered[forced]}
        offer = _Offer(
            callable=callable_,
            offered=offered,
            narrowed=_narrowed(callable_, request.messages) if guards.provenance else {},
            descriptions=descriptions,
            respond_params=respond_params,
            answer=answer,
            response_format=fmt,
            choice=choice,
            forced=forced,
            parallel=self.parallel,
            offers_respond=mode.offers_respond,
            call_due=bool(named),
            runs_tools=bool(server),
        )
        max_tokens = request.sampling.get("max_tokens")
        turn = shaping.turn(
            offer,
            list(request.messages),
            template=self.tools_template,
            max_depth=planner.config.max_json_depth,
            max_tokens=max_tokens or _GRAMMAR_TOKENS,
        )
        extra = request.extra
        mode = dataclasses.replace(
            mode,
            extra={**extra, **turn.extra},
            final_extra={**extra, **turn.final_extra},
            call_extra={**extra, **turn.call_extra} if turn.call_extra is not None else None,
            repair_grammar=turn.repair_grammar,
        )
        messages = turn.messages
        chat = planner.chat_request(request, messages, {})
        prompt_record: dict[str, Any] = {
            "api": "chat.completions",
            "model": chat.model,
            "mode": shaping.name,
            "messages": messages,
            "sampling": {
                "temperature": chat.temperature,
                "seed": chat.seed,
                "max_tokens": chat.max_tokens,
                "top_p": chat.top_p,
                "stop": chat.stop,
            },
            "tools": {name: dict(params) for name, params in callable_.items()},
            "tool_choice": choice if forced is None else {"function": forced},
            # The functions the last user message names, by the words that name them: a
            # call was required of this turn (the relevance guard).
            "named": named,
            "server_tools": list(server),
            "response_format": fmt.model_dump(by_alias=True) if fmt is not None else None,
            "guardrails": dict(self.guard_record),
            "request_extra": {k: v for k, v in mode.extra.items() if k != "grammar"},
            "grammar": "grammar" in mode.extra,
            # How the arguments were held to what the user said, and where (docs/proxy.md).
            "constraint": {
                "backend": shaping.backend,
                "narrowed": {name: dict(schema) for name, schema in offer.narrowed.items()},
            },
            # What the grammar could not hold the model to; validation checks it after.
            "validated_after_decoding": shaping.gaps(offer),
            "user": self.user,
            "metadata": self.metadata,
        }
        schemas = {"answer": answer} if answer is not None else {}
        return ShapedTurn(
            chat=chat,
            mode=mode,
            record=prompt_record,
            schemas=schemas,
            result_schema="answer" if answer is not None else None,
            registered=schemas,
            tools_allow=tuple(server),
            approval_tools=frozenset(
                n for n in server if (s := registry.get(n)) and s.needs_approval
            ),
            confirmations={
                n: s.confirm_with for n in server if (s := registry.get(n)) and s.confirm_with
            },
            client_tools=frozenset(client),
            # The proxy's conversation is the client's: the gateway does not compact it.
            compacts=False,
        )


@dataclass(frozen=True, slots=True)
class _Offer:
    """What a proxy turn offers the model, as both modes read it."""

    callable: Mapping[str, Mapping[str, Any]]  # this turn's functions, respond included
    offered: Mapping[str, Mapping[str, Any]]  # the client's and the server's (tool_choice)
    narrowed: Mapping[str, Mapping[str, Any]]  # provenance's narrowed parameters, by name
    descriptions: Mapping[str, str]
    respond_params: Mapping[str, Any]
    answer: CompiledSchema | None  # response_format's schema
    response_format: Any
    choice: str
    forced: str | None
    parallel: bool | None  # as asked
    offers_respond: bool
    call_due: bool = False  # the relevance guard: the user's message names a function
    # server tools are offered: a tool's result can be the last message of a later turn
    runs_tools: bool = False

    @property
    def parallel_calls(self) -> bool:
        """Whether a turn may make several calls: unless the client said no, or forced one."""
        return self.parallel is not False and self.forced is None


@dataclass(frozen=True, slots=True)
class ShapedCompletion:
    """What a :class:`CompletionShaping` makes of a proxy turn."""

    extra: Mapping[str, Any]  # each turn's request fields while tools are left
    final_extra: Mapping[str, Any]  # the same once max_tool_calls is spent
    repair_grammar: str | None  # the answer's JSON-value grammar (constrained)
    messages: list[Mapping[str, Any]]  # the client's, with the mode's prompt addendum
    # a turn answering the user's message while a call is due (the relevance guard): the
    # request fields with respond left out; None: as every other turn
    call_extra: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CompletionShaping:
    """How one mode shapes the proxy's turn (the planner has no ``if mode == ...``): the
    request fields every turn carries (a grammar, or the upstream's ``tools``,
    ``tool_choice`` and ``response_format``), the prompt addendum, and what ``prompt.json``
    records of it. This base is ``native``: the upstream's own function calling."""

    name: ModeName
    backend: str  # prompt.json's constraint.backend: what holds the arguments

    def turn(
        self,
        offer: _Offer,
        messages: list[Mapping[str, Any]],
        *,
        template: str,
        max_depth: int,
        max_tokens: int,
    ) -> ShapedCompletion:
        turn: dict[str, Any] = {}
        final: dict[str, Any] = {}
        fmt = offer.response_format
        if offer.callable or offer.offered:
            specs = [
                {"name": name, "description": offer.descriptions.get(name, ""), "input_schema": p}
                for name, p in {**offer.offered, **offer.callable, **offer.narrowed}.items()
            ]
            turn["tools"] = to_openai_tools(specs)
            turn["tool_choice"] = _native_choice(offer.choice, offer.forced, offer.offers_respond)
            if offer.parallel is not None:
                turn["parallel_tool_calls"] = offer.parallel
            if offer.offers_respond:
                final = {
                    "tools": to_openai_tools(
                        [
                            {
                                "name": RESPOND,
                                "description": _RESPOND_DESCRIPTION,
                                "input_schema": offer.respond_params,
                            }
                        ]
                    ),
                    "tool_choice": "required",
                }
        elif offer.answer is not None and fmt is not None:
            turn["response_format"] = final["response_format"] = fmt.model_dump(
                by_alias=True, exclude_none=True
            )
        return ShapedCompletion(turn, final, None, messages)

    def gaps(self, offer: _Offer) -> dict[str, list[str]]:
        """The schemas' constraints nothing holds the model to before validation: none
        recorded here, the upstream's own checks being unknown."""
        return {}


@dataclass(frozen=True, slots=True)
class _ConstrainedShaping(CompletionShaping):
    """``constrained``: a GBNF grammar of the call (or of the JSON answer) and a system
    message that lists the functions; llama-server gets no ``tools``."""

    def turn(
        self,
        offer: _Offer,
        messages: list[Mapping[str, Any]],
        *,
        template: str,
        max_depth: int,
        max_tokens: int,
    ) -> ShapedCompletion:
        turn: dict[str, Any] = {}
        final: dict[str, Any] = {}
        call_extra: dict[str, Any] | None = None
        callable_, answer = offer.callable, offer.answer
        if callable_:
            # With tool_choice auto and no respond offered, prose must stay possible: the
            # functions are described, but no grammar forces a call (rescue reads one).
            # With the relevance guard due and no server tools, every turn answers the
            # user's message (a retry's nudge is the user's too): the grammar with respond
            # would never be sent, so only the call grammar below is written.
            due_alone = offer.call_due and not offer.runs_tools
            if (offer.choice != "auto" or offer.offers_respond) and not due_alone:
                turn["grammar"] = json_value_grammar(
                    call_schema({**callable_, **offer.narrowed}, parallel=offer.parallel_calls),
                    max_depth=max_depth,
                    max_tokens=max_tokens,
                )
            messages = _with_tools_prompt(
                messages,
                template,
                callable_,
                offer.descriptions,
                respond=_respond_line(answer)
                if offer.offers_respond
                else (
                    "If no function fits, answer the user in plain text."
                    if offer.choice == "auto"
                    else ""
                ),
            )
            if offer.call_due:  # the user named a function: their message is answered by a call
                calls = {n: p for n, p in callable_.items() if n != RESPOND}
                call_extra = {
                    "grammar": json_value_grammar(
                        call_schema({**calls, **offer.narrowed}, parallel=offer.parallel_calls),
                        max_depth=max_depth,
                        max_tokens=max_tokens,
                    )
                }
                if due_alone:
                    turn, call_extra = call_extra, None
            if offer.offers_respond:  # max_tool_calls spent: only the answer is left
                final["grammar"] = json_value_grammar(
                    call_schema({RESPOND: offer.respond_params}, parallel=False),
                    max_depth=max_depth,
                    max_tokens=max_tokens,
                )
        elif answer is not None:
            turn["grammar"] = final["grammar"] = json_value_grammar(
                answer.schema, max_depth=max_depth, max_tokens=max_tokens
            )
        repair = (
            json_value_grammar(answer.schema, max_depth=max_depth, max_tokens=max_tokens)
            if answer is not None
            else None
        )
        return ShapedCompletion(turn, final, repair, messages, call_extra)

    def gaps(self, offer: _Offer) -> dict[str, list[str]]:
        """What the grammar could not hold the model to (``decoding_gaps``)."""
        answer = offer.answer
        return _gaps({**offer.callable, **({"response_format": answer.schema} if answer else {})})


_CONSTRAINED: Final = _ConstrainedShaping("constrained", "gbnf")
_NATIVE: Final = CompletionShaping("native", "tools")


def completion_request(req: CompletionAsk, *, tools_template: str, nudges: Nudges) -> PlanRequest:
    """A proxy request with no workflow as a
    :class:`~toolforge.runtime.planner.PlanRequest`: its :class:`CompletionTurn`, the
    client's messages (``developer`` as ``system``), sampling and forwarded parameters."""
    guards, guard_record = _guards(req.toolforge.guardrails)
    functions: dict[str, Mapping[str, Any]] = {}
    descriptions: dict[str, str] = {}
    for tool in req.tools or ():
        fn = tool.function
        functions[fn.name] = fn.parameters if fn.parameters is not None else _ANY_OBJECT
        descriptions[fn.name] = fn.description or ""
    choice = req.tool_choice_name
    return PlanRequest(
        turn=CompletionTurn(
            functions=functions,
            descriptions=descriptions,
            server_tools=req.toolforge.server_tools,
            choice=choice,
            forced=req.tool_choice.function.name if choice == "function" else None,
            parallel=req.parallel_tool_calls,
            response_format=req.response_format,
            guards=guards,
            guard_record=guard_record,
            tools_template=tools_template,
            nudges=nudges,
            user=req.user,
            metadata=req.metadata,
        ),
        messages=_messages(req.messages),
        model=req.model,
        sampling=_sampling(req, stop=True),
        max_tool_calls=req.toolforge.max_tool_calls,
        extra=_forwarded(req),
    )


async def plan_completion(
    planner: StreamPlanner,
    req: CompletionAsk,
    stream_id: str,
    *,
    tools_template: str,
    nudges: Nudges,
) -> StreamPlan:
    """The plan of one proxy request with no workflow: the body as a plan request
    (:func:`completion_request`), built by the one planner."""
    request = completion_request(req, tools_template=tools_template, nudges=nudges)
    return await planner.build(request, stream_id)


# -- toolforge.workflow: the gateway runs a workflow and answers with its result ---------------


def workflow_refusals(req: CompletionAsk) -> str | None:
    """What a request with ``toolforge.workflow`` asks that a workflow run cannot honour
    (the message of a 400), or None. A workflow names its own tools and its answer is its
    terminal tool's result: OpenAI's tool and answer parameters have no meaning there, and
    are refused rather than ignored."""
    fmt = req.response_format
    switches = req.toolforge.guardrails
    checks = (
        (req.tools, "'tools': a workflow runs its own tools (GET /v1/workflows lists them)"),
        (
            req.toolforge.server_tools,
            "'toolforge.server_tools': a workflow runs its own tools",
        ),
        (
            req.tool_choice not in (None, "auto"),
            "'tool_choice': a workflow decides which tool comes next",
        ),
        (req.parallel_tool_calls, "'parallel_tool_calls': a workflow makes one call a turn"),
        (
            fmt is not None and fmt.type != "text",
            "'response_format': a workflow's answer is its terminal tool's result",
        ),
        (req.stop, "'stop': a stop sequence would cut the workflow's tool calls"),
        (
            not (switches.respond and switches.json_ and switches.reasoning and switches.relevance),
            "'toolforge.guardrails': a workflow takes 'grammar', 'rescue', 'nudge' and "
            "'provenance'; "
            "'respond', 'json', 'reasoning' and 'relevance' are not switches of a workflow run",
        ),
    )
    for asked, why in checks:
        if asked:
            return f"not with 'toolforge.workflow': {why}; leave it out"
    return None


async def plan_workflow_completion(
    planner: StreamPlanner, req: CompletionAsk, stream_id: str, workflow: WorkflowDef
) -> StreamPlan:
    """The plan of a proxy request that runs ``workflow`` (``toolforge.workflow``, resolved
    and checked by the route): the same plan ``POST /v1/stream`` makes for it — its tools,
    its prompt, its policy, each turn's grammar narrowed on llama-server — from the
    client's messages and sampling. The guardrail switches map to the workflow's own:
    ``grammar`` off asks ``sentinel`` where ``auto`` would pick ``constrained``,
    ``rescue`` off is the workflow's ``rescue: false``, ``nudge`` off its
    ``max_retries_per_step: 0``."""
    refused = workflow_refusals(req)
    if refused is not None:
        raise _bad(refused)
    switches = req.toolforge.guardrails
    if not switches.rescue:
        workflow = dataclasses.replace(workflow, rescue=False)
    if not switches.nudge:
        workflow = dataclasses.replace(workflow, max_retries_per_step=0)
    if not switches.provenance:
        workflow = dataclasses.replace(workflow, narrow=False)
    mode = "auto"
    if not switches.grammar and (await planner.probe(req.model)).mode == "constrained":
        mode = "sentinel"
    _, guard_record = _guards(switches)
    extra = _forwarded(req)
    request = PlanRequest(
        turn=StreamTurn(mode=mode),
        messages=_messages(req.messages),
        model=req.model,
        sampling=_sampling(req, stop=False),
        max_tool_calls=req.toolforge.max_tool_calls,
        workflow=workflow.name,
        extra=extra,
        record={
            "api": "chat.completions",
            "guardrails": dict(guard_record),
            "request_extra": extra,
            "user": req.user,
            "metadata": req.metadata,
        },
    )
    return await planner.build(request, stream_id, workflow=workflow)


def _sampling(req: CompletionAsk, *, stop: bool) -> dict[str, Any]:
    """The sampling the request asks for explicitly; ``stop``: its stop sequences too (a
    workflow run takes none)."""
    asked: dict[str, Any] = {
        "temperature": req.temperature,
        "seed": req.seed,
        "max_tokens": req.max_completion_tokens or req.max_tokens,
        "top_p": req.top_p,
    }
    if stop:
        asked["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    return {k: v for k, v in asked.items() if v is not None}


def _narrowed(
    functions: Mapping[str, Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The functions whose arguments the default provenance narrows for a plain request
    (no workflow): numbers, dates, times, identifiers and required plain strings to what
    the last user message states, optional arguments nothing provides left out
    (toolforge.core.provenance).
    Only changed ones, as a backend reads them (``clean_schema``); ``respond`` is free."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    text = content_text(last.get("content"), " ") if last else ""
    held = Held(said=said_in(text, phrases=True), plain=True)
    out: dict[str, dict[str, Any]] = {}
    for name, params in functions.items():
        if name == RESPOND:
            continue
        narrowed = narrow_properties(name, params, {}, held, defaults=True, plain=True)
        if narrowed is not None and narrowed is not params:
            out[name] = clean_schema(narrowed)
    return out


def _gaps(schemas: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each schema's constraints the grammar leaves to validation (``decoding_gaps``)."""
    return {name: found for name, schema in schemas.items() if (found := decoding_gaps(schema))}


def _forwarded(req: CompletionAsk) -> dict[str, Any]:
    """The request's parameters every turn forwards as given (the upstream's own)."""
    extra: dict[str, Any] = {}
    if req.presence_penalty is not None:
        extra["presence_penalty"] = req.presence_penalty
    if req.frequency_penalty is not None:
        extra["frequency_penalty"] = req.frequency_penalty
    if req.reasoning_effort is not None:
        extra["reasoning_effort"] = req.reasoning_effort
    return extra


@functools.lru_cache(maxsize=64)
def _guards(switches: Hashable) -> tuple[Guards, tuple[tuple[str, bool], ...]]:
    """The engine's switches for the request's ``toolforge.guardrails`` and their record,
    once per distinct set (64 at most): ``model_dump`` and ``dataclasses.asdict`` were
    half of the plan's time (bench/RESULTS.md, B1p)."""
    guards = Guards(**switches.model_dump(by_alias=True))  # type: ignore[attr-defined]
    return guards, tuple(dataclasses.asdict(guards).items())


def _bad(message: str) -> RequestError:
    return RequestError(ErrorCode.BAD_REQUEST, message, http_status=400)


def _respond_line(answer: CompiledSchema | None) -> str:
    if answer is not None:
        return f'To answer the user directly, call "{RESPOND}" with your answer as its arguments.'
    return f'To answer the user directly, call "{RESPOND}" with {{"content": "<your answer>"}}.'


def _native_choice(choice: str, forced: str | None, respond: bool) -> object:
    if forced is not None:
        return {"type": "function", "function": {"name": forced}}
    if choice == "auto" and respond:
        return "required"  # the answer is a call to respond (docs/workflows.md)
    return choice


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The client's messages for the upstream: ``developer`` is a system message to the
    local servers (llama-server, Ollama) whose chat templates know no such role."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item = dict(message)
        if item.get("role") == "developer":
            item["role"] = "system"
        out.append(item)
    return out


def _with_tools_prompt(
    messages: list[Mapping[str, Any]],
    template: str,
    functions: Mapping[str, Mapping[str, Any]],
    descriptions: Mapping[str, str],
    *,
    respond: str,
) -> list[Mapping[str, Any]]:
    """The functions described in a system message (constrained mode sends no ``tools``):
    after the client's own system message, or as the first message."""
    listing = "\n".join(
        f"- {name}: {descriptions.get(name, '') or '(no description)'}\n"
        f"  arguments: {orjson.dumps(params).decode()}"
        for name, params in functions.items()
    )
    text = template.format(functions=listing, respond=respond).strip()
    if (
        messages
        and messages[0].get("role") == "system"
        and isinstance(messages[0].get("content"), str)
    ):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{text}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
