"""The conformance matrix: category × case → status and time, as JSON, Markdown and HTML.

``write_matrix(results, out)`` writes, under ``out`` (``artifacts/conformance/`` by
default)::

    matrix.json              summary, per-category counts, every case (failures included)
    matrix.md                the same as tables, for a README or a CI summary
    matrix.html              one self-contained page (inline CSS, no scripts, no fetches)
    failures/<case>.ndjson   the frames of each failing case, one JSON object per line

``failures/`` is emptied first, so it only ever holds the last run's failures.
``summary_line`` is the line the CLI prints: ``N passed, N failed``.
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.eval.conformance.case import category_rank
from toolforge.eval.conformance.runner import CaseResult

__all__ = ["matrix_document", "notes", "summary_line", "write_matrix"]

_STATUS_ORDER: Final = ("passed", "failed", "known_bug", "not_run")
_MARK: Final = {"passed": "✅", "failed": "❌", "known_bug": "🐞", "not_run": "⏸"}


def _count(results: Sequence[CaseResult], status: str) -> int:
    return sum(1 for r in results if r.status == status)


def summary_line(results: Sequence[CaseResult]) -> str:
    """``N passed, N failed``: the suite's verdict in one line."""
    return f"{_count(results, 'passed')} passed, {_count(results, 'failed')} failed"


def _schema_failures(results: Sequence[CaseResult], *, known_bugs: bool) -> int:
    return sum(r.schema_failures for r in results if (r.status == "known_bug") == known_bugs)


def _schema_note(schema: int, known: int) -> str:
    return f"{schema} schema failures" + (f" ({known} more in known bugs)" if known else "")


def notes(results: Sequence[CaseResult]) -> list[str]:
    """Lines that go under the summary: cases not run, known bugs, schema failures."""
    out = []
    if n := _count(results, "not_run"):
        out.append(f"{n} not run (they need a real model server: --real-upstream URL)")
    if n := _count(results, "known_bug"):
        out.append(f"{n} known gateway bugs documented (not counted as passed)")
    out.append(
        _schema_note(
            _schema_failures(results, known_bugs=False), _schema_failures(results, known_bugs=True)
        )
    )
    return out


def matrix_document(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The content of ``matrix.json``."""
    categories: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: (category_rank(r.category), r.category)):
        row = categories.setdefault(
            r.category, {**dict.fromkeys(_STATUS_ORDER, 0), "cases": 0, "duration_ms": 0.0}
        )
        row[r.status] += 1
        row["cases"] += 1
        row["duration_ms"] = round(row["duration_ms"] + r.duration_ms, 1)
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "summary": {
            "line": summary_line(results),
            "cases": len(results),
            **{status: _count(results, status) for status in _STATUS_ORDER},
            "schema_failures": _schema_failures(results, known_bugs=False),
            "schema_failures_in_known_bugs": _schema_failures(results, known_bugs=True),
            "duration_ms": round(sum(r.duration_ms for r in results), 1),
        },
        "categories": categories,
        "cases": [r.to_dict() for r in _ordered(results)],
    }


def _ordered(results: Sequence[CaseResult]) -> list[CaseResult]:
    return sorted(results, key=lambda r: (category_rank(r.category), r.category, r.name))


def _markdown(doc: dict[str, Any], results: Sequence[CaseResult]) -> str:
    summary = doc["summary"]
    lines = [
        "# Conformance matrix",
        "",
        f"**{summary['line']}** — {summary['cases']} cases, "
        f"{_schema_note(summary['schema_failures'], summary['schema_failures_in_known_bugs'])}, "
        f"{summary['duration_ms'] / 1000:.1f} s ({doc['generated_at']})",
        "",
        "| category | cases | passed | failed | known bug | not run | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in doc["categories"].items():
        lines.append(
            f"| {name} | {row['cases']} | {row['passed']} | {row['failed']} | "
            f"{row['known_bug']} | {row['not_run']} | {row['duration_ms'] / 1000:.2f} |"
        )
    lines += ["", "| category | case | status | ms | notes |", "|---|---|---|---:|---|"]
    for r in _ordered(results):
        detail = "; ".join(([r.note] if r.note else []) + r.failures)
        detail = detail.replace("|", "\\|").replace("\n", " ")
        if len(detail) > 300:
            detail = detail[:299] + "…"
        lines.append(
            f"| {r.category} | `{r.name}` | {_MARK[r.status]} {r.status} | "
            f"{r.duration_ms:.0f} | {detail} |"
        )
    return "\n".join(lines) + "\n"


_CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem;color:#1d1d1f}
h1{font-size:1.4rem}table{border-collapse:collapse;margin:1rem 0}
td,th{border:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f7}.grid td{width:1.1rem;height:1.1rem;padding:0}
.passed{background:#c8f0c8}.failed{background:#f6b8b8}.known_bug{background:#f8e3a0}
.not_run{background:#e0e0e6}.msg{font:12px ui-monospace,monospace;white-space:pre-wrap}
"""


def _html(doc: dict[str, Any], results: Sequence[CaseResult]) -> str:
    esc = html.escape
    summary = doc["summary"]
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>ToolForge conformance</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>ToolForge conformance matrix</h1>",
        f"<p><strong>{esc(summary['line'])}</strong> — {summary['cases']} cases, "
        f"{_schema_note(summary['schema_failures'], summary['schema_failures_in_known_bugs'])}, "
        f"{summary['duration_ms'] / 1000:.1f} s, {esc(doc['generated_at'])}</p>",
        "<table class=grid>",
    ]
    by_category: dict[str, list[CaseResult]] = {}
    for r in _ordered(results):
        by_category.setdefault(r.category, []).append(r)
    for category, rows in by_category.items():
        cells = "".join(
            f"<td class={r.status} title='{esc(r.name)}: {r.status}'></td>" for r in rows
        )
        parts.append(f"<tr><th>{esc(category)}</th>{cells}</tr>")
    parts += [
        "</table>",
        "<table><tr><th>category</th><th>case</th><th>status</th><th>ms</th>"
        "<th>description / failures</th></tr>",
    ]
    for r in _ordered(results):
        detail = "\n".join(([r.note] if r.note else []) + r.failures)
        parts.append(
            f"<tr class={r.status}><td>{esc(r.category)}</td><td><code>{esc(r.name)}</code></td>"
            f"<td>{r.status}</td><td>{r.duration_ms:.0f}</td><td>{esc(r.description)}"
            + (f"<div class=msg>{esc(detail)}</div>" if detail else "")
            + "</td></tr>"
        )
    parts.append("</table></body></html>\n")
    return "\n".join(parts)


def write_matrix(results: Sequence[CaseResult], out: Path) -> dict[str, Path]:
    """Write the matrix files and the failing cases' frames; return what was written."""
    out.mkdir(parents=True, exist_ok=True)
    doc = matrix_document(results)
    written = {
        "json": out / "matrix.json",
        "md": out / "matrix.md",
        "html": out / "matrix.html",
    }
    written["json"].write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    written["md"].write_text(_markdown(doc, results), encoding="utf-8")
    written["html"].write_text(_html(doc, results), encoding="utf-8")
    failures = out / "failures"
    shutil.rmtree(failures, ignore_errors=True)
    for r in results:
        if r.status == "failed":
            failures.mkdir(exist_ok=True)
            path = failures / f"{r.name}.ndjson"
            path.write_bytes(b"".join(orjson.dumps(f) + b"\n" for f in r.frames))
            written[f"failure:{r.name}"] = path
    return written
