"""Typed exceptions: HTTP errors before the stream starts, ``error`` frames after it.

Every exception is a :class:`ToolForgeError`. The gateway's errors carry a stable ``code``
(docs/protocol.md §9); match on it, never on the message.

- :class:`APIStatusError` (and one subclass per status): the gateway answered 4xx/5xx.
- :class:`APIConnectionError`: no answer (refused, reset, or dropped and not resumable);
  :class:`APITimeoutError` for a timeout, :class:`RequestTimeoutError` for the whole
  request's deadline (``timeout=`` of ``stream``/``run``).
- :class:`StreamError`: the stream ended with an ``error`` frame (``until_done``/``run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from toolforge_client._state import StreamResult

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTimeoutError",
    "StreamError",
    "ToolForgeError",
    "UpstreamError",
    "socket_error",
    "status_error",
]


class ToolForgeError(Exception):
    """The base of every error this SDK raises."""


class APIError(ToolForgeError):
    """A request to the gateway failed. ``code`` is the gateway's stable error code when
    it sent one."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class APIStatusError(APIError):
    """The gateway answered an HTTP error: ``status_code``, ``code``, ``message``,
    ``details`` (per field, for a 422) and ``body`` (the parsed JSON, if any)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message, code=code)
        self.status_code = status_code
        self.details = details or []
        self.body = body

    def __str__(self) -> str:
        code = f" {self.code}" if self.code else ""
        return f"HTTP {self.status_code}{code}: {self.message}"


class BadRequestError(APIStatusError):
    """400 or 422: the body is wrong (``details`` names each field)."""


class AuthenticationError(APIStatusError):
    """401: a missing or wrong API key."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404: no such stream (or it expired), or no such call waiting."""


class ConflictError(APIStatusError):
    """409: a call that has its answer already, or an idempotency key in flight."""


class PayloadTooLargeError(APIStatusError):
    """413: the request body is over the gateway's ``MAX_BODY_BYTES``."""


class RateLimitError(APIStatusError):
    """429."""


class InternalServerError(APIStatusError):
    """5xx."""


class APIConnectionError(APIError):
    """The gateway could not be reached, or the connection dropped and could not be
    resumed (``stream_id`` is set when the stream had started: resume it later with
    ``client.resume(stream_id, last_event_id)``)."""

    def __init__(
        self, message: str, *, stream_id: str | None = None, last_event_id: int = 0
    ) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.last_event_id = last_event_id


class APITimeoutError(APIConnectionError):
    """A connect or read timeout (``timeout=`` of the client)."""


class RequestTimeoutError(APITimeoutError):
    """The request's deadline passed: the SDK cancelled the stream on the gateway.
    ``result`` holds what had arrived."""

    def __init__(self, message: str, *, stream_id: str | None, result: StreamResult) -> None:
        super().__init__(message, stream_id=stream_id, last_event_id=result.last_event_id)
        self.result = result


class StreamError(ToolForgeError):
    """The stream ended with an ``error`` frame: ``code``, ``message``, ``retryable``,
    ``frame_id`` and ``result`` (everything that arrived, the ``done`` frame included)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        frame_id: str | None,
        result: StreamResult,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.frame_id = frame_id
        self.result = result
        self.stream_id = result.stream_id


class UpstreamError(StreamError):
    """An ``error`` frame about the model server (``UPSTREAM_*`` codes)."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    429: RateLimitError,
}


def status_error(response: httpx.Response) -> APIStatusError:
    """The typed error for an HTTP error ``response`` whose body has been read."""
    body: Any = None
    code: str | None = None
    message = response.reason_phrase or "HTTP error"
    details: list[dict[str, Any]] | None = None
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        if text:
            message = text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code")
        message = str(err.get("message", message))
        details = err.get("details")
    elif isinstance(body, dict) and "detail" in body:  # FastAPI's own (a 405, say)
        message = str(body["detail"])
    status = response.status_code
    cls = _BY_STATUS.get(status, InternalServerError if status >= 500 else APIStatusError)
    return cls(message, status_code=status, code=code, details=details, body=body)


# A refusal on the WebSocket carries the gateway's code but no HTTP status: the status of
# the HTTP route that refuses the same way (docs/protocol.md's error codes).
_STATUS_BY_CODE: dict[str, int] = {
    "BAD_REQUEST": 400,
    "INVALID_SCHEMA": 422,
    "UNKNOWN_SCHEMA": 422,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "TOOL_NOT_ALLOWED": 403,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "IDEMPOTENCY_IN_FLIGHT": 409,
    "IDEMPOTENCY_KEY_REUSED": 409,
    "BODY_TOO_LARGE": 413,
    "RATE_LIMITED": 429,
    "INTERNAL": 500,
    "STREAM_LOST": 500,
    "REDIS_UNAVAILABLE": 503,
}


def socket_error(
    error: dict[str, Any], *, status: int | None = None, prefix: str | None = None
) -> APIStatusError:
    """The typed error for a refusal on the WebSocket (``{"code", "message", ...}``), or
    for a socket the gateway refused to open (``status``: the handshake's HTTP status)."""
    code = error.get("code")
    message = str(error.get("message") or "refused")
    if prefix is not None:
        message = f"{prefix}: {message}"
    details = error.get("details")
    if status is None:
        status = _STATUS_BY_CODE.get(str(code), 400)
        if details:  # a body that fails validation: 422 over HTTP
            status = 422
    cls = _BY_STATUS.get(status, InternalServerError if status >= 500 else APIStatusError)
    return cls(
        message,
        status_code=status,
        code=code,
        details=details if isinstance(details, list) else None,
        body={"error": error},
    )
