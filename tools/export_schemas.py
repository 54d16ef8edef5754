"""Export every tool's input JSON Schema to ``schemas/tools/<name>.json``.

    python -m tools.export_schemas           # (re)write the files
    python -m tools.export_schemas --check   # exit 1, listing the differences, if stale

The files are generated from the tools' pydantic argument models (the same
``ToolSpec.input_schema`` the model is shown), never edited by hand: they exist so that a
schema change shows up in review, and so that clients can read them without running the
gateway. ``tests/test_schemas_drift.py`` fails when a committed file differs from what the
code generates. Files are 2-space indented JSON with a final newline, keys in pydantic's
order; a file for a tool that no longer exists is stale too (and removed on export).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import orjson

from app.core.tools import ToolRegistry
from tools import default_registry

__all__ = ["SCHEMAS_DIR", "check", "main", "render", "write"]

SCHEMAS_DIR: Final = Path(__file__).resolve().parents[1] / "schemas" / "tools"
REGENERATE: Final = "python -m tools.export_schemas"


def render(registry: ToolRegistry | None = None) -> dict[str, bytes]:
    """File name → exact file content, for every tool in ``registry`` (the default one)."""
    reg = registry if registry is not None else default_registry()
    return {
        f"{spec.name}.json": orjson.dumps(spec.input_schema, option=orjson.OPT_INDENT_2) + b"\n"
        for spec in reg
    }


def check(directory: Path = SCHEMAS_DIR, registry: ToolRegistry | None = None) -> list[str]:
    """What differs between ``directory`` and the generated files (empty: up to date)."""
    wanted = render(registry)
    problems = []
    for name, content in wanted.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != content:
            problems.append(f"{name}: differs from the tool's args model")
    if directory.is_dir():
        problems.extend(
            f"{p.name}: no tool of that name (stale)"
            for p in sorted(directory.glob("*.json"))
            if p.name not in wanted
        )
    return problems


def write(directory: Path = SCHEMAS_DIR, registry: ToolRegistry | None = None) -> list[Path]:
    """Write the generated files, remove stale ones; return the paths that changed."""
    wanted = render(registry)
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, content in wanted.items():
        path = directory / name
        if not path.is_file() or path.read_bytes() != content:
            path.write_bytes(content)
            changed.append(path)
    for path in sorted(directory.glob("*.json")):
        if path.name not in wanted:
            path.unlink()
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.export_schemas", description=__doc__)
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    parser.add_argument("--dir", type=Path, default=SCHEMAS_DIR, help="output directory")
    ns = parser.parse_args(argv)
    if ns.check:
        problems = check(ns.dir)
        for line in problems:
            print(f"{ns.dir / line}", file=sys.stderr)
        if problems:
            print(f"tool schemas are stale: run `{REGENERATE}`", file=sys.stderr)
        return 1 if problems else 0
    for path in write(ns.dir):
        print(f"wrote {path}" if path.exists() else f"removed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
