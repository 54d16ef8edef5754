"""Stream commands as values, applied by one function wherever the stream runs.

A command is what a client sends to a stream that is already running: stop it
(:class:`Cancel`), hold the model and let it go on (:class:`Pause`, :class:`Resume`),
answer a tool call that waits for confirmation (:class:`Approve`), or give a client-side
tool's result (:class:`PostToolResult`). Every transport builds the
same values (the HTTP routes, a replica forwarding one through Redis, a WebSocket), and
:func:`apply` is the only code that touches the session for them. The answer is a plain
dict (the JSON the HTTP route returns); a refusal is a :class:`RequestError`.

On the wire between replicas a command is :func:`to_wire`'s dict, read back by
:func:`from_wire` (a malformed one is a ``BAD_REQUEST``, never a crash of the owner).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, assert_never

from toolforge.core.tool_specs import ToolError
from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.session import ClientAnswer, StreamSession

__all__ = [
    "Approve",
    "Cancel",
    "ClientFailure",
    "Command",
    "Pause",
    "PostToolResult",
    "Resume",
    "apply",
    "check_caller",
    "from_wire",
    "to_wire",
]


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the stream: upstream and tools cancelled, ``done`` with reason ``cancelled``."""


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop reading the model, the stream open (``stream.paused``), until :class:`Resume`
    or ``PAUSE_MAX_S``."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Read the model again after a :class:`Pause` (``stream.resumed``)."""


@dataclass(frozen=True, slots=True)
class Approve:
    """Run (``approved``) or refuse the tool call ``call_id`` that waits for approval."""

    call_id: str
    approved: bool


@dataclass(frozen=True, slots=True)
class ClientFailure:
    """Why a client-side tool failed, in the client's words."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class PostToolResult:
    """A client-side tool's outcome for call ``call_id``: ``result`` when ``ok``, else
    ``error``. The stream resumes with it."""

    call_id: str
    ok: bool
    result: Any = None
    error: ClientFailure | None = None


Command = Cancel | Pause | Resume | Approve | PostToolResult


def check_caller(caller: str | None, owner: str | None, stream_id: str) -> None:
    """A stream takes commands from the API key that started it (by name; ``None`` on
    both sides when no keys are configured)."""
    if caller != owner:
        raise RequestError(
            ErrorCode.FORBIDDEN,
            f"stream {stream_id!r} was started with another API key; only that key may "
            "resume it, cancel it or answer its calls",
            http_status=403,
        )


async def apply(session: StreamSession, command: Command) -> dict[str, Any]:
    """Apply ``command`` to a stream run by this replica: its answer, or a
    :class:`RequestError` (no such call waits: ``NOT_FOUND``; answered already:
    ``CONFLICT``)."""
    stream_id = session.id
    match command:
        case Cancel():
            cancelled = session.cancel("cancelled")
            if cancelled:
                await session.wait()
            return {"stream_id": stream_id, "cancelled": cancelled, "reason": session.reason}
        case Pause():
            return {"stream_id": stream_id, "paused": session.pause()}
        case Resume():
            session.resume()
            return {"stream_id": stream_id, "paused": session.paused}
        case Approve(call_id=call_id, approved=approved):
            if not session.approve(call_id, approved):
                raise _not_waiting(f"tool call {call_id!r}", "approval", session)
            return {"stream_id": stream_id, "call_id": call_id, "approved": approved}
        case PostToolResult(call_id=call_id):
            outcome = session.post_tool_result(call_id, _answer(command))
            if outcome == "duplicate":
                raise RequestError(
                    ErrorCode.CONFLICT,
                    f"tool call {call_id!r} of stream {stream_id!r} has its result already",
                    http_status=409,
                )
            if outcome == "unknown":
                raise _not_waiting(f"client tool call {call_id!r}", "a result", session)
            return {"stream_id": stream_id, "call_id": call_id, "accepted": True}
        case _:
            assert_never(command)


def _not_waiting(what: str, for_what: str, session: StreamSession) -> RequestError:
    pending = session.pending_approvals if for_what == "approval" else session.pending_tool_results
    waiting = ", ".join(pending) or "none"
    message = f"no {what} is waiting for {for_what} in stream {session.id!r} (waiting: {waiting})"
    return RequestError(ErrorCode.NOT_FOUND, message, http_status=404)


def _answer(command: PostToolResult) -> ClientAnswer:
    failure = command.error
    if failure is None:
        return ClientAnswer(ok=command.ok, result=command.result)
    error = ToolError(
        ErrorCode.TOOL_FAILED, failure.message, details=[{"client_code": failure.code}]
    )
    return ClientAnswer(ok=command.ok, result=command.result, error=error)


# The commands without arguments, by their wire ``type``.
_BARE: Final[dict[str, Cancel | Pause | Resume]] = {
    "cancel": Cancel(),
    "pause": Pause(),
    "resume": Resume(),
}
_BARE_NAMES: Final = {type(command): name for name, command in _BARE.items()}


def to_wire(command: Command) -> dict[str, Any]:
    """``command`` as JSON-ready data (``type`` names the command)."""
    match command:
        case Cancel() | Pause() | Resume():
            return {"type": _BARE_NAMES[type(command)]}
        case Approve(call_id=call_id, approved=approved):
            return {"type": "approve", "call_id": call_id, "approved": approved}
        case PostToolResult(call_id=call_id, ok=ok, result=result, error=error):
            wire: dict[str, Any] = {"type": "tool_result", "call_id": call_id, "ok": ok}
            wire["result"] = result
            if error is not None:
                wire["error"] = {"code": error.code, "message": error.message}
            return wire
        case _:
            assert_never(command)


def from_wire(data: dict[str, Any]) -> Command:
    """:func:`to_wire`'s dict back to its value."""
    try:
        kind = data["type"]
        bare = _BARE.get(kind)
        if bare is not None:
            return bare
        if kind == "approve":
            return Approve(call_id=str(data["call_id"]), approved=bool(data["approved"]))
        if kind == "tool_result":
            error = data.get("error")
            failure = (
                None if error is None else ClientFailure(str(error["code"]), str(error["message"]))
            )
            return PostToolResult(
                call_id=str(data["call_id"]),
                ok=bool(data["ok"]),
                result=data.get("result"),
                error=failure,
            )
    except (KeyError, TypeError) as exc:
        raise RequestError(
            ErrorCode.BAD_REQUEST, f"malformed stream command: missing {exc}", http_status=400
        ) from exc
    raise RequestError(
        ErrorCode.BAD_REQUEST, f"unknown stream command {data.get('type')!r}", http_status=400
    )
