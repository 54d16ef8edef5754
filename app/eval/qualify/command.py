"""``toolforge eval``: run scenarios N times against a backend, write the reports.

    toolforge eval [--scenario NAME ...] [--tags TAG ...] [--scenarios FILE] [--runs N]
                   [--backend embedded|URL|ollama[:URL]|anthropic|scripted:MODEL]
                   [--model ID] [--mode auto|native|sentinel|constrained ...]
                   [--ablation PRESET ...] [--concurrency N] [--seed N] [--out DIR]

Results append to ``<out>/results.jsonl`` (one line per run, with its config); running the
same command again resumes, doing only the runs not yet there. Then ``summary.json``,
``report.md`` and ``report.html`` are written from the whole JSONL, and the table printed.
``--report-only`` rewrites the reports without running anything. ``--scenarios FILE`` runs
the scenarios of a YAML or JSON file instead of the built-in catalog (docs/eval.md, "Your
own scenarios"); ``--scenario`` and ``--tags`` then choose among them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from toolforge import __version__
from toolforge.eval.qualify.ablation import PRESETS, preset
from toolforge.eval.qualify.batch import Progress, RunFn, plan_jobs, run_batch
from toolforge.eval.qualify.catalog import ALL_SCENARIOS, select
from toolforge.eval.qualify.metrics import aggregate
from toolforge.eval.qualify.report import render_html, render_markdown, render_table, summary
from toolforge.eval.qualify.results import ResultsFile
from toolforge.eval.qualify.scenario import Scenario
from toolforge.eval.qualify.scenario_file import ScenarioFileError, load_scenarios

__all__ = ["add_eval_command", "eval_command", "provenance", "write_reports"]

MODES = ("auto", "native", "sentinel", "constrained")


def add_eval_command(subparsers: Any) -> None:
    """Register ``eval`` on the ``toolforge`` parser's subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "eval",
        help="qualify a model: scenarios × runs, with and without the guardrails",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = ", ".join(s.name for s in ALL_SCENARIOS)
    p.add_argument("--scenario", nargs="+", default=[], metavar="NAME", help=f"of: {names}")
    p.add_argument("--tags", nargs="+", default=[], metavar="TAG", help="scenarios with a tag")
    p.add_argument(
        "--scenarios",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML or JSON file of your own scenarios, run instead of the built-in ones",
    )
    p.add_argument("--runs", type=int, default=3, help="runs per cell (default 3)")
    p.add_argument(
        "--backend",
        default="embedded",
        help="embedded (the managed llama-server), an OpenAI-compatible URL, "
        "llama:URL (a llama-server, grammars on), ollama[:URL], anthropic, or "
        "scripted:MODEL (offline: perfect, needs_rescue, needs_steps, needs_nudge, "
        "needs_recovery)",
    )
    p.add_argument("--model", default=None, help="model id (embedded: smollm2-135m, gemma3-270m)")
    p.add_argument("--mode", nargs="+", default=["auto"], choices=MODES, help="default auto")
    p.add_argument(
        "--ablation",
        nargs="+",
        default=["reforged"],
        choices=sorted(PRESETS),
        help="guardrail presets (default reforged)",
    )
    p.add_argument("--concurrency", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--seed", type=int, default=42, help="base seed; run i uses seed + i")
    p.add_argument("--out", type=Path, default=None, help="default artifacts/eval/<run>/")
    p.add_argument("--report-only", action="store_true", help="only rewrite the reports")
    p.set_defaults(func=eval_command)


def provenance(backend: str, model: str, modes: Sequence[str]) -> dict[str, Any]:
    """Which commit, model, modes and machine produced a report."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = f"toolforge {__version__} (no git checkout)"
    return {
        "commit": commit,
        "toolforge": __version__,
        "backend": backend,
        "model": model,
        "modes": ", ".join(modes),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}",
        "written": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_reports(out: Path, prov: Mapping[str, Any]) -> str:
    """summary.json, report.md, report.html from ``out/results.jsonl``; returns the table."""
    runs = ResultsFile(out / "results.jsonl").read()
    cells = aggregate(runs)
    overall = aggregate(runs, overall=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_bytes(
        orjson.dumps(summary(cells, prov), option=orjson.OPT_INDENT_2)
    )
    (out / "report.md").write_text(render_markdown(cells, prov, overall), encoding="utf-8")
    (out / "report.html").write_text(render_html(runs, prov), encoding="utf-8")
    return render_table(cells) + "\n\n" + render_table(overall)


def _default_out(backend: str, model: str) -> Path:
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{backend}-{model}")
    return Path("artifacts") / "eval" / slug.strip("-")[:80]


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The built-in catalog's, or with ``--scenarios`` the file's (a bad file exits 2, one
    line per problem); ``--scenario`` and ``--tags`` choose among them."""
    if args.scenarios is None:
        return select(args.scenario, args.tags)
    try:
        loaded: list[Scenario] = list(load_scenarios(args.scenarios))
    except ScenarioFileError as exc:
        for line in exc.problems:
            print(f"toolforge eval: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.scenario:
        named = {s.name: s for s in loaded}
        missing = [n for n in args.scenario if n not in named]
        if missing:
            raise KeyError(
                f"no scenario {missing[0]!r} in {args.scenarios}; known: {', '.join(named)}"
            )
        return [named[n] for n in args.scenario]
    if args.tags:
        return [s for s in loaded if s.tags & set(args.tags)]
    return loaded


def eval_command(args: argparse.Namespace) -> None:
    from toolforge.eval.qualify.live import EvalSetupError, make_run, model_label

    try:
        scenarios = _scenarios(args)
        ablations = [preset(a) for a in args.ablation]
    except KeyError as exc:
        print(f"toolforge eval: {exc.args[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    if not scenarios:
        print(f"toolforge eval: no scenario has the tags {args.tags}", file=sys.stderr)
        raise SystemExit(2)
    if args.runs < 1 or args.concurrency < 1:
        print("toolforge eval: --runs and --concurrency must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    model = model_label(args.backend, args.model)
    out: Path = args.out or _default_out(args.backend, model)
    prov = provenance(args.backend, model, args.mode)
    if not args.report_only:
        results = ResultsFile(out / "results.jsonl")
        jobs = plan_jobs(
            scenarios,
            model=model,
            modes=args.mode,
            ablations=ablations,
            runs=args.runs,
            seed=args.seed,
            done=results.done(),
        )
        skipped = len(scenarios) * len(args.mode) * len(ablations) * args.runs - len(jobs)
        if skipped:
            print(f"resuming {out}: {skipped} runs already done", file=sys.stderr)

        async def go() -> None:
            # SIGTERM (``timeout``, a container stopping) ends the eval as Ctrl-C does: the
            # runs in flight are cancelled, not recorded, and the model server is stopped.
            # On the loop, not through SIGINT: a shell's background job ignores SIGINT.
            main = asyncio.current_task()
            assert main is not None
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
            run: RunFn
            async with make_run(args.backend, args.model) as run:
                await run_batch(
                    jobs,
                    run,
                    results,
                    concurrency=args.concurrency,
                    progress=Progress(len(jobs)),
                )

        if jobs:
            try:
                asyncio.run(go())
            except (KeyboardInterrupt, asyncio.CancelledError):
                kept = len(results.done())
                print(
                    f"toolforge eval: stopped: {kept} runs kept in {results.path}; "
                    "the same command resumes from there",
                    file=sys.stderr,
                )
                raise SystemExit(130) from None
            except EvalSetupError as exc:
                print(f"toolforge eval: stopped: {exc}", file=sys.stderr)
                raise SystemExit(1) from None
            except ValueError as exc:  # a backend or model that does not exist
                print(f"toolforge eval: {exc}", file=sys.stderr)
                raise SystemExit(2) from None
    print(write_reports(out, prov))
    print(f"\nreports: {out}/report.md, {out}/report.html, {out}/summary.json")
