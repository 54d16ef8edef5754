"""How deep a request body nests, checked where it is parsed (``MAX_REQUEST_DEPTH``).

orjson parses 1,024 levels but writes only 254, and the gateway writes what it is sent
(upstream requests, idempotency hashes, artifacts): a body nested in between was parsed,
then failed as an internal error halfway through its stream. Refused at parse time, it
is the caller's 422 like any other bad body.
"""

from __future__ import annotations

from typing import Any

from toolforge.errors import ErrorCode, RequestError

__all__ = ["check_depth", "depth_exceeds"]


def depth_exceeds(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``limit`` arrays and objects.
    Iterative: a deep value cannot exhaust Python's stack here."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def check_depth(body: bytes, value: object, limit: int) -> None:
    """A 422 if ``value``, parsed from ``body``, nests deeper than ``limit``.

    Free for almost every body: one that holds ``limit`` brackets or fewer cannot nest
    deeper than that, and ``bytes.count`` is C-fast; only a body with more is walked.
    """
    if body.count(b"{") + body.count(b"[") <= limit:
        return
    if depth_exceeds(value, limit):
        raise RequestError(
            ErrorCode.BAD_REQUEST,
            f"the body nests arrays and objects more than {limit} deep (MAX_REQUEST_DEPTH)",
            http_status=422,
        )
