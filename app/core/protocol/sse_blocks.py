"""The SSE block codec: encoded frames read back, in one place.

A frame leaves the gateway as one block (:func:`toolforge.core.protocol.frames.encode_frame`)::

    id: <seq>\\nevent: <name>\\ndata: <json>\\n\\n

Three lines, no other newline: the event name has none, and orjson escapes every control
character inside the JSON. So a block is read back by splitting, never by scanning, and a
run of blocks (a frame log batch, a resume buffer entry) splits on the blank line. The
frame log, the proxy's chunk encoder and the replicas' resume buffer all read blocks with
these functions; nothing else parses the bytes ``encode_frame`` wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

__all__ = ["END", "block_events", "parse_block", "split_blocks"]

END: Final = b"\n\n"  # what ends every block, and what nothing inside one contains
_EVENT: Final = len(b"event: ")
_DATA: Final = len(b"data: ")


def split_blocks(data: bytes) -> list[bytes]:
    """Blocks back to back -> one ``bytes`` each, its blank line kept (a trailing partial
    block, which a writer never produces, is dropped)."""
    parts = data.split(END)
    return [part + END for part in parts[:-1]]


def parse_block(block: bytes) -> tuple[int, bytes, bytes]:
    """One block (with or without its blank line) -> ``(id, event name, JSON bytes)``."""
    id_line, event_line, data_line = block.split(b"\n", 2)
    return int(id_line[4:]), event_line[_EVENT:], data_line[_DATA:].rstrip(b"\n")


def block_events(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(event name, JSON bytes)`` for each block of ``data``: the hot path of an encoder
    that turns frames into another wire format (it needs neither the id nor a copy)."""
    for block in data.split(END):
        if block:
            _, event_line, data_line = block.split(b"\n", 2)
            yield event_line[_EVENT:], data_line[_DATA:]
