"""The bundled workflow definitions (docs/workflows.md), package data of ``toolforge``: ``*.json``
and ``*.yaml`` files read and validated at start-up (``WORKFLOWS_DIR`` replaces this folder)."""
