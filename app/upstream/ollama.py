"""Adapter for Ollama's native ``POST /api/chat``: NDJSON streaming, native tools, ``num_ctx``.

Why the native API and not Ollama's ``/v1`` (which :mod:`toolforge.upstream.openai_compat`
already speaks): only the native API takes ``options.num_ctx`` and ``keep_alive``. Without
an explicit ``num_ctx`` Ollama runs every model at its own default context (2048 or 4096
tokens, depending on the version) and silently drops the start of a longer prompt; and a
request whose ``num_ctx`` differs from the loaded runner's makes Ollama reload the model.
So the context budget the ServerManager chose (docs/servers.md) is given to the constructor and
sent on every request; nothing in a :class:`ChatRequest` can change it.

The adapter is thin (docs/architecture.md): it builds the body and parses the stream with the
sans-IO :mod:`toolforge.upstream.ollama_wire`, over an injected ``httpx.AsyncClient``. Connect,
first-byte and idle timeouts, the one mapping of httpx exceptions
(:class:`~toolforge.upstream.exchange.Exchange`) and the drain after the last line are
:mod:`toolforge.upstream.exchange`'s, shared with :mod:`toolforge.upstream.openai_compat`, and the
close is as prompt and cancel-safe as there: closing the generator (``aclose()`` or
cancelling the task) closes the response, and with it the TCP connection when the body was
not finished (docs/protocol.md: cancel within 50 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import anyio
import httpx

from toolforge.errors import ErrorCode, UpstreamError
from toolforge.upstream.base import ChatRequest, UpstreamDelta
from toolforge.upstream.exchange import (
    STREAM,
    Exchange,
    drain,
    excerpt,
    open_stream,
    request_body,
)
from toolforge.upstream.ollama_wire import (
    ChatLineParser,
    NDJSONDecoder,
    OllamaModelNotFound,
    chat_body,
    http_error,
)
from toolforge.upstream.transport import PostTemplate

__all__ = ["OllamaModelNotFound", "OllamaUpstream", "ollama_root"]


def ollama_root(base_url: str) -> str:
    """The server root of ``base_url``, without a trailing ``/``; an OpenAI-style ``/v1``
    suffix is tolerated and a path prefix (a reverse proxy's) kept."""
    root = base_url.rstrip("/").removesuffix("/v1")
    url = httpx.URL(root)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"Ollama base_url must be an http(s) URL, got {base_url!r}")
    return root


class OllamaUpstream:
    """Streams ``POST {base_url}/api/chat`` from an Ollama server.

    ``base_url`` is the server root (``http://127.0.0.1:11434``; a trailing ``/v1`` is
    ignored). ``num_ctx`` is sent on every request (see the module docstring);
    ``keep_alive`` (``"5m"``, ``"24h"``, seconds, ``-1`` for ever; ``None``: the server's
    default) too. Timeouts as in :class:`~toolforge.upstream.openai_compat.OpenAICompatUpstream`:
    ``first_byte_s`` also covers loading the model, which Ollama does before it answers.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        num_ctx: int,
        keep_alive: str | float | None = None,
        connect_s: float = 5.0,
        first_byte_s: float = 120.0,
        idle_s: float = 30.0,
    ) -> None:
        if type(num_ctx) is not int or num_ctx <= 0:
            raise ValueError(f"num_ctx must be a positive int, got {num_ctx!r}")
        self._client = client
        self._url = httpx.URL(ollama_root(base_url) + "/api/chat")
        self._url_text = str(self._url)  # for errors: httpx rebuilds it on each str()
        self._post = PostTemplate(
            self._url, {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        )
        self._num_ctx = num_ctx
        self._keep_alive = keep_alive
        self._connect_s = connect_s
        self._first_byte_s = first_byte_s
        self._idle_s = idle_s
        self._timeout = httpx.Timeout(connect=connect_s, read=None, write=None, pool=connect_s)

    def __repr__(self) -> str:
        return f"OllamaUpstream({str(self._url)!r}, num_ctx={self._num_ctx})"

    @property
    def num_ctx(self) -> int:
        """The context length sent with every request."""
        return self._num_ctx

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so tests and logs can show it)."""
        return chat_body(request, num_ctx=self._num_ctx, keep_alive=self._keep_alive)

    async def stream(self, request: ChatRequest) -> AsyncGenerator[UpstreamDelta, None]:
        """Yield deltas until the ``done`` line; raise :class:`UpstreamError` on failure."""
        loop = asyncio.get_running_loop()
        exchange = Exchange(self._url_text, self._connect_s, self._first_byte_s, self._idle_s)
        head, chunks, first_byte_at, close = await open_stream(
            self._client,
            self._post,
            content=request_body(self.body(request)),
            timeouts=self._timeout,
            exchange=exchange,
            first_byte_s=self._first_byte_s,
        )
        try:
            with exchange.until(first_byte_at):
                if head.status_code >= 400:
                    raise http_error(
                        head.status_code,
                        await excerpt(chunks),
                        url=self._url_text,
                        model=request.model,
                    )
                chunk = await anext(chunks, None)
            exchange.phase = STREAM
            next_chunk = chunks.__anext__
            decoder = NDJSONDecoder()
            lines = ChatLineParser()
            while True:
                for line in decoder.feed(chunk) if chunk is not None else decoder.close():
                    delta = lines.parse(line)
                    if delta is None:
                        continue
                    if delta.finish_reason is not None:
                        exchange.finished = True
                        yield delta
                        await drain(chunks)  # nothing follows done
                        return
                    yield delta
                if chunk is None:
                    raise UpstreamError(
                        ErrorCode.UPSTREAM_PROTOCOL,
                        'upstream closed the stream early (no line with "done": true)',
                    )
                chunk = None  # never reprocess a chunk, whatever the read raised
                with exchange.until(loop.time() + self._idle_s):
                    try:  # not anext(chunks, None): a wrapper object per read (see openai_compat)
                        chunk = await next_chunk()
                    except StopAsyncIteration:
                        chunk = None
        finally:
            exchange.close()
            # Shielded: the cancel that may have brought us here must not cut the close
            # short, or httpcore keeps the connection ACTIVE in its pool.
            with anyio.CancelScope(shield=True):
                await close()
