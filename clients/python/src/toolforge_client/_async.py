"""The asynchronous client: :class:`AsyncToolForge` and its :class:`AsyncStream` (the
same behaviour as the sync client, on asyncio; callbacks and tools may be sync or async)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Unpack

import httpx
from httpx_sse import EventSource, ServerSentEvent, aconnect_sse

from toolforge_client._base import ClientBase, StreamBase
from toolforge_client._socket import AsyncSocket, SocketFrame
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
from toolforge_client._sync import DEFAULT_BASE_URL, DEFAULT_TIMEOUT, transport_error
from toolforge_client.errors import (
    APIConnectionError,
    APITimeoutError,
    ConflictError,
    status_error,
)
from toolforge_client.frames import ToolCall
from toolforge_client.tools import ClientTool, ToolFunction, run_tool_async

__all__ = ["AsyncStream", "AsyncToolForge"]


class AsyncToolForge(ClientBase):
    """The asyncio client; arguments as :class:`toolforge_client.ToolForge`'s
    (``http_client``: an ``httpx.AsyncClient``)."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_resumes: int = 5,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT_S,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url, api_key=api_key, max_resumes=max_resumes, tool_timeout=tool_timeout
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncToolForge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def stream(
        self, input: str | None = None, **options: Unpack[StreamOptions]
    ) -> AsyncStream:
        """``POST /v1/stream`` (see ``ToolForge.stream``): ``async for event in stream``."""
        p = plan(self.max_resumes, input, options)
        stream = AsyncStream(
            self, StreamState(), p.tools, p.callbacks, p.timeout, p.tool_timeout, p.transport
        )
        await stream._start("POST", "/v1/stream", json=p.body, headers=p.headers)
        return stream

    async def run(self, input: str | None = None, **options: Unpack[StreamOptions]) -> StreamResult:
        """``stream(...)`` to the end: the result, or :class:`StreamError`."""
        async with await self.stream(input, **options) as stream:
            return await stream.until_done()

    async def resume(
        self,
        stream_id: str,
        last_event_id: int = 0,
        *,
        client_tools: Iterable[ClientTool | ToolFunction | Mapping[str, Any]] = (),
        timeout: float | None = None,  # noqa: ASYNC109 (the stream's deadline, kept on it)
        tool_timeout: float | None = None,
        **callbacks: Callback,
    ) -> AsyncStream:
        """``GET /v1/streams/{id}`` after ``last_event_id``, then live to the end."""
        state, tools, headers = self._resume_state(stream_id, last_event_id, client_tools)
        stream = AsyncStream(self, state, tools, Callbacks(**callbacks), timeout, tool_timeout)
        await stream._start("GET", f"/v1/streams/{stream_id}", headers=headers)
        return stream

    async def cancel(self, stream_id: str) -> dict[str, Any]:
        return await self._post(f"/v1/streams/{stream_id}/cancel", None)

    async def pause(self, stream_id: str) -> dict[str, Any]:
        """As :meth:`ToolForge.pause`: ``POST /v1/streams/{id}/pause``."""
        return await self._post(f"/v1/streams/{stream_id}/pause", None)

    async def unpause(self, stream_id: str) -> dict[str, Any]:
        """As :meth:`ToolForge.unpause`: ``POST /v1/streams/{id}/resume``."""
        return await self._post(f"/v1/streams/{stream_id}/resume", None)

    async def approve(self, stream_id: str, call_id: str, approve: bool = True) -> dict[str, Any]:
        return await self._post(
            f"/v1/streams/{stream_id}/approvals/{call_id}", {"approve": approve}
        )

    async def submit_tool_result(
        self,
        stream_id: str,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        code: str = "CLIENT_TOOL_FAILED",
    ) -> dict[str, Any]:
        body = self._tool_result_body(result, error, code)
        return await self._post(f"/v1/streams/{stream_id}/tool_results/{call_id}", body)

    async def _post(self, path: str, body: Any) -> dict[str, Any]:
        try:
            response = await self._http.post(self.base_url + path, json=body, headers=self._headers)
        except httpx.TransportError as exc:
            raise transport_error(exc, f"POST {path}") from exc
        if response.status_code >= 400:
            raise status_error(response)
        data: dict[str, Any] = response.json()
        return data


async def _call(callback: Callback, arg: Any) -> Any:
    value = callback(arg)
    if inspect.isawaitable(value):
        value = await value
    return value


class AsyncStream(StreamBase[AsyncToolForge], AbstractAsyncContextManager["AsyncStream"]):
    """One stream on asyncio: ``async for event in stream``; see ``Stream``."""

    def __init__(
        self,
        client: AsyncToolForge,
        state: StreamState,
        tools: dict[str, ClientTool],
        callbacks: Callbacks,
        timeout: float | None,
        tool_timeout: float | None,
        transport: Transport = "sse",
    ) -> None:
        super().__init__(client, state, tools, callbacks, timeout, tool_timeout, transport)
        self._connection: AbstractAsyncContextManager[EventSource] | None = None
        self._response: httpx.Response | None = None
        self._sse: AsyncIterator[ServerSentEvent | SocketFrame] | None = None
        self._socket: AsyncSocket | None = None
        self._iterator = self._events()
        self._watchdog: asyncio.Task[None] | None = None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterator

    async def __anext__(self) -> Event:
        return await anext(self._iterator)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def until_done(self) -> StreamResult:
        async for _ in self._iterator:
            pass
        self._state.result.raise_for_error()
        return self._state.result

    async def cancel(self) -> dict[str, Any]:
        self._cancelled = True
        if self._socket is not None:
            return await self._socket.command({"type": "cancel"})
        return await self._client.cancel(self._require_id())

    async def pause(self) -> dict[str, Any]:
        """As :meth:`Stream.pause`: the model stops on the gateway until :meth:`resume`."""
        if self._socket is not None:
            return await self._socket.command({"type": "pause"})
        return await self._client.pause(self._require_id())

    async def resume(self) -> dict[str, Any]:
        """As :meth:`Stream.resume`."""
        if self._socket is not None:
            return await self._socket.command({"type": "resume"})
        return await self._client.unpause(self._require_id())

    async def approve(self, call_id: str, approve: bool = True) -> dict[str, Any]:
        if self._socket is not None:
            return await self._socket.command(self._approve_message(call_id, approve))
        return await self._client.approve(self._require_id(), call_id, approve)

    async def deny(self, call_id: str) -> dict[str, Any]:
        return await self.approve(call_id, False)

    async def submit_tool_result(
        self,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        code: str = "CLIENT_TOOL_FAILED",
    ) -> dict[str, Any]:
        if self._socket is not None:
            body = self._client._tool_result_body(result, error, code)
            return await self._socket.command(self._tool_result_message(call_id, body))
        return await self._client.submit_tool_result(
            self._require_id(), call_id, result, error=error, code=code
        )

    async def close(self) -> None:
        await self._iterator.aclose()
        await self._finish()

    # -- internals ----------------------------------------------------------------------

    async def _start(self, method: str, path: str, **kwargs: Any) -> None:
        await self._open(method, path, **kwargs)
        if self._timeout is not None:
            self._watchdog = asyncio.create_task(self._expire(self._timeout))

    async def _open(self, method: str, path: str, **kwargs: Any) -> None:
        if self._transport == "ws":
            await self._open_socket(kwargs.get("json"))
            return
        client = self._client
        headers = {**client._headers, **kwargs.pop("headers", {})}
        connection = aconnect_sse(
            client._http, method, client.base_url + path, headers=headers, **kwargs
        )
        try:
            source = await connection.__aenter__()
        except httpx.TransportError as exc:
            raise transport_error(exc, f"{method} {path}") from exc
        response = source.response
        if response.status_code >= 400:
            await response.aread()
            await connection.__aexit__(None, None, None)
            raise status_error(response)
        if self._state.result.stream_id is None:
            self._state.result.stream_id = response.headers.get("x-stream-id")
        self._connection, self._response = connection, response
        self._sse = source.aiter_sse()

    async def _open_socket(self, body: dict[str, Any] | None) -> None:
        """As ``Stream._open_socket``."""
        client = self._client
        open_timeout = client._http.timeout.connect or 5.0
        socket = await AsyncSocket.connect(client.base_url, client._headers, open_timeout)
        try:
            first = await socket.open(self._socket_opening(body))
        except BaseException:
            await socket.close()
            raise
        if self._state.result.stream_id is None and first.event == "stream.begin":
            self._state.result.stream_id = first.data.get("stream_id")
        self._socket, self._sse = socket, socket.frames()

    async def _disconnect(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.close()
        connection, sse = self._connection, self._sse
        self._connection, self._sse = None, None
        if sse is not None and hasattr(sse, "aclose"):
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                await sse.aclose()
        if connection is not None:
            with contextlib.suppress(httpx.HTTPError):
                await connection.__aexit__(None, None, None)

    async def _events(self) -> AsyncGenerator[Event, None]:
        state = self._state
        try:
            while True:
                assert self._sse is not None
                try:
                    sse = await anext(self._sse)
                except StopAsyncIteration:
                    await self._reconnect("the connection ended before the done frame")
                    continue
                except httpx.TransportError as exc:
                    timed_out = isinstance(exc, httpx.TimeoutException)
                    await self._reconnect(f"{type(exc).__name__}: {exc}", timed_out=timed_out)
                    continue
                event = state.accept(sse.event, sse.id, sse.data)
                if event is None:
                    continue
                for callback, arg in self._callbacks.calls(event):
                    await _call(callback, arg)
                if state.finished:
                    await self._disconnect()
                    if self._timed_out and not self._cancelled:
                        raise self._deadline_error()
                    yield event
                    return
                yield event
                if isinstance(event.data, ToolCall):
                    await self._act(event.data)
        finally:
            await self._finish()

    async def _act(self, call: ToolCall) -> None:
        run = self._client_tool(call)
        if run is not None:
            outcome = await run_tool_async(run[0], call.args, run[1])
            await self._post_result(call, outcome.to_wire())
        elif call.needs_approval and self._callbacks.on_approval is not None:
            await self.approve(call.id, bool(await _call(self._callbacks.on_approval, call)))

    async def _post_result(self, call: ToolCall, body: dict[str, Any]) -> None:
        """As ``Stream._post_result``."""
        first = 1
        if self._socket is not None:
            try:
                await self._socket.command(self._tool_result_message(call.id, body))
                return
            except APIConnectionError:
                first = 2  # it may have arrived: a 409 now is that
        for attempt in itertools.count(first):
            try:
                await self._client._post(self._tool_result_path(call), body)
                return
            except ConflictError:
                if attempt == 1:
                    raise
                return
            except APIConnectionError:
                if attempt > self._client.max_resumes:
                    raise
                await asyncio.sleep(backoff_s(attempt))

    async def _reconnect(self, why: str, *, timed_out: bool = False) -> None:
        await self._disconnect()
        if self._timed_out:
            raise self._deadline_error()
        while self._may_resume():
            self._state.result.resumes += 1
            await asyncio.sleep(backoff_s(self._state.result.resumes))
            path, headers = self._resume_path()
            try:
                await self._open("GET", path, headers=headers)
                return
            except APIConnectionError as exc:
                why, timed_out = str(exc), isinstance(exc, APITimeoutError)
        raise self._given_up(why, timed_out)

    async def _expire(self, after: float) -> None:
        await asyncio.sleep(after)
        if self._state.finished:
            return
        self._timed_out = True
        try:
            await self._client.cancel(self._require_id())
        except Exception:
            response = self._response
            if response is not None:
                await response.aclose()
            if self._socket is not None:
                await self._socket.close()

    async def _finish(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        await self._disconnect()
        if self._should_cancel_on_leaving():
            with contextlib.suppress(Exception):  # best effort: the gateway may be gone
                await self._client.cancel(self._require_id())
