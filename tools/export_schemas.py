"""Export the JSON Schemas the code defines, under ``schemas/``:

* ``tools/<name>.json`` — each tool's input schema, from its pydantic argument model (the
  same ``ToolSpec.input_schema`` the model is shown);
* ``frames/<event>.json`` — each SSE event's ``data`` object, from the typed frames of
  :mod:`toolforge.core.protocol.frames`; ``frames/frames.json`` — every event at once
  (``{"id", "event", "data"}``, a union discriminated by ``event``).

    python -m toolforge.tools.export_schemas           # (re)write the files
    python -m toolforge.tools.export_schemas --check   # exit 1, listing the differences, if stale

The files are generated, never edited by hand: they exist so that a schema change shows
up in review, and so that clients (the SDKs' typed frames, clients/python/README.md) can read them
without running the gateway. ``tests/test_schemas_drift.py`` fails when a committed file differs
from what the code generates. Files are 2-space indented JSON with a final newline, keys in
pydantic's order; a file in ``tools/`` or ``frames/`` that nothing generates any more is
stale too (and removed on export).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.core.protocol.frames import EVENTS
from toolforge.core.protocol.schema import (
    JSON_SCHEMA_DIALECT,
    STREAM_EVENT,
    frame_schema,
    stream_event_definitions,
)
from toolforge.core.tool_specs import ToolRegistry
from toolforge.tools import default_registry

__all__ = ["EXPORTED_DIRS", "SCHEMAS_DIR", "check", "main", "render", "write"]

SCHEMAS_DIR: Final = Path(__file__).resolve().parents[1] / "schemas"
EXPORTED_DIRS: Final = ("tools", "frames")
"""The subdirectories of ``schemas/`` whose every ``*.json`` file this module owns."""
REGENERATE: Final = "python -m toolforge.tools.export_schemas"


def _file(schema: Any) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n"


def render(registry: ToolRegistry | None = None) -> dict[str, bytes]:
    """Path under ``schemas/`` → exact file content, for every exported schema; the tools
    are ``registry``'s (the default one)."""
    reg = registry if registry is not None else default_registry()
    files = {f"tools/{spec.name}.json": _file(spec.input_schema) for spec in reg}
    files.update(
        {f"frames/{event}.json": _file(frame_schema(cls)) for event, cls in EVENTS.items()}
    )
    files["frames/frames.json"] = _file(
        {
            "$schema": JSON_SCHEMA_DIALECT,
            "title": "ToolForge stream events",
            "description": "Every server-sent event of POST /v1/stream and GET "
            "/v1/streams/{id} (docs/protocol.md), as {id, event, data}; each data object is also "
            "in <event>.json.",
            "$ref": f"#/$defs/{STREAM_EVENT}",
            "$defs": stream_event_definitions(),
        }
    )
    return files


def check(root: Path = SCHEMAS_DIR, registry: ToolRegistry | None = None) -> list[str]:
    """What differs between ``root`` and the generated files (empty: up to date)."""
    wanted = render(registry)
    problems = []
    for name, content in wanted.items():
        path = root / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif path.read_bytes() != content:
            problems.append(f"{name}: differs from the code that generates it")
    problems.extend(f"{name}: nothing generates it (stale)" for name in _stale(root, wanted))
    return problems


def write(root: Path = SCHEMAS_DIR, registry: ToolRegistry | None = None) -> list[Path]:
    """Write the generated files, remove stale ones; return the paths that changed."""
    wanted = render(registry)
    changed = []
    for name, content in wanted.items():
        path = root / name
        if not path.is_file() or path.read_bytes() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            changed.append(path)
    for name in _stale(root, wanted):
        (root / name).unlink()
        changed.append(root / name)
    return changed


def _stale(root: Path, wanted: dict[str, bytes]) -> list[str]:
    found = (
        f"{directory}/{path.name}"
        for directory in EXPORTED_DIRS
        for path in sorted((root / directory).glob("*.json"))
    )
    return [name for name in found if name not in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolforge.tools.export_schemas", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    parser.add_argument("--dir", type=Path, default=SCHEMAS_DIR, help="the schemas/ directory")
    ns = parser.parse_args(argv)
    if ns.check:
        problems = check(ns.dir)
        for line in problems:
            print(f"{ns.dir / line}", file=sys.stderr)
        if problems:
            print(f"schemas are stale: run `{REGENERATE}`", file=sys.stderr)
        return 1 if problems else 0
    for path in write(ns.dir):
        print(f"wrote {path}" if path.exists() else f"removed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
