"""What :class:`ToolForge` and :class:`AsyncToolForge`, and their streams, share: settings,
request bodies and the decisions a stream makes; the subclasses do the I/O, one with
threads and one with asyncio (the openai SDK's split)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from toolforge_client._state import (
    Callbacks,
    StreamResult,
    StreamState,
    Transport,
    build_body,
)
from toolforge_client.errors import APIConnectionError, APITimeoutError, RequestTimeoutError
from toolforge_client.frames import ToolCall
from toolforge_client.tools import ClientTool, ToolFunction

__all__ = ["ClientBase", "StreamBase"]


class ClientBase:
    """The settings of a client (see ``ToolForge``)."""

    def __init__(
        self, base_url: str, *, api_key: str | None, max_resumes: int, tool_timeout: float
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_resumes = max_resumes
        self.tool_timeout = tool_timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @staticmethod
    def _tool_result_body(result: Any, error: str | None, code: str) -> dict[str, Any]:
        if error is not None:
            return {"ok": False, "error": {"code": code, "message": error}}
        return {"ok": True, "result": result}

    @staticmethod
    def _resume_state(
        stream_id: str,
        last_event_id: int,
        client_tools: Iterable[ClientTool | ToolFunction | Mapping[str, Any]],
    ) -> tuple[StreamState, dict[str, ClientTool], dict[str, str]]:
        """The state, client tools and headers of ``GET /v1/streams/{id}``."""
        _, tools = build_body(
            input="", messages=None, tools=None, client_tools=client_tools,
            on_disconnect=None, extra={},
        )  # fmt: skip
        return StreamState(stream_id, last_event_id), tools, {"Last-Event-ID": str(last_event_id)}


C = TypeVar("C", bound=ClientBase)


class StreamBase(Generic[C]):
    """A stream's state and the decisions it makes, without I/O."""

    def __init__(
        self,
        client: C,
        state: StreamState,
        tools: dict[str, ClientTool],
        callbacks: Callbacks,
        timeout: float | None,
        tool_timeout: float | None,
        transport: Transport = "sse",
    ) -> None:
        self._client = client
        self._transport = transport
        self._state = state
        self._tools = tools
        self._callbacks = callbacks
        self._timeout = timeout
        self._tool_timeout = tool_timeout
        self._timed_out = False  # the request's deadline passed (the SDK cancelled it)
        self._cancelled = False  # the caller cancelled it
        self._abandoned = False  # cancelled on leaving, or left resumable: nothing more

    @property
    def stream_id(self) -> str | None:
        return self._state.result.stream_id

    @property
    def result(self) -> StreamResult:
        """What arrived so far (all of it once the stream is done)."""
        return self._state.result

    def _require_id(self) -> str:
        if self.stream_id is None:
            raise RuntimeError("the stream has no id yet")
        return self.stream_id

    def _resume_path(self) -> tuple[str, dict[str, str]]:
        result = self._state.result
        return f"/v1/streams/{result.stream_id}", {"Last-Event-ID": str(result.last_event_id)}

    def _tool_result_path(self, call: ToolCall) -> str:
        return f"/v1/streams/{self._require_id()}/tool_results/{call.id}"

    @staticmethod
    def _tool_result_message(call_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """A tool result as the socket's command (the HTTP body, with its type and call)."""
        return {"type": "tool_result", "call_id": call_id, **body}

    @staticmethod
    def _approve_message(call_id: str, approve: bool) -> dict[str, Any]:
        return {"type": "approve", "call_id": call_id, "approved": approve}

    def _socket_opening(self, body: dict[str, Any] | None) -> dict[str, Any]:
        """The socket's first message: ``start`` with ``body``, else ``resume`` after the
        last frame received."""
        if body is not None:
            return {"type": "start", "request": body}
        result = self._state.result
        return {"type": "resume", "stream_id": self._require_id(), "after": result.last_event_id}

    def _client_tool(self, call: ToolCall) -> tuple[ClientTool, float] | None:
        """The function to run for ``call`` and its timeout, if the SDK runs it."""
        tool = self._tools.get(call.name)
        if call.executor != "client" or tool is None or tool.fn is None:
            return None
        return tool, tool.timeout or self._tool_timeout or self._client.tool_timeout

    def _may_resume(self) -> bool:
        result = self._state.result
        return result.stream_id is not None and result.resumes < self._client.max_resumes

    def _given_up(self, why: str, timed_out: bool) -> APIConnectionError:
        """The error after the last resume failed; the stream is left resumable."""
        self._abandoned = True
        result = self._state.result
        cls = APITimeoutError if timed_out else APIConnectionError
        return cls(
            f"the connection to the gateway dropped ({why}) and was not resumed "
            f"after {result.resumes} attempt(s)",
            stream_id=result.stream_id,
            last_event_id=result.last_event_id,
        )

    def _deadline_error(self) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"the request did not finish in {self._timeout:g} s: cancelled",
            stream_id=self.stream_id,
            result=self._state.result,
        )

    def _should_cancel_on_leaving(self) -> bool:
        """A stream left before its done frame is cancelled, once."""
        if self._state.finished or self.stream_id is None or self._abandoned:
            return False
        self._abandoned = True
        return True
