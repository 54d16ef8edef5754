"""A request body, read and parsed: within ``MAX_BODY_BYTES`` while it arrives, within
``MAX_REQUEST_DEPTH`` once parsed, and every refusal a typed 413 or 422 naming the field."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import Receive

from toolforge.api.json_depth import check_depth
from toolforge.api.models import Sampling, StreamRequest
from toolforge.errors import ErrorCode, RequestError

__all__ = ["ClientGone", "parse_stream_request", "read_body", "validation_error"]


class ClientGone(Exception):
    """The client left while sending its body: nobody is there to answer."""


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body from ASGI ``receive``, refused with 413 as soon as it is known to
    exceed ``limit`` bytes (``declared``: the Content-Length header, if any)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if not parts and not more:  # the usual case: the whole body in one message
            if len(chunk) > limit:
                raise _too_large(limit)
            return chunk
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
        if not more:
            return b"".join(parts)


def _too_large(limit: int) -> RequestError:
    return RequestError(
        ErrorCode.BODY_TOO_LARGE,
        f"request body over {limit} bytes (MAX_BODY_BYTES); send less context",
        http_status=413,
    )


def parse_stream_request(body: bytes, max_depth: int) -> StreamRequest:
    """``POST /v1/stream``'s body: JSON, within the depth, and a valid request."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            ErrorCode.BAD_REQUEST, f"the body is not valid JSON: {exc}", http_status=422
        ) from exc
    check_depth(body, raw, max_depth)  # 422 here, not a 500 when it is written
    try:
        return StreamRequest.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _known_fields() -> dict[str, str]:
    """Every request field name -> where it lives, for 'did you mean' hints."""
    known = {name: name for name in StreamRequest.model_fields}
    known.update({name: f"sampling.{name}" for name in Sampling.model_fields})
    return known


_KNOWN_FIELDS = _known_fields()


def _explain(err: Mapping[str, Any]) -> str:
    if err["type"] != "extra_forbidden":
        return str(err["msg"])
    name = str(err["loc"][-1]) if err["loc"] else ""
    hint = difflib.get_close_matches(name, _KNOWN_FIELDS, n=1)
    suggestion = f"; did you mean '{_KNOWN_FIELDS[hint[0]]}'?" if hint else ""
    return f"unknown field{suggestion} (fields: docs/protocol.md)"


def validation_error(exc: ValidationError) -> RequestError:
    """A pydantic refusal as the gateway's 422: every field named, the first in the
    message."""
    details = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(body)", "message": _explain(err)}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    first = details[0]
    return RequestError(
        ErrorCode.BAD_REQUEST,
        f"invalid field '{first['field']}': {first['message']}"
        + (f" (and {len(details) - 1} more)" if len(details) > 1 else ""),
        http_status=422,
        details=details,
    )
