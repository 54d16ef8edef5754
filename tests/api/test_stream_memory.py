"""What an open stream's objects cost, held to its shape: CPython shares one key table
among a class's instances only while the class has fewer than 30 attribute names; an
instance past that carries a dict of its own, about 1.3 KB more. No object a stream
creates may cross it (docs/performance.md, "Memory per stream")."""

from __future__ import annotations

import gc
import types
from collections import Counter

from tests.api.conftest import HarnessFactory, open_raw_stream
from toolforge.eval.scripted_upstream import Script, Step

SHARED_KEYS_LIMIT = 30


def _census() -> tuple[Counter[type], list[object]]:
    gc.collect()
    objects = gc.get_objects()
    return Counter(type(o) for o in objects), objects


async def test_no_object_of_an_open_stream_carries_a_dict_of_its_own(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway([Script(steps=(Step(text="a"),), end="hang")] * 2, idle_s=30)
    # One stream first, so that what the process builds once (caches, pools) is built.
    reader, writer = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    await reader.readuntil(b"event: text.delta")
    before, _ = _census()
    reader, writer2 = await open_raw_stream(gw, {"input": "x", "on_disconnect": "cancel"})
    await reader.readuntil(b"event: text.delta")
    after, objects = _census()
    grew = {cls for cls, n in after.items() if n > before.get(cls, 0)}
    names = {cls.__qualname__ for cls in grew}
    # The census sees the stream: its session and its connection's protocol are new.
    assert "StreamSession" in names
    assert any(cls.__qualname__.endswith("Bound") for cls in grew), sorted(names)
    over = sorted(
        {
            f"{type(o).__module__}.{type(o).__qualname__}: {len(vars(o))} attributes"
            for o in objects
            if type(o) in grew
            and not isinstance(o, (type, types.ModuleType))
            and isinstance(getattr(o, "__dict__", None), dict)
            and len(vars(o)) >= SHARED_KEYS_LIMIT
        }
    )
    assert over == []
    for w in (writer, writer2):
        w.close()
    await gw.settle()
