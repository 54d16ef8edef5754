"""What a request must look like before any route reads it: its ``Host``, its
``Content-Type``, and (for the routes FastAPI serves) its body's size and depth.

**Without keys, only same-machine clients get in** (docs/security.md). A gateway on
127.0.0.1 with no API keys is still reachable from every web page its user opens: a page
may POST to ``http://127.0.0.1:8000`` (a "simple" cross-origin request: ``text/plain``,
no preflight), or make its own host name resolve to 127.0.0.1 and read the answers as
same-origin (DNS rebinding). Two checks close both:

- **JSON only.** A POST with a body must say ``Content-Type: application/json``, else
  415. A browser sends that type cross-origin only after a CORS preflight, which the
  gateway answers only for ``CORS_ORIGINS``. Always on: no client of the gateway sends
  anything else. A POST without a body (``…/cancel``) needs no type.
- **A Host allowlist.** The ``Host`` header must name this machine (``localhost``,
  ``127.0.0.1``, ``[::1]``, any port) or one of ``ALLOWED_HOSTS``, else 403: a rebinding
  page's requests carry its own host name. Checked whenever no keys are configured, and
  whenever ``ALLOWED_HOSTS`` is set. ``/healthz`` and ``/readyz`` are exempt (probes call
  them by whatever address reaches the process, and they say nothing but up or ready).

**Every POST's body.** ``POST /v1/stream`` and ``/v1/chat/completions`` read their body
themselves, within ``MAX_BODY_BYTES`` (:func:`toolforge.api.routes.read_body`), and check
its depth where they parse it. The POSTs FastAPI serves (cancel, approvals, tool
results) are read here first, under the same two limits, then handed on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import orjson
from starlette.types import Message, Receive, Scope

from toolforge.api.auth import PUBLIC_PATHS
from toolforge.api.json_depth import check_depth
from toolforge.api.routes import read_body
from toolforge.errors import ErrorCode, RequestError
from toolforge.settings import Settings

__all__ = ["LOOPBACK_HOSTS", "HostAllowlist", "RequestGuard", "split_host"]

LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "[::1]")
# How many allowed Host values a guard remembers (past it, each is checked every time).
_HOSTS_REMEMBERED: Final = 64


def split_host(value: str) -> tuple[str, str] | None:
    """A ``Host`` header's name (lower-case, without a final dot) and port (``""`` when
    absent); None when it is not a host name or address with an optional port."""
    if value.startswith("["):  # an IPv6 literal: "[::1]:8000"
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    else:
        name, colon, port = value.partition(":")
        if colon and ":" in port:  # a bare IPv6 address: not a Host header's form
            return None
        if colon and not port:
            return None
    if port and not port.isdigit():
        return None
    name = name.lower().removesuffix(".")
    if not name or any(c in name for c in " /\\@?#"):
        return None
    return name, port


@dataclass(frozen=True, slots=True)
class HostAllowlist:
    """The names a ``Host`` header may carry: the loopback ones and ``ALLOWED_HOSTS``."""

    names: frozenset[str]  # any port
    with_ports: frozenset[str] = frozenset()  # "name:port" entries: that port only
    suffixes: tuple[str, ...] = ()  # "*.example.com" entries, as ".example.com"
    any_host: bool = False  # "*"

    @classmethod
    def parse(cls, allowed: str | None) -> HostAllowlist:
        names, with_ports, suffixes = set(LOOPBACK_HOSTS), set[str](), list[str]()
        any_host = False
        for raw in (allowed or "").split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry == "*":
                any_host = True
            elif entry.startswith("*."):
                suffixes.append(entry[1:].removesuffix("."))
            else:
                split = split_host(entry)
                if split is None:
                    raise ValueError(f"ALLOWED_HOSTS: {raw.strip()!r} is not a host name")
                name, port = split
                if port:
                    with_ports.add(f"{name}:{port}")
                else:
                    names.add(name)
        return cls(frozenset(names), frozenset(with_ports), tuple(suffixes), any_host)

    def allows(self, host: str) -> bool:
        """Whether ``host`` (a ``Host`` header's value) names a host in the list."""
        if self.any_host:
            return True
        split = split_host(host)
        if split is None:
            return False
        name, port = split
        return (
            name in self.names
            or (bool(port) and f"{name}:{port}" in self.with_ports)
            or name.endswith(self.suffixes)
        )


@dataclass(frozen=True, slots=True)
class RequestGuard:
    """The checks of the module docstring, as the ASGI entry applies them."""

    hosts: HostAllowlist | None  # None: the Host header is not checked
    max_body_bytes: int
    max_depth: int
    # Host values the list allowed already (the list never changes): a client sends the
    # same one on every request, so it is parsed once, not per request. Bounded.
    _allowed: set[bytes] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, *, keys: bool) -> RequestGuard:
        """``keys``: whether API keys are configured (then ``Host`` is checked only when
        ``ALLOWED_HOSTS`` is set)."""
        check_hosts = not keys or settings.allowed_hosts is not None
        return cls(
            hosts=HostAllowlist.parse(settings.allowed_hosts) if check_hosts else None,
            max_body_bytes=settings.max_body_bytes,
            max_depth=settings.max_request_depth,
        )

    def refusal(self, scope: Scope) -> RequestError | None:
        """What is wrong with the request's head (``Host``, ``Content-Type``), if anything."""
        host = content_type = None
        has_body = False
        for name, value in scope["headers"]:  # lower-cased by the server (ASGI)
            if name == b"host":
                host = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                has_body = has_body or value.strip() not in (b"0", b"")
            elif name == b"transfer-encoding":
                has_body = True
        if self.hosts is not None and scope["path"] not in PUBLIC_PATHS:
            if host is None:
                return RequestError(
                    ErrorCode.BAD_REQUEST, "the request has no Host header", http_status=400
                )
            if host not in self._allowed:
                refused = self._host_refusal(self.hosts, host)
                if refused is not None:
                    return refused
        if scope["method"] == "POST" and has_body and not _is_json(content_type):
            shown = "none" if content_type is None else repr(content_type.decode("latin-1"))
            return RequestError(
                ErrorCode.BAD_REQUEST,
                f"a request body must be JSON, sent with 'Content-Type: application/json' "
                f"(got {shown[:100]})",
                http_status=415,
            )
        return None

    def _host_refusal(self, hosts: HostAllowlist, host: bytes) -> RequestError | None:
        shown = host.decode("latin-1")
        if not hosts.allows(shown):
            return RequestError(
                ErrorCode.FORBIDDEN,
                f"this gateway does not answer to the host {shown[:100]!r}; call it as "
                "localhost or 127.0.0.1, or list the name in ALLOWED_HOSTS "
                "(docs/security.md)",
                http_status=403,
            )
        if len(self._allowed) < _HOSTS_REMEMBERED:
            self._allowed.add(host)
        return None

    async def buffered(self, scope: Scope, receive: Receive) -> Receive:
        """Read a FastAPI-routed POST's body within the limits (413, 422; ``ClientGone``
        if the client leaves), and a ``receive`` that hands it on whole."""
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value.decode("latin-1")
                break
        body = await read_body(receive, declared, self.max_body_bytes)
        if body.count(b"{") + body.count(b"[") > self.max_depth:
            try:
                value = orjson.loads(body)
            except orjson.JSONDecodeError:
                pass  # FastAPI answers a body that is not JSON with its own 422
            else:
                check_depth(body, value, self.max_depth)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # what comes next: http.disconnect
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json"
