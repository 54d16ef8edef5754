"""The error tree drawn in ``toolforge.errors``'s docstring is the real one: every
``ToolForgeError`` subclass of the gateway and its demo tools is drawn, under the class
it really derives from, and nothing drawn is missing from the code."""

from __future__ import annotations

import importlib
import pkgutil
import re

import toolforge
import toolforge.tools
from toolforge import errors
from toolforge.errors import ToolForgeError

_ROW = re.compile(r"^    [│├└─ ]*(?P<name>[A-Za-z_]\w*)(?:\s|$)")


def _all_modules() -> None:
    for package in (toolforge, toolforge.tools):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(found.name)


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def drawn_tree(doc: str) -> dict[str, str | None]:
    """Each drawn class -> the class drawn above it one level up (None for the root)."""
    start = doc.index("    ToolForgeError\n")
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in doc[start:].splitlines():
        match = _ROW.match(line)
        if match is None:
            break
        depth = (match.start("name") - 4) // 4  # each level is four columns to the right
        del stack[depth:]
        parents[match["name"]] = stack[-1] if stack else None
        stack.append(match["name"])
    return parents


def test_the_drawing_names_every_error_class_under_its_parent() -> None:
    _all_modules()
    real = {
        cls.__name__: cls.__mro__[1].__name__
        for cls in _subclasses(ToolForgeError)
        if not cls.__name__.startswith("_") and cls.__module__.startswith("toolforge")
    }
    drawn = drawn_tree(errors.__doc__ or "")
    assert drawn.pop("ToolForgeError") is None
    assert drawn == real


def test_the_drawing_reader_sees_a_misplaced_class() -> None:
    doc = (
        "    ToolForgeError\n"
        "    ├── RequestError  x\n"
        "    │   └── RateLimited  y\n"
        "    └── UpstreamError  z\n"
    )
    assert drawn_tree(doc) == {
        "ToolForgeError": None,
        "RequestError": "ToolForgeError",
        "RateLimited": "RequestError",
        "UpstreamError": "ToolForgeError",
    }
