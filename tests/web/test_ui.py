"""The demo web UI (docs/ui.md) in headless Chromium: Debian's ``chromium``
driven by Playwright (``executable_path``: no browser download), against a real gateway on
loopback in front of the scripted model of ``tests/clients/cases.py``.

The page loads the TypeScript SDK's build (clients/ts/dist) and runs the demo; a person
approves the booking; the timeline shows every frame; the run is replayed from the
artifacts; model text that is HTML stays text. The demo's screenshot is kept in
``artifacts/ui/`` (git-ignored). Chromium, Playwright and the SDK's build come from
``make test``; without them these tests fail with what to run, never skip.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.clients.cases import XSS, approval_registry, serve_cases
from toolforge.api import web
from toolforge.eval.loopback import Harness

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "ui"
TIMEOUT_MS = 15_000  # a cold Chromium on a busy 2-core machine: seconds, not minutes


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.fail(
        "chromium is not on PATH: run `make test` (it installs Debian's chromium package "
        "with apt-get) or `apt-get install chromium`",
        pytrace=False,
    )


@dataclass
class Browser:
    gw: Harness
    page: Any  # playwright.async_api.Page (imported lazily, for the message below)
    errors: list[str]


@pytest.fixture
async def ui(tmp_path: Path) -> AsyncIterator[Browser]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run `make install` (dev extra)", pytrace=False)
    if not (web.SDK_DIR / "index.js").is_file():
        pytest.fail(f"{web.SDK_DIR} is not built: run `make ts-build`", pytrace=False)
    executable = _chromium()
    async with contextlib.AsyncExitStack() as stack:
        gw = await serve_cases(stack, tmp_path / "artifacts", approval_registry())
        # The async API: the gateway under test runs on this event loop.
        playwright = await stack.enter_async_context(async_playwright())
        # --no-sandbox: the tests may run as root (containers, CI), where Chromium's
        # sandbox refuses to start.
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        stack.push_async_callback(browser.close)
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []

        # Console errors include Content-Security-Policy violations: a page that needs
        # an inline script or a CDN fails here.
        def console(message: Any) -> None:
            # A gateway without workflows answers GET /v1/workflows 404: the form's
            # workflow field then stays free text. Any other error fails the test.
            if message.type == "error" and not message.location["url"].endswith("/v1/workflows"):
                errors.append(f"{message.text} {message.location}")

        page.on("console", console)
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(f"{gw.url}/")
        await page.wait_for_selector("body[data-ready=true]")
        yield Browser(gw, page, errors)
        await gw.settle()


async def kinds(page: Any) -> list[str]:
    result: list[str] = await page.eval_on_selector_all(
        "#timeline > li", "items => items.map(i => i.dataset.kind)"
    )
    return result


# The form's default request runs the booking workflow: search, then book (the terminal
# call, whose result is the stream's RESULT).
DEMO_KINDS = [
    "begin",
    "text",
    "tool.call",
    "tool.result",
    "text",
    "tool.call",
    "tool.result",
    "result",
    "done",
]


async def no_workflow(page: Any) -> None:
    """Clear the form's workflow (the demo's booking workflow by default)."""
    await page.fill("#workflow", "")


async def test_the_demo_live_with_an_approval_then_its_replay(ui: Browser) -> None:
    page = ui.page
    await page.wait_for_selector("label.tool >> text=bookings.create")
    assert (
        await page.input_value("#input") == "Find pizza near me; book a table for 2 at 7pm if open."
    )
    await page.click("#run")

    # The booking waits for a person: the UI shows its arguments and two buttons.
    approve = page.locator("li[data-kind='tool.call'] button.approve")
    await approve.wait_for()
    call = page.locator("li[data-kind='tool.call']").nth(1)
    assert "bookings.create" in await call.inner_text()
    assert '"place_id": "trattoria-roma"' in await call.locator("pre.args").inner_text()
    assert await page.text_content("#status") == "streaming"
    await approve.click()
    await page.wait_for_selector("li[data-kind='done']")

    assert await kinds(page) == DEMO_KINDS
    assert await call.locator(".decision").inner_text() == "approved"
    assert await call.locator("button.approve").is_disabled()
    results = page.locator("li[data-kind='tool.result']")
    assert [await results.nth(i).locator(".badge.good").inner_text() for i in (0, 1)] == ["ok"] * 2
    assert '"status": "confirmed"' in await results.nth(1).locator("pre").inner_text()
    assert await page.input_value("#workflow") == "book_a_table"
    result = await page.locator("li[data-kind='result'] pre.value").inner_text()
    assert '"place_id": "trattoria-roma"' in result and '"status": "confirmed"' in result
    done = await page.locator("li[data-kind='done']").inner_text()
    assert "time to first token" in done and "duration" in done and "frames" in done
    # The upstream's usage has a nested object: each of its values shows as itself.
    assert "[object Object]" not in done
    assert re.search(r"prompt tokens details cached tokens\s+768", done), done
    assert re.search(r"workflow completed steps\s+places.search, bookings.create", done), done
    assert (await page.text_content("#status") or "").startswith("done · stop")

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / "demo.png"), full_page=True)

    # The run is listed (newest first) and replays from its artifacts, frame for frame.
    run = page.locator("#runs button.run").first
    await run.wait_for()
    stream_id = await run.get_attribute("data-stream-id")
    assert stream_id is not None and "Find pizza" in await run.inner_text()
    await run.click()
    await page.wait_for_selector(f"#timeline-title >> text=Replay of {stream_id}")
    await page.wait_for_selector("li[data-kind='done']")
    assert await kinds(page) == DEMO_KINDS
    replayed = page.locator("li[data-kind='tool.call']").nth(1)
    assert await replayed.locator("button.approve").is_disabled()  # history is not live
    assert ui.errors == []


async def test_deny_and_cancel(ui: Browser) -> None:
    page = ui.page
    await page.click("#run")
    deny = page.locator("li[data-kind='tool.call'] button.deny")
    await deny.wait_for()
    await deny.click()
    await page.wait_for_selector("li[data-kind='done']")
    refused = page.locator("li[data-kind='tool.result']").nth(1)
    assert await refused.locator(".badge.bad").inner_text() == "TOOL_APPROVAL_DENIED"

    await no_workflow(page)
    await page.fill("#input", "go slowly [case:slow]")
    await page.click("#run")
    await page.wait_for_selector("li[data-kind='text']")
    await page.click("#cancel")
    await page.wait_for_selector("li[data-kind='done']")
    assert (await page.text_content("#status") or "") == "done · cancelled"
    assert ui.errors == []


async def test_a_client_side_tool_runs_in_the_page(ui: Browser) -> None:
    page = ui.page
    await no_workflow(page)
    await page.fill("#input", "what time is it? [case:clock]")
    await page.check("#clock")
    await page.click("#run")
    await page.wait_for_selector("li[data-kind='done']")
    call = page.locator("li[data-kind='tool.call']")
    assert await call.locator(".title").inner_text() == "browser.clock"
    assert "client" in await call.locator(".badge").all_inner_texts()
    result = page.locator("li[data-kind='tool.result']")
    assert await result.locator(".badge.good").inner_text() == "ok"
    shown = json.loads(await result.locator("pre").inner_text())
    assert set(shown) == {"iso", "time_zone"} and shown["iso"].endswith("Z")
    assert (await page.text_content("#status") or "") == "done · stop"
    assert ui.errors == []


async def test_model_text_is_never_html(ui: Browser) -> None:
    page = ui.page
    await no_workflow(page)
    await page.fill("#input", "show me [case:xss]")
    await page.click("#run")
    await page.wait_for_selector("li[data-kind='done']")
    assert await page.locator("#timeline img, #timeline script").count() == 0
    assert await page.evaluate("window.pwned") is None
    assert XSS in await page.locator("li[data-kind='text']").inner_text()
    shown = await page.locator("li[data-kind='result'] pre").inner_text()
    assert json.loads(shown)["answer"] == f"Answer {XSS}"
    # The runs list shows the input as text too.
    assert await page.locator("#runs img").count() == 0
    assert ui.errors == []
