"""Per-stream artifacts (docs/protocol.md): what happened in one stream, on disk, secrets redacted.

Layout, under ``<root>/runs/<stream_id>/``::

    frames.ndjson   every frame as sent, one compact JSON object per line, in order
    prompt.json     what the model was asked
    result.json     the final result
    tool_logs.json  tool invocation records
    metrics.json    latency stats, TTFT, tokens/s, repairs, tool timings, queue high-water

Why it is built this way:

* **Everything goes through** :func:`toolforge.core.redact.redact_serialisable`, with the
  tools' redaction lists added, before it is serialised: artifacts are the place secrets leak from.
* **A run appears whole** (the demo UI, an eval harness, ``tail``): its files are created
  in a hidden directory of its own (``runs/.<stream_id>.<random>.tmp``), which is then
  renamed to the stream id, so a reader never finds a run directory without all five
  files, nor a torn file; a rerun for the same stream moves each new file over the old
  one (``os.replace``), whole. One directory, five files and one rename per run: a temp
  file and a rename per file cost the file system twice the metadata work per stream.
  A pending directory a dead writer left is removed at start-up. There is no fsync:
  artifacts are diagnostics, and five disk flushes per stream buy only survival of a
  power cut. Files are owner-only (0600, as ``mkstemp`` makes them): prompts and tool output are
  user data.
* **Blocking work runs in one writer thread per app** (``_Writer``): redaction, encoding
  and disk I/O of a long stream must not stall the event loop that is serving other
  streams, and one thread, not a pool, is all that competes with the loop for the GIL.
* **Writing never fails on content.** Sets become arrays, other objects orjson does not
  know their ``str()``. A document orjson refuses (an integer past 64 bits, nesting past
  its 254 levels, a lone surrogate, a tuple key) is made strict JSON on a slow path
  (keys as strings, NaN as null, U+FFFD for lone surrogates, nesting cut off at 200 with
  a marker) and the stdlib writes big integers. One odd value never costs its file, let
  alone the others. Only the file system can make :meth:`RunArtifacts.write` raise, and
  then only after every file has been attempted.
* **The stream id is validated** although we generate it: it becomes a path component,
  and resume/cancel routes take it from the URL.
* **Every written run is indexed** (:mod:`toolforge.runtime.run_index`, one line in
  ``runs/.index.ndjson``), so listing runs never reads them all.
* **Retention keeps the directory bounded** (``ARTIFACTS_MAX_AGE``,
  ``ARTIFACTS_MAX_BYTES``): :meth:`ArtifactStore.prune` removes the oldest runs, those
  past the age first, then as many more as the total size needs, going by the index (no
  run is read to decide). It runs off the request path: in the writer's thread after a
  write once the runs written since the last sweep come to a sixteenth of the size limit
  (a burst cannot overshoot by much), and from :meth:`ArtifactStore.maintain`, which the
  app runs as a task: at start-up (when the index is also reconciled with the
  directories) and every :data:`SWEEP_INTERVAL_S` after. Only ``runs/`` counts and is
  pruned; the SQLite stores and the managed servers' logs beside it are not runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.core.protocol.sse_blocks import END, event_data
from toolforge.core.redact import (
    lines_redaction_may_change,
    normalize_key,
    redact_serialisable,
    remembered_generation,
)
from toolforge.errors import ErrorCode, RequestError
from toolforge.log import ARTIFACTS_PRUNED, get_logger
from toolforge.runtime.run_index import RunIndex, create_file, summarise

__all__ = ["ARTIFACT_FILES", "SWEEP_INTERVAL_S", "ArtifactStore", "EncodedFrames", "RunArtifacts"]

log = get_logger(__name__)

SWEEP_INTERVAL_S: Final = 300.0
"""How often :meth:`ArtifactStore.maintain` applies retention when no write has: what an
idle gateway keeps past ``ARTIFACTS_MAX_AGE`` at most."""

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
_TOOL_EVENTS_ENCODED = frozenset(event.encode() for event in _TOOL_EVENTS)
# An event name written into a record line as it is: nothing JSON would escape.
_EVENT_NAME: Final = re.compile(rb"[a-z][a-z0-9._]*")


@dataclass(frozen=True, slots=True)
class EncodedFrames:
    """A run's frames as its frame log holds them, for ``frames.ndjson``: the SSE blocks
    back to back (``encode_frame``'s bytes, frame ids 1, 2, ...) and the ids marked
    degraded. Read, redacted and written in the writer's thread: the event loop pays one
    copy of the buffer, not a ``bytes`` object per frame."""

    blocks: bytes
    degraded: frozenset[int] = frozenset()


# prompt.json's parts that the planner builds once per shape (schemas, tools, mode) and
# hands to every stream of that shape: redacted once per shape, not once per stream.
_SHARED_PROMPT_PARTS: Final = frozenset({"tools", "schemas"})
# Shapes whose redacted parts are kept: the planner's own shape cache is of this order.
_SHARED_MEMO_SIZE: Final = 64


class ArtifactStore:
    """Where runs are written, and the redaction lists every run applies: built once per
    app, so that starting a stream costs one small object (:meth:`run`)."""

    def __init__(
        self,
        root: Path,
        *,
        redact_keys: Iterable[str] = (),
        tool_redact_keys: Mapping[str, Iterable[str]] | None = None,
        max_age_s: float = 0.0,
        max_bytes: int = 0,
    ) -> None:
        self.runs = Path(root) / "runs"
        self.index = RunIndex(self.runs)
        # Retention (0: no limit of that kind); see the module docstring.
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._sweep_after = max(max_bytes // 16, 1) if max_bytes else 0
        self._written_since_sweep = 0
        self._sweeping = threading.Lock()
        self.redact_keys = tuple(redact_keys)
        # A tool's own list (docs/protocol.md) applies to its tool.call / tool.result frames; the
        # other files, which mix every tool's data, get every list.
        self.tool_keys = {
            name: (*self.redact_keys, *keys) for name, keys in (tool_redact_keys or {}).items()
        }
        self.all_keys = tuple(
            {*self.redact_keys, *(k for keys in self.tool_keys.values() for k in keys)}
        )
        # The redacted copies of shared prompt parts: id -> (the part, the generation of
        # remembered secrets it was redacted under, its copy). Holding the part keeps
        # its id from being reused; a new secret makes every copy stale.
        self._shared: OrderedDict[int, tuple[object, int, object]] = OrderedDict()
        self._shared_lock = threading.Lock()
        names = {normalize_key(k) for k in self.all_keys if isinstance(k, str)}
        self._shares = not names & {normalize_key(k) for k in _SHARED_PROMPT_PARTS}
        self.writer = _Writer()

    def run(self, stream_id: str) -> RunArtifacts:
        """The artifacts of one stream; raises ``RequestError`` for an invalid id."""
        return RunArtifacts(self, stream_id)

    def redact_prompt(self, prompt: object) -> object:
        """prompt.json redacted: the same result as ``redact_serialisable`` with every
        list, with the tools and schemas the planner shares between streams redacted
        once per shape. Profiled with the default tools, their walk was most of a
        stream's redaction (about 0.3 ms of the writer's CPU per stream)."""
        parts = _SHARED_PROMPT_PARTS
        if type(prompt) is not dict or not self._shares or not parts & prompt.keys():
            return redact_serialisable(prompt, extra_keys=self.all_keys)
        rest = redact_serialisable(
            {k: v for k, v in prompt.items() if k not in parts}, extra_keys=self.all_keys
        )
        if type(rest) is not dict or len(rest) != len(prompt) - len(parts & prompt.keys()):
            return redact_serialisable(prompt, extra_keys=self.all_keys)  # keys collided
        others = iter(rest.items())
        out: dict[object, object] = {}
        for key, value in prompt.items():
            if key in parts:
                out[key] = self._redact_shared(value)
            else:
                redacted_key, redacted = next(others)
                out[redacted_key] = redacted
        return out

    def _redact_shared(self, part: object) -> object:
        generation = remembered_generation()
        with self._shared_lock:
            hit = self._shared.get(id(part))
            if hit is not None and hit[0] is part and hit[1] == generation:
                self._shared.move_to_end(id(part))
                return hit[2]
        redacted = redact_serialisable(part, extra_keys=self.all_keys)
        with self._shared_lock:
            self._shared[id(part)] = (part, generation, redacted)
            self._shared.move_to_end(id(part))
            while len(self._shared) > _SHARED_MEMO_SIZE:
                self._shared.popitem(last=False)
        return redacted

    @property
    def retains(self) -> bool:
        """Whether a retention limit is set."""
        return bool(self.max_age_s or self.max_bytes)

    async def maintain(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Reconcile the index with the directories and apply retention now, then apply
        retention every ``interval_s`` (while limits are set); runs until cancelled.
        The work is done in a worker thread; a file system error is logged, not raised."""
        await asyncio.to_thread(self._sweep_logged, True)
        while self.retains:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self._sweep_logged, False)

    def prune(self, *, now: float | None = None, reconcile: bool = False) -> list[str]:
        """Apply retention (blocking: call it in a worker thread) and return the stream
        ids removed, oldest first. One sweep at a time: a call while another runs
        returns ``[]`` at once."""
        if not self._sweeping.acquire(blocking=False):
            return []
        try:
            return self._prune(time.time() if now is None else now, reconcile)
        finally:
            self._sweeping.release()

    def _prune(self, now: float, reconcile: bool) -> list[str]:
        self._written_since_sweep = 0
        if reconcile:
            _remove_stale_pending(self.runs, now)
        with self.index.lock:
            entries = self.index.reconcile() if reconcile else self.index.entries()
            if not self.retains:
                return []
            doomed: list[dict[str, Any]] = []
            kept = entries  # oldest first
            if self.max_age_s:
                cutoff = now - self.max_age_s
                doomed = [e for e in entries if e["ended"] < cutoff]
                kept = [e for e in entries if e["ended"] >= cutoff]
            if self.max_bytes:
                total = sum(e["bytes"] for e in kept)
                cut = 0
                while cut < len(kept) and total > self.max_bytes:
                    total -= kept[cut]["bytes"]
                    cut += 1
                doomed, kept = doomed + kept[:cut], kept[cut:]
            if not doomed:
                return []
            self.index.rewrite(kept)
        # Outside the lock: removing directories must not hold up writers' appends.
        for entry in doomed:
            directory = self.runs / entry["stream_id"]
            if directory.is_dir() and not directory.is_symlink():
                shutil.rmtree(directory, ignore_errors=True)
        removed = [e["stream_id"] for e in doomed]
        log.info(
            ARTIFACTS_PRUNED,
            removed=len(removed),
            freed_bytes=sum(e["bytes"] for e in doomed),
            kept=len(kept),
            kept_bytes=sum(e["bytes"] for e in kept),
        )
        return removed

    def _sweep_logged(self, reconcile: bool) -> None:
        try:
            self.prune(reconcile=reconcile)
        except OSError as exc:  # a full or read-only disk: the next sweep tries again
            log.warning(ARTIFACTS_PRUNED, error=f"{type(exc).__name__}: {exc}")

    def _indexed(self, entry: Mapping[str, Any]) -> None:
        """A run was written (in the writer's thread): index it, and sweep when the runs
        written since the last sweep could push the total far past the limit."""
        self.index.append(entry)
        if not self.retains:
            return
        self._written_since_sweep += int(entry["bytes"])
        if self._sweep_after and self._written_since_sweep >= self._sweep_after:
            self._sweep_logged(False)


# A writer with nothing to do waits this long for the next run before its thread ends.
_WRITER_LINGER_S: Final = 2.0


class _Writer:
    """The one thread that writes an app's runs, in the order they ended.

    ``asyncio.to_thread`` handed each run to a pool of up to six threads: under load
    several held the GIL in turn between their system calls while the event loop waited
    for it after each of its own, and each hand-over built an executor future and woke an
    idle thread. One thread bounds that to one contender, and a run handed to it while it
    is busy costs a list append. The thread ends after ``_WRITER_LINGER_S`` without work
    and starts again with the next run, so an idle app (and a test's) holds none."""

    __slots__ = ("_jobs", "_ready", "_running")

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._jobs: list[_Job] = []
        self._running = False

    def submit(self, job: _Job) -> None:
        with self._ready:
            self._jobs.append(job)
            if self._running:
                self._ready.notify()
                return
            self._running = True
        threading.Thread(target=self._drain, name="artifacts-writer", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self._ready:
                if not self._jobs:
                    self._ready.wait(_WRITER_LINGER_S)
                if not self._jobs:
                    self._running = False
                    return
                batch, self._jobs = self._jobs, []
            for job in batch:
                job.run()


class _Job:
    """One run to write, and the future its writer awaits on its own loop."""

    __slots__ = ("_documents", "_done", "_frames", "_loop", "_run")

    def __init__(
        self,
        run: RunArtifacts,
        frames: Iterable[Mapping[str, object]] | EncodedFrames,
        documents: dict[str, object],
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[None],
    ) -> None:
        self._run, self._frames, self._documents = run, frames, documents
        self._loop, self._done = loop, done

    def run(self) -> None:
        error: BaseException | None = None
        try:
            self._run._write_all(self._frames, self._documents)
        except BaseException as exc:  # handed to the awaiting caller, as to_thread would
            error = exc
        # The caller may be gone (cancelled: the write completed anyway) or its loop
        # closed: nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_settle, self._done, error)


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


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
        frames: Iterable[Mapping[str, object]] | EncodedFrames,
        prompt: object,
        result: object,
        tool_logs: object,
        metrics: Mapping[str, object],
    ) -> Path:
        """Write the five files (redacted, each atomically) and return the directory.

        A list of frames is copied before the worker thread starts, so the caller may keep
        appending to its own; any other iterable is consumed in the worker thread, and so
        are :class:`EncodedFrames` (what a stream's run record passes: its frame log's
        bytes), whose lines are the same records byte for byte. Raises
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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._store.writer.submit(_Job(self, snapshot, documents, loop, done))
        await done
        return self.directory

    def _line(self, frame: Mapping[str, object]) -> bytes:
        return _encode(redact_serialisable(frame, extra_keys=self._frame_keys(frame)))

    def _encoded_lines(self, frames: EncodedFrames) -> bytes:
        """``frames.ndjson`` from a frame log's bytes: the same lines :meth:`_line` writes
        for each frame's record (``{"id", "event", "data"[, "degraded"]}``), but a line
        that redaction would leave as it is is never parsed and encoded again.

        A block's JSON is orjson's compact output, and orjson writes a value it has just
        read back byte for byte, so the record line is the block's JSON between the
        record's other members. Which lines redaction may change is read on the lowered
        and case-folded text of them all at once (``lines_redaction_may_change``: a few
        substring scans of the whole text in C, not a walk of each value); those, and the
        tool events (redacted with their tool's own keys), take :meth:`_line`.
        """
        degraded = frames.degraded
        lines: list[bytes] = []
        parsed: list[tuple[bytes, bytes]] = []
        for seq, block in enumerate(frames.blocks.split(END)[:-1], start=1):
            event, data = event_data(block)
            parsed.append((event, data))
            lines.append(
                b'{"id":%d,"event":"%s","data":%s%s}'
                % (seq, event, data, b',"degraded":true' if seq in degraded else b"")
            )
        keys = self._store.redact_keys
        try:
            text = b"\n".join(lines).decode()
        except UnicodeDecodeError:  # orjson writes UTF-8 only; take no chances
            suspect: frozenset[int] | None = None
        else:
            suspect = lines_redaction_may_change(text, keys)
        for i, (event, data) in enumerate(parsed):
            if (
                suspect is None
                or i in suspect
                or event in _TOOL_EVENTS_ENCODED
                or _EVENT_NAME.fullmatch(event) is None
            ):
                record: dict[str, object] = {
                    "id": i + 1,
                    "event": event.decode(errors="replace"),
                    "data": _loads(data),
                }
                if i + 1 in degraded:
                    record["degraded"] = True
                lines[i] = self._line(record)
        lines.append(b"")
        return b"\n".join(lines)

    def _frame_keys(self, frame: Mapping[str, object]) -> tuple[str, ...]:
        store = self._store
        data = frame.get("data")
        if frame.get("event") in _TOOL_EVENTS and isinstance(data, Mapping):
            return store.tool_keys.get(str(data.get("name")), store.redact_keys)
        return store.redact_keys

    def _write_all(
        self,
        frames: Iterable[Mapping[str, object]] | EncodedFrames,
        documents: dict[str, object],
    ) -> None:
        contents: dict[str, bytes] = {
            # One line per frame, each encoded on its own: an odd frame cannot spoil
            # its neighbours, and line i is always frame i.
            "frames.ndjson": (
                self._encoded_lines(frames)
                if isinstance(frames, EncodedFrames)
                else b"".join(self._line(frame) + b"\n" for frame in frames)
            ),
        }
        redacted: dict[str, object] = {}
        store = self._store
        for name, value in documents.items():
            redacted[name] = (
                store.redact_prompt(value)
                if name == "prompt.json"
                else redact_serialisable(value, extra_keys=store.all_keys)
            )
            contents[name] = _encode(redacted[name], indent=True) + b"\n"
        _write_run(self._store.runs, self.stream_id, contents)
        self._store._indexed(
            summarise(
                self.stream_id,
                ended=time.time(),
                size=sum(len(data) for data in contents.values()),
                prompt=redacted["prompt.json"],
                result=redacted["result.json"],
                metrics=redacted["metrics.json"],
            )
        )


# A run's directory being written, under runs/: hidden (a leading dot is never a stream
# id, so listing and retention pass it by) until it is renamed to the stream id.
_PENDING_SUFFIX: Final = ".tmp"
# Pending directories older than this at start-up were left by a writer that died.
_PENDING_STALE_S: Final = 600.0


def _write_run(runs: Path, stream_id: str, contents: Mapping[str, bytes]) -> None:
    """Write a run's files into ``runs/<stream_id>/``, complete or not at all to a reader.

    A new run (the usual case) is written into a hidden directory of its own, each file
    created once, and the directory renamed to the stream id: one directory, five files and
    one rename, where a temp file and a rename per file cost four renames and five temp
    names more. A reader never finds the run's directory without all its files. A run
    written again (its directory exists) moves each new file over the old one, so a
    reader sees each file whole, old or new. Every file is attempted; the first failure is
    raised after the others are in place."""
    pending = runs / f".{stream_id}.{secrets.token_hex(6)}{_PENDING_SUFFIX}"
    # The files' paths as text: os.open takes it as is, where a Path per file cost the
    # writer's thread more than the name it builds.
    inside = f"{pending}{os.sep}"
    try:
        os.mkdir(pending)
    except FileNotFoundError:  # the first run, or runs/ removed by hand
        runs.mkdir(parents=True, exist_ok=True)
        os.mkdir(pending)
    renamed = False
    try:
        failures: list[OSError] = []
        written: list[str] = []
        for name in ARTIFACT_FILES:
            try:
                create_file(inside + name, contents[name])
                written.append(name)
            except OSError as exc:
                failures.append(exc)
        directory = runs / stream_id
        try:
            os.rename(pending, directory)  # also over an empty directory
            renamed = True
        except OSError:
            if not directory.is_dir() or directory.is_symlink():
                raise
            for name in written:  # written before: replace file by file
                try:
                    os.replace(pending / name, directory / name)
                except OSError as exc:
                    failures.append(exc)
        if failures:
            raise failures[0]
    finally:
        if not renamed:  # what is left of it after a rewrite or a failure
            shutil.rmtree(pending, ignore_errors=True)


def _remove_stale_pending(runs: Path, now: float) -> None:
    """Remove the hidden directories of writes that never finished (a writer that died)."""
    try:
        with os.scandir(runs) as entries:
            found = list(entries)
    except OSError:
        return
    for item in found:
        name = item.name
        if not (name.startswith(".") and name.endswith(_PENDING_SUFFIX)):
            continue
        with contextlib.suppress(OSError):
            if item.is_dir(follow_symlinks=False) and (
                now - item.stat(follow_symlinks=False).st_mtime > _PENDING_STALE_S
            ):
                shutil.rmtree(item.path, ignore_errors=True)


def _loads(data: bytes) -> object:
    """A frame's JSON back as a value; bytes that are not JSON (never written by
    ``encode_frame``) are kept as their text, redacted like any other string."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")


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
