"""Stream ids: ``s_`` and 20 hex digits, 80 bits from the operating system's CSPRNG.

A stream id is a capability without API keys (whoever knows it may resume or cancel the
stream), so it is drawn from ``os.urandom`` as ``secrets.token_hex`` draws it. The bytes
are drawn 4 KB at a time and each used once: one ``getrandom`` system call per 409 ids
instead of one per request. Under load that call was the event loop's costliest line
per request (bench/RESULTS.md, the first event): a system call lets go of the GIL, and
the artifacts writer's thread holds it until its own next system call. A forked child
draws its own pool (``os.register_at_fork``), so no two processes hand out the same ids.
"""

from __future__ import annotations

import os
import threading
from typing import Final

__all__ = ["new_stream_id"]

_ID_BYTES: Final = 10
_POOL_BYTES: Final = 4096 - 4096 % _ID_BYTES  # whole ids only


class _Pool:
    __slots__ = ("_bytes", "_lock", "_next")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._next = 0

    def take(self) -> bytes:
        with self._lock:
            at = self._next
            if at >= len(self._bytes):
                self._bytes, at = os.urandom(_POOL_BYTES), 0
            self._next = at + _ID_BYTES
            return self._bytes[at : at + _ID_BYTES]

    def forget(self) -> None:
        """Drop the bytes drawn so far (a forked child must not reuse its parent's)."""
        self._lock = threading.Lock()
        self._bytes = b""
        self._next = 0


_POOL: Final = _Pool()
os.register_at_fork(after_in_child=_POOL.forget)


def new_stream_id() -> str:
    """A new, unguessable stream id: ``s_`` and 20 lowercase hex digits."""
    return "s_" + _POOL.take().hex()
