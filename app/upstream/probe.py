"""``mode: auto``: ask the upstream once whether its model does native tool calls.

Native function calling is only as good as the model's chat template, and
OpenAI-compatible servers do not say in ``/v1`` whether theirs has one. Two servers do say
it elsewhere, and those are asked:

- llama-server: ``GET /props`` → ``chat_template_caps.supports_tool_calls``;
- Ollama: ``POST /api/show {"model"}`` → ``"tools"`` in ``capabilities``.

Anything else (vLLM, Groq, an older server, a probe that fails or times out) gets
``sentinel``, the mode that works on every OpenAI-compatible upstream. The decision and
its reason are logged, recorded in ``prompt.json`` and cached per upstream and model by
the caller, so the probe costs two small requests once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson

__all__ = ["ModeDecision", "probe_tool_mode"]


@dataclass(frozen=True, slots=True)
class ModeDecision:
    mode: Literal["sentinel", "native"]
    reason: str


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
) -> ModeDecision:
    """Decide ``native`` or ``sentinel`` for ``model`` on the upstream at ``base_url``."""
    root = base_url.rstrip("/").removesuffix("/v1")
    props = await _json(client.get(f"{root}/props", headers=headers, timeout=timeout_s))
    if isinstance(props, dict) and isinstance(caps := props.get("chat_template_caps"), dict):
        if caps.get("supports_tool_calls") is True:
            return ModeDecision("native", "llama-server /props: the chat template does tool calls")
        return ModeDecision("sentinel", "llama-server /props: the chat template has no tool calls")
    show = await _json(
        client.post(f"{root}/api/show", json={"model": model}, headers=headers, timeout=timeout_s)
    )
    if isinstance(show, dict) and isinstance(caps := show.get("capabilities"), list):
        if "tools" in caps:
            return ModeDecision("native", f"Ollama /api/show: {model} has the tools capability")
        return ModeDecision("sentinel", f"Ollama /api/show: {model} has no tools capability")
    return ModeDecision(
        "sentinel",
        "the upstream does not report tool support (/props, /api/show); "
        "sentinel works on every OpenAI-compatible upstream",
    )
