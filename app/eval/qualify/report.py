"""Reports of an eval: a terminal table, Markdown, and a self-contained HTML dashboard.

All three are pure functions of the runs (and a provenance record: commit, machine, when),
so a report can be made again from ``results.jsonl`` at any time. The HTML has no script
that fetches anything and no external asset: its charts are inline SVG drawn here, and the
numbers behind them are embedded once as JSON (``<script type="application/json"
id="eval-data">``), which is what the tests compare with the JSONL.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from toolforge.eval.qualify.metrics import CellMetrics, RunResult, aggregate

__all__ = ["chart_data", "render_html", "render_markdown", "render_table", "summary"]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _counts(m: Mapping[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in m.items()) or "—"


HEADERS = (
    "scenario",
    "model",
    "mode",
    "ablation",
    "n",
    "score",
    "95% CI",
    "compl.",
    "acc.",
    "eff.",
    "wasted",
    "p50 s",
    "p95 s",
    "nudges",
    "rescues",
    "compactions",
    "errors",
)


def _row(c: CellMetrics) -> list[str]:
    return [
        c.scenario,
        c.model,
        c.mode,
        c.ablation,
        str(c.runs),
        _pct(c.score),
        f"{_pct(c.score_low)}–{_pct(c.score_high)}",
        _pct(c.completeness),
        _pct(c.accuracy),
        "—" if c.efficiency is None else f"{c.efficiency:.2f}",
        f"{c.wasted_calls:.1f}",
        f"{c.latency_p50:.1f}",
        f"{c.latency_p95:.1f}",
        _counts(c.nudges),
        str(c.rescues),
        _counts(c.compactions),
        _counts(c.errors),
    ]


def summary(cells: Sequence[CellMetrics], provenance: Mapping[str, Any]) -> dict[str, Any]:
    """``summary.json``: every cell, the totals per (model, mode, ablation), provenance."""
    totals: dict[str, dict[str, Any]] = {}
    for c in cells:
        key = f"{c.model} | {c.mode} | {c.ablation}"
        t = totals.setdefault(key, {"runs": 0, "correct": 0, "scenarios": 0})
        t["runs"] += c.runs
        t["correct"] += c.correct
        t["scenarios"] += 1
    for t in totals.values():
        t["score"] = t["correct"] / t["runs"] if t["runs"] else 0.0
    return {
        "provenance": dict(provenance),
        "cells": [c.to_dict() for c in cells],
        "totals": totals,
    }


def render_table(cells: Sequence[CellMetrics]) -> str:
    """A fixed-width table for the terminal."""
    rows = [list(HEADERS), *(_row(c) for c in cells)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _provenance_lines(p: Mapping[str, Any]) -> list[str]:
    return [f"- **{k}**: {v}" for k, v in p.items()]


def _md_table(cells: Sequence[CellMetrics]) -> list[str]:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    out += ["| " + " | ".join(_row(c)) + " |" for c in cells]
    return out


def render_markdown(
    cells: Sequence[CellMetrics],
    provenance: Mapping[str, Any],
    overall: Sequence[CellMetrics] = (),
) -> str:
    """The report: provenance, the ``overall`` cells (every scenario together, per model,
    mode and ablation) when given, each scenario's cells, and the ablation deltas."""
    out = ["# ToolForge eval", "", *_provenance_lines(provenance), ""]
    if overall:
        out += ["## Every scenario together", "", *_md_table(overall), "", "## Per scenario", ""]
    out += _md_table(cells)
    deltas = _ablation_deltas(cells)
    if deltas:
        out += ["", "## What each guardrail is worth", ""]
        out.append("Score with the preset minus the score with everything on (`reforged`).")
        out += ["", "| scenario | model | mode | ablation | Δ score |", "|---|---|---|---|---|"]
        for d in deltas:
            out.append(
                f"| {d['scenario']} | {d['model']} | {d['mode']} | {d['ablation']} | "
                f"{100 * d['delta']:+.0f} pts |"
            )
    return "\n".join(out) + "\n"


def _ablation_deltas(cells: Sequence[CellMetrics]) -> list[dict[str, Any]]:
    base = {(c.scenario, c.model, c.mode): c.score for c in cells if c.ablation == "reforged"}
    return [
        {
            "scenario": c.scenario,
            "model": c.model,
            "mode": c.mode,
            "ablation": c.ablation,
            "delta": c.score - base[(c.scenario, c.model, c.mode)],
        }
        for c in cells
        if c.ablation != "reforged" and (c.scenario, c.model, c.mode) in base
    ]


def chart_data(runs: Sequence[RunResult]) -> dict[str, Any]:
    """What the dashboard's charts draw: score per cell with its interval, the ablation
    deltas, and each cell's latencies."""
    cells = aggregate(runs)
    latencies: dict[str, list[float]] = {}
    for r in runs:
        latencies.setdefault(" | ".join((r.scenario, r.model, r.mode, r.ablation)), []).append(
            r.latency_s
        )
    return {
        "scores": [
            {
                "cell": " | ".join(c.key),
                "score": c.score,
                "low": c.score_low,
                "high": c.score_high,
                "runs": c.runs,
                "correct": c.correct,
            }
            for c in cells
        ],
        "deltas": _ablation_deltas(cells),
        "latencies": {k: sorted(v) for k, v in sorted(latencies.items())},
    }


# -- the HTML dashboard: inline SVG ---------------------------------------------------------

# The plot's own width; the labels' column is as wide as the longest label needs.
_PLOT = 420
# Upper bound of one character's advance at the charts' 11 px sans-serif (digits and
# lower case are narrower; "m" and "W" about this): labels are never cut at the left.
_CHAR_PX = 7.0


def _label_column(labels: Sequence[str]) -> int:
    return 12 + int(_CHAR_PX * max((len(label) for label in labels), default=0))


def _svg_scores(scores: Sequence[Mapping[str, Any]]) -> str:
    bar_h, gap = 18, 6
    left = _label_column([s["cell"] for s in scores])
    width = left + _PLOT + 40
    h = len(scores) * (bar_h + gap) + 30
    span = _PLOT
    parts = [f'<svg class="chart" width="{width}" height="{h}" role="img" aria-label="score">']
    for i, s in enumerate(scores):
        y = 20 + i * (bar_h + gap)
        w = s["score"] * span
        lo, hi = left + s["low"] * span, left + s["high"] * span
        label = html.escape(s["cell"])
        parts.append(
            f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{label}</text>'
            f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" class="bar">'
            f"<title>{label}: {s['correct']}/{s['runs']}</title></rect>"
            f'<line x1="{lo:.1f}" x2="{hi:.1f}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" '
            'class="ci"/>'
            f'<text x="{left + w + 4:.1f}" y="{y + 13}">{100 * s["score"]:.0f}%</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _svg_deltas(deltas: Sequence[Mapping[str, Any]]) -> str:
    if not deltas:
        return "<p>No ablation runs beside <code>reforged</code> in these results.</p>"
    bar_h, gap = 18, 6
    labels = [f"{d['scenario']} | {d['model']} | {d['mode']} | {d['ablation']}" for d in deltas]
    left = _label_column(labels)
    width = left + _PLOT + 40
    half = _PLOT / 2
    mid = left + half
    h = len(deltas) * (bar_h + gap) + 30
    parts = [f'<svg class="chart" width="{width}" height="{h}" role="img" aria-label="deltas">']
    parts.append(f'<line x1="{mid}" x2="{mid}" y1="10" y2="{h - 10}" class="axis"/>')
    for i, d in enumerate(deltas):
        y = 20 + i * (bar_h + gap)
        w = abs(d["delta"]) * half
        x = mid if d["delta"] >= 0 else mid - w
        label = html.escape(labels[i])
        cls = "up" if d["delta"] >= 0 else "down"
        parts.append(
            f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{label}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" class="{cls}"/>'
            f'<text x="{mid + 4}" y="{y + 13}">{100 * d["delta"]:+.0f}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _svg_latencies(latencies: Mapping[str, Sequence[float]]) -> str:
    row_h = 20
    left = _label_column(list(latencies))
    width = left + _PLOT + 40
    top = max((max(v) for v in latencies.values() if v), default=1.0) or 1.0
    span = _PLOT
    h = len(latencies) * row_h + 30
    parts = [f'<svg class="chart" width="{width}" height="{h}" role="img" aria-label="latency">']
    for i, (cell, values) in enumerate(latencies.items()):
        y = 20 + i * row_h
        parts.append(
            f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{html.escape(cell)}</text>'
        )
        for v in values:
            parts.append(f'<circle cx="{left + v / top * span:.1f}" cy="{y}" r="3" class="dot"/>')
    parts.append(
        f'<text x="{left}" y="{h - 4}">0 s</text>'
        f'<text x="{left + span}" y="{h - 4}" text-anchor="end">{top:.1f} s</text></svg>'
    )
    return "".join(parts)


_STYLE = """
body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}
.chart text{font-size:11px}.bar{fill:#4a7bd0}.ci{stroke:#111;stroke-width:2}
.up{fill:#3a9d5d}.down{fill:#c9443b}.axis{stroke:#888}.dot{fill:#4a7bd0;opacity:.7}
"""


def render_html(runs: Sequence[RunResult], provenance: Mapping[str, Any]) -> str:
    """The self-contained dashboard: provenance, the table, three charts, and the data."""
    cells = aggregate(runs)
    data = chart_data(runs)
    # Nothing in the data may close the script element early: "<" as its JSON escape.
    embedded = orjson.dumps(data).decode().replace("<", "\\u003c")
    table = "".join(
        "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in _row(c)) + "</tr>" for c in cells
    )
    prov = "".join(
        f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>"
        for k, v in provenance.items()
    )
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<title>ToolForge eval</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>ToolForge eval</h1><ul>{prov}</ul>"
        f"<h2>Score per scenario</h2>{_svg_scores(data['scores'])}"
        f"<h2>Ablation deltas</h2>{_svg_deltas(data['deltas'])}"
        f"<h2>Latency per run</h2>{_svg_latencies(data['latencies'])}"
        f"<h2>All cells</h2><table><tr>{head}</tr>{table}</table>"
        f'<script type="application/json" id="eval-data">{embedded}</script>'
        "</body></html>\n"
    )
