"""Serving the gateway with uvicorn, ending open streams cleanly on shutdown.

uvicorn's shutdown closes the listeners, then waits for open connections to finish
before it runs the lifespan's shutdown (where the session registry would cancel the
streams): an SSE stream that lasts minutes would hold the process that long, or be cut
at the graceful-shutdown timeout without its ``done``. :class:`GatewayServer` cancels
every running stream the moment shutdown starts (a signal, or ``should_exit = True``
from code), so each ends with ``done`` (reason ``shutdown``), its artifacts are written,
and the connections close on their own.

It also serves with the app's :class:`~toolforge.api.server_limits.ServerLimits` (header
and body timeouts, header size and count, the connection cap, keep-alive): whoever serves
the gateway through it (``toolforge serve``, the Docker image, the test harness) gets
them without a flag of its own.

**Workers** (``toolforge serve --workers N``, docs/deployment.md): :func:`serve_workers`
binds the port, once per worker with ``SO_REUSEPORT`` (the kernel spreads new connections
evenly over the N sockets; one socket shared by every worker, as uvicorn's workers do,
hands most of them to whichever worker waited last), then starts N processes, each
accepting on its own socket. A socket listens only once its worker is ready (uvicorn
calls ``listen`` after the app's start-up): the kernel queues a connection on a listening
socket whoever accepts on it, so a socket listening before its worker could serve would
hold its share of new connections until that worker came up, or for ever if it never
did. The parent keeps no copy once the workers have theirs, so a worker's socket closes
with it. Each builds its own app and serves it with
:class:`GatewayServer`, so each ends its streams cleanly on shutdown; each is a replica of
its own (REDIS_URL: its own replica id, commands for its streams reach it over Redis like
another machine's). The parent only supervises: SIGINT or SIGTERM goes on to every
worker, which end their streams and exit; a worker that exits on its own stops the others
too, and the parent exits with its code, for the process manager to restart the whole
(never fewer workers than asked, serving on as if nothing happened).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

import uvicorn
from fastapi import FastAPI

from toolforge.api.server_limits import ServerLimits

__all__ = ["GatewayServer", "apply_limits", "run", "serve_workers"]

# How long a worker may take to end its streams after SIGTERM before it is killed.
_WORKER_EXIT_S: Final = 30.0


class GatewayServer(uvicorn.Server):
    """``uvicorn.Server`` for an app from :func:`toolforge.api.app.create_app`."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        limits = getattr(app, "server_limits", None)  # the GatewayApp's, from its settings
        if isinstance(limits, ServerLimits):
            apply_limits(config, limits)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exiting = False
        super().__init__(config)

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    # uvicorn sets ``should_exit`` from its signal handler and polls it from the main
    # loop; embedding code sets it too. A property sees every way shutdown starts.
    @property
    def should_exit(self) -> bool:
        return self._exiting

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        first = value and not self._exiting
        self._exiting = value
        if first and self._loop is not None:
            # Possibly inside a signal handler: do the work on the loop, not here.
            self._loop.call_soon_threadsafe(self._end_streams)

    def _end_streams(self) -> None:
        gateway = getattr(self._app.state, "gateway", None)
        if gateway is not None:
            gateway.registry.cancel_all("shutdown")


def apply_limits(config: uvicorn.Config, limits: ServerLimits) -> None:
    """Serve ``config`` with ``limits``: the limited httptools protocol (unless the
    caller chose h11, which gets the head limit h11 has), the keep-alive timeout."""
    if config.http in ("auto", "httptools"):
        config.http = limits.protocol()
    elif config.http == "h11":
        config.h11_max_incomplete_event_size = limits.max_header_bytes
    config.timeout_keep_alive = max(1, round(limits.keepalive_timeout_s))


def run(
    app: FastAPI,
    *,
    host: str,
    port: int,
    sockets: list[socket.socket] | None = None,
    **options: Any,
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM: httptools + uvloop when installed
    (uvicorn[standard]); ``options`` go to ``uvicorn.Config``.

    Off by default, as work no response needs: the access log (the gateway logs each
    stream itself), the ``X-Forwarded-*`` rewrite of the client address (nothing here
    reads it) and the ``Server: uvicorn`` header (which only tells a scanner what runs).
    ``sockets``: listen on these (a worker's share of :func:`serve_workers`' socket)
    instead of binding ``host:port``.
    """
    options = {
        # No logging config of uvicorn's own: its loggers propagate to the root handler
        # that toolforge.log.configure_logging installed (one format for every line).
        "log_config": None,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        **options,
    }
    config = uvicorn.Config(app, host=host, port=port, **options)
    try:
        GatewayServer(config, app).run(sockets=sockets)
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn has shut down (every stream ended with done, managed servers
        # stopped) and re-raised SIGINT, which asyncio turns into KeyboardInterrupt. Exit
        # as a shell expects after SIGINT, without a traceback.
        raise SystemExit(128 + signal.SIGINT) from None


Worker = Callable[[socket.socket, int], None]
"""``(the shared listening socket, the worker's index) -> None``: one worker's whole life,
run in a process of its own (picklable: a module-level function or a partial of one)."""


def serve_workers(worker: Worker, *, workers: int, host: str, port: int) -> int:
    """Bind ``host:port`` once and run ``worker`` in ``workers`` processes on that socket
    until SIGINT/SIGTERM or until one of them exits (module docstring); the exit code."""
    listeners = _listeners(host, port, workers)
    # spawn, as uvicorn's workers: a fresh interpreter each, no state forked mid-flight.
    context = multiprocessing.get_context("spawn")
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs = [
        context.Process(target=worker, args=(sock, i), name=f"toolforge-worker-{i}")
        for i, sock in enumerate(listeners)
    ]
    code = 0
    try:
        for proc in procs:
            proc.start()  # the socket's descriptor is the child's from here
        for sock in listeners:
            sock.close()
        while not stop.wait(0.2):
            ended = next((p for p in procs if not p.is_alive()), None)
            if ended is not None:
                code = ended.exitcode or 1
                print(
                    f"toolforge: worker {ended.name} (pid {ended.pid}) exited with "
                    f"{ended.exitcode}; stopping the other workers",
                    file=sys.stderr,
                    flush=True,
                )
                break
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: each ends its streams with done, then exits
        for proc in procs:
            proc.join(_WORKER_EXIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for sock in listeners:
            sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if signal.SIGINT in signals:
        return 128 + signal.SIGINT  # as a shell expects after Ctrl-C
    return code


def _listeners(host: str, port: int, workers: int) -> list[socket.socket]:
    """One socket per worker on ``host:port``, bound here (a port in use fails before any
    worker starts) but not listening (its worker listens once ready: module docstring):
    with ``SO_REUSEPORT`` where the system has it, else one socket that every worker
    shares."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reuse = hasattr(socket, "SO_REUSEPORT")
    first = _bound(family, host, port, reuse)
    port = first.getsockname()[1]  # port 0: the one the system chose, for every socket
    listeners = [first]
    try:
        for _ in range(workers - 1):
            listeners.append(_bound(family, host, port, reuse=True) if reuse else first)
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    for sock in listeners:
        sock.set_inheritable(True)
    return listeners


def _bound(family: socket.AddressFamily, host: str, port: int, reuse: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` as ``socket.create_server`` binds one (address
    reuse, IPv6 only on an IPv6 address), without ``listen``."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
