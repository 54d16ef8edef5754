"""Messages with metadata: what the conversation remembers, and why (docs/workflows.md). No I/O.

A :class:`Message` is one message of the history *as the gateway sees it*: its wire form
(OpenAI-shaped: ``role``, ``content``, ``tool_calls``, ``tool_call_id``) and a
:class:`MessageMeta` that says what kind of message it is (the system prompt, the user's
input, a tool call, a tool result, a nudge, a compaction summary), which iteration of the
conversation made it, and which tools it called. Compaction (:mod:`toolforge.core.context`)
decides by that metadata; the model never sees it.

A ``Message`` *is* a read-only ``Mapping`` of its wire form, so everything that reads a
history as OpenAI-shaped dicts (the modes, the proxy, tests) reads it unchanged. The
metadata is not among its keys, and the adapters serialise histories with
:func:`wire_messages` at the upstream boundary (OpenAI-compatible, llama-server, Ollama,
Anthropic), which hands over the wire dicts alone: the metadata cannot reach an upstream.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "Message",
    "MessageMeta",
    "MessageType",
    "as_messages",
    "content_text",
    "first_user_index",
    "message",
    "wire_messages",
]


class MessageType(StrEnum):
    """What a message is, for compaction's priorities (docs/context.md)."""

    SYSTEM_PROMPT = "system_prompt"
    USER_INPUT = "user_input"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    REASONING = "reasoning"
    TEXT_RESPONSE = "text_response"  # model text that was not the answer (a failed attempt)
    STEP_NUDGE = "step_nudge"  # a workflow's "call X first"
    RETRY_NUDGE = "retry_nudge"  # "that was not a tool call, try again"
    SUMMARY = "summary"  # compacted content; original_type says what it replaced


@dataclass(frozen=True, slots=True)
class MessageMeta:
    """A message's metadata. Never sent to an upstream.

    ``step`` is the conversation's iteration (model turn) that produced the message:
    ``None`` for the opening messages the request brought (system prompt, user input,
    earlier history). ``tools`` are the names of the tools a ``TOOL_CALL`` message called
    (in sentinel mode the call is in the text; this names it all the same).
    """

    type: MessageType
    step: int | None = None
    tools: tuple[str, ...] = ()
    original_type: MessageType | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Message(Mapping[str, Any]):
    """One message: its wire form (``data``, the Mapping's items) and its ``meta``.

    Equality is the Mapping's: a ``Message`` equals the dict of its wire form, whatever
    its metadata (histories compare as the model would see them).
    """

    data: Mapping[str, Any]
    meta: MessageMeta

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Message({dict(self.data)!r}, {self.meta!r})"

    @property
    def role(self) -> str:
        return str(self.data.get("role", ""))

    @property
    def content(self) -> str:
        """The text content (``""`` for none, or for content that is not a string)."""
        content = self.data.get("content")
        return content if isinstance(content, str) else ""

    @property
    def plain(self) -> bool:
        """A message with text alone: no tool calls, not a ``tool`` answer (two such of
        the same role may merge into one)."""
        return self.role != "tool" and not self.data.get("tool_calls")

    def with_content(self, content: str, meta: MessageMeta | None = None) -> Message:
        """This message with other text (and metadata)."""
        return Message({**self.data, "content": content}, meta or self.meta)

    def with_step(self, step: int) -> Message:
        return Message(self.data, replace(self.meta, step=step))


def message(
    role: str,
    content: str | None,
    type_: MessageType,
    *,
    step: int | None = None,
    tools: Sequence[str] = (),
    **wire: Any,
) -> Message:
    """A new message: ``wire`` holds further wire fields (``tool_calls``, ``tool_call_id``)."""
    return Message(
        {"role": role, "content": content, **wire}, MessageMeta(type_, step, tuple(tools))
    )


def content_text(content: Any, sep: str = "") -> str:
    """A message's text: its ``content`` string, or its text parts (OpenAI content parts)
    joined by ``sep``; anything else is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return sep.join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return ""


def first_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """The index of the first user message (-1: none)."""
    for index, item in enumerate(messages):
        if item.get("role") == "user":
            return index
    return -1


_BY_ROLE = {
    "system": MessageType.SYSTEM_PROMPT,
    "user": MessageType.USER_INPUT,
    "tool": MessageType.TOOL_RESULT,
}


def as_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """``messages`` as :class:`Message` values: those that are keep their metadata; plain
    mappings (a request's own messages) are classified by role and place — system
    messages are the system prompt, user messages user input, assistant messages with
    calls tool calls and others text, ``tool`` messages tool results."""
    out: list[Message] = []
    for item in messages:
        if isinstance(item, Message):
            out.append(item)
            continue
        role = item.get("role")
        if role == "assistant":
            calls = item.get("tool_calls") or ()
            names = tuple(str((call.get("function") or {}).get("name", "")) for call in calls)
            kind = MessageType.TOOL_CALL if calls else MessageType.TEXT_RESPONSE
            out.append(Message(item, MessageMeta(kind, tools=names)))
        else:
            out.append(Message(item, MessageMeta(_BY_ROLE.get(str(role), MessageType.USER_INPUT))))
    return out


def wire_messages(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """The history as the upstream gets it: each :class:`Message`'s wire dict, metadata
    left behind. A history of plain dicts is returned as is (no copy on the hot path)."""
    for item in messages:
        if type(item) is Message:
            return [m.data if type(m) is Message else m for m in messages]
    return messages
