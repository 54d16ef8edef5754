"""``mode: auto``: ask the upstream once what it can do: native tool calls, grammars.

Native function calling is only as good as the model's chat template, and
OpenAI-compatible servers do not say in ``/v1`` whether theirs has one. Two servers do say
it elsewhere, and those are asked:

- llama-server: ``GET /props`` → ``chat_template_caps.supports_tool_calls``. Answering
  ``/props`` at all also says it is a llama-server, which takes a GBNF ``grammar`` with
  each request: ``constrained`` mode (docs/protocol.md) when the template has no tool calls;
- Ollama: ``POST /api/show {"model"}`` → ``"tools"`` in ``capabilities`` (no grammars).

The preference is native (the model's own format), then constrained (a grammar makes even
a 135M model frame correctly), then ``sentinel``, the mode that works on every
OpenAI-compatible upstream (vLLM, Groq, an older server, a probe that fails or times out).
The decision and its reason are logged, recorded in ``prompt.json`` and cached per upstream
and model by the caller, so the probe costs two small requests once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson

__all__ = ["ModeDecision", "probe_tool_mode"]


# Keys of llama-server's /props answer (any one is enough: they vary across versions).
_LLAMA_SERVER_PROPS = frozenset(
    {"chat_template_caps", "default_generation_settings", "total_slots", "chat_template"}
)


@dataclass(frozen=True, slots=True)
class ModeDecision:
    """The mode a stream runs in, why, and whether the upstream takes GBNF grammars.

    ``native_tools``: whether the model's chat template renders tools, where the upstream
    says (llama-server's ``/props``, Ollama's capabilities); ``None`` where it does not.
    """

    mode: Literal["sentinel", "constrained", "native"]
    reason: str
    grammar: bool = False
    native_tools: bool | None = None


async def _json(response_coro: Any) -> Any:
    try:
        response = await response_coro
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None


async def probe_tool_mode(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 2.0,
    llama_server: bool = False,
) -> ModeDecision:
    """Decide ``native``, ``constrained`` or ``sentinel`` for ``model`` at ``base_url``.

    ``llama_server``: the operator says the upstream is one (``UPSTREAM_KIND``), so it
    takes grammars even if ``/props`` does not answer (a proxy in front of it).
    """
    root = base_url.rstrip("/").removesuffix("/v1")
    props = await _json(client.get(f"{root}/props", headers=headers, timeout=timeout_s))
    if isinstance(props, dict) and not _LLAMA_SERVER_PROPS.isdisjoint(props):
        caps = props.get("chat_template_caps")
        if isinstance(caps, dict) and caps.get("supports_tool_calls") is True:
            return ModeDecision(
                "native",
                "llama-server /props: the chat template does tool calls",
                grammar=True,
                native_tools=True,
            )
        return ModeDecision(
            "constrained",
            "llama-server /props: the chat template has no tool calls, and the server "
            "takes GBNF grammars",
            grammar=True,
            native_tools=False,
        )
    if llama_server:
        return ModeDecision(
            "constrained",
            "UPSTREAM_KIND=llama_server: the server takes GBNF grammars (/props did not "
            "answer, so its template's tool calls are unknown)",
            grammar=True,
        )
    show = await _json(
        client.post(f"{root}/api/show", json={"model": model}, headers=headers, timeout=timeout_s)
    )
    if isinstance(show, dict) and isinstance(caps := show.get("capabilities"), list):
        if "tools" in caps:
            return ModeDecision(
                "native", f"Ollama /api/show: {model} has the tools capability", native_tools=True
            )
        return ModeDecision(
            "sentinel", f"Ollama /api/show: {model} has no tools capability", native_tools=False
        )
    return ModeDecision(
        "sentinel",
        "the upstream does not report tool support or grammars (/props, /api/show); "
        "sentinel works on every OpenAI-compatible upstream",
    )
