"""An httpx transport for HTTP/1.1 on asyncio protocols and llhttp (``httptools``).

Why: the gateway streams an upstream's SSE body token by token. httpx's default transport
(httpcore + pure-Python h11) costs ~12-14 µs per HTTP chunk (one ``aiter_raw()`` item per
chunk) and ~1 ms of CPU per request (anyio/sniffio detection, shielded cancel scopes, pool
bookkeeping), as measured in bench/RESULTS.md. :class:`LeanTransport` keeps httpx as the
client API (Request/Response, timeouts, exceptions, ``MockTransport`` in tests) while the
bytes path is: socket → ``data_received`` → llhttp (C) → one ``bytes`` item per *socket
read*. Every chunked-encoding chunk already received is coalesced into that one item, so a
fast upstream costs one Python iteration per read, not one per token.

What it does not handle goes to ``fallback`` (by default an ``httpx.AsyncHTTPTransport``
with the same limits), so behaviour is never worse than httpx's: URLs other than http(s),
HEAD and CONNECT (llhttp cannot know that a HEAD response has no body), requests with an
``Upgrade`` header, and any request extension other than ``timeout`` and ``trace``.

Proxies: httpx reads ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``/``NO_PROXY`` only for
clients without a custom transport, so this one reads them itself (the standard library's
``urllib.request.getproxies_environment``; ``NO_PROXY`` as curl reads it: ``*``, host
names matching themselves and their subdomains, IP addresses and CIDR blocks, each with an
optional ``:port``) and hands every request to a proxied origin to an
``httpx.AsyncHTTPTransport(proxy=...)``: a forward proxy for http, a CONNECT tunnel for
https. Loopback origins (``127.0.0.0/8``, ``::1``, ``localhost``: the managed
llama-server) are never proxied. With no proxy variable set, the cost is one check of an
empty dict per request.

Errors mirror httpcore's choices (httpcore/_async/http11.py, _backends/anyio.py): refused,
unreachable, DNS or TLS failure → ``ConnectError``; a reset → ``ReadError``; a clean close
before the response or inside a framed body, or a malformed response →
``RemoteProtocolError``. A body framed by neither Content-Length nor chunked ends at EOF:
httptools does not expose ``llhttp_finish``, so EOF itself completes such a message.

This module is the pool; one connection and its response body are
:mod:`toolforge.upstream.http11`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import select
import ssl
import urllib.request
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from typing import Any, Final, TypeAlias

import httpx

from toolforge.upstream.http11 import (
    HIGH_WATER,
    Body,
    Connection,
    Key,
    read_error,
    request_head,
)

__all__ = [
    "DEFAULT_LIMITS",
    "HIGH_WATER",
    "KEEPALIVE_EXPIRY_S",
    "PRECONNECT_WINDOW_S",
    "RESERVED_CONNECTIONS",
    "LeanTransport",
    "PostTemplate",
    "ResponseHead",
    "UpstreamClient",
    "pool_limits",
]

KEEPALIVE_EXPIRY_S: Final = 5.0
"""An idle connection's life: llama-server closes one idle for 5 s itself."""


RESERVED_CONNECTIONS: Final = 4
"""Connections beyond the streams' own, for the gateway's short requests of its own (the
readiness check, a mode probe): with every stream slot held, ``/readyz`` still answers."""


def pool_limits(max_connections: int, max_keepalive: int) -> httpx.Limits:
    """The pool's limits from ``UPSTREAM_MAX_CONNECTIONS`` (the streams admitted at once,
    one connection each: :mod:`toolforge.runtime.admission`), plus
    :data:`RESERVED_CONNECTIONS`, and ``UPSTREAM_MAX_KEEPALIVE``."""
    total = max_connections + RESERVED_CONNECTIONS
    return httpx.Limits(
        max_connections=total,
        max_keepalive_connections=min(max_keepalive, total),
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )


DEFAULT_LIMITS: Final = pool_limits(1000, 100)
"""The settings' defaults, for a transport built without them (tests, embedders)."""

_Timeouts: TypeAlias = dict[str, float | None]  # httpx's "timeout" extension
_Trace: TypeAlias = Callable[[str, dict[str, Any]], Awaitable[None]]
_PORTS: Final = {"http": 80, "https": 443}
_EXTENSIONS: Final = frozenset({"timeout", "trace"})
PRECONNECT_WINDOW_S: Final = 60.0
"""With ``preconnect``, how long after an origin's last request a spare is kept ready."""
_SPARE_MIN_LIFE_S: Final = 1.0  # a spare closed sooner was refused, not timed out


class PostTemplate:
    """A POST that is sent again and again with other bodies: its URL and headers, and
    for :meth:`LeanTransport.post` the request head, serialised once on first use.

    Raises ``ValueError`` for a URL other than http(s); an illegal character in a header
    (CR or LF) raises ``httpx.LocalProtocolError`` from :meth:`head`, as httpx would when
    the request is sent.
    """

    __slots__ = ("_head", "headers", "key", "url")

    def __init__(self, url: httpx.URL, headers: Mapping[str, str]) -> None:
        scheme = url.scheme
        if scheme != "http" and scheme != "https":
            raise ValueError(f"not an http(s) URL: {url}")
        self.url = url
        self.headers: Mapping[str, str] = dict(headers)
        self.key: Key = (scheme, url.raw_host.decode("ascii"), url.port or _PORTS[scheme])
        self._head: bytes | None = None

    def head(self) -> bytes:
        """The request line and headers (Host first, as httpx sends them), ending with
        ``Content-Length: `` for the caller to complete."""
        if self._head is None:
            request = httpx.Request("POST", self.url, headers=self.headers, content=b"")
            full = request_head(request)  # checks for CR/LF
            lines = full.split(b"\r\n")
            kept = [line for line in lines[:-2] if not line.lower().startswith(b"content-length:")]
            self._head = b"\r\n".join([*kept, b"Content-Length: "])
        return self._head


class ResponseHead:
    """A response's status and headers as received, and its body (``stream``) unread:
    what :meth:`LeanTransport.post` returns instead of an ``httpx.Response``."""

    __slots__ = ("__weakref__", "headers", "status_code", "stream")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], stream: Body) -> None:
        self.status_code = status_code
        self.headers = headers
        self.stream = stream

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or ``None``."""
        key = name.lower().encode("latin-1")
        for field, value in self.headers:
            if field.lower() == key:
                return value.decode("latin-1")
        return None

    async def aclose(self) -> None:
        await self.stream.aclose()


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio for ``httpx.AsyncClient(transport=LeanTransport(), ...)``.

    ``limits`` as httpx's: ``max_connections`` bounds connections busy plus idle (a request
    waits up to the pool timeout for one, then ``PoolTimeout``), at most
    ``max_keepalive_connections`` stay idle, each for at most ``keepalive_expiry`` seconds.
    ``verify`` is an ``ssl.SSLContext`` or a bool, as for httpx. ``fallback`` serves what
    this transport does not (see the module docstring); :meth:`aclose` closes it too.

    ``preconnect``: when the last idle connection to an origin goes away (the server closed
    it after a response, answered ``Connection: close``, or timed out an idle one) and a
    request went to that origin within the last :data:`PRECONNECT_WINDOW_S` seconds, open
    a spare connection to it in the background, so that the next request finds one ready
    instead of waiting for the TCP (and TLS) handshake. llama-server closes the connection
    after every streamed response (seen with 11434.0.0 and with plain httpx) and an idle
    one after 5 s: without a spare, every stream pays a connect (0.1-0.4 ms on loopback)
    before its request goes out. At most one spare per origin is connecting at a time; a
    failed one is not retried, one the server drops within a second of opening it is not
    replaced, and an origin nobody asked for within the window gets no new spare. Envoy
    calls the same idea a preconnect policy.
    """

    def __init__(
        self,
        *,
        limits: httpx.Limits = DEFAULT_LIMITS,
        verify: ssl.SSLContext | bool = True,
        fallback: httpx.AsyncBaseTransport | None = None,
        preconnect: bool = False,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        self._limits = limits
        # scheme ("http", "https", "all", and "no" for NO_PROXY) -> value; None: from the
        # environment, as httpx and requests read it.
        env = urllib.request.getproxies_environment() if proxies is None else proxies
        self._proxy_env = {k: v for k, v in env.items() if k in ("http", "https", "all", "no")}
        if set(self._proxy_env) <= {"no"}:
            self._proxy_env = {}
        self._proxy_for: dict[Key, httpx.AsyncBaseTransport | None] = {}
        self._proxy_transports: dict[str, httpx.AsyncBaseTransport] = {}
        self._verify = verify
        self._ssl = verify if isinstance(verify, ssl.SSLContext) else None
        self._fallback = fallback
        self._idle: dict[Key, list[Connection]] = {}  # per origin, most recent last
        self._idle_count = 0
        self._open = 0  # connections counted against max_connections, connecting included
        self._conns: set[Connection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._next_sweep = 0.0
        self._closed = False
        self._preconnect = preconnect
        # Per origin: when its last request checked out a connection, and with what
        # timeouts (a spare connects with that request's connect timeout).
        self._recent: dict[Key, tuple[float, _Timeouts]] = {}
        self._spares: dict[Key, asyncio.Task[None]] = {}  # spare connects under way

    @property
    def connections(self) -> int:
        """Connections open now (busy, idle or still connecting)."""
        return self._open

    def proxied(self, key: Key) -> bool:
        """Whether requests to ``key``'s origin go through a proxy (then :meth:`post` is not
        for them: send them through the client, which comes back here)."""
        return bool(self._proxy_env) and self._proxy(key) is not None

    def _proxy(self, key: Key) -> httpx.AsyncBaseTransport | None:
        """The proxy transport for an origin, or ``None``; decided once per origin."""
        try:
            return self._proxy_for[key]
        except KeyError:
            pass
        scheme, host, port = key
        url = self._proxy_env.get(scheme) or self._proxy_env.get("all")
        transport: httpx.AsyncBaseTransport | None = None
        if url and not _loopback(host) and not _no_proxy(host, port, self._proxy_env.get("no", "")):
            transport = self._proxy_transports.get(url)
            if transport is None:
                transport = httpx.AsyncHTTPTransport(
                    proxy=url, verify=self._verify, limits=self._limits
                )
                self._proxy_transports[url] = transport
        self._proxy_for[key] = transport
        return transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if self._proxy_env and scheme in _PORTS:
            key = (scheme, url.raw_host.decode("ascii"), url.port or _PORTS[scheme])
            if (proxy := self._proxy(key)) is not None:
                return await proxy.handle_async_request(request)
        if (
            (scheme != "http" and scheme != "https")
            or request.method in ("HEAD", "CONNECT")
            or not _EXTENSIONS.issuperset(request.extensions)
            or "upgrade" in request.headers
        ):
            return await self._fallback_transport().handle_async_request(request)
        timeouts: _Timeouts = request.extensions.get("timeout", {})
        trace: _Trace | None = request.extensions.get("trace")
        key = (scheme, url.raw_host.decode("ascii"), url.port or _PORTS[scheme])
        conn = await self._checkout(key, request, timeouts)
        new = conn is None
        if conn is None:  # a slot is reserved for us; _connect gives it back if it fails
            conn = await self._connect(key, request, timeouts, trace)
        try:
            if trace is not None and new:
                await trace("connection.connect_tcp.complete", {"return_value": conn})
            await self._send(conn, request, timeouts, trace)
            if trace is not None:
                await trace("http11.receive_response_headers.started", {"request": request})
            await self._head(conn, request, timeouts)
            version = b"HTTP/" + conn.parser.get_http_version().encode("ascii")
            if trace is not None:
                head = (version, conn.status, conn.reason, conn.headers)
                await trace("http11.receive_response_headers.complete", {"return_value": head})
        except BaseException:
            self.discard(conn)
            raise
        return self._response(conn, request, timeouts, version)

    async def post(
        self,
        template: PostTemplate,
        body: bytes,
        timeouts: _Timeouts,
        on_sent: Callable[[], None] | None = None,
        extra_headers: bytes = b"",
    ) -> ResponseHead:
        """POST ``body`` with ``template``'s URL and headers: the response's status and
        headers, its body unread.

        What the adapters' streaming requests use: the same pool, connections and errors
        as :meth:`handle_async_request`, without building an ``httpx.Request`` (about
        17 µs hot and several times that cold, each request) or an ``httpx.Response``
        (3 µs hot, 30-50 µs cold, on the time to first token; the adapters read only the
        status, the content type and the body). The exceptions raised carry no request.
        ``timeouts`` is httpx's ``timeout`` extension; ``on_sent`` is called as the
        request goes out, after any connect. ``extra_headers``: header lines
        (``b"name: value\\r\\n"`` each) for this request only (``traceparent``).
        """
        key = template.key
        if self._proxy_env and self._proxy(key) is not None:
            raise ValueError(f"{key} goes through a proxy: send it with the client, not post()")
        head = template.head()
        if extra_headers:  # before the closing "Content-Length: " (16 bytes)
            head = b"".join((head[:-16], extra_headers, head[-16:]))
        conn = await self._checkout(key, None, timeouts)
        if conn is None:  # a slot is reserved for us; _connect gives it back if it fails
            conn = await self._connect(key, None, timeouts, None)
        try:
            if on_sent is not None:
                on_sent()
            # One write: one segment when small. The head ends with "Content-Length: ".
            conn.write(b"".join((head, b"%d\r\n\r\n" % len(body), body)))
            if conn.write_paused:
                try:
                    await conn.drain(timeouts.get("write"))
                except TimeoutError:
                    raise httpx.WriteTimeout("write timed out") from None
            await self._head(conn, None, timeouts)
        except BaseException:
            self.discard(conn)
            raise
        return ResponseHead(conn.status, conn.headers, Body(conn, None, timeouts.get("read")))

    @staticmethod
    async def _head(conn: Connection, request: httpx.Request | None, timeouts: _Timeouts) -> None:
        """Until the response head is in."""
        while not conn.head_done:
            if conn.lost or conn.error is not None:
                raise read_error(conn, request)
            try:
                await conn.wait(timeouts.get("read"))
            except TimeoutError:
                raise httpx.ReadTimeout("read timed out", request=request) from None

    @staticmethod
    def _response(
        conn: Connection, request: httpx.Request | None, timeouts: _Timeouts, version: bytes
    ) -> httpx.Response:
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=Body(conn, request, timeouts.get("read")),
            extensions={"http_version": version, "reason_phrase": conn.reason},
        )

    async def aclose(self) -> None:
        """Close every connection, idle or busy, and the fallback."""
        self._closed = True
        spares = list(self._spares.values())
        for task in spares:
            task.cancel()
        await asyncio.gather(*spares, return_exceptions=True)
        for conn in list(self._conns):
            self.discard(conn)
        if self._fallback is not None:
            await self._fallback.aclose()
        for proxy in self._proxy_transports.values():
            await proxy.aclose()

    async def _connect(
        self, key: Key, request: httpx.Request | None, timeouts: _Timeouts, trace: _Trace | None
    ) -> Connection:
        scheme, host, port = key
        timeout = timeouts.get("connect")
        try:
            if trace is not None:
                info = {"host": host, "port": port, "local_address": None, "timeout": timeout}
                await trace("connection.connect_tcp.started", info)
            tls = self._ssl_context() if scheme == "https" else None
            async with asyncio.timeout(timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    functools.partial(Connection, self, key),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
        except BaseException as exc:
            self._open -= 1
            self._wake()
            if isinstance(exc, TimeoutError):  # tested first: TimeoutError is an OSError
                message = f"connect to {host}:{port} timed out"
                raise httpx.ConnectTimeout(message, request=request) from exc
            if isinstance(exc, OSError):  # refused, unreachable, DNS, TLS handshake
                message = str(exc) or type(exc).__name__
                raise httpx.ConnectError(message, request=request) from exc
            raise
        self._conns.add(conn)
        return conn

    async def _send(
        self, conn: Connection, request: httpx.Request, timeouts: _Timeouts, trace: _Trace | None
    ) -> None:
        head = request_head(request)
        try:
            body: bytes | None = request.content  # read already when built from bytes
        except httpx.RequestNotRead:
            body = None  # a streamed body
        if trace is not None:
            await trace("http11.send_request_headers.started", {"request": request})
        write = conn.write
        write(head if body is None else head + body)  # one write: one segment when small
        try:
            if conn.write_paused:
                await conn.drain(timeouts.get("write"))
            if trace is not None:
                await trace("http11.send_request_headers.complete", {"return_value": None})
                await trace("http11.send_request_body.started", {"request": request})
            if body is None:
                stream = request.stream
                assert isinstance(stream, AsyncIterable)
                chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
                async for part in stream:
                    if conn.lost:
                        break  # as httpcore: stop sending, and read what the server said
                    if part:
                        write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                    if conn.write_paused:
                        await conn.drain(timeouts.get("write"))
                if chunked:
                    write(b"0\r\n\r\n")
        except TimeoutError:
            raise httpx.WriteTimeout("write timed out", request=request) from None
        if trace is not None:
            await trace("http11.send_request_body.complete", {"return_value": None})

    # -- the pool ----------------------------------------------------------------------------

    async def _checkout(
        self, key: Key, request: httpx.Request | None, timeouts: _Timeouts
    ) -> Connection | None:
        """An idle connection to ``key``, or ``None`` with a slot reserved for a new one."""
        loop = asyncio.get_running_loop()
        timeout = timeouts.get("pool")
        deadline = None if timeout is None else loop.time() + timeout
        limit = self._limits.max_connections
        if self._preconnect:
            self._recent[key] = (loop.time(), timeouts)
        while True:
            stack = self._idle.get(key)
            while stack:
                conn = stack.pop()
                self._idle_count -= 1
                conn.in_pool = conn.spare = False
                if self._fresh(conn, loop.time()):
                    return conn
                self.discard(conn)
            spare = self._spares.get(key)
            if spare is not None:  # a spare is connecting: sooner than a connect of our own
                await asyncio.wait((spare,))  # (a cancel of ours leaves the spare alone)
                continue
            if limit is None or self._open < limit:
                self._open += 1
                return None
            if self._idle_count:  # full, but idle connections to other origins hold slots
                oldest = min((s[0] for s in self._idle.values() if s), key=lambda c: c.idle_since)
                self.discard(oldest)
                continue
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but leaving: pass the turn on
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    message = "no connection free in the pool"
                    raise httpx.PoolTimeout(message, request=request) from None
                raise

    def _fresh(self, conn: Connection, now: float) -> bool:
        expiry = self._limits.keepalive_expiry
        if conn.lost or (expiry is not None and now - conn.idle_since >= expiry):
            return False
        # The server's FIN may be in the kernel before the loop has told us (httpcore checks
        # the same way): an idle HTTP/1.1 socket that is readable is closing or misbehaving.
        poller = select.poll()
        poller.register(conn.transport.get_extra_info("socket"), select.POLLIN)
        return not poller.poll(0)

    def release(self, conn: Connection) -> None:
        """Pool a connection whose response was received in full, or close it."""
        limit = self._limits.max_keepalive_connections
        if not conn.keep_alive or conn.lost:  # the server will not take another request
            self.discard(conn)
            self._replace(conn.key)
            return
        if (
            conn.closed  # by aclose(), while its response was being read
            or self._closed
            or (limit is not None and self._idle_count >= limit)
        ):
            self.discard(conn)
            return
        self._pool(conn)

    def _pool(self, conn: Connection) -> None:
        """Put a connection with no request on it into the idle pool."""
        conn.reset()
        conn.in_pool = True
        conn.idle_since = now = conn.loop.time()
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        self._sweep(now)
        self._wake()

    def _sweep(self, now: float) -> None:
        """Close idle connections past ``keepalive_expiry``, at most once per expiry period."""
        expiry = self._limits.keepalive_expiry
        if expiry is None or now < self._next_sweep:
            return
        self._next_sweep = now + expiry
        for stack in list(self._idle.values()):
            for conn in [c for c in stack if now - c.idle_since >= expiry]:
                self.discard(conn)

    def discard(self, conn: Connection) -> None:
        """Close a connection and give its slot back (once, whoever asks)."""
        if conn.closed:
            return
        conn.closed = True
        idle = conn.in_pool
        if idle:
            conn.in_pool = False
            stack = self._idle[conn.key]
            stack.remove(conn)
            if not stack:
                del self._idle[conn.key]
            self._idle_count -= 1
        self._open -= 1
        self._conns.discard(conn)
        # abort(), not close(): no flush, and no wait for a stalling peer's TLS close_notify.
        conn.transport.abort()
        self._wake()
        # Closed by the server (its keep-alive timeout, or it spoke out of turn) while idle.
        # Not a spare dropped as soon as it was opened: a server that refuses every new
        # connection that way would have us reconnecting in a loop.
        if idle and not (conn.spare and conn.loop.time() - conn.idle_since < _SPARE_MIN_LIFE_S):
            self._replace(conn.key)

    # -- preconnect ------------------------------------------------------------------------

    def _replace(self, key: Key) -> None:
        """Open a spare connection to ``key`` if ``preconnect`` asks for one now."""
        if not self._preconnect or self._closed or self._idle.get(key) or key in self._spares:
            return
        recent = self._recent.get(key)
        loop = asyncio.get_running_loop()
        if recent is None or loop.time() - recent[0] >= PRECONNECT_WINDOW_S:
            return  # nobody asked for this origin lately: let it rest
        task = loop.create_task(self._spare(key, recent[1]), name=f"preconnect:{key[1]}")
        self._spares[key] = task

    async def _spare(self, key: Key, timeouts: _Timeouts) -> None:
        try:
            limit = self._limits.max_connections
            if self._closed or (limit is not None and self._open >= limit):
                return  # (checked here: a task cancelled before it runs reserves nothing)
            self._open += 1  # the slot is the spare's; _connect gives it back if it fails
            conn = await self._connect(key, None, timeouts, None)
        except httpx.TransportError:
            return  # the next request connects (and fails) in its own right
        finally:
            self._spares.pop(key, None)
        conn.spare = True
        if self._closed:
            self.discard(conn)
        else:
            self._pool(conn)

    def _wake(self) -> None:
        """Tell the longest waiter for a pool slot to look again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # built on first use: loading the CA bundle takes ~20 ms
            self._ssl = httpx.create_ssl_context(verify=self._verify)
        return self._ssl

    def _fallback_transport(self) -> httpx.AsyncBaseTransport:
        if self._fallback is None:
            self._fallback = httpx.AsyncHTTPTransport(verify=self._verify, limits=self._limits)
        return self._fallback


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _no_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` exempts ``host:port``."""
    host = host.strip("[]").lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want_port and want_port != str(port):
            continue
        name = name.strip("[]")
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


class UpstreamClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` over a :class:`LeanTransport`, kept at hand as ``lean``.

    The adapters send their streaming request on ``lean`` directly when there is one:
    ``AsyncClient.send`` wraps every request in layers the gateway never uses (auth,
    redirects, cookies, event hooks, client-default merging), measured at about 0.2 ms
    of the time to first token. Everything else (probes, control calls) goes through
    the client as usual.
    """

    def __init__(self, *, transport: LeanTransport, **options: Any) -> None:
        super().__init__(transport=transport, **options)
        self.lean = transport
