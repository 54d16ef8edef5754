"""The values a conversation exchanges with a model: one request, and its output in steps.

They are dialect-neutral: every upstream adapter turns a :class:`ChatRequest` into its own
wire format and yields :class:`UpstreamDelta` values. They live in core because the turn
engine (:mod:`toolforge.core.engine`) builds the requests and reads the deltas without any I/O;
:mod:`toolforge.upstream.base` re-exports them as part of the model seam.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolforge.core.native_tools import ToolCallDelta

__all__ = ["ChatRequest", "UpstreamDelta"]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat-completion request, independent of any upstream dialect.

    ``None`` means "not sent; the upstream's default applies". ``extra`` is merged last
    into the wire body (e.g. llama-server's ``grammar``/``cache_prompt``), so it can also
    override what the adapter would send.

    Native mode (docs/protocol.md) sends its tools through ``extra`` as well: ``{"tools": [...],
    "tool_choice": "auto"}``, the tools in OpenAI format (built by
    :func:`toolforge.core.native_tools.to_openai_tools`). Its continuation ``messages`` then
    hold OpenAI-shaped assistant messages with ``tool_calls`` and ``{"role": "tool",
    "tool_call_id": ..., "content": ...}`` messages (see
    :func:`toolforge.core.native_tools.assistant_tool_call_message` and
    :func:`toolforge.core.native_tools.tool_result_message`); adapters pass them through as is.
    """

    model: str
    messages: Sequence[Mapping[str, Any]]
    temperature: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: Sequence[str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UpstreamDelta:
    """One step of the model's output: new text, and at the end the finish reason/usage.

    ``text`` may be empty (a usage-only, finish-only or tool-call chunk). ``usage`` is the
    upstream's token accounting as sent (``prompt_tokens``, ``completion_tokens``, ...).
    ``tool_calls`` holds the native tool-call pieces of this chunk, in the order sent;
    empty unless the request offered ``tools`` and the model called one. ``reasoning``
    is the upstream's own ``reasoning_content`` (servers that split a model's thinking off
    themselves); the OpenAI-compatible proxy returns it as such, ``/v1/stream`` ignores it.
    """

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    reasoning: str = ""
