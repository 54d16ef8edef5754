"""The names of everything the replicas keep in Redis (one place, one prefix)."""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = [
    "PREFIX",
    "SEM_KEYS",
    "SEM_RELEASED",
    "alive_key",
    "channel",
    "frames_key",
    "hashed",
    "idem_key",
    "meta_key",
]

PREFIX: Final = "tf:"
# The tool slots' semaphore: holders, queue, queue liveness, ticket counter.
SEM_KEYS: Final = ("tf:sem:h", "tf:sem:q", "tf:sem:a", "tf:sem:n")
SEM_RELEASED: Final = "tf:sem:rel"  # published whenever a slot is given back


def frames_key(stream_id: str) -> str:
    """A stream's resume buffer (a Redis Stream of its SSE blocks)."""
    return f"{PREFIX}s:{stream_id}:f"


def meta_key(stream_id: str) -> str:
    """A stream's record: ``{state: running|done|lost, owner[, key]}``."""
    return f"{PREFIX}s:{stream_id}:m"


def alive_key(replica: str) -> str:
    """A replica's heartbeat: it expires unless the replica renews it."""
    return f"{PREFIX}r:{replica}"


def channel(replica: str) -> str:
    """A replica's control channel: commands for its streams, replies to its questions."""
    return f"{PREFIX}c:{replica}"


def hashed(prefix: str, key: str) -> str:
    """``tf:{prefix}:{sha256(key)}``: a client's key may hold any character, and its length
    is the client's."""
    return f"{PREFIX}{prefix}:{hashlib.sha256(key.encode()).hexdigest()}"


def idem_key(key: str) -> str:
    """An Idempotency-Key's record: ``{h: body hash, s: stream id}``."""
    return hashed("k", key)
