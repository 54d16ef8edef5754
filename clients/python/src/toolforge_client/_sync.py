"""The synchronous client: :class:`ToolForge` and its :class:`Stream`."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Unpack

import httpx
from httpx_sse import EventSource, ServerSentEvent, connect_sse

from toolforge_client._base import ClientBase, StreamBase
from toolforge_client._socket import SocketFrame, SyncSocket
from toolforge_client._state import (
    DEFAULT_TOOL_TIMEOUT_S,
    Callback,
    Callbacks,
    Event,
    StreamOptions,
    StreamResult,
    StreamState,
    Transport,
    backoff_s,
    plan,
)
from toolforge_client.errors import (
    APIConnectionError,
    APITimeoutError,
    ConflictError,
    status_error,
)
from toolforge_client.frames import ToolCall
from toolforge_client.tools import ClientTool, ToolFunction, run_tool_sync

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_TIMEOUT", "Stream", "ToolForge", "transport_error"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# Reads wait at most 60 s: the gateway pings every 15 s, so a silent minute is a dead line.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


def transport_error(exc: httpx.TransportError, what: str) -> APIConnectionError:
    cls = APITimeoutError if isinstance(exc, httpx.TimeoutException) else APIConnectionError
    return cls(f"{what}: {type(exc).__name__}: {exc}")


class ToolForge(ClientBase):
    """A client of one ToolForge gateway.

    ``base_url``: the gateway (``TOOLFORGE_BASE_URL``'s usual value is the default).
    ``api_key``: sent as ``Authorization: Bearer``. ``timeout``: httpx's connect/read
    timeouts (seconds or an ``httpx.Timeout``). ``max_resumes``: reconnections after a
    dropped connection, per stream (0: never resume). ``tool_timeout``: seconds a client
    tool may run, unless the tool or the call says otherwise. ``http_client``: your own
    ``httpx.Client`` (proxies, transports, socket options); it is not closed for you.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_resumes: int = 5,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT_S,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key=api_key, max_resumes=max_resumes, tool_timeout=tool_timeout
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout)

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ToolForge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- streams ------------------------------------------------------------------------

    def stream(self, input: str | None = None, **options: Unpack[StreamOptions]) -> Stream:
        """``POST /v1/stream``: returns once the gateway accepted the request (an HTTP
        error raises here), to be iterated (``for event in stream``) or drained
        (``stream.until_done()``). ``options``: :class:`StreamOptions` (the request
        fields of docs/protocol.md §5, callbacks, ``timeout`` for the whole request,
        ``tool_timeout`` for each client tool, ``transport="ws"`` for one WebSocket
        instead of SSE and HTTP posts: docs/websocket.md). Leaving a stream early cancels
        it.
        """
        p = plan(self.max_resumes, input, options)
        stream = Stream(
            self, StreamState(), p.tools, p.callbacks, p.timeout, p.tool_timeout, p.transport
        )
        stream._start("POST", "/v1/stream", json=p.body, headers=p.headers)
        return stream

    def run(self, input: str | None = None, **options: Unpack[StreamOptions]) -> StreamResult:
        """``stream(...)`` to the end: the :class:`StreamResult`, or :class:`StreamError`
        if the stream ended with an ``error`` frame."""
        with self.stream(input, **options) as stream:
            return stream.until_done()

    def resume(
        self,
        stream_id: str,
        last_event_id: int = 0,
        *,
        client_tools: Iterable[ClientTool | ToolFunction | Mapping[str, Any]] = (),
        timeout: float | None = None,
        tool_timeout: float | None = None,
        **callbacks: Callback | None,
    ) -> Stream:
        """``GET /v1/streams/{id}``: the frames after ``last_event_id``, then live to the
        end (a stream stays resumable for the gateway's ``RESUME_TTL_S``)."""
        state, tools, headers = self._resume_state(stream_id, last_event_id, client_tools)
        stream = Stream(self, state, tools, Callbacks(**callbacks), timeout, tool_timeout)
        stream._start("GET", f"/v1/streams/{stream_id}", headers=headers)
        return stream

    def cancel(self, stream_id: str) -> dict[str, Any]:
        """``POST /v1/streams/{id}/cancel``: answers once the stream has ended."""
        return self._post(f"/v1/streams/{stream_id}/cancel", None)

    def pause(self, stream_id: str) -> dict[str, Any]:
        """``POST /v1/streams/{id}/pause``: the gateway stops reading the model (the model
        really stops; the stream stays open and sends ``stream.paused``). Answers
        ``{"stream_id", "paused"}``, the state after the command."""
        return self._post(f"/v1/streams/{stream_id}/pause", None)

    def unpause(self, stream_id: str) -> dict[str, Any]:
        """``POST /v1/streams/{id}/resume``: the model is read again (``stream.resumed``).
        Named apart from :meth:`resume`, which follows a stream after a dropped connection."""
        return self._post(f"/v1/streams/{stream_id}/resume", None)

    def approve(self, stream_id: str, call_id: str, approve: bool = True) -> dict[str, Any]:
        """Approve (or, ``approve=False``, deny) a tool call that needs approval."""
        return self._post(f"/v1/streams/{stream_id}/approvals/{call_id}", {"approve": approve})

    def submit_tool_result(
        self,
        stream_id: str,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        code: str = "CLIENT_TOOL_FAILED",
    ) -> dict[str, Any]:
        """Post a client tool's result (or ``error=`` a message saying why it failed).
        404: no such call waits; 409: it has its result already; 422: a bad body."""
        body = self._tool_result_body(result, error, code)
        return self._post(f"/v1/streams/{stream_id}/tool_results/{call_id}", body)

    def _post(self, path: str, body: Any) -> dict[str, Any]:
        try:
            response = self._http.post(self.base_url + path, json=body, headers=self._headers)
        except httpx.TransportError as exc:
            raise transport_error(exc, f"POST {path}") from exc
        if response.status_code >= 400:
            raise status_error(response)
        data: dict[str, Any] = response.json()
        return data


class Stream(StreamBase[ToolForge], AbstractContextManager["Stream"]):
    """One stream: iterate it for its :class:`Event` s (pings left out). Callbacks run
    as each frame arrives; client tools run, and approvals are asked, right after their
    ``tool.call`` was handed to you. Not reading pauses the stream: the gateway's queue
    fills, and then it stops reading the model (backpressure), losing nothing."""

    def __init__(
        self,
        client: ToolForge,
        state: StreamState,
        tools: dict[str, ClientTool],
        callbacks: Callbacks,
        timeout: float | None,
        tool_timeout: float | None,
        transport: Transport = "sse",
    ) -> None:
        super().__init__(client, state, tools, callbacks, timeout, tool_timeout, transport)
        self._connection: AbstractContextManager[EventSource] | None = None
        self._response: httpx.Response | None = None
        self._sse: Iterator[ServerSentEvent | SocketFrame] | None = None
        self._socket: SyncSocket | None = None
        self._iterator = self._events()
        self._timer: threading.Timer | None = None

    def __iter__(self) -> Iterator[Event]:
        return self._iterator

    def __next__(self) -> Event:
        return next(self._iterator)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def until_done(self) -> StreamResult:
        """Read to the end: the :class:`StreamResult`, or :class:`StreamError`."""
        for _ in self._iterator:
            pass
        self._state.result.raise_for_error()
        return self._state.result

    def cancel(self) -> dict[str, Any]:
        """Stop the stream on the gateway; iterating goes on to its ``done`` (cancelled)."""
        self._cancelled = True
        if self._socket is not None:
            return self._socket.command({"type": "cancel"})
        return self._client.cancel(self._require_id())

    def pause(self) -> dict[str, Any]:
        """Pause the model on the gateway (``pause`` on the socket with ``transport="ws"``,
        else ``POST /v1/streams/{id}/pause``): it reads no more of the model until
        :meth:`resume` (or ``PAUSE_MAX_S``). Iterating goes on: ``stream.paused`` and the
        frames already made still come. Answers ``{"stream_id", "paused"}``."""
        if self._socket is not None:
            return self._socket.command({"type": "pause"})
        return self._client.pause(self._require_id())

    def resume(self) -> dict[str, Any]:
        """Read the model again after :meth:`pause` (``stream.resumed``)."""
        if self._socket is not None:
            return self._socket.command({"type": "resume"})
        return self._client.unpause(self._require_id())

    def approve(self, call_id: str, approve: bool = True) -> dict[str, Any]:
        if self._socket is not None:
            return self._socket.command(self._approve_message(call_id, approve))
        return self._client.approve(self._require_id(), call_id, approve)

    def deny(self, call_id: str) -> dict[str, Any]:
        return self.approve(call_id, False)

    def submit_tool_result(
        self,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        code: str = "CLIENT_TOOL_FAILED",
    ) -> dict[str, Any]:
        if self._socket is not None:
            body = self._client._tool_result_body(result, error, code)
            return self._socket.command(self._tool_result_message(call_id, body))
        return self._client.submit_tool_result(
            self._require_id(), call_id, result, error=error, code=code
        )

    def close(self) -> None:
        """Close the connection; a stream not done yet is cancelled on the gateway."""
        self._iterator.close()
        self._finish()

    # -- internals ----------------------------------------------------------------------

    def _start(self, method: str, path: str, **kwargs: Any) -> None:
        self._open(method, path, **kwargs)
        if self._timeout is not None:
            self._timer = threading.Timer(self._timeout, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _open(self, method: str, path: str, **kwargs: Any) -> None:
        if self._transport == "ws":
            self._open_socket(kwargs.get("json"))
            return
        client = self._client
        headers = {**client._headers, **kwargs.pop("headers", {})}
        connection = connect_sse(
            client._http, method, client.base_url + path, headers=headers, **kwargs
        )
        try:
            source = connection.__enter__()
        except httpx.TransportError as exc:
            raise transport_error(exc, f"{method} {path}") from exc
        response = source.response
        if response.status_code >= 400:
            response.read()
            connection.__exit__(None, None, None)
            raise status_error(response)
        if self._state.result.stream_id is None:
            self._state.result.stream_id = response.headers.get("x-stream-id")
        self._connection, self._response, self._sse = connection, response, source.iter_sse()

    def _open_socket(self, body: dict[str, Any] | None) -> None:
        """A socket that starts the stream (``body``) or resumes it after the last frame."""
        client = self._client
        socket = SyncSocket(client.base_url, client._headers, client._http.timeout.connect or 5.0)
        try:
            first = socket.open(self._socket_opening(body))
        except BaseException:
            socket.close()
            raise
        if self._state.result.stream_id is None and first.event == "stream.begin":
            self._state.result.stream_id = first.data.get("stream_id")
        self._socket, self._sse = socket, socket.frames()

    def _disconnect(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            socket.close()
        connection, self._connection, self._sse = self._connection, None, None
        if connection is not None:
            try:
                connection.__exit__(None, None, None)
            except httpx.HTTPError:
                pass  # it was broken already

    def _events(self) -> Generator[Event, None, None]:
        state = self._state
        try:
            while True:
                assert self._sse is not None
                try:
                    sse = next(self._sse)
                except StopIteration:
                    self._reconnect("the connection ended before the done frame")
                    continue
                except httpx.TransportError as exc:
                    timed_out = isinstance(exc, httpx.TimeoutException)
                    self._reconnect(f"{type(exc).__name__}: {exc}", timed_out=timed_out)
                    continue
                event = state.accept(sse.event, sse.id, sse.data)
                if event is None:
                    continue
                for callback, arg in self._callbacks.calls(event):
                    callback(arg)
                if state.finished:
                    self._disconnect()
                    if self._timed_out and not self._cancelled:
                        raise self._deadline_error()
                    yield event
                    return
                yield event
                if isinstance(event.data, ToolCall):
                    self._act(event.data)
        finally:
            self._finish()

    def _act(self, call: ToolCall) -> None:
        run = self._client_tool(call)
        if run is not None:
            outcome = run_tool_sync(run[0], call.args, run[1])
            self._post_result(call, outcome.to_wire())
        elif call.needs_approval and self._callbacks.on_approval is not None:
            self.approve(call.id, bool(self._callbacks.on_approval(call)))

    def _post_result(self, call: ToolCall, body: dict[str, Any]) -> None:
        """Post a tool's result, again after a failed connection (a 409 then means the
        first one arrived). On a socket it goes over the socket; if that drops, over HTTP."""
        first = 1
        if self._socket is not None:
            try:
                self._socket.command(self._tool_result_message(call.id, body))
                return
            except APIConnectionError:
                first = 2  # it may have arrived: a 409 now is that
        for attempt in itertools.count(first):
            try:
                self._client._post(self._tool_result_path(call), body)
                return
            except ConflictError:
                if attempt == 1:
                    raise
                return
            except APIConnectionError:
                if attempt > self._client.max_resumes:
                    raise
                time.sleep(backoff_s(attempt))

    def _reconnect(self, why: str, *, timed_out: bool = False) -> None:
        self._disconnect()
        if self._timed_out:
            raise self._deadline_error()
        while self._may_resume():
            self._state.result.resumes += 1
            time.sleep(backoff_s(self._state.result.resumes))
            path, headers = self._resume_path()
            try:
                self._open("GET", path, headers=headers)
                return
            except APIConnectionError as exc:
                why, timed_out = str(exc), isinstance(exc, APITimeoutError)
        raise self._given_up(why, timed_out)

    def _expire(self) -> None:
        """The request's deadline: cancel the stream (its done frame ends the reading);
        if the gateway cannot be told, close the connection instead."""
        if self._state.finished:
            return
        self._timed_out = True
        try:
            self._client.cancel(self._require_id())
        except Exception:
            response = self._response
            if response is not None:
                response.close()
            if self._socket is not None:
                self._socket.close()

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._disconnect()
        if self._should_cancel_on_leaving():
            try:
                self._client.cancel(self._require_id())
            except Exception:  # best effort: the gateway may be gone
                pass
