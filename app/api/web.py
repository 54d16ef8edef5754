"""The demo web UI (SPEC §10, docs/ui.md): ``GET /`` and its static files.

``/`` is ``web/index.html``; ``/ui/*`` are the other files of ``web/``; ``/sdk/*`` is the
TypeScript SDK's build, ``clients/ts/dist`` (the UI is built on it: no bundler, no CDN,
no network). Both folders are read from the source checkout the gateway runs from, and
the SDK's build is not in git: ``make install`` / ``make run`` / ``make ts-build`` make it
when npm is there. Without it, ``/`` answers 503 with a page that says how to build it,
rather than a page whose script cannot load.

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

__all__ = ["SDK_DIR", "WEB_DIR", "install_web"]

_ROOT: Final = Path(__file__).resolve().parents[2]  # app/api/web.py -> the checkout
WEB_DIR: Final = _ROOT / "web"
SDK_DIR: Final = _ROOT / "clients" / "ts" / "dist"

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
            "kept in git. It needs node >= 20 and npm.",
            "make ts-build      # npm ci and tsc in clients/ts",
        )
    page = page_path.read_text(encoding="utf-8")
    headers = {**_HEADERS, "Content-Security-Policy": _policy(page)}
    return HTMLResponse(page, headers=headers)


def install_web(app: FastAPI) -> None:
    """``GET /``, ``/ui/*`` (web/) and ``/sdk/*`` (clients/ts/dist) on ``app``."""
    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    # check_dir=False: the SDK may be built after the gateway started. StaticFiles keeps
    # every path inside its directory (no "..", no symlinks out).
    app.mount("/ui", StaticFiles(directory=WEB_DIR, check_dir=False), name="ui")
    app.mount("/sdk", StaticFiles(directory=SDK_DIR, check_dir=False), name="sdk")
