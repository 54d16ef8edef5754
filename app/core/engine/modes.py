"""The three modes of docs/protocol.md as strategies of the turn engine. No I/O.

A mode answers four questions, and only a mode answers them (the engine has no
``if mode == ...``):

    question                       sentinel           constrained          native
    -----------------------------  -----------------  -------------------  --------------------
    how is a turn requested?       the messages       + the turn's GBNF    + the upstream's tools
                                                      (ids, tools left)    (in the plan's extra)
    how do deltas become frames?   the Framer         the Framer           the Framer, and the
                                                                           tool_calls assembled
    how does the conversation go   the model's text   as sentinel          an assistant message
    on after its tool calls?       up to END, then a                       with tool_calls, then
                                   user message with                       a tool message each
                                   the result
    how is a body repaired?        a JSON-only prompt + a JSON-value GBNF  as sentinel

Constrained mode also *drains* after a tool call: its grammar ends the generation at the
call's END, so the finish reason and usage follow at once and are worth reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from toolforge.core.chat import ChatRequest, UpstreamDelta
from toolforge.core.compiler import clean_schema
from toolforge.core.decisions import TurnHints
from toolforge.core.events import FrameKind
from toolforge.core.framer import BodyClosed, Framer
from toolforge.core.gbnf import FrameGrammar
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.core.messages import Message, MessageMeta, MessageType, message
from toolforge.core.native_tools import (
    AssembledCall,
    ToolCallAssembler,
    assistant_tool_call_message,
    from_openai_name,
    to_openai_name,
    tool_result_message,
)
from toolforge.core.prompt import render_tool_result
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import Frame, ModeName
from toolforge.core.schemas import CompiledSchema
from toolforge.errors import JSONError

__all__ = [
    "ConstrainedMode",
    "Mode",
    "NativeMode",
    "ReaderLimits",
    "SentinelMode",
    "Turn",
    "TurnReader",
    "mode_named",
]

Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ReaderLimits:
    """docs/protocol.md's per-frame limits, as the Framer takes them."""

    max_frame_bytes: int = 64 * 1024
    max_json_depth: int = 16


@dataclass(slots=True)
class Turn:
    """How one generation ended: the tool calls it made (none: the conversation is over),
    the text to record as the model's, and (native mode) the calls as the upstream sent
    them, for the continuation.

    A reader that decides only at the end of the turn (the OpenAI-compatible proxy's, see
    :mod:`toolforge.core.engine.completion`) also says what to emit now (``frames``), which
    bodies the JSON guarantee decides (``bodies``), which calls it rescued from text
    (``rescued``: their ids), what its guardrails did (``notes``, counted in
    ``done.guardrails``), and whether to ask again: ``nudge`` is the correction for the
    model, and the turn is then not shown at all.
    """

    calls: list[BodyClosed] = field(default_factory=list)
    text: str = ""
    native: list[AssembledCall] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    bodies: list[BodyClosed] = field(default_factory=list)
    rescued: frozenset[str] = frozenset()
    notes: list[str] = field(default_factory=list)
    nudge: str | None = None


class TurnReader:
    """How one generation's deltas become frames: the sentinel Framer (the engine feeds
    it the text itself: that is the per-token path) and, in native mode, the tool calls."""

    __slots__ = ("framer",)

    def __init__(self, limits: ReaderLimits, seen_ids: set[str]) -> None:
        self.framer = Framer(
            max_frame_bytes=limits.max_frame_bytes,
            max_depth=limits.max_json_depth,
            seen_ids=seen_ids,
        )

    def tool_call_pieces(self, delta: UpstreamDelta) -> None:
        """Native tool-call pieces: not for this mode (an upstream that sends them unasked
        is ignored, as before)."""

    def reasoning(self, text: str) -> list[Frame]:
        """The upstream's own reasoning (``reasoning_content``): not part of the frames of
        ``/v1/stream`` (ignored, as before); the proxy's reader returns it."""
        return []

    def ended_at(self, call: BodyClosed, text: str) -> Turn:
        """The turn ended at a sentinel tool call's END; ``text`` is the model's text so
        far, and the turn's is that text up to and including the END.

        The real END is the last occurrence so far: an earlier one can only sit inside a
        JSON string of the body (where it is content). The model's text after the END in
        the same chunk is dropped: the model should have stopped there.
        """
        end = sentinels.end(FrameKind.TOOL_CALL, call.id)
        cut = text.rfind(end)
        return Turn([call], text[: cut + len(end)] if cut >= 0 else text)

    def finished(self, text: str) -> Turn:
        """The generation ended (``text``: all it said) without a sentinel tool call."""
        return Turn()


class NativeTurnReader(TurnReader):
    """Native mode: text is framed as in sentinel mode, and the upstream's own
    ``tool_calls`` pieces are assembled into calls at the end of the generation."""

    __slots__ = ("_assembler",)

    def __init__(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> None:
        super().__init__(limits, seen_ids)
        self._assembler = ToolCallAssembler(id_prefix=f"call_{turn}_")

    def tool_call_pieces(self, delta: UpstreamDelta) -> None:
        self._assembler.feed(delta.tool_calls)

    def finished(self, text: str) -> Turn:
        if not self._assembler.has_calls:
            return Turn()
        # finish_reason "tool_calls" (or "stop" from servers that say so anyway)
        native = self._assembler.finish()
        return Turn([_as_closed(c) for c in native], text, native)


class Mode(Protocol):
    """A mode of docs/protocol.md: how turns are requested, read, continued and repaired."""

    @property
    def name(self) -> ModeName: ...

    @property
    def drains_after_call(self) -> bool:
        """Read the generation's trailing chunks after a tool call's END (usage)."""
        ...

    def turn_request(
        self,
        base: ChatRequest,
        messages: Messages,
        *,
        seen_ids: set[str],
        tools_left: bool,
        hints: TurnHints | None = None,
    ) -> ChatRequest:
        """The next turn's request: ``base`` with ``messages``; ``hints``: a workflow's
        constraints on the turn (constrained mode's grammar honours them)."""
        ...

    def reader(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> TurnReader:
        """A reader for turn number ``turn`` (from 1)."""
        ...

    def continuation(
        self, messages: Messages, turn: Turn, envelopes: Sequence[Mapping[str, object]]
    ) -> list[Mapping[str, Any]]:
        """The messages after ``turn``'s calls ran: ``envelopes`` answer them in order."""
        ...

    def repair_request(
        self, base: ChatRequest, prompt: str, schema: CompiledSchema, body_chars: int
    ) -> ChatRequest:
        """The one model call that repairs a body (temperature 0)."""
        ...


@dataclass(frozen=True, slots=True)
class SentinelMode:
    """Any OpenAI-compatible upstream; the system prompt teaches the sentinel contract."""

    name: ModeName = "sentinel"
    drains_after_call: bool = False

    def turn_request(
        self,
        base: ChatRequest,
        messages: Messages,
        *,
        seen_ids: set[str],
        tools_left: bool,
        hints: TurnHints | None = None,
    ) -> ChatRequest:
        if messages is base.messages:
            return base
        return dataclasses.replace(base, messages=messages)

    def reader(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> TurnReader:
        return TurnReader(limits, seen_ids)

    def continuation(
        self, messages: Messages, turn: Turn, envelopes: Sequence[Mapping[str, object]]
    ) -> list[Mapping[str, Any]]:
        # A sentinel turn ends at its first tool call: one call, one envelope. The result
        # goes back as a user message, which every chat template accepts.
        (call,), (envelope,) = turn.calls, envelopes
        return [
            *messages,
            message("assistant", turn.text, MessageType.TOOL_CALL, tools=(call.name,)),
            message(
                "user",
                render_tool_result(call.id, call.name, envelope),
                MessageType.TOOL_RESULT,
                tools=(call.name,),
            ),
        ]

    def repair_request(
        self, base: ChatRequest, prompt: str, schema: CompiledSchema, body_chars: int
    ) -> ChatRequest:
        return dataclasses.replace(
            base,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=min(4096, 256 + body_chars),
        )


@dataclass(frozen=True, slots=True)
class ConstrainedMode:
    """Sentinel mode plus a GBNF grammar on every request (llama-server): each turn's
    grammar allows only the ids after those seen and no tool call once ``max_tool_calls``
    are spent; the repair call's grammar allows only the JSON value."""

    grammar: FrameGrammar
    name: ModeName = "constrained"
    drains_after_call: bool = True

    def turn_request(
        self,
        base: ChatRequest,
        messages: Messages,
        *,
        seen_ids: set[str],
        tools_left: bool,
        hints: TurnHints | None = None,
    ) -> ChatRequest:
        request = _SENTINEL.turn_request(base, messages, seen_ids=seen_ids, tools_left=tools_left)
        if hints is None:
            return _with_grammar(request, self.grammar.next_turn(seen_ids, allow_tools=tools_left))
        grammar = self.grammar.next_turn(
            seen_ids,
            allow_tools=tools_left,
            narrowed=hints.narrowed,
            allow_result=hints.allow_result,
            free_text=hints.free_text,
        )
        return _with_grammar(request, grammar)

    def reader(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> TurnReader:
        return TurnReader(limits, seen_ids)

    def continuation(
        self, messages: Messages, turn: Turn, envelopes: Sequence[Mapping[str, object]]
    ) -> list[Mapping[str, Any]]:
        return _SENTINEL.continuation(messages, turn, envelopes)

    def repair_request(
        self, base: ChatRequest, prompt: str, schema: CompiledSchema, body_chars: int
    ) -> ChatRequest:
        request = _SENTINEL.repair_request(base, prompt, schema, body_chars)
        return _with_grammar(request, self.grammar.json_value(schema.schema))


@dataclass(frozen=True, slots=True)
class NativeMode:
    """The upstream's own ``tool_calls`` (its tools are in the plan's request ``extra``);
    frames of text as in sentinel mode. ``schema_format``: the upstream constrains its
    output to a JSON Schema given as ``format`` (Ollama), and has no ``tool_choice``: a
    workflow's turn that must call is asked for the call as that JSON (read back as the
    call by the workflow's rescue)."""

    name: ModeName = "native"
    drains_after_call: bool = False
    schema_format: bool = False

    def turn_request(
        self,
        base: ChatRequest,
        messages: Messages,
        *,
        seen_ids: set[str],
        tools_left: bool,
        hints: TurnHints | None = None,
    ) -> ChatRequest:
        request = _SENTINEL.turn_request(base, messages, seen_ids=seen_ids, tools_left=tools_left)
        if hints is None or not isinstance(base.extra.get("tools"), list):
            return request
        extra = _native_constraint(base.extra, hints)
        if self.schema_format and hints.tool_choice not in (None, "auto") and extra.get("tools"):
            extra["format"] = _call_format(extra["tools"])
        return dataclasses.replace(request, extra=extra)

    def reader(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> TurnReader:
        return NativeTurnReader(limits, seen_ids, turn)

    def continuation(
        self, messages: Messages, turn: Turn, envelopes: Sequence[Mapping[str, object]]
    ) -> list[Mapping[str, Any]]:
        if not turn.native:  # the model wrote a sentinel call in its text: answered so
            return _SENTINEL.continuation(messages, turn, envelopes)
        return [
            *messages,
            Message(
                assistant_tool_call_message(turn.native, turn.text),
                MessageMeta(MessageType.TOOL_CALL, tools=tuple(c.tool_name for c in turn.native)),
            ),
            *(
                Message(
                    tool_result_message(call.id, dict(envelope)),
                    MessageMeta(MessageType.TOOL_RESULT, tools=(call.name,)),
                )
                for call, envelope in zip(turn.native, envelopes, strict=True)
            ),
        ]

    def repair_request(
        self, base: ChatRequest, prompt: str, schema: CompiledSchema, body_chars: int
    ) -> ChatRequest:
        return _SENTINEL.repair_request(base, prompt, schema, body_chars)


_SENTINEL: Final = SentinelMode()
# The stateless strategies, built once: a plan asks for one per stream.
_MODES: Final[Mapping[str, Mode]] = {"sentinel": _SENTINEL, "native": NativeMode()}


def mode_named(name: str, grammar: FrameGrammar | None = None) -> Mode:
    """The strategy for a mode name: ``constrained`` needs its ``grammar``."""
    if name == "constrained":
        if grammar is None:
            raise ValueError("constrained mode needs a grammar")
        return ConstrainedMode(grammar)
    return _MODES[name]


def _with_grammar(chat: ChatRequest, grammar: str) -> ChatRequest:
    # ``grammar``: llama-server's request field for a GBNF grammar.
    return dataclasses.replace(chat, extra={**chat.extra, "grammar": grammar})


def _as_closed(call: AssembledCall) -> BodyClosed:
    """A native tool call as the framer would have closed it: parsed strictly, so every
    mode runs tools under exactly the same rules."""
    validator = StreamingJSONValidator(frame_id=call.id)
    value: object = None
    error: JSONError | None = None
    try:
        validator.feed(call.arguments_text)
        value = validator.close()
    except JSONError as exc:
        error = exc
    return BodyClosed(
        FrameKind.TOOL_CALL,
        call.id,
        call.tool_name,
        call.arguments_text,
        value,
        error,
        len(call.arguments_text.encode("utf-8")),
    )


def _native_constraint(extra: Mapping[str, Any], hints: TurnHints) -> dict[str, Any]:
    """A workflow's turn constraint for an upstream's own function calling: its ``tools``
    cut to the legal ones, their parameters narrowed, and ``tool_choice`` naming the one
    legal tool (or ``required``) while a call is due (toolforge.core.compiler)."""
    tools: list[Any] = []
    for tool in extra["tools"]:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        wire = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(wire, str):
            tools.append(tool)
            continue
        name = from_openai_name(wire)
        if name not in hints.narrowed:
            tools.append(tool)
            continue
        schema = hints.narrowed[name]
        if schema is not None:
            tools.append({**tool, "function": {**fn, "parameters": clean_schema(schema)}})
    if not tools:  # nothing callable this turn: no tools at all (an empty list is refused)
        return {k: v for k, v in extra.items() if k not in ("tools", "tool_choice")}
    out = {**extra, "tools": tools}
    if hints.tool_choice is not None:
        choice = hints.tool_choice
        named = choice.get("function") if isinstance(choice, Mapping) else None
        if isinstance(named, Mapping):
            wire_name = to_openai_name(str(named.get("name")))
            if any(t.get("function", {}).get("name") == wire_name for t in tools):
                choice = {"type": "function", "function": {"name": wire_name}}
            else:
                choice = "required"  # the legal tool is not the upstream's: any of them
        out["tool_choice"] = choice
    return out


def _call_format(tools: Sequence[Any]) -> dict[str, Any]:
    """The JSON Schema of one call to one of ``tools`` (OpenAI tool objects), as Ollama's
    ``format``: ``{"name": <a tool>, "arguments": <its parameters>}``."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["function"]["name"]},
                    "arguments": tool["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
            }
            for tool in tools
        ]
    }
