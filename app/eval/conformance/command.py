"""``toolforge conformance``: run the suite against live gateways, write the matrix.

    toolforge conformance [--cases DIR] [--out DIR] [-k SUBSTRING] [--keep-runs]
                          [--real-upstream URL [--real-model ID] [--real-kind KIND]] [-v]

Prints each failing case with its messages, then the summary line ``N passed, N failed``
(and notes: cases not run, known bugs, schema failures), and writes the matrix to
``--out`` (``artifacts/conformance/``). Exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

from toolforge.eval.conformance.case import DEFAULT_CASES_DIR, load_cases
from toolforge.eval.conformance.matrix import notes, summary_line, write_matrix
from toolforge.eval.conformance.runner import CaseResult, RealUpstream, run_cases

__all__ = ["add_conformance_command", "conformance"]


def add_conformance_command(subparsers: Any) -> None:
    """Register ``conformance`` on the ``toolforge`` parser's subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "conformance", help="run the conformance suite against live gateways; write the matrix"
    )
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES_DIR, help="case folder")
    parser.add_argument(
        "--out", type=Path, default=Path("artifacts/conformance"), help="matrix folder"
    )
    parser.add_argument("-k", help="only cases whose name or category contains this")
    parser.add_argument(
        "--real-upstream", help="OpenAI-compatible base URL for the cases that need a real model"
    )
    parser.add_argument("--real-model", help="model id to ask the real upstream for")
    parser.add_argument(
        "--real-kind",
        default="llama_server",
        choices=["openai", "llama_server", "ollama"],
        help="the real upstream's UPSTREAM_KIND (llama_server allows the constrained cases)",
    )
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep each case's gateway artifacts under OUT/traces/<case>/runs/ (trace logs)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="a line for every case")
    parser.set_defaults(func=conformance)


def conformance(args: argparse.Namespace) -> None:
    """The command: run, print, write; exit 1 on any failure."""
    if not args.cases.is_dir():
        # The cases are the source tree's tests/conformance/cases/, not package data: an
        # installed wheel has no default folder.
        print(
            f"no conformance case folder at {args.cases}: the cases ship with the source "
            "tree (tests/conformance/cases/); run from a clone, or pass --cases DIR",
            file=sys.stderr,
        )
        sys.exit(2)
    cases = load_cases(args.cases, select=args.k)
    if not cases:
        where = f"{args.cases}" + (f" matching {args.k!r}" if args.k else "")
        print(f"no conformance cases in {where}", file=sys.stderr)
        sys.exit(1)
    real = (
        RealUpstream(args.real_upstream, args.real_model, kind=args.real_kind)
        if args.real_upstream
        else None
    )

    def progress(result: CaseResult) -> None:
        if result.status == "failed":
            print(f"FAILED {result.category}/{result.name}", flush=True)
            for message in result.failures:
                print(f"    {message}", flush=True)
        elif args.verbose:
            print(f"{result.status:<9} {result.category}/{result.name}", flush=True)

    runs = args.out / "traces" if args.keep_runs else None
    if runs is not None:
        shutil.rmtree(runs, ignore_errors=True)  # only this run's traces
    results = asyncio.run(run_cases(cases, real_upstream=real, workdir=runs, on_result=progress))
    written = write_matrix(results, args.out)
    print(summary_line(results))
    for line in notes(results):
        print(line)
    print(f"matrix: {written['md']} (and matrix.json, matrix.html)")
    sys.exit(1 if any(r.status == "failed" for r in results) else 0)
