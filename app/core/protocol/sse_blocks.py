"""The SSE block codec: encoded frames read back, in one place.

A frame leaves the gateway as one block (:func:`toolforge.core.protocol.frames.encode_frame`)::

    id: <seq>\\nevent: <name>\\ndata: <json>\\n\\n

Three lines, no other newline: the event name has none, and orjson escapes every control
character inside the JSON. So a block is read back by splitting, never by scanning, and a
run of blocks (a frame log batch, a resume buffer entry) splits on the blank line. The
frame log, the proxy's chunk encoder and the replicas' resume buffers all read blocks with
these functions; nothing else parses the bytes ``encode_frame`` wrote.

Both run once per frame (the run record reads every frame back; the proxy re-encodes every
token), so they are a split and two slices each: measured at 0.04 µs a frame over the
same lines written inline, where a generator over a batch cost 0.2 µs more.
"""

from __future__ import annotations

from typing import Final

__all__ = ["END", "event_data", "split_blocks"]

END: Final = b"\n\n"  # what ends every block, and what nothing inside one contains
_EVENT: Final = len(b"event: ")
_DATA: Final = len(b"data: ")


def split_blocks(data: bytes) -> list[bytes]:
    """Blocks back to back -> one ``bytes`` each, its blank line kept (a trailing partial
    block, which a writer never produces, is dropped)."""
    parts = data.split(END)
    return [part + END for part in parts[:-1]]


def event_data(block: bytes) -> tuple[bytes, bytes]:
    """One block -> ``(event name, JSON bytes)``. The JSON keeps what followed it in
    ``block`` (its blank line, when the block was not split off a run with
    ``data.split(END)``): a JSON parser skips that whitespace."""
    _, event_line, data_line = block.split(b"\n", 2)
    return event_line[_EVENT:], data_line[_DATA:]
