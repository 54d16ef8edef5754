"""The body of ``POST /v1/responses``, in pydantic: what the gateway honours, and what it
refuses by name (docs/responses.md lists every parameter).

Unknown fields are refused too (``extra="forbid"``), so that a typo is a 400 that names
it, never an option silently ignored. A valid body becomes the OpenAI-compatible proxy's
request (:meth:`ResponsesRequest.chat_request`): one plan for both APIs.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolforge.api.json_depth import check_depth
from toolforge.api.models import ChatCompletionRequest, ToolForgeExtension
from toolforge.errors import ErrorCode, RequestError

__all__ = ["REFUSED", "ResponsesRequest", "parse_request"]

_STRICT: Final = ConfigDict(extra="forbid", frozen=True)
_EMPTY: Final[tuple[object, ...]] = (None, False, [], {}, 0, "")

# The Responses API's parameters that the gateway refuses, with what to do instead.
REFUSED: Final[dict[str, str]] = {
    "background": "background responses are not supported; stream the response instead",
    "conversation": "conversation objects are not supported; use 'previous_response_id'",
    "prompt": "stored prompt templates are not supported; send 'instructions' and 'input'",
    "include": "no extra output data (encrypted reasoning, logprobs, tool sources) is "
    "returned by this gateway; leave it out or send []",
    "top_logprobs": "token log-probabilities are not returned by this gateway; leave it out",
    "context_management": "compaction is the gateway's own (docs/context.md); leave it out",
    "prompt_cache_retention": "the prompt cache is the model server's; leave it out",
    "prompt_cache_options": "the prompt cache is the model server's; leave it out",
}


class FunctionTool(BaseModel):
    """A function tool, as the Responses API writes one (flat: no ``function`` object)."""

    model_config = _STRICT

    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the arguments are always validated against parameters

    @model_validator(mode="before")
    @classmethod
    def _only_functions(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") != "function":
            raise ValueError(
                f"tool type {data.get('type')!r} is not supported: this gateway calls "
                "function tools (and its own, in 'toolforge.server_tools')"
            )
        return data


class FunctionChoice(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = _STRICT

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")] | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("format 'json_schema' needs its 'name' and 'schema'")
        return self


class TextConfig(BaseModel):
    model_config = _STRICT

    format: TextFormat = TextFormat(type="text")
    verbosity: None = Field(
        None,
        description="refused when set: a small model's length is asked for in the prompt",
    )


class ReasoningConfig(BaseModel):
    model_config = _STRICT

    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: None = Field(
        None, description="refused when set: the reasoning is returned whole, never summarised"
    )
    generate_summary: None = None


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_obfuscation: bool | None = None  # the gateway never pads events: nothing to drop


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``."""

    model_config = _STRICT

    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: (
        Annotated[str, Field(min_length=1, max_length=512 * 1024)]
        | Annotated[list[dict[str, Any]], Field(min_length=1, max_length=4096)]
    )
    instructions: Annotated[str, Field(max_length=512 * 1024)] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(ge=0, le=64)] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=131_072)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    # A hint for a provider's prompt cache: accepted, and a no-op (the model server keeps
    # its own prompt cache).
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    truncation: Literal["disabled"] | None = None
    service_tier: Literal["auto", "default"] | None = None
    toolforge: ToolForgeExtension = Field(default_factory=ToolForgeExtension)

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in REFUSED.items():
                if data.get(name) not in _EMPTY:
                    raise ValueError(f"'{name}' is not supported: {why}")
            # Sent empty (the Agents SDK sends 'include': []), they ask for nothing.
            return {k: v for k, v in data.items() if k not in REFUSED}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        names = [tool.name for tool in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same name")
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice) and choice.name not in names:
            raise ValueError(
                f"tool_choice names {choice.name!r}, which is not in 'tools' "
                f"({', '.join(names) or 'none given'})"
            )
        if choice == "required" and not names and not self.toolforge.server_tools:
            raise ValueError("tool_choice 'required' needs 'tools'")
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed with 'stream': true")
        if self.toolforge.workflow is not None:
            self._workflow_refusals()
        return self

    def _workflow_refusals(self) -> None:
        """What a workflow run cannot honour, refused by its name here (a workflow names
        its own tools, decides the next one, and answers with its terminal tool's result)."""
        fmt = (self.text or TextConfig()).format
        checks = (
            (self.tools, "'tools': a workflow runs its own tools (GET /v1/workflows lists them)"),
            (self.toolforge.server_tools, "'toolforge.server_tools': a workflow runs its own"),
            (self.tool_choice not in (None, "auto"), "'tool_choice': the workflow decides"),
            (self.parallel_tool_calls, "'parallel_tool_calls': a workflow makes one call a turn"),
            (fmt.type != "text", "'text.format': the answer is the terminal tool's result"),
        )
        for asked, why in checks:
            if asked:
                raise ValueError(f"not with 'toolforge.workflow': {why}; leave it out")

    def input_items(self) -> list[dict[str, Any]]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [dict(item) for item in self.input]

    def chat_request(self, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The proxy's request for this one, with ``messages`` (the input, translated)."""
        fmt = (self.text or TextConfig()).format
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": self.stream,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_completion_tokens": self.max_output_tokens,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "parallel_tool_calls": self.parallel_tool_calls,
            "user": self.user or self.safety_identifier,
            "metadata": self.metadata,
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
        }
        if self.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": tool.model_dump(exclude={"type"}, exclude_none=True),
                }
                for tool in self.tools
            ]
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif choice is not None:
            body["tool_choice"] = choice
        if fmt.type == "json_schema":
            schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
            if fmt.strict is not None:
                schema["strict"] = fmt.strict
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        extension = self.toolforge
        if self.max_tool_calls is not None:
            extension = extension.model_copy(
                update={"max_tool_calls": min(self.max_tool_calls, extension.max_tool_calls)}
            )
        request = ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}
        )
        return request.model_copy(update={"toolforge": extension})

    def echo(self) -> dict[str, Any]:
        """The request's fields as the response object repeats them."""
        fmt = (self.text or TextConfig()).format
        text_format: dict[str, Any] = {"type": fmt.type}
        if fmt.type == "json_schema":
            # Open Responses' published type has the schema null in the response object.
            text_format.update(
                name=fmt.name, description=fmt.description, schema=None, strict=bool(fmt.strict)
            )
        choice = self.tool_choice
        return {
            "model": self.model,
            "previous_response_id": self.previous_response_id,
            "instructions": self.instructions,
            "tools": [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": tool.strict,
                }
                for tool in self.tools or ()
            ],
            "tool_choice": choice.model_dump()
            if isinstance(choice, FunctionChoice)
            else (choice or "auto"),
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "text": {"format": text_format},
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "reasoning": {"effort": self.reasoning.effort, "summary": None}
            if self.reasoning
            else None,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "store": self.store,
            "metadata": self.metadata or {},
            "safety_identifier": self.safety_identifier,
        }


def parse_request(body: bytes, max_depth: int) -> ResponsesRequest:
    """The body, checked; every problem is a 400 that names its field."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}", http_status=400
        ) from exc
    check_depth(body, raw, max_depth)
    try:
        return ResponsesRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "(body)"
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = (
                f"unknown parameter '{field}'; docs/responses.md lists every parameter "
                "(ToolForge's own go in the 'toolforge' extension object)"
            )
        elif first["type"] == "none_required":
            message = f"'{field}' is not supported: leave it out"
        raise RequestError(
            ErrorCode.BAD_REQUEST,
            f"invalid '{field}': {message}" if field != "(body)" else message,
            details=[{"field": field, "message": message}],
            http_status=400,
        ) from exc
