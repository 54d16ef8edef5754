"""Serving the gateway with uvicorn, ending open streams cleanly on shutdown.

uvicorn's shutdown closes the listeners, then waits for open connections to finish
before it runs the lifespan's shutdown (where the session registry would cancel the
streams): an SSE stream that lasts minutes would hold the process that long, or be cut
at the graceful-shutdown timeout without its ``done``. :class:`GatewayServer` cancels
every running stream the moment shutdown starts (a signal, or ``should_exit = True``
from code), so each ends with ``done`` (reason ``shutdown``), its artifacts are written,
and the connections close on their own.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import uvicorn
from fastapi import FastAPI

__all__ = ["GatewayServer", "run"]


class GatewayServer(uvicorn.Server):
    """``uvicorn.Server`` for an app from :func:`toolforge.api.app.create_app`."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
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
