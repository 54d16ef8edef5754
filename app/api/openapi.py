"""The OpenAPI document, completed where FastAPI cannot see (docs/protocol.md: "the OpenAPI
document describes this body and every frame").

``POST /v1/stream`` reads its body itself (it is served ahead of FastAPI, see
:mod:`toolforge.api.fastpath`) and answers with server-sent events, so FastAPI documents neither
its request body nor its response. :func:`complete_openapi` adds both: the body is
:class:`~toolforge.api.models.StreamRequest`'s JSON Schema, the response a ``text/event-stream``
of ``StreamEvent`` (the typed frames' union, :mod:`toolforge.core.protocol.schema`), and the
errors the gateway's own ``{"error": {...}}`` body. ``GET /v1/streams/{stream_id}``
answers the same events. :func:`install_openapi` hooks it into the app the way FastAPI documents
("Extending OpenAPI"): by replacing ``app.openapi``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from fastapi import FastAPI

from toolforge.api.models import ChatCompletionRequest, StreamRequest
from toolforge.core.protocol.frames import EVENTS, Error, Frame
from toolforge.core.protocol.schema import STREAM_EVENT, stream_event_definitions

__all__ = ["complete_openapi", "install_openapi"]

_REF: Final = "#/components/schemas/{model}"
_ERROR_BODY: Final = "ErrorResponse"
_STREAM_ERRORS: Final = {
    "409": "`IDEMPOTENCY_IN_FLIGHT`: a stream with this Idempotency-Key is still running",
    "413": "`BODY_TOO_LARGE`: the body is over `MAX_BODY_BYTES`",
    "422": "`BAD_REQUEST` (a field is wrong or unknown: `details` lists each), "
    "`UNKNOWN_SCHEMA`, `INVALID_SCHEMA`, `MODE_UNAVAILABLE`, `IDEMPOTENCY_KEY_REUSED`, ...",
}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and so ``/openapi.json``) return the completed document."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_openapi(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented hook


def complete_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (FastAPI's) with the stream's body, events and errors described."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    request = StreamRequest.model_json_schema(ref_template=_REF)
    _add(schemas, {**request.pop("$defs", {}), "StreamRequest": request})
    _add(schemas, stream_event_definitions(_REF))
    _add(
        schemas,
        {
            _ERROR_BODY: {
                "title": _ERROR_BODY,
                "description": "An error before the stream began; after it, the same object "
                "is an `error` event.",
                "type": "object",
                "properties": {"error": {"$ref": _REF.format(model=Error.__name__)}},
                "required": ["error"],
                "additionalProperties": False,
            }
        },
    )
    paths = document.get("paths", {})
    post = paths["/v1/stream"]["post"]
    post["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="StreamRequest")}}},
    }
    post["responses"] = {"200": _events_response(), **_errors(_STREAM_ERRORS)}
    resume = paths.get("/v1/streams/{stream_id}", {}).get("get")
    if resume is not None:
        resume["responses"]["200"] = _events_response()
    proxy = paths.get("/v1/chat/completions", {}).get("post")
    if proxy is not None:  # its body is read by the route itself, to answer in OpenAI's shape
        completion = ChatCompletionRequest.model_json_schema(ref_template=_REF, by_alias=True)
        _add(schemas, {**completion.pop("$defs", {}), "ChatCompletionRequest": completion})
        proxy["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model="ChatCompletionRequest")}}
            },
        }
        proxy["responses"] = {
            "200": {
                "description": "OpenAI's `chat.completion` (JSON), or with `stream: true` its "
                "`chat.completion.chunk` events (`text/event-stream`, ending in "
                "`data: [DONE]`); docs/proxy.md",
            },
            "400": {
                "description": 'OpenAI\'s error body: `{"error": {message, type, param, code}}`'
            },
            "502": {"description": "The upstream failed before a non-streaming answer"},
        }
    return document


def _add(schemas: dict[str, Any], definitions: Mapping[str, Any]) -> None:
    for name, schema in definitions.items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two different schemas are named {name!r} in the OpenAPI document")


def _events_response() -> dict[str, Any]:
    events = "\n".join(f"- `{event}`: {_summary(cls)}" for event, cls in EVENTS.items())
    return {
        "description": "A stream of server-sent events, each `id: <n>` (pings have none), "
        "`event: <name>` and one `data: <JSON>` line (docs/protocol.md; the schema of each event's "
        f"data is in schemas/frames/<event>.json):\n\n{events}",
        "headers": {
            "X-Stream-Id": {
                "description": "The stream's id, for resume, cancel and approvals",
                "schema": {"type": "string"},
            }
        },
        "content": {"text/event-stream": {"schema": {"$ref": _REF.format(model=STREAM_EVENT)}}},
    }


def _summary(cls: type[Frame]) -> str:
    """The first sentence of a frame's docstring, as Markdown."""
    first = " ".join((cls.__doc__ or "").split()).split(". ")[0].rstrip(".")
    return first.replace("``", "`") + "."


def _errors(descriptions: Mapping[str, str]) -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": _REF.format(model=_ERROR_BODY)}}}
    return {status: {"description": text, "content": body} for status, text in descriptions.items()}
