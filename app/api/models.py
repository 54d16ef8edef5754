"""HTTP request and response bodies: the wire contract of SPEC §2, in pydantic.

Unknown fields are rejected (``extra="forbid"``) so that a typo in a field name is a 422
naming the field, not a silently ignored option.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ApprovalDecision",
    "ChatMessage",
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


class StreamRequest(BaseModel):
    """``POST /v1/stream``. Give ``messages`` or ``input``, not both."""

    model_config = _STRICT

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)] | None = None
    input: Annotated[str, Field(min_length=1, max_length=512 * 1024)] | None = None
    tools: list[SchemaName] | None = None
    result_schema: SchemaName = "AssistantReply"
    object_schemas: list[SchemaName | InlineSchema] = Field(default_factory=list, max_length=32)
    mode: Literal["auto", "sentinel", "constrained", "native"] = "auto"
    sampling: Sampling | None = None
    profile: Literal["demo"] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0, le=64)] = 8
    # Ours, beyond SPEC §2 (docs/protocol.md): what a client disconnect means. "cancel"
    # (the default) stops the model within 50 ms; "continue" lets the stream run to its
    # end so the client can pick it up with GET /v1/streams/{id} and Last-Event-ID.
    on_disconnect: Literal["cancel", "continue"] = "cancel"

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
