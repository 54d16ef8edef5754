"""The architecture, enforced: app/core is sans-IO (docs/architecture.md), and data flows one
way (api -> runtime -> upstream -> core)."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"

# What app/core may never import: anything that does I/O, owns an event loop or reads
# the clock. Time comes in as an argument.
CORE_BANNED = {
    "asyncio",
    "anyio",
    "httpx",
    "httpx_sse",
    "fastapi",
    "starlette",
    "sse_starlette",
    "uvicorn",
    "structlog",
    "logging",
    "time",
    "socket",
    "subprocess",
    "threading",
    "os",
    "pynvml",
}
# Which of our own modules each layer may import, besides itself, toolforge.errors and
# toolforge.core. Data flows one way: api -> runtime -> upstream -> core.
ALLOWED_LAYERS = {
    "core": set(),
    "upstream": {"log"},
    "runtime": {"upstream", "log"},
    # toolforge.tools (the demo pack, tools/) is built on core, and served by api and eval.
    "api": {"upstream", "runtime", "log", "settings", "tools"},
    "eval": {"upstream", "runtime", "api", "log", "settings", "tools"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def layer_files(layer: str) -> list[Path]:
    return sorted((APP / layer).rglob("*.py"))


@pytest.mark.parametrize("path", layer_files("core"), ids=lambda p: p.name)
def test_core_imports_nothing_that_does_io(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m.split(".")[0] in CORE_BANNED}
    assert not bad, f"{path.relative_to(APP.parent)} imports {sorted(bad)}: app/core is sans-IO"


@pytest.mark.parametrize("layer", sorted(ALLOWED_LAYERS))
def test_layers_import_only_downstream(layer: str) -> None:
    for path in layer_files(layer):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] != "toolforge" or len(parts) < 2 or parts[1] in {layer, "core", "errors"}:
                continue
            assert parts[1] in ALLOWED_LAYERS[layer], (
                f"{path.relative_to(APP.parent)} imports {module}: "
                f"{layer} may only use {sorted(ALLOWED_LAYERS[layer]) or 'core'}"
            )


def test_the_layering_test_sees_a_violation(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import asyncio\nfrom httpx import AsyncClient\n", encoding="utf-8")
    assert {"asyncio", "httpx"} <= imported_modules(probe)


def test_tests_cannot_leave_the_machine() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(pytest.fail.Exception):
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed
    finally:
        sock.close()
