"""The eval's HTML report in headless Chromium, at the 1280-px width of a laptop: every
label of every chart is drawn inside its chart (none cut at the left, as the longest
scenario names once were)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import async_playwright

from tests.eval.test_metrics_reports import run
from tests.web.test_ui import TIMEOUT_MS, _chromium
from toolforge.eval.qualify.report import render_html

# Longest real names: the catalog's scenarios, both embedded models, every ablation.
LONG = [
    ("compaction_stress", "gemma3-270m-it-q8", "constrained", "no_provenance"),
    ("multi_turn_stateful_booking", "smollm2-135m-instruct", "sentinel", "no_grammar"),
    ("basic_2step", "smollm2-135m-instruct", "native", "bare"),
]

_OUTSIDE = """() => {
  const out = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const width = svg.width.baseVal.value;
    for (const text of svg.querySelectorAll("text")) {
      const box = text.getBBox();
      const outside = box.x < 0 || box.x + box.width > width;
      if (outside) out.push([text.textContent, box.x, box.width, width]);
    }
  }
  return out;
}"""


async def test_every_chart_label_is_drawn_inside_its_chart() -> None:
    runs: list[Any] = []
    for scenario, model, mode, ablation in LONG:
        for n, correct in ((0, True), (1, False)):
            for which in ("reforged", ablation):
                runs.append(
                    run(scenario, n=n, model=model, mode=mode, ablation=which, correct=correct)
                )
    page_html = render_html(runs, {"commit": "abc123", "machine": "test"})
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=_chromium(), headless=True, args=["--no-sandbox"]
        )
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(TIMEOUT_MS)
            await page.set_content(page_html)
            charts = await page.locator("svg.chart").count()
            assert charts == 3
            assert await page.evaluate(_OUTSIDE) == []
            labels = await page.locator("svg.chart text").all_text_contents()
            assert any(label.startswith("compaction_stress |") for label in labels)
        finally:
            await browser.close()
