"""Native tool calls (docs/protocol.md, ``native`` mode): the upstream's own ``tool_calls``.

Two halves, both sans-IO:

* :class:`ToolCallAssembler` turns the streamed pieces (:class:`ToolCallDelta`, parsed
  from ``delta.tool_calls`` by the adapters, which re-export it from
  :mod:`toolforge.upstream.base`) into whole calls.
* :func:`to_openai_tools`, :func:`assistant_tool_call_message` and
  :func:`tool_result_message` build the OpenAI wire shapes: the ``tools`` offered, and the
  two messages that continue the conversation after the calls ran (docs/tools.md: wire formats
  are adapters over :class:`toolforge.core.tool_specs.ToolSpec`).

Theory of operation of the assembler. OpenAI streams each call as pieces that share an
``index``: the first carries ``id`` and ``function.name``, the rest argument fragments to
concatenate. Servers differ (see ``toolforge.upstream.openai_compat._parse_tool_calls``), so a
piece is placed by these rules, in order:

1. A piece with an ``index`` continues the call last seen at that index, unless it plainly
   belongs to another call: its ``id`` differs from that call's, or (without ids) its
   name does. Then it starts a new call: Ollama's ``/v1`` reuses index 0 for every
   parallel call on some models (ollama/ollama#15457; vercel/ai#14277 applies the same fix).
2. A piece without ``index`` (Ollama's ``/v1`` before 0.4.7, ollama/ollama#7881)
   continues the most recent call when it carries neither ``id`` nor name, or that call's
   ``id``, or fills in what that call still lacks; otherwise (a second name, another id)
   it starts a new call.
3. A new call gets the upstream's index when it is free, else the next one after the
   highest in use; :attr:`AssembledCall.index` is always unique.
4. At :meth:`~ToolCallAssembler.finish` a call without an ``id``, or with one an earlier
   call already has, gets ``<id_prefix><index>`` (made unique); a call without a name is
   ``NATIVE_TOOL_CALL_MALFORMED``.

The result does not depend on how the upstream groups pieces into chunks (the tests feed
each stream whole, piece by piece and at random splits). Errors are sticky, as in h11:
after one, ``feed`` and ``finish`` raise it again.

Names: OpenAI function names must match ``^[a-zA-Z0-9_-]{1,64}$``, and ours are dotted
(``places.search``). On the wire a dot is written ``__`` (``places__search``);
:func:`from_openai_name` maps back. A name whose mapping would not come back unchanged
(``a__b``, ``a_.b``) or does not fit the pattern cannot be offered natively and is refused
by :func:`to_openai_name`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from toolforge.core.tool_specs import MAX_ARGS_BYTES
from toolforge.errors import ErrorCode, ModelBehaviorError

__all__ = [
    "MAX_NATIVE_CALLS",
    "AssembledCall",
    "ToolCallAssembler",
    "ToolCallDelta",
    "assistant_tool_call_message",
    "from_openai_name",
    "to_openai_name",
    "to_openai_tools",
    "tool_result_message",
]

MAX_NATIVE_CALLS: Final = 16
"""Calls per model turn. OpenAI documents no limit; 16 is far above what a turn needs
(parallel calls are usually 2-5) and bounds what a looping model can make us hold."""

_OPENAI_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_DOT: Final = "__"
_EMPTY_OBJECT: Final = "{}"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One piece of a native tool call, as the upstream streamed it.

    Fields are what the chunk carried, unchecked against earlier pieces: ``index`` and
    ``id`` are ``None`` where the upstream left them out, ``name`` usually comes once, in
    the first piece, and ``arguments`` is the raw JSON-text fragment ("" when absent).
    Defined here rather than in :mod:`toolforge.upstream.base` (which re-exports it) because
    core imports no other layer.
    """

    index: int | None
    id: str | None
    name: str | None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class AssembledCall:
    """One complete native tool call.

    ``name`` is the wire name as the model wrote it (``places__search``); :attr:`tool_name`
    is ours (``places.search``). ``arguments_text`` is the raw JSON text, unchecked
    (``"{}"`` when the model sent none or only whitespace, as models do for tools without
    parameters): validate it with :func:`toolforge.core.tool_specs.parse_args`.
    """

    index: int
    id: str
    name: str
    arguments_text: str

    @property
    def tool_name(self) -> str:
        """The tool's own name: :func:`from_openai_name` of :attr:`name`."""
        return from_openai_name(self.name)


class _Call:
    """A call being assembled (mutable; private to the assembler)."""

    __slots__ = ("id", "index", "name", "parts", "size")

    def __init__(self, index: int) -> None:
        self.index = index
        self.id: str | None = None
        self.name: str | None = None
        self.parts: list[str] = []
        self.size = 0  # UTF-8 bytes of the arguments so far


class ToolCallAssembler:
    """Assembles one model turn's streamed tool-call pieces (see the module docstring).

    ``feed`` every :attr:`UpstreamDelta.tool_calls <toolforge.upstream.base.UpstreamDelta>` as it
    arrives, then ``finish`` once the turn ended. Use one assembler per turn; give each
    turn of a stream its own ``id_prefix`` (``"call_1_"``, ...) when ids must be unique
    across the stream. Limits: at most ``max_calls`` calls (``TOOL_CALL_LIMIT``) and
    ``max_argument_bytes`` of UTF-8 arguments per call (``ARGUMENTS_TOO_LARGE``), both
    :class:`~toolforge.errors.ModelBehaviorError` raised by ``feed`` as soon as they are
    passed, so the caller can stop the upstream.
    """

    __slots__ = (
        "_by_wire",
        "_calls",
        "_error",
        "_id_prefix",
        "_last",
        "_max_argument_bytes",
        "_max_calls",
        "_next_index",
        "_result",
    )

    def __init__(
        self,
        *,
        id_prefix: str = "call_",
        max_calls: int = MAX_NATIVE_CALLS,
        max_argument_bytes: int = MAX_ARGS_BYTES,
    ) -> None:
        self._id_prefix = id_prefix
        self._max_calls = max_calls
        self._max_argument_bytes = max_argument_bytes
        self._calls: dict[int, _Call] = {}  # by our index
        self._by_wire: dict[int, _Call] = {}  # upstream index -> the call it means now
        self._last: _Call | None = None
        self._next_index = 0
        self._error: ModelBehaviorError | None = None
        self._result: list[AssembledCall] | None = None

    @property
    def has_calls(self) -> bool:
        """Whether any tool-call piece arrived (some servers then finish with ``stop``)."""
        return bool(self._calls)

    def feed(self, deltas: Iterable[ToolCallDelta]) -> None:
        """Take the pieces of one chunk (or of several, or one piece: all the same)."""
        if self._error is not None:
            raise self._error
        if self._result is not None:
            raise RuntimeError("ToolCallAssembler.feed() after finish()")
        try:
            for delta in deltas:
                self._place(delta)
        except ModelBehaviorError as exc:
            self._error = exc
            raise

    def finish(self) -> list[AssembledCall]:
        """The calls, ordered by index. Raises ``NATIVE_TOOL_CALL_MALFORMED`` for a call
        without a name. Calling it again returns the same calls."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            try:
                self._result = self._assemble()
            except ModelBehaviorError as exc:
                self._error = exc
                raise
        return list(self._result)

    # -- placing pieces ----------------------------------------------------------------

    def _place(self, delta: ToolCallDelta) -> None:
        wire = delta.index
        if wire is None:
            call = self._last
            if call is None or _starts_another(call, delta, indexed=False):
                call = self._open(None)
        else:
            found = self._by_wire.get(wire)
            if found is None or _starts_another(found, delta, indexed=True):
                call = self._open(wire)
                self._by_wire[wire] = call
            else:
                call = found
        self._last = call
        if delta.id is not None and call.id is None:
            call.id = delta.id
        if delta.name is not None:
            if call.name is None:
                call.name = delta.name
            elif call.name != delta.name:  # same id, two names: which tool to run?
                raise ModelBehaviorError(
                    ErrorCode.NATIVE_TOOL_CALL_MALFORMED,
                    f"native tool call {call.id!r} was named both {call.name!r} and {delta.name!r}",
                )
        fragment = delta.arguments
        if fragment:
            # str.isascii() is O(1) in CPython; only non-ASCII text is encoded to count.
            size = len(fragment) if fragment.isascii() else _utf8_len(fragment)
            call.size += size
            if call.size > self._max_argument_bytes:
                raise ModelBehaviorError(
                    ErrorCode.ARGUMENTS_TOO_LARGE,
                    f"native tool call {call.index} ({call.name or 'unnamed'}) has more than "
                    f"{self._max_argument_bytes} bytes of arguments",
                    details=[{"size": str(call.size), "limit": str(self._max_argument_bytes)}],
                )
            call.parts.append(fragment)

    def _open(self, wire: int | None) -> _Call:
        if len(self._calls) >= self._max_calls:
            raise ModelBehaviorError(
                ErrorCode.TOOL_CALL_LIMIT,
                f"the model made more than {self._max_calls} native tool calls in one turn",
            )
        index = wire if wire is not None and wire not in self._calls else self._next_index
        self._next_index = max(self._next_index, index + 1)
        call = self._calls[index] = _Call(index)
        if wire is None:
            # A later piece that names this index means this call (a server that adds
            # the index after the first piece).
            self._by_wire.setdefault(index, call)
        return call

    def _assemble(self) -> list[AssembledCall]:
        calls = [self._calls[i] for i in sorted(self._calls)]
        for call in calls:
            if call.name is None:
                raise ModelBehaviorError(
                    ErrorCode.NATIVE_TOOL_CALL_MALFORMED,
                    f"native tool call {call.index} (id {call.id!r}) has no function name",
                )
        taken = {call.id for call in calls if call.id is not None}
        seen: set[str] = set()
        out: list[AssembledCall] = []
        for call in calls:
            call_id = call.id
            if call_id is None or call_id in seen:
                call_id = base = f"{self._id_prefix}{call.index}"
                suffix = 1
                while call_id in taken:
                    call_id = f"{base}_{suffix}"
                    suffix += 1
                taken.add(call_id)
            seen.add(call_id)
            arguments = "".join(call.parts)
            assert call.name is not None
            out.append(
                AssembledCall(
                    call.index,
                    call_id,
                    call.name,
                    arguments if arguments.strip() else _EMPTY_OBJECT,
                )
            )
        return out


def _starts_another(call: _Call, delta: ToolCallDelta, *, indexed: bool) -> bool:
    """Whether ``delta`` belongs to a new call rather than to ``call`` (rules 1 and 2)."""
    if delta.id is not None and call.id is not None:
        return delta.id != call.id
    if delta.name is None or call.name is None:
        return False
    # Both named, no ids to compare: under one index a repeated name is a repeat (servers
    # that send the name in every piece); without an index a second name is a second call.
    return delta.name != call.name if indexed else True


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# -- names and wire shapes ----------------------------------------------------------------


def to_openai_name(name: str) -> str:
    """Our tool name as an OpenAI function name: dots become ``__``.

    Raises ``ValueError`` when the result would not map back to ``name`` or does not
    match ``^[a-zA-Z0-9_-]{1,64}$``: such a tool cannot be offered in native mode.
    """
    wire = name.replace(".", _DOT)
    if from_openai_name(wire) != name:
        raise ValueError(
            f"tool name {name!r} cannot be sent natively: '__' and '_' next to '.' "
            "are ambiguous once dots are written as '__'"
        )
    if _OPENAI_NAME.fullmatch(wire) is None:
        raise ValueError(
            f"tool name {name!r} cannot be sent natively: {wire!r} is not an OpenAI "
            "function name (letters, digits, '_' and '-', 1 to 64 of them)"
        )
    return wire


def from_openai_name(wire: str) -> str:
    """The inverse of :func:`to_openai_name`: ``places__search`` → ``places.search``.

    Any string maps to something; an unknown result is for the registry to refuse.
    """
    return wire.replace(_DOT, ".")


def to_openai_tools(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Our tool descriptions (``{name, description, input_schema}``, as
    :meth:`ToolSpec.to_dict <toolforge.core.tool_specs.ToolSpec.to_dict>` writes them; other keys
    are ignored) as the OpenAI ``tools`` list:
    ``{"type": "function", "function": {name, description, parameters}}``.

    Raises ``ValueError`` for a name :func:`to_openai_name` refuses, or the same name twice.
    """
    tools: list[dict[str, Any]] = []
    names: set[str] = set()
    for spec in specs:
        wire = to_openai_name(spec["name"])
        if wire in names:
            raise ValueError(f"tool {spec['name']!r} is listed twice")
        names.add(wire)
        function: dict[str, Any] = {"name": wire}
        description = spec.get("description")
        if description:
            function["description"] = description
        schema = spec.get("input_schema")
        # A function without parameters still needs an object schema (OpenAI, vLLM).
        function["parameters"] = dict(schema) if schema else {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": function})
    return tools


def assistant_tool_call_message(
    calls: Sequence[AssembledCall], content: str | None = ""
) -> dict[str, Any]:
    """The assistant message that records ``calls`` in the continuation's ``messages``.

    ``content`` is the text the model wrote before its calls. The default ``""`` rather
    than OpenAI's ``null``: Ollama's ``/v1`` answers 400 "invalid message content type:
    <nil>" to ``null`` (pydantic/pydantic-ai#5206); pass ``None`` for a server that wants
    it. Arguments that are not a JSON object go back as ``"{}"``: vLLM ``json.loads`` the
    history's arguments to render its chat template and fails the whole request on bad
    JSON, and the call's tool message already tells the model what was wrong.
    """
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _object_or_empty(call)},
            }
            for call in calls
        ],
    }


def tool_result_message(call_id: str, content: object) -> dict[str, Any]:
    """The ``tool`` message answering call ``call_id``. ``content`` is sent as is when it
    is a string, else as compact JSON (e.g. a :class:`~toolforge.core.tool_specs.ToolEnvelope`'s
    ``to_dict()``)."""
    text = content if isinstance(content, str) else orjson.dumps(content, default=_plain).decode()
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _object_or_empty(call: AssembledCall) -> str:
    text = call.arguments_text
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _EMPTY_OBJECT
    return text if type(value) is dict else _EMPTY_OBJECT


def _plain(value: object) -> object:
    # Read-only mappings (MappingProxyType) are what frozen values hold; orjson wants dicts.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot serialise {type(value).__name__} in a tool message")
