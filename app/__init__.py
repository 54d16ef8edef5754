"""ToolForge: a streaming tool-calling gateway.

The workflow runner's Python API is importable from here (docs/workflows.md)::

    from toolforge import ToolDef, Workflow, WorkflowRunner
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolforge.runtime.workflow_runner import ToolDef, Workflow, WorkflowResult, WorkflowRunner

__version__ = "0.1.0"
__all__ = ["ToolDef", "Workflow", "WorkflowResult", "WorkflowRunner", "__version__"]

_LAZY = frozenset({"ToolDef", "Workflow", "WorkflowResult", "WorkflowRunner"})


def __getattr__(name: str) -> Any:
    # Imported on first use: `import toolforge` stays cheap (the CLI, the layering test).
    if name in _LAZY:
        from toolforge.runtime import workflow_runner

        return getattr(workflow_runner, name)
    raise AttributeError(f"module 'toolforge' has no attribute {name!r}")
