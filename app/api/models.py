"""HTTP request and response bodies: the wire contract of docs/protocol.md, in pydantic.

Unknown fields are rejected (``extra="forbid"``) so that a typo in a field name is a 422
naming the field, not a silently ignored option.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolforge.runtime.planner import DEFAULT_MAX_TOOL_CALLS

__all__ = [
    "ApprovalDecision",
    "ChatMessage",
    "ClientTool",
    "ClientToolResult",
    "InlineSchema",
    "Sampling",
    "StreamRequest",
]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class ChatMessage(BaseModel):
    """An OpenAI-style chat message."""

    model_config = ConfigDict(extra="allow", frozen=True)  # name, tool_call_id, ... pass through

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(None, max_length=512 * 1024)


class Sampling(BaseModel):
    model_config = _STRICT

    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    seed: int | None = None
    max_tokens: Annotated[int, Field(ge=1, le=131_072)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None


class InlineSchema(BaseModel):
    """A caller-supplied JSON Schema the model may emit as an OBJECT frame."""

    model_config = _STRICT

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")]
    schema_: dict[str, Any] = Field(alias="schema")


SchemaName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\-]{1,128}$")]


class ClientTool(BaseModel):
    """A tool the caller runs itself (docs/tools.md): the stream waits at its call for
    ``POST /v1/streams/{id}/tool_results/{call_id}``."""

    model_config = _STRICT

    # A name a sentinel can carry (no spaces), as a registry tool's.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ClientToolError(BaseModel):
    model_config = _STRICT

    code: Annotated[str, Field(min_length=1, max_length=64)] = "CLIENT_TOOL_FAILED"
    message: Annotated[str, Field(min_length=1, max_length=4096)]


class ClientToolResult(BaseModel):
    """``POST /v1/streams/{id}/tool_results/{call_id}``: ``{"ok": true, "result": ...}`` or
    ``{"ok": false, "error": {"code", "message"}}``."""

    model_config = _STRICT

    ok: bool
    result: Any = None
    error: ClientToolError | None = None

    @model_validator(mode="after")
    def _one_of(self) -> ClientToolResult:
        if self.ok and self.error is not None:
            raise ValueError("an ok result has no 'error'")
        if not self.ok and self.error is None:
            raise ValueError("a failed result needs 'error': {\"message\": ...}")
        if not self.ok and self.result is not None:
            raise ValueError("a failed result has no 'result'")
        return self


class StreamRequest(BaseModel):
    """``POST /v1/stream``. Give ``messages`` or ``input``, not both."""

    model_config = _STRICT

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)] | None = None
    input: Annotated[str, Field(min_length=1, max_length=512 * 1024)] | None = None
    tools: list[SchemaName] | None = None
    result_schema: SchemaName = "AssistantReply"
    object_schemas: list[SchemaName | InlineSchema] = Field(default_factory=list, max_length=32)
    client_tools: list[ClientTool] = Field(default_factory=list, max_length=32)
    mode: Literal["auto", "sentinel", "constrained", "native"] = "auto"
    sampling: Sampling | None = None
    profile: Literal["demo"] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0, le=64)] = DEFAULT_MAX_TOOL_CALLS
    # docs/workflows.md: a registered workflow's name (GET /v1/workflows) or an inline definition
    # (checked when the stream is planned: WORKFLOW_INVALID, 422).
    workflow: Annotated[str, Field(min_length=1, max_length=64)] | dict[str, Any] | None = None
    # What a client disconnect means (docs/protocol.md, section 7). "grace" (the default)
    # keeps the stream running for DISCONNECT_GRACE_MS so the client can resume it with
    # GET /v1/streams/{id} and Last-Event-ID, then cancels it; "cancel" stops the model
    # within 50 ms; "continue" runs the stream to its end for a resume at any time.
    on_disconnect: Literal["grace", "cancel", "continue"] = "grace"

    @model_validator(mode="after")
    def _one_prompt(self) -> StreamRequest:
        if (self.messages is None) == (self.input is None):
            raise ValueError("give exactly one of 'messages' (a chat) or 'input' (a string)")
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return [m.model_dump(exclude_none=True) for m in self.messages]
        return [{"role": "user", "content": self.input}]


class ApprovalDecision(BaseModel):
    """``POST /v1/streams/{id}/approvals/{call_id}``: run the tool call, or refuse it."""

    model_config = _STRICT

    approve: bool


# -- the OpenAI-compatible proxy (docs/proxy.md) ------------------------------------

_OPENAI = ConfigDict(extra="forbid", frozen=True)
# OpenAI's parameters that the proxy refuses by name, with what to do instead: never
# silently ignored (docs/proxy.md lists every parameter).
REFUSED_PARAMETERS: dict[str, str] = {
    "logprobs": "token log-probabilities are not returned by this gateway; leave it out",
    "top_logprobs": "token log-probabilities are not returned by this gateway; leave it out",
    "logit_bias": "logit_bias is not supported; use a grammar-backed response_format or tools",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported; leave it out",
    "prediction": "predicted outputs are not supported; leave it out",
    "web_search_options": "web search is not a tool of this gateway; offer a function instead",
    "functions": "the legacy 'functions' field is not supported; use 'tools'",
    "function_call": "the legacy 'function_call' field is not supported; use 'tool_choice'",
    "service_tier": "service tiers are not supported; leave it out",
    "store": "stored completions are not supported; every run is in artifacts/runs/ instead",
}


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments are always validated against parameters


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with its schema")
        return self


class GuardSwitches(BaseModel):
    """``toolforge.guardrails``: each small-model guardrail, on unless switched off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grammar: bool = True
    rescue: bool = True
    nudge: bool = True
    respond: bool = True
    json_: bool = Field(True, alias="json")
    reasoning: bool = True
    provenance: bool = True
    relevance: bool = True


class ToolForgeExtension(BaseModel):
    """The ``toolforge`` extension field (the SDKs' ``extra_body``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server_tools: list[SchemaName] = Field(default_factory=list, max_length=64)
    guardrails: GuardSwitches = GuardSwitches()
    max_tool_calls: Annotated[int, Field(ge=0, le=64)] = DEFAULT_MAX_TOOL_CALLS
    # docs/workflows.md: the gateway runs this workflow (a registered name, GET /v1/workflows, or an
    # inline definition) and answers with its terminal tool's result (docs/proxy.md).
    workflow: Annotated[str, Field(min_length=1, max_length=64)] | dict[str, Any] | None = None


_NO_EXTENSION: Final = ToolForgeExtension()


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: OpenAI's request body. Parameters the proxy cannot
    honour are refused by name (:data:`REFUSED_PARAMETERS`), unknown ones too."""

    model_config = _OPENAI

    model: Annotated[str, Field(min_length=1, max_length=256)]
    messages: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=1024)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=131_072)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=131_072)] | None = None
    n: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    tools: Annotated[list[ToolDef], Field(max_length=128)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: dict[str, str] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # A factory returning one shared (frozen) default: pydantic deep-copies a plain default
    # on every request (14 µs of 23 in validation, bench/RESULTS.md, B1p).
    toolforge: ToolForgeExtension = Field(default_factory=lambda: _NO_EXTENSION)

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in REFUSED_PARAMETERS.items():
                value = data.get(name)
                if value not in (None, False, [], {}):
                    raise ValueError(f"'{name}' is not supported: {why}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.n not in (None, 1):
            raise ValueError(
                f"n={self.n}: this gateway returns one choice; send n=1 or leave it out"
            )
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed with 'stream': true")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("give one of 'max_tokens' and 'max_completion_tokens'")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same function name")
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names {self.tool_choice.function.name!r}, which is not in "
                    f"'tools' ({', '.join(names) or 'none given'})"
                )
        elif self.tool_choice == "required" and not names and not self.toolforge.server_tools:
            raise ValueError("tool_choice 'required' needs 'tools'")
        for message in self.messages:
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise ValueError(
                    f"message role {role!r}: use system, developer, user, assistant or tool"
                )
        return self

    @property
    def tool_choice_name(self) -> str:
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return "function"
        return choice or "auto"
