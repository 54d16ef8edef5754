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
* The text a grammar forces at either end (a tool call's sentinels: 41 of the booking
  call's 57 tokens) is not decoded one forward pass a token (``prefill_forced``, on by
  default): the prefix goes as the start of the assistant's reply, which llama-server
  processes as prompt and continues; the grammar of the middle alone is sent; the
  suffix is written by the adapter when the model ends the middle (``finish_reason``
  ``stop``). The deltas the runtime reads are the same text as without it
  (toolforge.core.gbnf_forced; docs/performance.md).
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

import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from toolforge.core.gbnf_forced import ForcedText, forced_text
from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, DeltaStream, UpstreamDelta
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
        prefill_forced: bool = True,
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
        # Public: a bench switches it between runs to measure it (bench/demo.py).
        self.prefill_forced = prefill_forced
        self._defaults: dict[str, Any] = {"cache_prompt": cache_prompt}
        if slot is not None:
            self._defaults["id_slot"] = slot

    def __repr__(self) -> str:
        return f"LlamaServerUpstream({self.base_url!r})"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``: the OpenAI body plus llama-server's fields
        (with a grammar's forced text taken out, as :meth:`stream` sends it)."""
        request = self._with_defaults(request)
        forced = self._forced(request)
        return self._inner.body(_prefilled(request, forced) if forced else request)

    def stream(self, request: ChatRequest) -> DeltaStream:
        """The OpenAI-compatible adapter's stream itself, not a generator around it: a
        layer more would cost every token a resume and a suspend (see its ``stream``).
        Only a grammar with forced text gets the layer that writes that text back."""
        request = self._with_defaults(request)
        forced = self._forced(request)
        if forced is None:
            return self._inner.stream(request)
        return self._forced_stream(_prefilled(request, forced), forced)

    def _with_defaults(self, request: ChatRequest) -> ChatRequest:
        # The request's own extra wins (a caller may turn cache_prompt off for a benchmark).
        return dataclasses.replace(request, extra={**self._defaults, **request.extra})

    def _forced(self, request: ChatRequest) -> ForcedText | None:
        """The forced text of the request's grammar, when it can be sent as a prefill: the
        last message is not the assistant's already (llama-server would continue that
        one), and a suffix only without stop strings (one could end the middle early)."""
        grammar = request.extra.get("grammar")
        if not (self.prefill_forced and isinstance(grammar, str) and request.messages):
            return None
        if request.messages[-1].get("role") == "assistant":
            return None
        return forced_text(grammar, suffix=not request.stop)

    async def _forced_stream(
        self, request: ChatRequest, forced: ForcedText
    ) -> AsyncGenerator[UpstreamDelta, None]:
        """The model's deltas with ``forced``'s text written back: the prefix before its
        first text, the suffix before a ``stop``. A server that writes either itself
        (llama-server echoes the prefill; a server that ignores the grammar writes the
        suffix) has it passed on as it sent it, not twice."""
        prefix, suffix = forced.prefix, forced.suffix
        held = ""  # the stream's first text, while it could still be the prefix's echo
        tail = ""  # the text's last len(suffix) characters
        async with contextlib.aclosing(self._inner.stream(request)) as deltas:
            async for delta in deltas:
                if prefix and delta.text:
                    held += delta.text
                    if len(held) < len(prefix) and prefix.startswith(held):
                        if delta.finish_reason is None and delta.usage is None:
                            continue
                        delta = dataclasses.replace(delta, text="")
                    else:
                        text = held if held.startswith(prefix) else prefix + held
                        delta = dataclasses.replace(delta, text=text)
                        prefix = held = ""
                if suffix and delta.text:
                    tail = (tail + delta.text)[-len(suffix) :]
                if delta.finish_reason is not None:
                    if prefix:  # no text came, or only part of an echo: the whole prefix
                        yield UpstreamDelta(text=prefix)
                        prefix = held = ""
                    if delta.finish_reason == "stop" and suffix and tail != suffix:
                        yield UpstreamDelta(text=suffix)
                        suffix = ""
                yield delta

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


def _prefilled(request: ChatRequest, forced: ForcedText) -> ChatRequest:
    """``request`` with the forced prefix as the assistant's reply begun, and the grammar
    of what lies between the prefix and the suffix."""
    messages = list(request.messages)
    if forced.prefix:
        messages.append({"role": "assistant", "content": forced.prefix})
    return dataclasses.replace(
        request, messages=messages, extra={**request.extra, "grammar": forced.grammar}
    )
