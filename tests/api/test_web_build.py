"""``/sdk/*`` and ``/ui/*`` on a gateway without the build: a typed 404 each time, one log
line, never a traceback (a client polling the missing SDK must not flood the log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import HarnessFactory
from toolforge.api import web


async def test_sdk_without_its_build_is_a_clean_404(
    make_gateway: HarnessFactory,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    missing = tmp_path / "clients" / "ts" / "dist"
    monkeypatch.setattr(web, "SDK_DIR", missing)
    gw = await make_gateway()
    capfd.readouterr()  # the start-up's lines
    for path in ("/sdk/index.js", "/sdk/vendor/eventsource-parser.js", "/sdk/"):
        for _ in range(3):
            response = await gw.client.get(f"{gw.url}{path}")
            assert response.status_code == 404, path
            error = response.json()["error"]
            assert error["code"] == "NOT_FOUND" and "make ts-build" in error["message"]
    assert (await gw.client.get(f"{gw.url}/healthz")).status_code == 200
    logged = capfd.readouterr()
    text = logged.out + logged.err
    assert text.count("web.not_built") == 1, text
    for sign in ("Traceback", "RuntimeError", "Exception in ASGI", "does not exist"):
        assert sign not in text, text

    # Built while the gateway runs: served from then on, no restart.
    missing.mkdir(parents=True)
    (missing / "index.js").write_text("export const ok = 1;\n")
    served = await gw.client.get(f"{gw.url}/sdk/index.js")
    assert served.status_code == 200 and "ok = 1" in served.text


async def test_ui_files_outside_a_checkout_are_a_clean_404(
    make_gateway: HarnessFactory,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(web, "WEB_DIR", tmp_path / "web")
    gw = await make_gateway()
    capfd.readouterr()
    for _ in range(5):
        response = await gw.client.get(f"{gw.url}/ui/app.js")
        assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"
    text = "".join(capfd.readouterr())
    assert text.count("web.not_built") == 1 and "Traceback" not in text, text
