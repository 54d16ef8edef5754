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
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import uvicorn
from fastapi import FastAPI

from toolforge.api.server_limits import ServerLimits

__all__ = ["GatewayServer", "apply_limits", "run"]


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


def run(app: FastAPI, *, host: str, port: int, **options: Any) -> None:
    """Serve ``app`` until SIGINT/SIGTERM: httptools + uvloop when installed
    (uvicorn[standard]); ``options`` go to ``uvicorn.Config``.

    Off by default, as work no response needs: the access log (the gateway logs each
    stream itself), the ``X-Forwarded-*`` rewrite of the client address (nothing here
    reads it) and the ``Server: uvicorn`` header (which only tells a scanner what runs).
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
        GatewayServer(config, app).run()
    except KeyboardInterrupt:
        # Ctrl-C: uvicorn has shut down (every stream ended with done, managed servers
        # stopped) and re-raised SIGINT, which asyncio turns into KeyboardInterrupt. Exit
        # as a shell expects after SIGINT, without a traceback.
        raise SystemExit(128 + signal.SIGINT) from None
