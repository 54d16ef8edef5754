"""The demo web UI (docs/ui.md): ``GET /`` and its static files.

``/`` is ``web/index.html``; ``/ui/*`` are the other files of ``web/``; ``/sdk/*`` is the
TypeScript SDK's build, ``clients/ts/dist`` (the UI is built on it: no bundler, no CDN,
no network). From a source checkout both are read in place; the SDK's build is not in
git: ``make install`` / ``make run`` / ``make ts-build`` make it when npm is there. An
installed wheel carries both as package data (``toolforge/web``, its SDK in
``toolforge/web/sdk``: ``web/sdk`` links to ``clients/ts/dist``, so a wheel built after
``make ts-build`` has it). Without the SDK, ``/`` answers 503 with a page that says how to build it,
rather than a page whose script cannot load, and ``/sdk/*`` (or ``/ui/*`` outside a
checkout) answers a plain ``NOT_FOUND`` 404 that says the same, logged once as
``web.not_built``: a client polling a missing build costs a stat per request, never a
traceback in the log.

The page gets a strict Content-Security-Policy: scripts only from this origin (plus the
hash of the page's one inline script, its import map), no inline styles or handlers, no
other origin to connect to. The UI renders model text with ``textContent`` only; the
policy is the second line of defence.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from toolforge.errors import ErrorCode, RequestError
from toolforge.log import WEB_NOT_BUILT, get_logger

__all__ = ["SDK_DIR", "WEB_DIR", "BuiltFiles", "install_web"]


def _locate() -> tuple[Path, Path]:
    """The UI's folder and the SDK's build: the package's own in an installed wheel
    (``<site-packages>/toolforge/web``), else the source checkout's."""
    packaged = Path(__file__).resolve().parents[1] / "web"  # toolforge/api/web.py -> toolforge/
    if (packaged / "index.html").is_file():
        return packaged, packaged / "sdk"
    checkout = Path(__file__).resolve().parents[2]  # app/api/web.py -> the checkout
    return checkout / "web", checkout / "clients" / "ts" / "dist"


WEB_DIR, SDK_DIR = _locate()

log = get_logger(__name__)

_INLINE_SCRIPT: Final = re.compile(r"<script type=\"importmap\">(.*?)</script>", re.S)
_HEADERS: Final = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _policy(page: str) -> str:
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.encode()).digest()).decode() + "'"
        for m in _INLINE_SCRIPT.findall(page)
    )
    return (
        "default-src 'none'; "
        f"script-src 'self' {hashes}; "
        "style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _not_built(reason: str, command: str) -> HTMLResponse:
    body = (
        "<!doctype html><meta charset=utf-8><title>ToolForge: web UI not built</title>"
        "<h1>The web UI is not built</h1>"
        f"<p>{html.escape(reason)}</p><p>Build it in the checkout, then reload:</p>"
        f"<pre>{html.escape(command)}</pre>"
        "<p>The API does not need it: <a href=/docs>/docs</a>.</p>"
    )
    return HTMLResponse(body, status_code=503, headers=_HEADERS)


async def index() -> Response:
    """The UI's page, or a page that says how to build the SDK it loads."""
    page_path = WEB_DIR / "index.html"
    if not page_path.is_file():
        return _not_built(
            f"{page_path} is missing: the UI is served from a source checkout of ToolForge.",
            "git clone <the ToolForge repository> && cd toolforge && make run",
        )
    if not (SDK_DIR / "index.js").is_file():
        return _not_built(
            f"{SDK_DIR} is missing: the UI loads the TypeScript SDK's build, which is not "
            "kept in git (a wheel has it when it was built after make ts-build). It needs "
            "node >= 20 and npm.",
            "make ts-build      # npm ci and tsc in clients/ts; then rebuild the wheel",
        )
    page = page_path.read_text(encoding="utf-8")
    headers = {**_HEADERS, "Content-Security-Policy": _policy(page)}
    return HTMLResponse(page, headers=headers)


class BuiltFiles:
    """Static files from a folder that may not exist (yet): ``StaticFiles`` when it does,
    a ``NOT_FOUND`` 404 naming the build command when it does not.

    StaticFiles raises ``RuntimeError`` on every request for a missing folder (a
    traceback each time); the folder is checked first instead, and its absence is logged
    once per mount. The check is per request because the build may appear while the
    gateway runs (``make ts-build`` in another terminal)."""

    def __init__(self, directory: Path, *, what: str, command: str) -> None:
        self.directory = directory
        self.what = what
        self.command = command
        # check_dir=False: the folder may be built after the gateway started. StaticFiles
        # keeps every path inside its directory (no "..", no symlinks out).
        self.files = StaticFiles(directory=directory, check_dir=False)
        self.logged = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.directory.is_dir():
            await self.files(scope, receive, send)
            return
        if not self.logged:
            self.logged = True
            log.warning(WEB_NOT_BUILT, directory=str(self.directory), build=self.command)
        raise RequestError(
            ErrorCode.NOT_FOUND,
            f"{self.what} is not built on this gateway ({self.directory} is missing); "
            f"build it in the checkout: {self.command}",
            http_status=404,
        )


def install_web(app: FastAPI) -> None:
    """``GET /``, ``/ui/*`` (web/) and ``/sdk/*`` (clients/ts/dist) on ``app``."""
    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    ui = BuiltFiles(WEB_DIR, what="the web UI", command="git clone and make run")
    sdk = BuiltFiles(SDK_DIR, what="the TypeScript SDK", command="make ts-build")
    app.mount("/ui", ui, name="ui")
    app.mount("/sdk", sdk, name="sdk")
