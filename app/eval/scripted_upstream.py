"""A scripted OpenAI-style upstream: a real HTTP/1.1 server on 127.0.0.1 for tests and benches.

Why a real server and not ``httpx.MockTransport``: the faults the gateway must survive
(the usual upstream faults: RST, FIN without ``[DONE]``, truncated chunked bodies, hangs before and
after headers, chunk boundaries inside a UTF-8 character or between CR and LF) only exist
on a socket. The server writes raw bytes with ``asyncio.start_server``: each script step is
one write, which with the default chunked framing is one HTTP chunk, so the client's
``aiter_raw()`` sees exactly the script's boundaries. It is a test fixture, never a product
default.

A script is data (JSON-able), chosen per request from a queue or by a callable::

    {"steps": [{"text": "Hel", "delay_ms": 5},          # a chat.completion.chunk event
               {"text": "lo", "split": [7]},            # written in two pieces (byte offsets)
               {"raw": "data: {oops\\n\\n"},              # bytes verbatim (UTF-8, surrogateescape)
               {"finish": "stop", "usage": {...}},     # a finish_reason chunk (usage optional)
               {"usage": {...}}],                      # a usage-only chunk (choices: [])
     "end": "done",          # done | eof | fin | rst | hang | hang_after_headers |
                             # hang_before_headers | status
     "end_delay_ms": 0,      # pause before the end behaviour
     "status": 500, "body": "...",   # for end == "status"
     "chunked": true}        # false: no chunked framing; the body ends when the socket closes

Ends: ``done`` sends ``data: [DONE]`` and ends the body cleanly (the connection stays open
for the next request); ``eof`` ends the body cleanly without ``[DONE]``; ``fin`` closes the
socket without ``[DONE]`` (with chunked framing that is also a truncated chunked body);
``rst`` aborts with ``SO_LINGER`` 0, so the client gets a TCP RST; the ``hang*`` ends keep
the socket open and silent until the client leaves; ``status`` answers ``status``/``body``
as JSON. To send bytes that are not UTF-8, write them as surrogate escapes:
``b"\\xff".decode("utf-8", "surrogateescape")`` is ``"\\udcff"``.

The server records the chat-completion requests (``requests``, ``wait_for_requests``) and
every request (``all_requests``: probes and health checks too), and counts open
connections (``open_connections``, ``wait_connections_closed``), so tests can assert what
the gateway sent, on which connection (``RecordedRequest.connection``), when each step of
its answer went out (``RecordedRequest.written_ns``, ``time.perf_counter_ns`` once the
step's bytes are with the kernel: what a benchmark compares its client's arrival times
with), and that it left nothing open. ``pace=False`` ignores every delay (full-speed
benches); by default ``delay_ms`` is honoured with ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias, cast, get_args

import orjson

__all__ = [
    "End",
    "RecordedRequest",
    "Script",
    "ScriptLike",
    "ScriptedUpstream",
    "Step",
]

End: TypeAlias = Literal[
    "done", "eof", "fin", "rst", "hang", "hang_after_headers", "hang_before_headers", "status"
]
_ENDS: Final = frozenset(get_args(End))
_STEP_KEYS: Final = frozenset({"text", "raw", "finish", "usage", "delay_ms", "split"})
_SCRIPT_KEYS: Final = frozenset({"steps", "end", "end_delay_ms", "status", "body", "chunked"})
_MAX_HEAD: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class Step:
    """One write (or, with ``split``, several) of the response body.

    Exactly one of ``text`` (a content delta), ``raw`` (verbatim bytes), ``finish`` (a
    finish_reason chunk, optionally with ``usage``) or ``usage`` alone (a usage-only chunk).
    ``split`` cuts the step's bytes at these byte offsets into separate writes.
    """

    text: str | None = None
    raw: str | None = None
    finish: str | None = None
    usage: Mapping[str, Any] | None = None
    delay_ms: float = 0
    split: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        kinds = (self.text is not None, self.raw is not None, self.finish is not None)
        if sum(kinds) > 1 or (sum(kinds) == 0 and self.usage is None):
            raise ValueError("a step has exactly one of text, raw, finish (or usage alone)")
        if self.usage is not None and (self.text is not None or self.raw is not None):
            raise ValueError("usage goes with finish or alone")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Step:
        unknown = set(obj) - _STEP_KEYS
        if unknown:
            raise ValueError(f"unknown step keys: {sorted(unknown)}")
        return cls(
            text=obj.get("text"),
            raw=obj.get("raw"),
            finish=obj.get("finish"),
            usage=obj.get("usage"),
            delay_ms=obj.get("delay_ms", 0),
            split=tuple(obj.get("split", ())),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("text", "raw", "finish", "usage"):
            value = getattr(self, name)
            if value is not None:
                out[name] = dict(value) if name == "usage" else value
        if self.delay_ms:
            out["delay_ms"] = self.delay_ms
        if self.split:
            out["split"] = list(self.split)
        return out

    def encode(self, model: str) -> list[bytes]:
        """The bytes of this step, already cut into its writes."""
        if self.raw is not None:
            payload = self.raw.encode("utf-8", "surrogateescape")
        else:
            payload = b"data: " + orjson.dumps(self._chunk(model)) + b"\n\n"
        cuts = [0, *sorted(self.split), len(payload)]
        return [payload[a:b] for a, b in itertools.pairwise(cuts) if b > a]

    def _chunk(self, model: str) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        if self.text is not None:
            choices.append({"index": 0, "delta": {"content": self.text}, "finish_reason": None})
        elif self.finish is not None:
            choices.append({"index": 0, "delta": {}, "finish_reason": self.finish})
        chunk: dict[str, Any] = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": choices,
        }
        if self.usage is not None:
            chunk["usage"] = dict(self.usage)
        return chunk


@dataclass(frozen=True, slots=True)
class Script:
    """What the upstream answers to one request: steps, then an end behaviour."""

    steps: tuple[Step, ...] = ()
    end: End = "done"
    end_delay_ms: float = 0
    status: int = 200
    body: str = ""
    chunked: bool = True

    def __post_init__(self) -> None:
        if self.end not in _ENDS:
            raise ValueError(f"unknown end {self.end!r}; one of {sorted(_ENDS)}")

    @classmethod
    def from_json(cls, obj: ScriptLike) -> Script:
        """A :class:`Script`, a dict in the module docstring's format, or a list of steps."""
        if isinstance(obj, Script):
            return obj
        if not isinstance(obj, Mapping):
            obj = {"steps": obj}
        unknown = set(obj) - _SCRIPT_KEYS
        if unknown:
            raise ValueError(f"unknown script keys: {sorted(unknown)}")
        steps = tuple(s if isinstance(s, Step) else Step.from_json(s) for s in obj.get("steps", ()))
        return cls(
            steps=steps,
            end=obj.get("end", "done"),
            end_delay_ms=obj.get("end_delay_ms", 0),
            status=obj.get("status", 200),
            body=obj.get("body", ""),
            chunked=obj.get("chunked", True),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [step.to_json() for step in self.steps],
            "end": self.end,
            "end_delay_ms": self.end_delay_ms,
            "status": self.status,
            "body": self.body,
            "chunked": self.chunked,
        }

    @classmethod
    def from_tokens(
        cls,
        tokens: Iterable[str],
        *,
        delay_ms: float = 0,
        finish: str | None = "stop",
        usage: Mapping[str, Any] | None = None,
        end: End = "done",
    ) -> Script:
        """The common case: one text step per token, then a finish chunk, then ``end``."""
        steps = [Step(text=token, delay_ms=delay_ms) for token in tokens]
        if finish is not None:
            steps.append(Step(finish=finish, usage=usage))
        elif usage is not None:
            steps.append(Step(usage=usage))
        return cls(steps=tuple(steps), end=end)


ScriptLike: TypeAlias = Script | Mapping[str, Any] | Sequence[Step | Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request as the scripted upstream received it (headers lower-cased)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any = field(default=None)
    connection: int = 0  # which connection carried it: 1 for the first one accepted, ...
    written_ns: list[int] = field(default_factory=list)  # when each step of the answer went out


_NOT_FOUND: Final = Script(
    end="status", status=404, body='{"error": {"message": "scripted upstream: no route"}}'
)
_NO_SCRIPT: Final = Script(
    end="status",
    status=500,
    body='{"error": {"message": "scripted upstream: no script left for this request"}}',
)


class ScriptedUpstream:
    """``async with ScriptedUpstream(scripts=[...]) as up:`` then point a client at
    ``up.base_url`` (which ends in ``/v1``, like an OpenAI base URL).

    ``routes`` answer fixed paths (``{"/props": script}``) every time. Otherwise scripts
    come from ``script_for(request_json)`` when given, else chat completions take the
    ``scripts`` queue in order (none left: HTTP 500) and any other path gets 404, so a
    probe or health check never consumes a chat script.
    """

    def __init__(
        self,
        scripts: Iterable[ScriptLike] = (),
        *,
        script_for: Callable[[Any], ScriptLike] | None = None,
        routes: Mapping[str, ScriptLike] | None = None,
        pace: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._scripts: deque[Script] = deque(Script.from_json(s) for s in scripts)
        self._script_for = script_for
        self._routes = {path: Script.from_json(v) for path, v in (routes or {}).items()}
        self._pace = pace
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._new_request = asyncio.Event()
        self.requests: list[RecordedRequest] = []  # chat completions
        self.all_requests: list[RecordedRequest] = []
        self.open_connections = 0
        self.connections_total = 0

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}/v1"

    def add(self, script: ScriptLike) -> None:
        """Queue one more script."""
        self._scripts.append(Script.from_json(script))

    async def wait_for_requests(self, count: int = 1) -> None:
        """Return once ``count`` requests have arrived (bound it with ``asyncio.timeout``)."""
        while len(self.requests) < count:
            self._new_request.clear()
            await self._new_request.wait()

    async def wait_connections_closed(self) -> None:
        """Return once no connection is open (bound it with ``asyncio.timeout``)."""
        await self._idle.wait()

    async def __aenter__(self) -> ScriptedUpstream:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, limit=_MAX_HEAD
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        # Close the sockets rather than cancel the handlers: each handler then sees the
        # client "leave" and ends normally (on 3.11, asyncio.streams logs an error for a
        # cancelled handler task).
        for writer in self._writers:
            writer.transport.abort()
        _, stuck = await asyncio.wait(self._tasks, timeout=1.0) if self._tasks else ((), ())
        for task in stuck:
            task.cancel()
        await self._server.wait_closed()

    # -- one connection ------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = cast("asyncio.Task[None]", asyncio.current_task())
        self._tasks.add(task)
        self._writers.add(writer)
        self.open_connections += 1
        self.connections_total += 1
        serial = self.connections_total
        self._idle.clear()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # drain() then waits until the kernel has every byte, which rst relies on.
        writer.transport.set_write_buffer_limits(0)
        try:
            while (request := await self._read_request(reader, serial)) is not None:
                self.all_requests.append(request)
                if request.path.split("?", 1)[0].endswith("/chat/completions"):
                    self.requests.append(request)
                    self._new_request.set()
                if not await self._respond_watching(reader, writer, request):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client left mid-request, or sent a head over _MAX_HEAD
        except ValueError:
            pass  # not HTTP/1.1 as httpx writes it: drop the connection
        finally:
            writer.close()
            self.open_connections -= 1
            if self.open_connections == 0:
                self._idle.set()
            self._tasks.discard(task)
            self._writers.discard(writer)

    @staticmethod
    async def _read_request(
        reader: asyncio.StreamReader, connection: int
    ) -> RecordedRequest | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # the client closed between requests
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        return RecordedRequest(method, path, headers, body, parsed, connection)

    def _select(self, request: RecordedRequest) -> Script:
        path = request.path.split("?", 1)[0]
        if path in self._routes:  # fixed answers: /v1/models, /props, /api/show, ...
            return self._routes[path]
        if self._script_for is not None:
            return Script.from_json(self._script_for(request.json))
        if not path.endswith("/chat/completions"):
            return _NOT_FOUND  # a probe or a health check must not take a chat script
        return self._scripts.popleft() if self._scripts else _NO_SCRIPT

    async def _respond_watching(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: RecordedRequest
    ) -> bool:
        """Respond while watching for the client to leave; True to keep the connection."""
        respond = asyncio.create_task(self._respond(writer, self._select(request), request))
        # HTTP/1.1 clients send nothing while a response is in flight, so any read that
        # completes means the client closed (or misbehaves): stop and drop the connection.
        watch = asyncio.create_task(reader.read(1))
        try:
            await asyncio.wait((respond, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (respond, watch):
                pending.cancel()
            await asyncio.gather(respond, watch, return_exceptions=True)
        if respond.cancelled() or respond.exception() is not None:
            return False
        return respond.result()

    async def _respond(
        self, writer: asyncio.StreamWriter, script: Script, request: RecordedRequest
    ) -> bool:
        forever = asyncio.Event()  # never set: the hang ends when the client leaves
        if script.end == "hang_before_headers":
            await forever.wait()
        if script.end == "status":
            body = script.body.encode()
            writer.write(
                self._head(script.status, "application/json", f"Content-Length: {len(body)}") + body
            )
            await writer.drain()
            return True
        framing = "Transfer-Encoding: chunked" if script.chunked else "Connection: close"
        writer.write(self._head(200, "text/event-stream", "Cache-Control: no-cache", framing))
        await writer.drain()
        if script.end == "hang_after_headers":
            await forever.wait()
        model = request.json.get("model", "") if isinstance(request.json, dict) else ""
        frame = self._chunk if script.chunked else bytes
        for step in script.steps:
            if self._pace and step.delay_ms:
                await asyncio.sleep(step.delay_ms / 1000)
            for piece in step.encode(model):
                writer.write(frame(piece))
                await writer.drain()
            request.written_ns.append(time.perf_counter_ns())
        if self._pace and script.end_delay_ms:
            await asyncio.sleep(script.end_delay_ms / 1000)
        match script.end:
            case "done" | "eof":
                if script.end == "done":
                    writer.write(frame(b"data: [DONE]\n\n"))
                if script.chunked:
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
                return script.chunked  # without chunked framing, only a close ends the body
            case "fin":
                return False
            case "rst":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            case _:  # "hang"
                await forever.wait()
                return False

    @staticmethod
    def _head(status: int, content_type: str, *headers: str) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"Content-Type: {content_type}", *headers, "", ""]
        return "\r\n".join(lines).encode("latin-1")

    @staticmethod
    def _chunk(piece: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(piece), piece)
