"""The scripted model behind the client tests (the TypeScript SDK, the web UI): one
upstream that answers every test case, chosen by a ``[case:<name>]`` tag in the request's
first user message and by the turn (how many assistant messages the conversation has).

A tag, not a queue of scripts: ``node --test`` runs its files in parallel, so requests do
not arrive in a fixed order. The scripts are data; the clients' tests know what each case
sends (``clients/ts/test/*.test.mjs`` recompute the long texts with the same formulas).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.core.tool_specs import ToolRegistry
from toolforge.eval.loopback import Harness, start_gateway
from toolforge.eval.scripted_upstream import Script, ScriptedUpstream, ScriptLike, Step
from toolforge.tools import default_registry

__all__ = [
    "DEMO_INPUT",
    "PAUSE_CHUNKS",
    "PAUSE_CHUNK_CHARS",
    "WEATHER",
    "XSS",
    "approval_registry",
    "pause_chunk",
    "script_for",
    "serve_cases",
]

_CASE: Final = re.compile(r"\[case:([a-z_]+)\]")

DEMO_INPUT: Final = "Find pizza near me; book a table for 2 at 7pm if open."

WEATHER: Final = {
    "name": "get_weather",
    "description": "The weather in a city, from the user's device.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

# The pause case: enough text to fill the socket buffers on both sides of loopback and
# then the gateway's frame queue, so that a paused client really stops the upstream.
PAUSE_CHUNKS: Final = 1500
PAUSE_CHUNK_CHARS: Final = 4000


def pause_chunk(i: int) -> str:
    """The pause case's i-th text chunk (clients/ts/test/pause.test.mjs: the same)."""
    head = f"<{i}>"
    return head + "x" * (PAUSE_CHUNK_CHARS - len(head))


def _tokens(text: str, size: int = 7, delay_ms: float = 0) -> list[Step]:
    return [Step(text=text[i : i + size], delay_ms=delay_ms) for i in range(0, len(text), size)]


def _script(
    *texts: str, delay_ms: float = 0, size: int = 7, usage: dict[str, Any] | None = None
) -> Script:
    steps = [step for text in texts for step in _tokens(text, size, delay_ms)]
    # Usage in a chunk of its own, first: the gateway stops reading a turn at a tool call's
    # END, before the finish chunk where a server puts it.
    first = (Step(usage=usage),) if usage is not None else ()
    return Script(steps=(*first, *steps, Step(finish="stop")))


# What llama-server and OpenAI report: counts, and nested details among them.
DEMO_USAGE: dict[str, Any] = {
    "prompt_tokens": 812,
    "completion_tokens": 41,
    "total_tokens": 853,
    "prompt_tokens_details": {"cached_tokens": 768},
}


def _call(fid: str, name: str, args: object) -> str:
    return sentinels.frame(FrameKind.TOOL_CALL, fid, name, orjson.dumps(args).decode())


def _reply(answer: str, rid: str = "r1") -> str:
    body = orjson.dumps({"answer": answer, "citations": []}).decode()
    return sentinels.frame(FrameKind.RESULT, rid, "AssistantReply", body)


def _object(oid: str, schema: str, value: object) -> str:
    return sentinels.frame(FrameKind.OBJECT, oid, schema, orjson.dumps(value).decode())


def _demo(turn: int) -> ScriptLike:
    """The demo request (docs/protocol.md): search, book, an Action object, the reply."""
    if turn == 0:
        search = {"query": "pizza", "radius_km": 5, "open_at": "19:00"}
        return _script(
            "Let me look for pizza places. ",
            _call("t1", "places.search", search),
            usage=DEMO_USAGE,
        )
    if turn == 1:
        booking = {"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}
        return _script(
            "Trattoria Roma is open at 7pm. ",
            _call("t2", "bookings.create", booking),
        )
    action = {"mode": "book", "target": {"kind": "place", "id": "trattoria-roma"}}
    return _script(
        "Booked. ",
        _object("o1", "Action", action),
        _reply("Booked a table for 2 at Trattoria Roma at 19:00."),
    )


def _client(turn: int) -> ScriptLike:
    if turn == 0:
        return _script("Checking the weather. ", _call("t1", "get_weather", {"city": "Oslo"}))
    return _script(_reply("It is sunny in Oslo."))


def _approve(turn: int) -> ScriptLike:
    """A call that a person must approve (conf.approve of the conformance tool pack)."""
    if turn == 0:
        return _script("I need your go-ahead. ", _call("t1", "conf.approve", {"action": "order"}))
    return _script(_reply("Done: the order is placed."))


def _clock(turn: int) -> ScriptLike:
    """The web UI's client-side tool, browser.clock, run by the page."""
    if turn == 0:
        return _script("Let me check your clock. ", _call("t1", "browser.clock", {}))
    return _script(_reply("Got your time."))


def _pause(turn: int) -> ScriptLike:
    steps = [Step(text=pause_chunk(i)) for i in range(PAUSE_CHUNKS)]
    return Script(steps=(*steps, *_tokens(_reply("That was long.")), Step(finish="stop")))


def _drop(turn: int) -> ScriptLike:
    """Slow enough that a connection cut after the first frames leaves most of it to come."""
    words = " ".join(f"w{i}" for i in range(60))
    return _script(words + " ", _reply("Still here."), delay_ms=10, size=6)


def _slow(turn: int) -> ScriptLike:
    """A model that trickles for ten seconds: cancel and the request timeout stop it."""
    return Script(steps=tuple(Step(text=f"t{i} ", delay_ms=50) for i in range(200)))


XSS: Final = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


def _xss(turn: int) -> ScriptLike:
    """Model text that is HTML: a client must show it as text, never run it."""
    return _script(f"Here: {XSS} ", _reply(f"Answer {XSS}"))


_CASES: Final[dict[str, Callable[[int], ScriptLike]]] = {
    "demo": _demo,
    "client": _client,
    "clock": _clock,
    "approve": _approve,
    "pause": _pause,
    "drop": _drop,
    "slow": _slow,
    "xss": _xss,
}


def approval_registry() -> ToolRegistry:
    """The demo tools, with ``bookings.create`` waiting for a person's approval: the web
    UI's demo (a booking is the kind of call a person confirms)."""
    return ToolRegistry(
        [
            dataclasses.replace(spec, needs_approval=True)
            if spec.name == "bookings.create"
            else spec
            for spec in default_registry()
        ]
    )


_NO_ROUTE: Final = Script(end="status", status=404, body='{"error": {"message": "no route"}}')


def script_for(request: Any) -> ScriptLike:
    """The scripted upstream's ``script_for``: the case's script for this turn. Requests
    that are not chat completions (the mode probe's ``GET /props``) get a 404."""
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return _NO_ROUTE
    messages: list[dict[str, Any]] = request["messages"]
    first_user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    match = _CASE.search(str(first_user))
    if match is None:
        # The web UI's default request is the demo, untagged.
        return _demo(sum(m.get("role") == "assistant" for m in messages))
    case = _CASES.get(match.group(1))
    if case is None:
        return Script(end="status", status=400, body='{"error": {"message": "unknown case"}}')
    return case(sum(m.get("role") == "assistant" for m in messages))


async def serve_cases(
    stack: contextlib.AsyncExitStack, artifacts: Path, tools: ToolRegistry
) -> Harness:
    """A gateway on loopback, owned by ``stack``, in front of an upstream that answers
    every case of this module."""
    upstream = await stack.enter_async_context(ScriptedUpstream(script_for=script_for))
    return await start_gateway(stack, artifacts, upstream_base_url=upstream.base_url, tools=tools)
