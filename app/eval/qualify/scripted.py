"""Scripted models for the offline eval: deterministic stand-ins that follow a script of
turns, each one needing a guardrail the way a small model does.

A :class:`ScriptedModel` is an :class:`~toolforge.upstream.base.Upstream`: the runner asks
it for a turn and it streams the next turn of its script, whatever it was sent (a small
model does not read carefully either). Once the script is spent it answers with an empty
turn. It records every request, so a test can also check what the model was *sent* (a
grammar, a nudge, a compacted history).

The models (:data:`MODELS`), each a function of the scenario:

* ``perfect``: the ideal path, one call a turn, as sentinel frames (or native calls).
* ``needs_rescue``: writes its first call as a JSON code fence instead of a frame.
* ``needs_steps``: calls the terminal tool first, with made-up arguments.
* ``needs_nudge``: answers its first turn in prose, with no call.
* ``needs_recovery``: gives its first call arguments the tool refuses, then corrects them.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.events import FrameKind
from toolforge.core.native_tools import ToolCallDelta
from toolforge.core.protocol import sentinels
from toolforge.eval.qualify.scenario import Scenario

__all__ = ["MODELS", "ScriptedModel", "Turn", "call_turn", "scripted"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One model turn: text (frames included) or native tool calls."""

    text: str = ""
    calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()


def call_turn(name: str, args: Mapping[str, Any]) -> Turn:
    return Turn(calls=((name, args),))


@dataclass
class ScriptedModel:
    """An :class:`~toolforge.upstream.base.Upstream` that plays ``turns`` in order."""

    turns: Sequence[Turn]
    native: bool = False
    requests: list[ChatRequest] = field(default_factory=list)
    _next: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def stream(self, request: ChatRequest) -> AsyncGenerator[UpstreamDelta, None]:
        self.requests.append(request)
        turn = self.turns[self._next] if self._next < len(self.turns) else Turn()
        self._next += 1
        usage = {"prompt_tokens": 10 * len(request.messages), "completion_tokens": 5}
        if self.native and turn.calls:
            deltas = tuple(
                ToolCallDelta(i, f"call_{next(self._ids)}", name, orjson.dumps(args).decode())
                for i, (name, args) in enumerate(turn.calls)
            )
            yield UpstreamDelta(text="", tool_calls=deltas)
            yield UpstreamDelta(text="", finish_reason="tool_calls", usage=usage)
            return
        text = turn.text + "".join(
            sentinels.frame(
                FrameKind.TOOL_CALL,
                f"c{next(self._ids)}",
                name,
                orjson.dumps(args).decode(),
            )
            for name, args in turn.calls
        )
        # Two pieces, so the framer sees a frame split across deltas as it would live.
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            if piece:
                yield UpstreamDelta(text=piece)
        yield UpstreamDelta(text="", finish_reason="stop", usage=usage)


def _ideal(s: Scenario) -> list[Turn]:
    return [call_turn(name, args) for name, args in s.ideal_path]


def _needs_rescue(s: Scenario) -> list[Turn]:
    name, args = s.ideal_path[0]
    fence = "```json\n" + orjson.dumps({"name": name, "arguments": args}).decode() + "\n```"
    return [Turn(text=f"I will call the tool.\n{fence}"), *_ideal(s)[1:]]


def _needs_steps(s: Scenario) -> list[Turn]:
    terminal = s.ideal_path[-1][0]
    made_up = {k: ("unknown" if isinstance(v, str) else 7) for k, v in s.ideal_path[-1][1].items()}
    return [call_turn(terminal, made_up), *_ideal(s)]


def _needs_nudge(s: Scenario) -> list[Turn]:
    return [Turn(text="Sure, I can help with that."), *_ideal(s)]


def _needs_recovery(s: Scenario) -> list[Turn]:
    name, args = s.ideal_path[0]
    broken = {**args, "unexpected_argument": True}  # StrictArgs refuses it
    return [call_turn(name, broken), *_ideal(s)]


MODELS: Final[Mapping[str, Callable[[Scenario], list[Turn]]]] = {
    "perfect": _ideal,
    "needs_rescue": _needs_rescue,
    "needs_steps": _needs_steps,
    "needs_nudge": _needs_nudge,
    "needs_recovery": _needs_recovery,
}


def scripted(name: str, scenario: Scenario, *, native: bool = False) -> ScriptedModel:
    """A fresh scripted model ``name`` for one run of ``scenario``."""
    try:
        script = MODELS[name]
    except KeyError:
        raise KeyError(f"no scripted model {name!r}; known: {', '.join(MODELS)}") from None
    return ScriptedModel(script(scenario), native=native)
