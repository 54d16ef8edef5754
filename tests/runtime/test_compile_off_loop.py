"""Request schemas are compiled in the planner's worker thread, once: a schema compiled
already costs no thread hop (a client sends the same tools with every request)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from toolforge.core.schemas import compile_schema, is_compiled
from toolforge.errors import RequestError
from toolforge.runtime import planner


class _Counting(concurrent.futures.ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(*args, **kwargs)


async def test_only_new_schemas_go_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _Counting()
    monkeypatch.setattr(planner, "_COMPILER", worker)
    schema = {
        "type": "object",
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"}},
    }
    await planner.compile_off_loop([(schema, "sku.parameters", False)])
    assert worker.jobs == 1 and is_compiled(schema, name="sku.parameters", fallback=False)
    await planner.compile_off_loop([(schema, "sku.parameters", False)])
    assert worker.jobs == 1  # answered from the cache, on the loop
    compile_schema({"type": "string"}, name="plain", fallback=True)
    await planner.compile_off_loop(
        [(schema, "sku.parameters", False), ({"type": "string"}, "plain", True)]
    )
    assert worker.jobs == 1
    with pytest.raises(RequestError, match="is not local"):
        await planner.compile_off_loop([({"$ref": "http://example.com/x"}, "remote", True)])
    assert worker.jobs == 2  # refused in the worker, raised to the caller
    worker.shutdown()
