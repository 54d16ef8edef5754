"""Per-stream artifacts (SPEC §4): what happened in one stream, on disk, secrets redacted.

Layout, under ``<root>/runs/<stream_id>/``::

    frames.ndjson   every frame as sent, one compact JSON object per line, in order
    prompt.json     what the model was asked
    result.json     the final result
    tool_logs.json  tool invocation records
    metrics.json    latency stats, TTFT, tokens/s, repairs, tool timings, queue high-water

Why it is built this way:

* **Everything goes through** :func:`toolforge.core.redact.redact_serialisable`, with the
  tools' redaction lists added, before it is serialised: artifacts are the place secrets leak from.
* **Each file is written atomically** (a temp file in the same directory, then
  ``os.replace``), so a reader (the demo UI, an eval harness, ``tail``) never sees a torn
  file, and a rerun for the same stream replaces files whole. There is no fsync:
  artifacts are diagnostics, and five disk flushes per stream buy only survival of a
  power cut. Files are owner-only (0600, as ``mkstemp`` makes them): prompts and tool output are
  user data.
* **Blocking work runs in** ``asyncio.to_thread``: redaction, encoding and disk I/O of a
  long stream must not stall the event loop that is serving other streams.
* **Writing never fails on content.** Sets become arrays, other objects orjson does not
  know their ``str()``. A document orjson refuses (an integer past 64 bits, nesting past
  its 254 levels, a lone surrogate, a tuple key) is made strict JSON on a slow path
  (keys as strings, NaN as null, U+FFFD for lone surrogates, nesting cut off at 200 with
  a marker) and the stdlib writes big integers. One odd value never costs its file, let
  alone the others. Only the file system can make :meth:`RunArtifacts.write` raise, and
  then only after every file has been attempted.
* **The stream id is validated** although we generate it: it becomes a path component,
  and resume/cancel routes take it from the URL.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import orjson

from toolforge.core.redact import redact_serialisable
from toolforge.errors import ErrorCode, RequestError

__all__ = ["ARTIFACT_FILES", "ArtifactStore", "RunArtifacts"]

ARTIFACT_FILES: Final = (
    "frames.ndjson",
    "prompt.json",
    "result.json",
    "tool_logs.json",
    "metrics.json",
)
"""The files every run directory holds once :meth:`RunArtifacts.write` has returned."""

# One plain path component: starts with a letter or digit (so never "." or ".."), no
# separators, no NUL, bounded well below any file system's name limit.
_STREAM_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


_TOOL_EVENTS = frozenset({"tool.call", "tool.result"})


class ArtifactStore:
    """Where runs are written, and the redaction lists every run applies: built once per
    app, so that starting a stream costs one small object (:meth:`run`)."""

    def __init__(
        self,
        root: Path,
        *,
        redact_keys: Iterable[str] = (),
        tool_redact_keys: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.runs = Path(root) / "runs"
        self.redact_keys = tuple(redact_keys)
        # A tool's own list (SPEC §4) applies to its tool.call / tool.result frames; the
        # other files, which mix every tool's data, get every list.
        self.tool_keys = {
            name: (*self.redact_keys, *keys) for name, keys in (tool_redact_keys or {}).items()
        }
        self.all_keys = tuple(
            {*self.redact_keys, *(k for keys in self.tool_keys.values() for k in keys)}
        )

    def run(self, stream_id: str) -> RunArtifacts:
        """The artifacts of one stream; raises ``RequestError`` for an invalid id."""
        return RunArtifacts(self, stream_id)


class RunArtifacts:
    """The artifact directory of one stream: ``<root>/runs/<stream_id>/``.

    Construction only validates; nothing touches the disk until :meth:`write`.
    """

    __slots__ = ("_store", "stream_id")

    def __init__(self, store: ArtifactStore, stream_id: str) -> None:
        if not _STREAM_ID.fullmatch(stream_id) or ".." in stream_id:
            raise RequestError(
                ErrorCode.BAD_REQUEST,
                f"invalid stream id {stream_id!r}: use 1-128 letters, digits, '.', '_' or '-'",
            )
        self._store = store
        self.stream_id = stream_id

    @property
    def directory(self) -> Path:
        return self._store.runs / self.stream_id

    async def write(
        self,
        *,
        frames: Iterable[Mapping[str, object]],
        prompt: object,
        result: object,
        tool_logs: object,
        metrics: Mapping[str, object],
    ) -> Path:
        """Write the five files (redacted, each atomically) and return the directory.

        A list of frames is copied before the worker thread starts, so the caller may keep
        appending to its own; any other iterable (the session passes a generator over a
        snapshot of its encoded frames) is consumed in the worker thread. Raises
        ``OSError`` only if the file system refuses (the directory cannot be made, or a
        file cannot be written: then after attempting every file). Cancelling the caller
        does not stop a write already handed to the thread; it completes, file by file,
        atomically.
        """
        documents: dict[str, object] = {
            "prompt.json": prompt,
            "result.json": result,
            "tool_logs.json": tool_logs,
            "metrics.json": metrics,
        }
        snapshot = list(frames) if isinstance(frames, list) else frames
        await asyncio.to_thread(self._write_all, snapshot, documents)
        return self.directory

    def _frame_keys(self, frame: Mapping[str, object]) -> tuple[str, ...]:
        store = self._store
        data = frame.get("data")
        if frame.get("event") in _TOOL_EVENTS and isinstance(data, Mapping):
            return store.tool_keys.get(str(data.get("name")), store.redact_keys)
        return store.redact_keys

    def _write_all(
        self, frames: Iterable[Mapping[str, object]], documents: dict[str, object]
    ) -> None:
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        contents: dict[str, bytes] = {
            # One line per frame, each encoded on its own: an odd frame cannot spoil
            # its neighbours, and line i is always frame i.
            "frames.ndjson": b"".join(
                _encode(redact_serialisable(frame, extra_keys=self._frame_keys(frame))) + b"\n"
                for frame in frames
            ),
        }
        for name, value in documents.items():
            encoded = _encode(
                redact_serialisable(value, extra_keys=self._store.all_keys), indent=True
            )
            contents[name] = encoded + b"\n"
        failures: list[OSError] = []
        for name in ARTIFACT_FILES:
            try:
                _replace_atomically(directory / name, contents[name])
            except OSError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]


def _encode(value: object, *, indent: bool = False) -> bytes:
    """JSON for any value; never raises."""
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(value, default=_default, option=option)
    except TypeError:  # orjson.JSONEncodeError: big integers, depth, surrogates, odd keys
        pass
    plain = _jsonable(value, _MAX_DEPTH)
    try:
        return orjson.dumps(plain, option=option)
    except TypeError:  # integers past 64 bits: the stdlib writes them exactly
        pass
    try:
        text = json.dumps(
            plain, allow_nan=False, indent=2 if indent else None, separators=_SEPARATORS[indent]
        )
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # unreachable, but never raise
        placeholder = {"unserialisable": type(value).__name__, "reason": type(exc).__name__}
        return orjson.dumps(placeholder, option=option)


def _default(value: object) -> object:
    # Sets are arrays (redaction keeps them sets); everything else orjson lacks is text.
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


# Below orjson's own limit (254), far below Python's recursion limit.
_MAX_DEPTH: Final = 200
_SEPARATORS: Final = {False: (",", ":"), True: (",", ": ")}


def _jsonable(value: object, depth: int) -> object:
    """Strict-JSON data for the slow path: keys as strings, NaN/Infinity as null, lone
    surrogates as U+FFFD, nesting past ``_MAX_DEPTH`` cut off with a marker."""
    if isinstance(value, str):
        # Round-trip through UTF-16 turns each lone surrogate into U+FFFD and nothing else.
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping | list | tuple | set | frozenset) and depth <= 0:
        return f"[truncated: nested deeper than {_MAX_DEPTH}]"
    if isinstance(value, Mapping):
        return {
            (k if isinstance(k, str) else str(k)): _jsonable(v, depth - 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth - 1) for v in value]
    return _jsonable(str(value), depth)


def _replace_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new, never half."""
    # os.open/os.write rather than mkstemp + a file object: the same O_EXCL, owner-only
    # temp file, in half the system calls (no buffered writer: no fstat, ioctl, lseek).
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        # Leave nothing behind, whatever interrupted us.
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
