"""The OpenAI-compatible proxy's mode: a strategy of the turn engine, with the small-model
guardrails of docs/workflows.md. No I/O.

The proxy's conversation is the engine's (:class:`~toolforge.core.engine.Conversation`): the same
turns, tool runs, repairs and finish. What differs is how a turn is requested and read,
and that is this strategy's:

    question                     CompletionMode
    ---------------------------  ----------------------------------------------------------
    how is a turn requested?     the client's messages; on llama-server (``constrained``)
                                 a GBNF grammar that admits only a call to an offered
                                 function (``{"name", "arguments"}``, or a list of them), or
                                 the answer's JSON Schema; elsewhere (``native``) the
                                 functions as the upstream's ``tools``
    how do deltas become frames? no sentinels: text is the answer (``text.delta``), and
                                 ``<think>`` is split off (``reasoning.delta``). With
                                 tools or a JSON answer the text is *held* until the turn
                                 ends, since only the whole turn says what it is
    what is the turn?            decided at its end (:meth:`CompletionReader.finished`):
                                 the upstream's tool calls, the grammar's call, or a call
                                 rescued from text; a call to ``respond`` is the answer;
                                 a JSON answer is a body for the guarantee; no usable call
                                 where one is required, an unknown function or bad
                                 arguments: a nudge, and the engine asks once more
    how does it go on?           server tools only (the ``toolforge.server_tools``
                                 extension): an assistant message with ``tool_calls``,
                                 then a ``tool`` message each, as in native mode
    how is a body repaired?      a JSON-only prompt (+ the JSON-value grammar)

Every guardrail is switchable (:class:`Guards`); each action is a note on the turn, which
the engine counts in ``done.guardrails``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from toolforge.core.chat import ChatRequest
from toolforge.core.decisions import TurnHints
from toolforge.core.engine.modes import (
    Messages,
    NativeMode,
    ReaderLimits,
    Turn,
    TurnReader,
    _as_closed,
)
from toolforge.core.events import FrameKind
from toolforge.core.framer import BodyClosed
from toolforge.core.json_validator import StreamingJSONValidator
from toolforge.core.native_tools import (
    AssembledCall,
    ToolCallAssembler,
    to_openai_name,
)
from toolforge.core.protocol.frames import Frame, ModeName, ReasoningDelta, TextDelta
from toolforge.core.reasoning import ReasoningSplitter
from toolforge.core.rescue import canonical_tool_name, find_unknown_call, rescue_tool_calls
from toolforge.core.schemas import CompiledSchema
from toolforge.core.workflow import RESPOND
from toolforge.errors import JSONError

__all__ = [
    "RESPOND",
    "CompletionMode",
    "CompletionReader",
    "Guards",
    "Nudges",
    "PlainFramer",
    "ToolChoice",
]

_NATIVE: Final = NativeMode()

# RESPOND (core.workflow's, the one answer tool) is offered beside the client's tools too
# (docs/workflows.md): small models choose well between tools and badly between a tool and
# prose, so the answer is a call too.

ToolChoice = Literal["auto", "none", "required", "function"]


@dataclass(frozen=True, slots=True)
class Guards:
    """The small-model guardrails, each on by default and switchable per request."""

    grammar: bool = True  # constrained decoding on llama-server
    rescue: bool = True  # tool calls written as text become tool_calls
    nudge: bool = True  # no usable call where one is required, unknown tool: ask again
    respond: bool = True  # the synthetic respond tool when tools are present
    json: bool = True  # response_format json_schema: valid, repaired once, or degraded
    reasoning: bool = True  # <think>...</think> returned as reasoning_content
    # arguments held to what the user said (numbers, dates, times, identifiers), optional
    # ones nothing provides left out (toolforge.core.provenance)
    provenance: bool = True
    # constrained mode: a last user message that names an offered function (a word of its
    # name or description) is answered by a call, respond not offered (toolforge.core.relevance)
    relevance: bool = True


@dataclass(frozen=True, slots=True)
class Nudges:
    """The corrections sent to the model (``prompts/proxy_nudge_*.txt``); ``{tools}``,
    ``{name}`` and ``{problem}`` are filled in."""

    required: str = "Answer by calling one of these functions: {tools}."
    unknown: str = "There is no function named '{name}'. Call one of: {tools}."
    invalid: str = "The arguments of '{name}' are not valid: {problem}. Call it again."


class PlainFramer:
    """The turn reader's framer for text with no sentinels: the same interface as
    :class:`toolforge.core.framer.Framer` (``feed``, ``close``, ``error``, ``open_frame_id``), so
    the engine's per-token loop is the same for every mode. Text is the answer, passed on
    at once or held for the end of the turn (``hold``); ``<think>`` goes to its own frames.
    """

    __slots__ = ("_content", "_hold", "_split", "error", "open_frame_id")

    def __init__(self, *, hold: bool, reasoning: bool) -> None:
        self._hold = hold
        self._split = ReasoningSplitter() if reasoning else None
        self._content: list[str] = []
        self.error = None
        self.open_frame_id = None

    def feed(self, text: str) -> list[Any]:
        if self._split is None:
            return self._frames("", text)
        return self._frames(*self._split.feed(text))

    def close(self) -> list[Any]:
        if self._split is None:
            return []
        return self._frames(*self._split.close())

    def _frames(self, reasoning: str, content: str) -> list[Any]:
        out: list[Any] = []
        if reasoning:
            out.append(ReasoningDelta(reasoning))
        if content:
            self._content.append(content)
            if not self._hold:
                out.append(TextDelta(content))
        return out

    @property
    def content(self) -> str:
        """The answer's text so far (reasoning excluded)."""
        return "".join(self._content)


@dataclass(frozen=True, slots=True)
class CompletionMode:
    """The proxy's strategy (see the module docstring); built per request by the planner.

    ``tools``: the functions offered by name (the client's and the server tools), with
    their compiled parameter schemas; ``answer``: the JSON answer's schema
    (``response_format``), or None for text. ``extra``: what each turn's request adds (the
    grammar, or the upstream's ``tools``/``tool_choice``/``response_format``);
    ``final_extra``: the same once ``max_tool_calls`` is spent.
    """

    name: ModeName
    tools: Mapping[str, CompiledSchema] = field(default_factory=dict)
    choice: ToolChoice = "auto"
    forced: str | None = None  # tool_choice {"type": "function", ...}: its name
    guards: Guards = Guards()
    answer: CompiledSchema | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    final_extra: Mapping[str, Any] = field(default_factory=dict)
    # A turn whose last message is the user's, while tools are left, when a call is due
    # (the relevance guard): the grammar without respond. None: ``extra`` as every turn.
    call_extra: Mapping[str, Any] | None = None
    repair_grammar: str | None = None  # the answer's JSON-value grammar (constrained)
    nudges: Nudges = Nudges()
    id_prefix: str = "call_"
    drains_after_call: bool = False

    @property
    def offers_respond(self) -> bool:
        return bool(self.tools) and self.guards.respond and self.choice == "auto"

    @property
    def holds(self) -> bool:
        """Whether text waits for the end of the turn (see :class:`PlainFramer`)."""
        return bool(self.tools) or self.answer is not None

    def turn_request(
        self,
        base: ChatRequest,
        messages: Messages,
        *,
        seen_ids: set[str],
        tools_left: bool,
        hints: TurnHints | None = None,
    ) -> ChatRequest:
        extra = self.extra if tools_left else self.final_extra
        if self.call_extra is not None and tools_left and messages[-1].get("role") == "user":
            extra = self.call_extra
        if not extra and messages is base.messages:
            return base
        return dataclasses.replace(base, messages=messages, extra={**base.extra, **extra})

    def reader(self, limits: ReaderLimits, seen_ids: set[str], turn: int) -> CompletionReader:
        return CompletionReader(self, turn)

    def continuation(
        self, messages: Messages, turn: Turn, envelopes: Sequence[Mapping[str, object]]
    ) -> list[Mapping[str, Any]]:
        # Server tools only (the client's end the conversation): as in native mode.
        return _NATIVE.continuation(messages, turn, envelopes)

    def repair_request(
        self, base: ChatRequest, prompt: str, schema: CompiledSchema, body_chars: int
    ) -> ChatRequest:
        extra: dict[str, Any] = {}
        if self.repair_grammar is not None:
            extra["grammar"] = self.repair_grammar  # llama-server's GBNF field
        return ChatRequest(
            model=base.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=min(4096, 256 + body_chars),
            extra=extra,
        )


class CompletionReader(TurnReader):
    """One turn of the proxy: text through a :class:`PlainFramer`, the upstream's own
    tool calls assembled, and the turn decided at its end (:meth:`finished`)."""

    __slots__ = ("_assembler", "_mode", "_turn")

    def __init__(self, mode: CompletionMode, turn: int) -> None:
        self.framer = PlainFramer(hold=mode.holds, reasoning=mode.guards.reasoning)  # type: ignore[assignment]
        self._mode = mode
        self._turn = turn
        self._assembler = ToolCallAssembler(id_prefix=f"{mode.id_prefix}{turn}_")

    def tool_call_pieces(self, delta: Any) -> None:
        self._assembler.feed(delta.tool_calls)

    def reasoning(self, text: str) -> list[Frame]:
        if not self._mode.guards.reasoning:
            return []
        return [ReasoningDelta(text)]

    def finished(self, text: str) -> Turn:
        mode = self._mode
        content: str = self.framer.content  # type: ignore[attr-defined]
        notes: list[str] = []
        calls: list[AssembledCall] = []
        rescued: set[str] = set()
        if self._assembler.has_calls:
            calls = self._assembler.finish()
        elif mode.tools and mode.choice != "none":
            calls = self._grammar_calls(content) if mode.name == "constrained" else []
            was_rescued = False
            if not calls and mode.guards.rescue:
                # Text, or a list of calls cut by max_tokens (no JSON): rescue reads them.
                calls = self._rescued(content)
                was_rescued = True
            if len(calls) > 1:
                calls, repeats = self._once_each(calls)
                notes += ["repeated_call"] * repeats
            if was_rescued:
                rescued = {call.id for call in calls}
                notes += ["rescued"] * len(calls)
        known = self._known()
        answer: str | None = None
        usable: list[tuple[str, AssembledCall]] = []
        for call in calls:
            name = self._name(call, known)
            if name == RESPOND and mode.offers_respond:
                answer = self._respond(call)
                notes.append("respond")
                continue
            if name is None or name == RESPOND:
                if mode.guards.nudge:
                    nudge = mode.nudges.unknown.format(name=call.name, tools=self._listed())
                    return self._nudged(content, [*notes, "unknown_tool"], nudge)
                name = call.name
            problem = self._problem(name, call)
            if problem is not None and mode.guards.nudge:
                nudge = mode.nudges.invalid.format(name=name, problem=problem, tools="")
                return self._nudged(content, [*notes, "invalid_arguments"], nudge)
            usable.append((name, dataclasses.replace(call, name=_wire(name))))
        if usable:
            if answer is not None:  # the calls are the turn: the answer beside them is not
                notes = ["respond_set_aside" if n == "respond" else n for n in notes]
            # The engine's calls carry our names; the continuation's the wire names the
            # upstream was offered (``places__search`` for ``places.search``).
            closed = [dataclasses.replace(_as_closed(call), name=name) for name, call in usable]
            native = [call for _, call in usable]
            return Turn(closed, content, native, rescued=frozenset(rescued), notes=notes)
        if answer is None:
            answer = content
            if mode.tools and mode.guards.nudge and self._must_call():
                unknown = find_unknown_call(content, self._listed_names()) if content else None
                if unknown is not None:
                    nudge = mode.nudges.unknown.format(name=unknown, tools=self._listed())
                    return self._nudged(content, [*notes, "unknown_tool"], nudge)
                nudge = mode.nudges.required.format(tools=self._listed())
                return self._nudged(content, notes, nudge)
        return self._answered(content, answer, notes)

    def _answered(self, content: str, answer: str, notes: list[str]) -> Turn:
        """The turn as the answer ``answer``: a body for the JSON guarantee, or the text
        held until now."""
        mode = self._mode
        if mode.answer is not None and mode.guards.json:
            return Turn(text=content, bodies=[_answer_body(answer)], notes=notes)
        frames: list[Frame] = []
        if mode.holds and answer:
            frames.append(TextDelta(answer))
        return Turn(text=content, frames=frames, notes=notes)

    def _nudged(self, content: str, notes: list[str], nudge: str) -> Turn:
        """Ask again with ``nudge``; once no nudge is left, the turn is what it said."""
        turn = self._answered(content, content, notes)
        turn.nudge = nudge
        return turn

    # -- deciding the turn ----------------------------------------------------------------

    def _must_call(self) -> bool:
        """A reply that is not a call is refused: ``required``, one forced function, or
        ``auto`` with ``respond`` offered (the answer itself is a call then)."""
        mode = self._mode
        return mode.choice in ("required", "function") or mode.offers_respond

    def _known(self) -> list[str]:
        names = list(self._mode.tools)
        if self._mode.offers_respond:
            names.append(RESPOND)
        return names

    def _listed_names(self) -> list[str]:
        mode = self._mode
        if mode.choice == "function" and mode.forced is not None:
            return [mode.forced]
        return self._known()

    def _listed(self) -> str:
        return ", ".join(self._listed_names())

    def _name(self, call: AssembledCall, known: Sequence[str]) -> str | None:
        """The offered function ``call`` names, or None (the forced one only, if any)."""
        name = canonical_tool_name(call.name, known) or canonical_tool_name(call.tool_name, known)
        mode = self._mode
        if mode.choice == "function" and name != mode.forced:
            return None
        return name

    def _problem(self, name: str, call: AssembledCall) -> str | None:
        schema = self._mode.tools.get(name)
        try:
            value = orjson.loads(call.arguments_text or "{}")
        except orjson.JSONDecodeError as exc:
            return f"not JSON ({exc})"
        if schema is None or schema.is_valid(value):
            return None
        errors = sorted(schema.validator.iter_errors(value), key=lambda e: list(e.path))
        first = errors[0] if errors else None
        where = "/".join(str(p) for p in first.path) if first is not None else ""
        return f"{where or 'arguments'}: {first.message}" if first is not None else "invalid"

    def _respond(self, call: AssembledCall) -> str:
        """The answer a ``respond`` call carries: its ``content`` (or the JSON answer)."""
        if self._mode.answer is not None:
            return call.arguments_text
        try:
            args = orjson.loads(call.arguments_text)
        except orjson.JSONDecodeError:
            return call.arguments_text
        if isinstance(args, dict):
            value = args.get("content")
            if isinstance(value, str):
                return value
        return call.arguments_text

    def _grammar_calls(self, content: str) -> list[AssembledCall]:
        """The call(s) the constrained grammar let the model write: strict JSON,
        ``{"name", "arguments"}`` or a list of them."""
        try:
            value = orjson.loads(content.strip() or "null")
        except orjson.JSONDecodeError:
            return []
        items = value if isinstance(value, list) else [value]
        calls: list[AssembledCall] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return []
            args = item.get("arguments", {})
            calls.append(self._call(len(calls), item["name"], args))
        return calls

    def _rescued(self, content: str) -> list[AssembledCall]:
        found = rescue_tool_calls(content, self._known())
        return [self._call(i, c.name, c.arguments) for i, c in enumerate(found)]

    def _once_each(self, calls: list[AssembledCall]) -> tuple[list[AssembledCall], int]:
        """The calls of a turn's text (the grammar's list, or rescued) with each call once:
        a small model that may write a list repeats its call (the same function, the same
        arguments, until max_tokens cuts it: a loop, not a request), and a call made twice
        runs twice. Returns the calls kept, in order and numbered anew, and how many were
        dropped."""
        seen: set[tuple[str, bytes]] = set()
        kept: list[AssembledCall] = []
        for call in calls:
            try:
                args = orjson.dumps(orjson.loads(call.arguments_text), option=orjson.OPT_SORT_KEYS)
            except orjson.JSONDecodeError:
                args = call.arguments_text.encode()
            if (call.name, args) not in seen:
                seen.add((call.name, args))
                kept.append(call)
        if len(kept) == len(calls):
            return calls, 0
        renumbered = [self._call(i, c.name, c.arguments_text) for i, c in enumerate(kept)]
        return renumbered, len(calls) - len(kept)

    def _call(self, index: int, name: str, args: object) -> AssembledCall:
        text = orjson.dumps(args).decode() if not isinstance(args, str) else args
        return AssembledCall(index, f"{self._mode.id_prefix}{self._turn}_{index}", name, text)


def _wire(name: str) -> str:
    """``name`` as an OpenAI function name where it has to change (dots), else as is."""
    try:
        return to_openai_name(name)
    except ValueError:
        return name


def _answer_body(text: str) -> BodyClosed:
    """The JSON answer as the engine's RESULT body: parsed strictly, decided by the
    guarantee against ``result_schema`` (valid, repaired once, or degraded)."""
    validator = StreamingJSONValidator(frame_id="r1")
    value: object = None
    error: JSONError | None = None
    try:
        validator.feed(text)
        value = validator.close()
    except JSONError as exc:
        error = exc
    return BodyClosed(
        FrameKind.RESULT, "r1", "answer", text, value, error, len(text.encode("utf-8"))
    )
