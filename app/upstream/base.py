"""The model seam: what the runtime asks of an upstream, and what it gets back.

Every adapter (OpenAI-compatible, llama-server, Ollama, ...) turns a dialect-neutral
:class:`ChatRequest` into its own wire format and yields :class:`UpstreamDelta` values, so
the runtime never sees HTTP, SSE or a dialect's JSON (docs/architecture.md: a small ``Model`` seam,
as in openai-agents). Scripted fakes for tests implement the same :class:`Upstream` protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol

# Defined in core (which imports no other layer) so the assembler and the turn engine can
# use them; part of this seam's surface all the same.
from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.native_tools import ToolCallDelta

__all__ = [
    "PROFILES",
    "ChatRequest",
    "DeltaConsumer",
    "DeltaStream",
    "SamplingProfile",
    "ToolCallDelta",
    "Upstream",
    "UpstreamDelta",
]


@dataclass(frozen=True, slots=True)
class SamplingProfile:
    """Named sampling settings a caller can pick with ``profile`` (docs/protocol.md)."""

    temperature: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    top_p: float | None = None

    def apply(self, request: ChatRequest) -> ChatRequest:
        """``request`` with this profile's settings where the profile sets them."""
        changes = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        return dataclasses.replace(request, **changes)


PROFILES: Final[Mapping[str, SamplingProfile]] = MappingProxyType(
    {
        # docs/protocol.md: low temperature and a fixed seed make the demo repeatable on small
        # models; 384 tokens is enough for a tool call plus a short answer.
        "demo": SamplingProfile(temperature=0.2, seed=42, max_tokens=384),
    }
)


class DeltaStream(Protocol):
    """One generation's deltas: an async iterator that can be closed (an async generator
    is one). Closing it (``aclose()``, or cancelling the task reading it) stops the
    generation and releases its connection promptly."""

    def __aiter__(self) -> AsyncIterator[UpstreamDelta]: ...

    async def __anext__(self) -> UpstreamDelta: ...

    async def aclose(self) -> None: ...


class DeltaConsumer(Protocol):
    """Who takes a generation's deltas as they arrive, inside the socket's read callback
    (``follow`` of :class:`toolforge.upstream.openai_compat.ChatStream`)."""

    def deliver(self, delta: UpstreamDelta) -> bool:
        """Take ``delta`` now; False: no more now (the consumer's task reads the rest)."""
        ...

    def settle(self) -> None:
        """The socket read that brought the last deltas is done (its deltas were
        delivered, or some are left for the task)."""
        ...


class Upstream(Protocol):
    """A model server that streams a chat completion.

    ``stream`` returns a :class:`DeltaStream`: iterate it, and close it (``aclose()`` or
    cancel the task) to stop the generation; implementations release the connection
    promptly. Errors are :class:`toolforge.errors.UpstreamError`.
    """

    def stream(self, request: ChatRequest) -> DeltaStream:
        """Yield the model's output for ``request`` until it finishes."""
        ...
