"""Every module declares its public surface in ``__all__``, and what it declares exists
(the httpx ``test_exported_members`` idea)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import toolforge


def all_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(toolforge.__path__, prefix="toolforge."))


@pytest.mark.parametrize("name", all_modules())
def test_module_declares_all_and_every_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [attr for attr in exported if not hasattr(module, attr)]
    assert not missing, f"{name}.__all__ names missing attributes {missing}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    # Order is ruff's job (RUF022, isort-style), not this test's.
