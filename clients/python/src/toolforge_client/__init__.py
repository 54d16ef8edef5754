"""ToolForge's Python client: stream a request to a ToolForge gateway and get typed frames.

    from toolforge_client import ToolForge

    with ToolForge("http://127.0.0.1:8000") as client:
        for event in client.stream("Find pizza near me.", profile="demo"):
            print(event.id, event.event, event.data)

See clients/python/README.md for every feature: callbacks, client-side tools, approvals,
resume, timeouts, cancel, the async client and the errors.
"""

from __future__ import annotations

from toolforge_client import frames
from toolforge_client._async import AsyncStream, AsyncToolForge
from toolforge_client._state import Callbacks, Event, StreamOptions, StreamResult
from toolforge_client._sync import DEFAULT_BASE_URL, Stream, ToolForge
from toolforge_client.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    RequestTimeoutError,
    StreamError,
    ToolForgeError,
    UpstreamError,
)
from toolforge_client.tools import ClientTool, client_tool

__all__ = [
    "DEFAULT_BASE_URL",
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncStream",
    "AsyncToolForge",
    "AuthenticationError",
    "BadRequestError",
    "Callbacks",
    "ClientTool",
    "ConflictError",
    "Event",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTimeoutError",
    "Stream",
    "StreamError",
    "StreamOptions",
    "StreamResult",
    "ToolForge",
    "ToolForgeError",
    "UpstreamError",
    "client_tool",
    "frames",
]

__version__ = "0.1.0"
