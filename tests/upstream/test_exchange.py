"""Helpers shared by the HTTP adapters (app/upstream/exchange.py)."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from toolforge.upstream.exchange import json_default, request_body


def test_request_body_is_the_json_in_an_exact_size_object() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "x" * 9000}]}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [request_body(body) for _ in range(20)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert kept[0] == orjson.dumps(body)
    # orjson's own result sits in the buffer it grew while writing (about 130 KB for
    # this body); each open stream keeps its body, so only the bytes may stay.
    assert held < 2 * len(kept[0])


def test_request_body_serialises_read_only_mappings_and_refuses_the_rest() -> None:
    from types import MappingProxyType

    assert request_body({"extra": MappingProxyType({"a": 1})}) == b'{"extra":{"a":1}}'
    with pytest.raises(TypeError):
        request_body({"x": object()})
    assert json_default(MappingProxyType({"b": 2})) == {"b": 2}
