"""The bundled workflow definitions (SPEC §7), package data of ``toolforge``: ``*.json`` and
``*.yaml`` files read and validated at start-up (``WORKFLOWS_DIR`` replaces this folder)."""
