"""What every stream must satisfy (the protocol invariants), and a case's own expectations.

Checks return failure messages rather than raising: the runner collects them so the
matrix can say *what* failed, and a case reports every problem it has, not the first.

The invariants, on every stream a case produces (docs/protocol.md):

1. **Wire**: each frame has a numeric ``id``; pings have none; ``data`` is a JSON object
   valid against its event's schema (``schemas/frames/<event>.json``, generated from the
   typed frames of :mod:`toolforge.core.protocol.frames`).
2. **Ids** are 1, 2, ..., n: strictly increasing, no gaps, no repeats.
3. **Ends**: ``stream.begin`` first; exactly one ``done``, last; an ``error`` frame is at
   most one, right before ``done``, and ``done.reason`` is ``error`` exactly then;
   ``done.metrics.frames`` is n.
4. **Frames**: BEGIN/delta/END of one frame at a time, never interleaved with text, tools
   or another frame; every END's ``length`` is the UTF-8 size of its deltas, and a value
   sent as is (neither repaired nor degraded) is exactly what the deltas parse to; a
   frame left open is allowed only when the stream did not end normally.
5. **Tools**: ``tool.call`` ids are unique; a ``tool.call`` is followed at once by its
   ``tool.result`` (or by the stream's end when it was stopped); a ``tool.result``
   without a call is a refusal (``ok: false``, ``attempts: 0``); no ``tool.call`` before
   its END: each one is a TOOL_CALL frame the upstream sent completely, BEGIN to END,
   with ``args`` equal to its body (scripted sentinel-mode cases); no raw sentinel in a
   tool result.
6. **Schemas**: every ``json.end`` value is valid against the schema its ``json.begin``
   names, every ``result.end`` value against the request's ``result_schema``; a degraded
   value carries ``diagnostics.error = "schema_repair_failed"`` (in it or beside it).
   These count as *schema failures* in the matrix.
7. **No sentinel in text**: a complete sentinel never reaches the client as text.
8. **Artifacts**: ``artifacts/runs/<stream_id>/`` has its five files; ``frames.ndjson``
   is the stream exactly as the client received it (secrets redacted with the same
   rules, degraded frames marked); ``metrics.json`` and ``result.json`` agree with it;
   ``tool_logs.json`` has one record per ``tool.result``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from jsonschema import Draft202012Validator

from toolforge.core.events import FrameKind
from toolforge.core.guarantee import REPAIR_FAILED, validate
from toolforge.core.protocol import sentinels
from toolforge.core.protocol.frames import EVENTS
from toolforge.core.protocol.schema import frame_schema
from toolforge.core.redact import redact
from toolforge.core.schemas import SchemaRegistry, builtin_registry
from toolforge.core.tool_specs import ToolRegistry
from toolforge.errors import ToolForgeError
from toolforge.eval.conformance.case import Case
from toolforge.eval.conformance.match import json_type, matches
from toolforge.runtime.artifacts import ARTIFACT_FILES

__all__ = [
    "DONE_REASONS",
    "Findings",
    "check_artifacts",
    "check_expectations",
    "check_stream",
    "frame_schema_errors",
]

DONE_REASONS: Final = frozenset(
    {"stop", "length", "error", "cancelled", "client_disconnected", "shutdown"}
)
_STOPPED: Final = frozenset({"error", "cancelled", "client_disconnected", "shutdown"})
# expect key -> the client's timing it bounds (milliseconds)
_TIMINGS: Final = (
    ("upstream_closed_within_ms", "upstream_closed_ms"),
    ("cancel_within_ms", "cancel_ms"),
)
_FRAME_EVENTS: Final = {
    "json.begin": ("json", "begin"),
    "json.delta": ("json", "delta"),
    "json.end": ("json", "end"),
    "result.begin": ("result", "begin"),
    "result.delta": ("result", "delta"),
    "result.end": ("result", "end"),
}


@dataclass
class Findings:
    """Failure messages, and how many of them are schema failures."""

    failures: list[str] = field(default_factory=list)
    schema_failures: int = 0

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def schema(self, message: str) -> None:
        self.schema_failures += 1
        self.failures.append(f"schema: {message}")


@functools.cache
def _frame_validator(event: str) -> Any:
    """The validator of one event's frames, from the schema its file in schemas/frames/
    holds (tests/test_schemas_drift.py keeps the two equal); None for an unknown event."""
    cls = EVENTS.get(event)
    return None if cls is None else Draft202012Validator(frame_schema(cls))


def frame_schema_errors(event: str, data: object) -> list[str]:
    """Why ``data`` is not a valid ``event`` frame (empty: it is one)."""
    validator = _frame_validator(event)
    if validator is None:
        return [f"no such event {event!r}"]
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(data)'}: {error.message}"
        for error in validator.iter_errors(data)
    ]


def request_schemas(request: Mapping[str, Any]) -> SchemaRegistry:
    """The built-in schemas plus the request's inline ``object_schemas``."""
    registry = builtin_registry().scoped()
    for item in request.get("object_schemas", ()):
        if isinstance(item, Mapping):
            try:
                registry.register_inline(str(item.get("name")), item.get("schema"))
            except ToolForgeError:
                pass  # the gateway refuses such a request before any frame
    return registry


def tool_calls_sent(texts: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Complete TOOL_CALL frames in what the upstream sent: id -> [(name, body)].

    The END is the last one with the call's id in that response: an earlier one can only
    sit inside a JSON string of the body, where it is content (docs/protocol.md)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for text in texts:
        for begin in sentinels.TOOL_CALL_BEGIN_RE.finditer(text):
            fid, name = begin.group(1), begin.group(2)
            end = text.rfind(sentinels.end(FrameKind.TOOL_CALL, fid))
            if end >= begin.end():
                found.setdefault(fid, []).append((name, text[begin.end() : end]))
    return found


def _parses_to(body: str, value: object) -> bool:
    try:
        return bool(orjson.loads(body) == value)
    except orjson.JSONDecodeError:
        return False


class _StreamChecker:
    def __init__(
        self,
        frames: Sequence[Mapping[str, Any]],
        request: Mapping[str, Any],
        schemas: SchemaRegistry,
        findings: Findings,
        label: str,
    ) -> None:
        self.frames = frames
        self.request = request
        self.schemas = schemas
        self.out = findings
        self.label = label
        self.open: tuple[str, str, str, list[str]] | None = None  # kind, id, schema, chunks

    def fail(self, message: str) -> None:
        self.out.fail(f"{self.label}{message}")

    def run(self, sent_calls: Mapping[str, list[tuple[str, str]]] | None) -> None:
        frames = self.frames
        if not frames:
            self.fail("the stream has no frames")
            return
        ids = [f["id"] for f in frames]
        if ids != list(range(1, len(ids) + 1)):
            bad = next(i for i, x in enumerate(ids, start=1) if x != i)
            self.fail(f"ids are not 1..n: frame {bad} has id {ids[bad - 1]!r}")
        names = [f["event"] for f in frames]
        if names[0] != "stream.begin":
            self.fail(f"the first frame is {names[0]}, not stream.begin")
        if names.count("done") != 1 or names[-1] != "done":
            self.fail(f"{names.count('done')} done frames; the last frame is {names[-1]}")
        done = frames[-1]["data"] if names[-1] == "done" else {}
        self._check_done(done, len(frames))
        self._check_errors(names, done)
        for i, frame in enumerate(frames):
            self._check_frame(i, frame, done)
        if self.open is not None and done.get("reason") not in _STOPPED:
            self.fail(f"frame {self.open[1]} never ended, yet the stream ended normally")
        text = "".join(
            str(f["data"].get("chunk", "")) for f in frames if f["event"] == "text.delta"
        )
        if (leak := sentinels.SENTINEL_RE.search(text)) is not None:
            self.fail(f"a sentinel reached the client as text: {leak.group(0)!r}")
        if sent_calls is not None:
            self._check_calls_sent(sent_calls)

    def _check_done(self, done: Mapping[str, Any], n: int) -> None:
        if not done:
            return
        if done.get("reason") not in DONE_REASONS:
            self.fail(f"done.reason {done.get('reason')!r} is not one of {sorted(DONE_REASONS)}")
        if not isinstance(done.get("usage"), dict):
            self.fail("done.usage is not an object")
        metrics = done.get("metrics")
        if not isinstance(metrics, dict) or metrics.get("frames") != n:
            self.fail(f"done.metrics.frames is not {n}: {metrics}")

    def _check_errors(self, names: list[str], done: Mapping[str, Any]) -> None:
        errors = [i for i, name in enumerate(names) if name == "error"]
        if len(errors) > 1:
            self.fail(f"{len(errors)} error frames")
        if errors and errors[-1] != len(names) - 2:
            self.fail("an error frame is not right before done")
        if bool(errors) != (done.get("reason") == "error"):
            self.fail(f"done.reason is {done.get('reason')!r} with {len(errors)} error frames")
        for i in errors:
            data = self.frames[i]["data"]
            if not (
                isinstance(data.get("code"), str)
                and isinstance(data.get("message"), str)
                and isinstance(data.get("retryable"), bool)
            ):
                self.fail(f"the error frame lacks code, message or retryable: {data}")

    def _check_frame(self, i: int, frame: Mapping[str, Any], done: Mapping[str, Any]) -> None:
        event, data = frame["event"], frame["data"]
        if not isinstance(data, dict):
            self.fail(f"frame {frame['id']} ({event}) data is not an object")
            return
        for error in frame_schema_errors(event, data):
            self.fail(f"frame {frame['id']} breaks schemas/frames/{event}.json: {error}")
        if event in _FRAME_EVENTS:
            self._check_body_frame(event, data)
        elif self.open is not None and event not in ("error", "done"):
            self.fail(f"{event} (frame {frame['id']}) inside the open frame {self.open[1]}")
        if event == "text.delta" and not (isinstance(data.get("chunk"), str) and data["chunk"]):
            self.fail(f"text.delta {frame['id']} has no text")
        elif event == "tool.call":
            self._check_tool_call(i, data, done)
        elif event == "tool.result":
            self._check_tool_result(i, data)

    def _check_body_frame(self, event: str, data: Mapping[str, Any]) -> None:
        kind, part = _FRAME_EVENTS[event]
        fid = data.get("id")
        if part == "begin":
            if self.open is not None:
                self.fail(f"{event} {fid} while frame {self.open[1]} is open")
            self.open = (kind, str(fid), str(data.get("schema")), [])
            return
        if self.open is None or self.open[0] != kind or self.open[1] != fid:
            self.fail(f"{event} {fid} without its {kind}.begin")
            return
        if part == "delta":
            self.open[3].append(str(data.get("chunk", "")))
            return
        _, _, schema, chunks = self.open
        self.open = None
        body = "".join(chunks)
        if data.get("length") != len(body.encode("utf-8")):
            size = len(body.encode("utf-8"))
            self.fail(
                f"{event} {fid}: length {data.get('length')}, but the deltas are {size} bytes"
            )
        repaired, degraded = data.get("repaired"), data.get("degraded")
        if not (isinstance(repaired, bool) and isinstance(degraded, bool)) or (
            repaired and degraded
        ):
            self.fail(f"{event} {fid}: repaired={repaired!r}, degraded={degraded!r}")
        if repaired is False and degraded is False and not _parses_to(body, data.get("value")):
            self.fail(f"{event} {fid}: the value is not what its deltas parse to")
        if degraded:
            inside = data.get("value")
            diagnostics = (inside.get("diagnostics") if isinstance(inside, dict) else None) or (
                data.get("diagnostics")
            )
            if not isinstance(diagnostics, dict) or diagnostics.get("error") != REPAIR_FAILED:
                self.fail(f"{event} {fid} is degraded without diagnostics")
        self._check_schema(kind, fid, schema, data.get("value"))

    def _check_schema(self, kind: str, fid: object, named: str, value: object) -> None:
        checks = [named]
        if kind == "result":
            checks = [str(self.request.get("result_schema", "AssistantReply"))]
            if named not in checks and named in self.schemas:
                checks.append(named)
        for name in checks:
            if name not in self.schemas:
                self.out.schema(f"{self.label}{kind} {fid}: no schema {name!r} is registered")
                continue
            errors = validate(self.schemas.get(name), value)
            if errors:
                first = errors[0]
                self.out.schema(
                    f"{self.label}{kind} {fid} value is not a valid {name}: "
                    f"{first.path}: {first.message}"
                )

    def _check_tool_call(self, i: int, data: Mapping[str, Any], done: Mapping[str, Any]) -> None:
        fid = data.get("id")
        earlier = [f for f in self.frames[:i] if f["event"] == "tool.call"]
        if any(f["data"].get("id") == fid for f in earlier):
            self.fail(f"tool.call id {fid!r} is used twice")
        after = self.frames[i + 1] if i + 1 < len(self.frames) else None
        if after is not None and after["event"] == "tool.result":
            if after["data"].get("id") != fid or after["data"].get("name") != data.get("name"):
                self.fail(f"tool.call {fid} is followed by another call's tool.result")
        elif not (
            after is not None and after["event"] == "done" and done.get("reason") in _STOPPED
        ):
            self.fail(f"tool.call {fid} is not followed by its tool.result")

    def _check_tool_result(self, i: int, data: Mapping[str, Any]) -> None:
        fid = data.get("id")
        before = self.frames[i - 1] if i > 0 else None
        called = before is not None and before["event"] == "tool.call"
        if not called and not (data.get("ok") is False and data.get("attempts") == 0):
            self.fail(f"tool.result {fid} ran a tool that no tool.call announced")
        for key, kind in (("ok", "boolean"), ("attempts", "integer"), ("cached", "boolean")):
            if json_type(data.get(key)) != kind:
                self.fail(f"tool.result {fid}: {key} is not a {kind}")
        if ("result" in data) == ("error" in data) or ("result" in data) != data.get("ok"):
            self.fail(f"tool.result {fid}: ok={data.get('ok')} needs exactly a result or error")
        if any(ch in orjson.dumps(data).decode() for ch in "\u27e6\u27e7"):
            self.fail(f"tool.result {fid} carries a raw sentinel character")

    def _check_calls_sent(self, sent: Mapping[str, list[tuple[str, str]]]) -> None:
        for f in self.frames:
            if f["event"] != "tool.call":
                continue
            fid, name, args = f["data"].get("id"), f["data"].get("name"), f["data"].get("args")
            bodies = [body for n, body in sent.get(str(fid), []) if n == name]
            if not bodies:
                self.fail(f"tool.call {fid} ({name}) came before its END, or was never sent")
            elif not any(_parses_to(body, args) for body in bodies):
                self.fail(f"tool.call {fid} args are not the body the model sent")


def check_stream(
    frames: Sequence[Mapping[str, Any]],
    request: Mapping[str, Any],
    findings: Findings,
    *,
    script_texts: Sequence[str] | None = None,
    label: str = "",
) -> None:
    """The invariants (1-7 above) on one stream's numbered frames.

    ``script_texts`` (what a scripted upstream sent) enables the check that no tool ran
    before its END; it applies to sentinel mode only.
    """
    checker = _StreamChecker(frames, request, request_schemas(request), findings, label)
    sentinel_mode = bool(frames) and frames[0]["data"].get("mode") == "sentinel"
    sent = tool_calls_sent(script_texts) if script_texts is not None and sentinel_mode else None
    checker.run(sent)


def _frame_keys(frame: Mapping[str, Any], tools: ToolRegistry | None) -> frozenset[str]:
    """The extra redaction keys for a frame: its tool's list, for tool frames."""
    if tools is None or frame["event"] not in ("tool.call", "tool.result"):
        return frozenset()
    spec = tools.get(str(frame["data"].get("name")))
    return spec.redact_keys if spec is not None else frozenset()


def check_artifacts(
    run: Path,
    frames: Sequence[Mapping[str, Any]],
    findings: Findings,
    *,
    tools: ToolRegistry | None = None,
    label: str = "",
) -> None:
    """Invariant 8: the run's artifacts are complete and equal to what the client got."""
    missing = [name for name in ARTIFACT_FILES if not (run / name).is_file()]
    if missing:
        findings.fail(f"{label}artifacts missing in {run}: {missing}")
        return
    written = [orjson.loads(line) for line in (run / "frames.ndjson").read_bytes().splitlines()]
    marked = [w.pop("degraded", False) for w in written]
    expected = [redact(dict(f), extra_keys=_frame_keys(f, tools)) for f in frames]
    if written != expected:
        at = next(
            (i for i, (w, e) in enumerate(zip(written, expected, strict=False)) if w != e),
            min(len(written), len(expected)),
        )
        findings.fail(
            f"{label}frames.ndjson differs from what the client received at frame {at + 1} "
            f"({len(written)} written, {len(expected)} received)"
        )
    degraded = [bool(f["data"].get("degraded")) for f in frames]
    if marked != degraded[: len(marked)]:
        findings.fail(f"{label}frames.ndjson marks other frames degraded than the stream")
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    done = frames[-1]["data"] if frames and frames[-1]["event"] == "done" else {}
    if metrics.get("reason") != done.get("reason") or metrics.get("frames") != len(frames):
        findings.fail(
            f"{label}metrics.json says reason={metrics.get('reason')!r}, "
            f"frames={metrics.get('frames')}; the stream: {done.get('reason')!r}, {len(frames)}"
        )
    result = orjson.loads((run / "result.json").read_bytes())
    ends = [redact(f["data"]) for f in frames if f["event"] == "result.end"]
    if result.get("results") != ends:
        findings.fail(f"{label}result.json results differ from the result.end frames")
    tool_logs = orjson.loads((run / "tool_logs.json").read_bytes())
    results = sum(1 for f in frames if f["event"] == "tool.result")
    if not isinstance(tool_logs, list) or len(tool_logs) != results:
        findings.fail(f"{label}tool_logs.json has {len(tool_logs)} records for {results} results")


def _frame_pattern_matches(pattern: Mapping[str, Any], frames: Sequence[Mapping[str, Any]]) -> bool:
    candidates = [f for f in frames if f["event"] == pattern["event"]]
    if "n" in pattern:
        n = int(pattern["n"])
        if not -len(candidates) <= n < len(candidates):
            return False
        candidates = [candidates[n]]
    return any(matches(pattern.get("data", {}), f["data"]) for f in candidates)


def _messages_text(request_json: object) -> str:
    if not isinstance(request_json, dict):
        return ""
    return "\n".join(
        str(m.get("content") or "") for m in request_json.get("messages", []) if isinstance(m, dict)
    )


def check_expectations(
    case: Case,
    *,
    status: int,
    error_body: object,
    frames: Sequence[Mapping[str, Any]],
    upstream_requests: Sequence[object],
    run: Path | None,
    timings: Mapping[str, float],
    findings: Findings,
) -> None:
    """The case's ``expect`` block (see docs/conformance.md for each key)."""
    expect = case.expect
    want_status = expect.get("status", 200)
    if status != want_status:
        findings.fail(f"HTTP {status}, expected {want_status}: {error_body}")
    if "error" in expect:
        got = error_body.get("error") if isinstance(error_body, dict) else error_body
        if not matches(expect["error"], got):
            findings.fail(f"error body {got} does not match {expect['error']}")
    names = [f["event"] for f in frames]
    if "done_reason" in expect:
        reason = frames[-1]["data"].get("reason") if names and names[-1] == "done" else None
        if not matches(expect["done_reason"], reason):
            findings.fail(f"done.reason is {reason!r}, expected {expect['done_reason']!r}")
    if "upstream_requests" in expect and len(upstream_requests) != expect["upstream_requests"]:
        findings.fail(
            f"{len(upstream_requests)} upstream requests, expected {expect['upstream_requests']}"
        )
    if "events" in expect and names != expect["events"]:
        findings.fail(f"events are {names}, expected {expect['events']}")
    if "sequence" in expect:
        wanted = set(expect["sequence"])
        got_seq = [n for n in names if n in wanted]
        if got_seq != expect["sequence"]:
            findings.fail(f"sequence is {got_seq}, expected {expect['sequence']}")
    for pattern in expect.get("frames", []):
        if not _frame_pattern_matches(pattern, frames):
            findings.fail(f"no frame matches {pattern}")
    for pattern in expect.get("absent", []):
        if _frame_pattern_matches(pattern, frames):
            findings.fail(f"a frame matches {pattern}, which must not come")
    for event, n in expect.get("count", {}).items():
        if names.count(event) != n:
            findings.fail(f"{names.count(event)} {event} frames, expected {n}")
    _check_text(expect, frames, findings)
    _check_upstream(expect, upstream_requests, findings)
    _check_run(expect, run, findings)
    for key, timing in _TIMINGS:
        if key in expect and not timings.get(timing, float("inf")) <= expect[key]:
            findings.fail(f"{timing} was {timings.get(timing)}, expected at most {expect[key]}")


def _check_text(
    expect: Mapping[str, Any], frames: Sequence[Mapping[str, Any]], findings: Findings
) -> None:
    text = "".join(str(f["data"].get("chunk", "")) for f in frames if f["event"] == "text.delta")
    if "text" in expect and text != expect["text"]:
        shown = text if len(text) < 200 else text[:200] + "…"
        findings.fail(f"text is {shown!r} ({len(text)} chars), expected {expect['text'][:200]!r}")
    for part in expect.get("text_contains", []):
        if part not in text:
            findings.fail(f"text does not contain {part!r}")
    for part in expect.get("text_excludes", []):
        if part in text:
            findings.fail(f"text contains {part!r}")


def _check_upstream(
    expect: Mapping[str, Any], requests: Sequence[object], findings: Findings
) -> None:
    for spec in expect.get("upstream", []):
        i = int(spec.get("request", 0))
        if not -len(requests) <= i < len(requests):
            findings.fail(f"upstream request {i} was never made")
            continue
        body = getattr(requests[i], "json", None)
        if "json" in spec and not matches(spec["json"], body):
            findings.fail(f"upstream request {i} does not match {spec['json']}")
        text = _messages_text(body)
        for part in spec.get("messages_contain", []):
            if part not in text:
                findings.fail(f"upstream request {i}'s messages do not contain {part!r}")
        for part in spec.get("messages_exclude", []):
            if part in text:
                findings.fail(f"upstream request {i}'s messages contain {part!r}")
        if "last_message" in spec:
            messages = body.get("messages", []) if isinstance(body, dict) else []
            if not messages or not matches(spec["last_message"], messages[-1]):
                findings.fail(f"upstream request {i}'s last message does not match")


def _check_run(expect: Mapping[str, Any], run: Path | None, findings: Findings) -> None:
    wants = ("metrics", "metrics_min", "metrics_max", "tool_logs", "artifacts_exclude")
    if not any(key in expect for key in wants):
        return
    if run is None or not (run / "metrics.json").is_file():
        findings.fail("the stream's artifacts were not written")
        return
    metrics = orjson.loads((run / "metrics.json").read_bytes())
    if "metrics" in expect and not matches(expect["metrics"], metrics):
        shown = {k: metrics.get(k) for k in expect["metrics"]}
        findings.fail(f"metrics.json {shown} does not match {expect['metrics']}")
    for key, low in expect.get("metrics_min", {}).items():
        if not (isinstance(metrics.get(key), int | float) and metrics[key] >= low):
            findings.fail(f"metrics.json {key} is {metrics.get(key)}, expected at least {low}")
    for key, high in expect.get("metrics_max", {}).items():
        if not (isinstance(metrics.get(key), int | float) and metrics[key] <= high):
            findings.fail(f"metrics.json {key} is {metrics.get(key)}, expected at most {high}")
    if "tool_logs" in expect:
        logs = orjson.loads((run / "tool_logs.json").read_bytes())
        if not matches(expect["tool_logs"], logs):
            findings.fail(f"tool_logs.json {logs} does not match {expect['tool_logs']}")
    for secret in expect.get("artifacts_exclude", []):
        for path in sorted(run.iterdir()):
            if secret in path.read_text(encoding="utf-8", errors="replace"):
                findings.fail(f"{path.name} holds {secret!r}")
