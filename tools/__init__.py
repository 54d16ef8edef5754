"""Tool packs: Python tools, one module each, selected by configuration (docs/tools.md).

A *pack* is a module ``toolforge.tools.<name>`` (a file ``tools/<name>.py``, or a folder
``tools/<name>/``) with one function, ``pack_tools(settings: Settings) -> list[ToolSpec]``,
returning its tools built from the settings (a pack may return fewer tools, or none, when
what they need is not configured; a pack whose tools ask the gateway's own model takes it
too: ``pack_tools(settings, *, model)``, see :data:`toolforge.core.tool_specs.ModelQuery`).
``TOOL_PACKS`` (comma-separated, default ``demo``) says which packs the gateway serves;
:func:`load_packs` builds the registry from them, stamping each tool's ``source`` as
``pack:<name>``, and checks the tool rules of docs/tools.md (a redaction allowlist, the JSON Schema
subset): a broken tool stops the start-up with a message naming it.

Packs here: ``demo`` (``places.search``, ``bookings.create``), ``agent`` (``fs.read``,
``sqlite.query``, ``time.now``), ``task_analysis`` (five tools over a task
index) and ``workspace`` (docs/tools.md: facts that change only after a person confirms). See
docs/tools.md §6.

Fixtures live in ``tools/fixtures/``; the demo tools' input schemas are exported to
``schemas/tools/`` by ``python -m toolforge.tools.export_schemas`` (a test fails when
they drift).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Any

from toolforge.core.tool_rules import ToolConfigError, check_registry
from toolforge.core.tool_specs import ModelQuery, ToolRegistry, ToolSpec
from toolforge.settings import Settings

__all__ = ["available_packs", "default_registry", "load_packs", "pack_names"]

# Modules under tools/ that are helpers, not packs.
_NOT_PACKS = frozenset({"bookings", "places", "export_schemas"})


def available_packs() -> list[str]:
    """The pack modules shipped under tools/."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(__path__)
        if not m.name.startswith("_") and m.name not in _NOT_PACKS
    )


def pack_names(setting: str) -> list[str]:
    """``TOOL_PACKS`` as names, in order, without blanks or repeats."""
    out: list[str] = []
    for part in setting.split(","):
        name = part.strip()
        if name and name not in out:
            out.append(name)
    return out


def load_packs(settings: Settings, *, model: ModelQuery | None = None) -> ToolRegistry:
    """A registry with the tools of every pack in ``settings.tool_packs``, checked.

    Raises :class:`~toolforge.core.tool_rules.ToolConfigError` for an unknown pack, two
    tools with one name, or a tool that breaks the tool rules (docs/tools.md).
    """
    known = available_packs()
    registry = ToolRegistry()
    for name in pack_names(settings.tool_packs):
        if name not in known:
            raise ToolConfigError(
                f"TOOL_PACKS names an unknown pack {name!r}; available: {', '.join(known)}"
            )
        module = importlib.import_module(f"{__name__}.{name}")
        build = getattr(module, "pack_tools", None)
        if build is None:
            raise ToolConfigError(f"tools/{name}.py has no pack_tools(settings) function")
        try:
            # A pack that needs the gateway's model takes it as ``model`` (task_analysis).
            wants_model = "model" in inspect.signature(build).parameters
            specs: list[ToolSpec[Any]] = (
                build(settings, model=model) if wants_model else build(settings)
            )
        except ValueError as exc:  # a setting the pack cannot use
            raise ToolConfigError(f"pack {name!r}: {exc}") from exc
        for spec in specs:
            stamped = dataclasses.replace(spec, source=f"pack:{name}")
            if stamped.name in registry:
                raise ToolConfigError(
                    f"pack {name!r} defines {stamped.name!r}, which another pack already has"
                )
            registry.register(stamped)
    check_registry(registry)
    return registry


def default_registry() -> ToolRegistry:
    """The demo pack alone (what the gateway serves by default)."""
    return load_packs(Settings(tool_packs="demo"))
