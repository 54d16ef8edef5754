"""The workflow registry: definitions read from a folder at start-up (docs/workflows.md).

Every ``*.json``, ``*.yaml`` and ``*.yml`` file of the folder (``WORKFLOWS_DIR``, or the
bundled ``workflows/``) holds one definition, checked by
:func:`toolforge.core.workflow.parse_workflow` against the tools that exist. A bad file
stops the start-up with a ``WORKFLOW_INVALID`` error naming the file and the problem: a
gateway never serves with a workflow it could not enforce.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import orjson
import yaml

from toolforge.core.workflow import RESPOND, WorkflowDef, parse_workflow
from toolforge.errors import ErrorCode, RequestError
from toolforge.log import WORKFLOW_SKIPPED, get_logger

log = get_logger(__name__)

__all__ = ["bundled_workflows_dir", "load_workflows"]

_SUFFIXES = (".json", ".yaml", ".yml")


def bundled_workflows_dir() -> Traversable:
    """The demo workflows shipped with the package (``workflows/``)."""
    return files("toolforge.workflows")


def _entries(folder: Path | Traversable) -> Iterable[Path | Traversable]:
    return sorted(
        (e for e in folder.iterdir() if e.is_file() and e.name.endswith(_SUFFIXES)),
        key=lambda e: e.name,
    )


def load_workflows(
    folder: Path | Traversable,
    *,
    known_tools: Collection[str],
    skip_unavailable: bool = False,
) -> dict[str, WorkflowDef]:
    """Every definition in ``folder`` by name; ``WORKFLOW_INVALID`` on the first bad one.

    ``skip_unavailable``: leave out (and log) a definition whose tools this gateway does
    not have, instead of refusing to start: the bundled demo workflows need the demo
    tools, which a gateway built with other tools lacks. A configured ``WORKFLOWS_DIR`` is
    strict."""
    if isinstance(folder, Path) and not folder.is_dir():
        raise RequestError(
            ErrorCode.WORKFLOW_INVALID,
            f"WORKFLOWS_DIR {str(folder)!r} is not a folder; point it at one holding "
            "workflow definitions (*.json, *.yaml)",
            http_status=422,
        )
    found: dict[str, WorkflowDef] = {}
    for entry in _entries(folder):
        text = entry.read_text(encoding="utf-8")
        source = f"{folder}/{entry.name}" if isinstance(folder, Path) else entry.name
        try:
            doc = orjson.loads(text) if entry.name.endswith(".json") else yaml.safe_load(text)
        except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
            raise RequestError(
                ErrorCode.WORKFLOW_INVALID,
                f"workflow file {source}: not valid {entry.name.rsplit('.', 1)[-1].upper()} "
                f"({str(exc).splitlines()[0]})",
                http_status=422,
            ) from None
        if skip_unavailable and isinstance(doc, dict) and isinstance(doc.get("tools"), list):
            missing = [t for t in doc["tools"] if t not in known_tools and t != RESPOND]
            if missing:
                log.info(WORKFLOW_SKIPPED, source=source, missing_tools=missing)
                continue
        workflow = parse_workflow(doc, known_tools=known_tools, source=source)
        if workflow.name in found:
            raise RequestError(
                ErrorCode.WORKFLOW_INVALID,
                f"workflow file {source}: the name {workflow.name!r} is taken by "
                f"{found[workflow.name].source}; names are unique",
                http_status=422,
            )
        found[workflow.name] = workflow
    return found
