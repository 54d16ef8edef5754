"""Adapter for llama.cpp's ``llama-server``: its OpenAI-compatible stream plus its own fields.

llama-server speaks the OpenAI ``chat.completion.chunk`` dialect, so streaming is the
OpenAI-compatible adapter's; what differs is data (docs/architecture.md: dialect differences are
data, not ``if``\\ s), merged into every request body:

* ``cache_prompt: true`` — reuse the KV cache of the longest common prefix. A resumed turn
  after a tool call sends the previous prompt plus the model's own text plus the result
  (app/runtime/session.py), so only the new tokens are processed (docs/protocol.md).
* ``id_slot`` when the adapter is pinned to a slot. Unpinned (the default), llama-server
  picks the idle slot whose cached prompt is most similar to the new one, which keeps a
  resumed stream on its slot without making concurrent streams queue for one slot.
* ``grammar`` arrives per request through ``ChatRequest.extra`` (constrained mode).
* The last chunk carries ``timings`` (``cache_n``: prompt tokens served from the cache,
  ``prompt_n``, ``predicted_per_second``), which the OpenAI-compatible decoder folds into
  ``usage["timings"]`` so the session can report prompt-cache reuse.

llama-server sometimes closes a kept-alive connection instead of answering the next
request on it (seen here: 1 to 4 times in 12 reuses after a finished stream, with plain
httpx, no gateway). Nothing of that request reached the model, so the adapter sends it
once more on a fresh connection (``OpenAICompatUpstream(retry_unanswered=True)``); a
failure once the answer's body has begun is never retried.

The context a slot really has comes from ``GET /props`` (:meth:`LlamaServerUpstream.props`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.openai_compat import OpenAICompatUpstream

__all__ = ["LlamaServerUpstream"]


class LlamaServerUpstream:
    """Streams from a llama-server at ``base_url`` (the server root, without ``/v1``)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        slot: int | None = None,
        cache_prompt: bool = True,
        connect_s: float = 5.0,
        first_byte_s: float = 120.0,
        idle_s: float = 30.0,
    ) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self._inner = OpenAICompatUpstream(
            client,
            self.base_url + "/v1",
            connect_s=connect_s,
            first_byte_s=first_byte_s,
            idle_s=idle_s,
            retry_unanswered=True,
        )
        self._connect_s = connect_s
        self._defaults: dict[str, Any] = {"cache_prompt": cache_prompt}
        if slot is not None:
            self._defaults["id_slot"] = slot

    def __repr__(self) -> str:
        return f"LlamaServerUpstream({self.base_url!r})"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``: the OpenAI body plus llama-server's fields."""
        return self._inner.body(self._with_defaults(request))

    def stream(self, request: ChatRequest) -> AsyncGenerator[UpstreamDelta, None]:
        """The OpenAI-compatible adapter's stream itself, not a generator around it: a
        layer more would cost every token a resume and a suspend (see its ``stream``)."""
        return self._inner.stream(self._with_defaults(request))

    def _with_defaults(self, request: ChatRequest) -> ChatRequest:
        # The request's own extra wins (a caller may turn cache_prompt off for a benchmark).
        return dataclasses.replace(request, extra={**self._defaults, **request.extra})

    async def tokenize(self, text: str) -> int:
        """How many tokens ``text`` is for the loaded model (``POST /tokenize``): context
        compaction measures prompts with it (toolforge.runtime.context). Sent once more on
        a fresh connection when llama-server closed a kept-alive one without answering (as
        the streams are, above): counting is idempotent, and one such race must not send
        the rest of the stream to the characters/4 estimate."""
        try:
            for attempt in (1, 2):
                try:
                    response = await self._client.post(
                        f"{self.base_url}/tokenize", json={"content": text}, timeout=self._connect_s
                    )
                    break
                except httpx.RemoteProtocolError:
                    if attempt == 2:
                        raise
            response.raise_for_status()
            tokens = response.json().get("tokens")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise UpstreamError(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"llama-server at {self.base_url} did not answer /tokenize ({exc!r})",
            ) from exc
        if not isinstance(tokens, list):
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL, f"llama-server /tokenize has no token list: {tokens!r}"
            )
        return len(tokens)

    async def props(self) -> dict[str, Any]:
        """``GET /props``: per-slot ``n_ctx``, slot count, chat template capabilities."""
        try:
            response = await self._client.get(f"{self.base_url}/props", timeout=self._connect_s)
            response.raise_for_status()
            props = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise UpstreamError(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"llama-server at {self.base_url} did not answer /props ({exc!r}); is it "
                "running and healthy?",
            ) from exc
        if not isinstance(props, dict):
            raise UpstreamError(
                ErrorCode.UPSTREAM_PROTOCOL, f"llama-server /props is not an object: {props!r}"
            )
        return props
