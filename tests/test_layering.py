"""The architecture, enforced: app/core is sans-IO (docs/architecture.md), and data flows one
way (api -> runtime -> upstream -> core)."""

from __future__ import annotations

import ast
import asyncio
import collections
import contextlib
import functools
import socket
import types
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


# -- runtime never calls up into api, not even through a callback --------------------------

_LEAVES = (str, bytes, int, float, bool, type(None), type, types.ModuleType)


def api_callbacks(root: object, limit: int = 200_000) -> list[str]:
    """Every function of ``toolforge.api`` reachable from ``root`` through what runtime
    objects hold: their attributes, containers, closures, partials, bound methods and the
    frames of their tasks. Functions' globals are not followed (every module reaches
    every other through them); classes and modules are leaves."""
    found: list[str] = []
    seen: set[int] = set()
    todo: list[object] = [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            if obj.__module__.startswith("toolforge.api"):
                found.append(f"{obj.__module__}.{obj.__qualname__}")
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            todo.extend(obj.__defaults__ or ())
        elif isinstance(obj, types.MethodType):
            todo.extend((obj.__func__, obj.__self__))
        elif isinstance(obj, functools.partial):
            todo.extend((obj.func, *obj.args, *obj.keywords.values()))
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            todo.extend(obj)
        elif isinstance(obj, asyncio.Future):
            if isinstance(obj, asyncio.Task):
                coro = obj.get_coro()
                frame = getattr(coro, "cr_frame", None)
                if frame is not None:
                    todo.extend(frame.f_locals.values())
            todo.extend(cb for cb, _ in getattr(obj, "_callbacks", None) or ())
        elif type(obj).__module__.startswith(("toolforge.runtime", "toolforge.core")):
            todo.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if hasattr(obj, name):
                        todo.append(getattr(obj, name))
    return found


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def test_the_callback_walk_sees_a_route_function_handed_to_runtime() -> None:
    from toolforge.runtime.streams import StreamRegistry

    def route(*_: object) -> None: ...

    route.__module__ = "toolforge.api.routes"
    registry = StreamRegistry(resume_ttl_s=1)
    registry.on_command = functools.partial(route, "bound")  # type: ignore[attr-defined]
    assert api_callbacks(registry) == ["toolforge.api.routes." + route.__qualname__]


async def test_no_runtime_object_holds_an_api_callback_once_the_app_has_started(
    tmp_path: Path,
) -> None:
    """The whole runtime side of a started gateway, with Redis configured (its command
    handler registered; Redis need not answer for that): nothing of ``toolforge.api``."""
    from tests.replicas.conftest import free_port
    from toolforge.eval.loopback import start_gateway

    async with contextlib.AsyncExitStack() as stack:
        gw = await start_gateway(
            stack,
            tmp_path / "artifacts",
            (),
            redis_url=f"redis://127.0.0.1:{free_port()}/0",
            redis_timeout_ms=100,
        )
        streams = gw.gateway.streams
        assert streams.cluster is not None
        assert streams.cluster.commands._handler is not None  # registered at start-up
        assert api_callbacks(streams) == []
        assert api_callbacks(gw.gateway.planner) == []
