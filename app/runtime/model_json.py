"""Ask the gateway's own model for a JSON value, with the JSON guarantee (docs/protocol.md).

Tools that need the model (the task-analysis pack's ``detect-dependencies``) call
:func:`ask_json`: one turn at temperature 0 asking for JSON, then the same policy a frame
gets (:mod:`toolforge.core.guarantee`): strict parse, local repair, one model repair with
``prompts/repair.txt`` and the validator's errors, and a minimal valid value with
diagnostics when that fails too. The caller learns whether the value was degraded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from toolforge.core.chat import ChatRequest
from toolforge.core.guarantee import Degraded, after_model_repair, render_repair_prompt
from toolforge.core.schemas import compile_schema
from toolforge.upstream.base import Upstream

__all__ = ["JsonAnswer", "ask_json"]

ModelT = TypeVar("ModelT", bound=BaseModel)

SYSTEM = "You answer with one JSON value and nothing else: no prose, no code fences."


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    value: BaseModel
    repaired: bool
    degraded: bool
    diagnostics: dict[str, object] | None


async def _complete(upstream: Upstream, model: str, messages: list[dict[str, str]]) -> str:
    request = ChatRequest(model=model, messages=messages, temperature=0.0, max_tokens=1024)
    parts: list[str] = []
    stream = upstream.stream(request)
    try:
        async for delta in stream:
            parts.append(delta.text)
    finally:
        await stream.aclose()
    return "".join(parts)


async def ask_json(
    upstream: Upstream,
    *,
    model: str,
    prompt: str,
    schema: type[ModelT],
    repair_template: str,
) -> JsonAnswer:
    """The model's answer to ``prompt`` as a valid ``schema`` (never raises on bad JSON)."""
    compiled = compile_schema(schema.model_json_schema(), name=schema.__name__)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    first = await _complete(upstream, model, messages)
    outcome = after_model_repair(first, compiled, ())
    repaired = False
    if isinstance(outcome, Degraded):
        fix = render_repair_prompt(
            repair_template, schema=compiled, text=first, errors=outcome.errors
        )
        reply = await _complete(upstream, model, [{"role": "user", "content": fix}])
        outcome = after_model_repair(reply, compiled, outcome.errors)
        repaired = True
    if isinstance(outcome, Degraded):
        value = schema.model_validate(_without_diagnostics(outcome.value))
        return JsonAnswer(value, repaired, True, outcome.diagnostics)
    return JsonAnswer(schema.model_validate(outcome.value), repaired, False, None)


def _without_diagnostics(value: object) -> object:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "diagnostics"}
    return value
