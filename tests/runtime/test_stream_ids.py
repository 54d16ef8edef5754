"""Stream ids: unguessable, never repeated, never shared with a forked child."""

from __future__ import annotations

import os
import re

import pytest

from toolforge.runtime import stream_ids
from toolforge.runtime.stream_ids import new_stream_id
from toolforge.runtime.stream_service import new_stream_id as exported

ID = re.compile(r"s_[0-9a-f]{20}")


def test_ids_have_the_documented_form_and_never_repeat_across_pools() -> None:
    # Well past one pool of drawn bytes, so the refill is crossed several times.
    ids = [new_stream_id() for _ in range(5000)]
    assert all(ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert exported is new_stream_id


def test_a_pool_draws_from_the_operating_system_once_per_409_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        drawn.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", counted)
    stream_ids._POOL.forget()
    for _ in range(409 * 2):
        new_stream_id()
    assert drawn == [4090, 4090]


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_stream_id()  # the parent holds a pool with ids left in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without pytest's teardown
        os.close(read)
        os.write(write, " ".join(new_stream_id() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode().split()
    os.waitpid(pid, 0)
    parent = [new_stream_id() for _ in range(5)]
    assert len(child) == 5
    assert not set(child) & set(parent)
