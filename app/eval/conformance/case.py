"""Conformance cases are data: one JSON file per case, loaded and expanded here.

A case file (``<name>.json``, the file named after its ``name``)::

    {
      "name": "tool_call_split_every_char",
      "category": "partial_frames",          # the matrix row group (see CATEGORIES)
      "description": "One sentence: what is checked and why.",
      "request": {"input": "pizza?"},        # the POST /v1/stream body
      "headers": {"Idempotency-Key": "k1"},  # optional request headers
      "settings": {"queue_max_frames": 8},   # optional gateway Settings for this case
      "upstream": [<script>, ...],           # one script per upstream request, in order,
                                             # or "real": a real model server (see below)
      "routes": {"/props": <script>},        # optional fixed answers by path
      "client": {"mode": "read_all"},        # what the client does (eval.conformance.client)
      "expect": {...},                       # what must come back (eval.conformance.checks)
      "timeout_s": 30,                       # optional bound on the whole case
      "known_bug": "text"                    # optional: a gateway bug this case documents
    }

Scripts are ``app/eval/scripted_upstream.py``'s format (``steps``, ``end``,
``end_delay_ms``, ``status``, ``body``, ``chunked``; steps ``text``, ``raw``, ``finish``,
``usage``, ``delay_ms``, ``split``) plus shorthands that keep cases readable:

* a step may be a plain string: ``"Hello"`` is ``{"text": "Hello"}``;
* ``"chunks": 4`` cuts a step's text into 4-character steps, ``"chunks": "chars"`` into
  one character per step, ``"chunks": [3, 1, 5]`` into pieces of those sizes (the rest
  is the last piece); ``delay_ms`` and ``split`` then apply to every piece;
* ``"repeat": n`` repeats a step n times;
* ``{"delta": {...}, "reason": "tool_calls"}`` is one ``chat.completion.chunk`` with that
  delta and finish_reason, verbatim (native ``tool_calls`` pieces, odd deltas);
* ``"raw_bytes"`` is ``raw`` for bytes that are not UTF-8: each character U+0000-U+00FF
  is one byte (``"\u00ff"`` is the byte 0xFF);
* frame steps write the sentinels for you: ``{"tool_call": {"id", "name", "args"}}``,
  ``{"object": {"id", "schema", "value"}}``, ``{"result": {"id", "schema", "value"}}``
  (``schema`` defaults to ``AssistantReply`` for results). ``body`` instead of
  ``args``/``value`` is the body text verbatim (for broken JSON); ``"end": false`` leaves
  the END sentinel out. They combine with ``chunks`` and ``repeat``;
* a script whose ``end`` is ``done`` (the default) and has no ``finish`` step (nor a
  ``delta`` step with a ``reason``) gets
  ``{"finish": "stop"}`` appended; ``"finish": "length"`` on the script picks another
  reason and ``"finish": null`` appends none.

Anywhere in a case, ``{"$repeat": "ab", "times": 3}`` is the string ``"ababab"``: large
bodies without large files.

``"upstream": "real"`` runs the case against a real OpenAI-compatible model server
passed to the runner (``RealUpstream``); without one the case is reported *not run*,
never passed.

Unknown keys are errors (a typo must not silently weaken a case); a file that cannot be
read or expanded still becomes a :class:`Case` whose ``error`` the runner reports as a
failure, so one broken file cannot hide the rest of the matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels

__all__ = [
    "CATEGORIES",
    "CLIENT_KEYS",
    "DEFAULT_CASES_DIR",
    "EXPECT_KEYS",
    "Case",
    "CaseFormatError",
    "category_rank",
    "expand_script",
    "expand_value",
    "frame_text",
    "load_case",
    "load_cases",
    "parse_case",
]

DEFAULT_CASES_DIR: Final = Path(__file__).resolve().parents[3] / "tests" / "conformance" / "cases"

# The categories of docs/conformance.md, in the matrix's order; a case may name another (it sorts
# last).
CATEGORIES: Final = (
    "valid_json",
    "partial_frames",
    "mid_stream_tools",
    "interruptions",
    "backpressure",
    "repair",
    "security",
    "upstream_faults",
    "determinism",
)

_TOP_KEYS: Final = frozenset(
    {
        "name",
        "category",
        "description",
        "request",
        "headers",
        "settings",
        "upstream",
        "routes",
        "client",
        "expect",
        "timeout_s",
        "known_bug",
    }
)
EXPECT_KEYS: Final = frozenset(
    {
        "status",
        "error",
        "done_reason",
        "upstream_requests",
        "upstream_closed",
        "upstream_closed_within_ms",
        "cancel_within_ms",
        "events",
        "sequence",
        "frames",
        "absent",
        "count",
        "text",
        "text_contains",
        "text_excludes",
        "metrics",
        "metrics_min",
        "metrics_max",
        "upstream",
        "tool_logs",
        "artifacts_exclude",
    }
)
# Each client mode and the keys it takes ("then" works with every mode).
CLIENT_KEYS: Final = {
    "read_all": frozenset(),
    "stall": frozenset({"stall_ms", "rcvbuf", "read_bytes", "pause_ms", "abort"}),
    "slow": frozenset({"stall_ms", "rcvbuf", "read_bytes", "pause_ms", "abort"}),
    "cancel": frozenset({"after_frames", "after_event", "resume", "expect_cancelled"}),
    "disconnect": frozenset({"after_frames", "after_event", "resume"}),
    "resume": frozenset({"at", "query"}),
    "replay": frozenset({"key", "second_request", "during", "wait_ms", "second"}),
    "approve": frozenset({"decisions"}),
    "repeat": frozenset({"times", "concurrent", "identical"}),
    "seeds": frozenset({"seeds"}),
}
_FRAME_STEPS: Final = {
    "tool_call": (FrameKind.TOOL_CALL, "name", "args"),
    "object": (FrameKind.OBJECT, "schema", "value"),
    "result": (FrameKind.RESULT, "schema", "value"),
}


class CaseFormatError(ValueError):
    """A case file that does not follow the format above."""


@dataclass(frozen=True, slots=True)
class Case:
    """One conformance case, expanded and ready to run."""

    name: str
    category: str
    description: str
    request: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    upstream: tuple[dict[str, Any], ...] | None = ()  # None: the real model server
    routes: Mapping[str, Any] = field(default_factory=dict)
    client: Mapping[str, Any] = field(default_factory=lambda: {"mode": "read_all"})
    expect: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0
    known_bug: str | None = None
    path: Path | None = None
    error: str | None = None  # why the file could not be loaded (reported as a failure)

    @property
    def real(self) -> bool:
        """Whether this case needs a real model server."""
        return self.upstream is None

    @property
    def mode(self) -> str:
        return str(self.client.get("mode", "read_all"))

    @property
    def script_texts(self) -> list[str]:
        """The text each scripted response carries (what the model "wrote"), in order."""
        return [
            "".join(s["text"] for s in script.get("steps", ()) if "text" in s)
            for script in self.upstream or ()
        ]


def expand_value(value: Any) -> Any:
    """``{"$repeat": s, "times": n}`` anywhere in ``value`` becomes ``s * n``."""
    if isinstance(value, dict):
        if "$repeat" in value:
            if set(value) != {"$repeat", "times"} or not isinstance(value["$repeat"], str):
                raise CaseFormatError(f'"$repeat" takes a string and "times" only: {value}')
            return value["$repeat"] * int(value["times"])
        return {k: expand_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_value(v) for v in value]
    return value


def frame_text(kind: str, spec: Mapping[str, Any]) -> str:
    """The sentinel text of a frame step (``tool_call``, ``object`` or ``result``)."""
    sentinel, attr, value_key = _FRAME_STEPS[kind]
    unknown = set(spec) - {"id", attr, value_key, "body", "end"}
    if unknown:
        raise CaseFormatError(f"unknown {kind} keys: {sorted(unknown)}")
    fid = spec.get("id", {"tool_call": "t1", "object": "o1", "result": "r1"}[kind])
    name = spec.get(attr, "AssistantReply" if kind == "result" else None)
    if name is None:
        raise CaseFormatError(f"a {kind} step needs {attr!r}")
    if "body" in spec:
        body = str(spec["body"])
    elif value_key in spec:
        body = orjson.dumps(spec[value_key]).decode()
    else:
        raise CaseFormatError(f"a {kind} step needs {value_key!r} or 'body'")
    text = sentinels.begin(sentinel, fid, name) + body
    if spec.get("end", True):
        text += sentinels.end(sentinel, fid)
    return text


def _pieces(text: str, chunks: Any) -> list[str]:
    if chunks == "chars":
        return list(text)
    if isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > 0:
        return [text[i : i + chunks] for i in range(0, len(text), chunks)]
    if isinstance(chunks, list) and all(isinstance(n, int) and n > 0 for n in chunks):
        out, at = [], 0
        for size in chunks:
            if at < len(text):
                out.append(text[at : at + size])
            at += size
        if at < len(text):
            out.append(text[at:])
        return out
    raise CaseFormatError(f'"chunks" is a positive size, "chars" or a list of sizes: {chunks!r}')


def _expand_step(step: Any) -> list[dict[str, Any]]:
    if isinstance(step, str):
        return [{"text": step}]
    if not isinstance(step, dict):
        raise CaseFormatError(f"a step is a string or an object: {step!r}")
    step = dict(step)
    if "raw_bytes" in step:  # code points 0-255 are the bytes: non-UTF-8 upstream output
        try:
            data = str(step.pop("raw_bytes")).encode("latin-1")
        except UnicodeEncodeError as exc:
            raise CaseFormatError(f'"raw_bytes" holds only U+0000-U+00FF: {exc}') from exc
        step["raw"] = data.decode("utf-8", "surrogateescape")
    if "delta" in step:  # a raw chat.completion.chunk: native tool calls, odd deltas
        chunk = {
            "id": "chatcmpl-conformance",
            "object": "chat.completion.chunk",
            "choices": [
                {"index": 0, "delta": step.pop("delta"), "finish_reason": step.pop("reason", None)}
            ],
        }
        step["raw"] = "data: " + orjson.dumps(chunk).decode() + "\n\n"
    times = step.pop("repeat", 1)
    chunks = step.pop("chunks", None)
    for kind in _FRAME_STEPS:
        if kind in step:
            if "text" in step:
                raise CaseFormatError(f"a step has 'text' or {kind!r}, not both")
            step["text"] = frame_text(kind, step.pop(kind))
    pieces = [step]
    if chunks is not None:
        if "text" not in step:
            raise CaseFormatError('"chunks" needs "text" (or a frame)')
        pieces = [{**step, "text": piece} for piece in _pieces(step["text"], chunks)]
    if not isinstance(times, int) or times < 0:
        raise CaseFormatError(f'"repeat" is a count: {times!r}')
    return pieces * times


def expand_script(script: Any) -> dict[str, Any]:
    """A case's script in the scripted upstream's own format (shorthands expanded)."""
    if isinstance(script, list):
        script = {"steps": script}
    if not isinstance(script, dict):
        raise CaseFormatError(f"a script is an object or a list of steps: {script!r}")
    script = dict(script)
    finish = script.pop("finish", "stop")
    raw_steps = script.get("steps", [])
    finished = any(isinstance(s, dict) and ("finish" in s or s.get("reason")) for s in raw_steps)
    steps = [piece for step in raw_steps for piece in _expand_step(step)]
    if script.get("end", "done") == "done" and finish is not None and not finished:
        steps.append({"finish": finish})
    script["steps"] = steps
    return dict(script)


def _require(raw: Mapping[str, Any], key: str, kind: type) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind) or (isinstance(value, str) and not value):
        raise CaseFormatError(f"{key!r} is required ({kind.__name__})")
    return value


def _parse(raw: Any, path: Path | None) -> Case:
    if not isinstance(raw, dict):
        raise CaseFormatError("a case is a JSON object")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise CaseFormatError(f"unknown case keys: {sorted(unknown)}")
    name = _require(raw, "name", str)
    if path is not None and path.stem != name:
        raise CaseFormatError(f"the file is {path.name} but the case is named {name!r}")
    raw = expand_value(raw)
    client = dict(raw.get("client", {"mode": "read_all"}))
    mode = client.get("mode", "read_all")
    if mode not in CLIENT_KEYS:
        raise CaseFormatError(f"unknown client mode {mode!r}; one of {sorted(CLIENT_KEYS)}")
    extra = set(client) - CLIENT_KEYS[mode] - {"mode", "then"}
    if extra:
        raise CaseFormatError(f"client mode {mode!r} does not take {sorted(extra)}")
    expect = raw.get("expect", {})
    if not isinstance(expect, dict) or set(expect) - EXPECT_KEYS:
        bad = sorted(set(expect) - EXPECT_KEYS) if isinstance(expect, dict) else expect
        raise CaseFormatError(f"unknown expect keys: {bad}")
    upstream_raw = raw.get("upstream", [])
    upstream: tuple[dict[str, Any], ...] | None
    if upstream_raw == "real":
        upstream = None
    elif isinstance(upstream_raw, list):
        upstream = tuple(expand_script(s) for s in upstream_raw)
    else:
        raise CaseFormatError('"upstream" is a list of scripts or "real"')
    return Case(
        name=name,
        category=_require(raw, "category", str),
        description=_require(raw, "description", str),
        request=raw.get("request", {"input": "hi"}),
        headers=raw.get("headers", {}),
        settings=raw.get("settings", {}),
        upstream=upstream,
        routes={p: expand_script(s) for p, s in raw.get("routes", {}).items()},
        client=client,
        expect=expect,
        timeout_s=float(raw.get("timeout_s", 30.0)),
        known_bug=raw.get("known_bug"),
        path=path,
    )


def load_case(path: Path) -> Case:
    """One case file; a file that cannot be used comes back with ``error`` set."""
    try:
        return _parse(orjson.loads(path.read_bytes()), path)
    except (OSError, orjson.JSONDecodeError, CaseFormatError, TypeError, ValueError) as exc:
        return Case(
            name=path.stem,
            category="(unreadable)",
            description=str(path),
            path=path,
            error=f"{type(exc).__name__}: {exc}",
        )


def load_cases(directory: Path = DEFAULT_CASES_DIR, *, select: str | None = None) -> list[Case]:
    """Every ``*.json`` case under ``directory`` (sorted by category, then name).

    ``select`` keeps the cases whose name or category contains it (``-k``).
    """
    cases = [load_case(p) for p in sorted(Path(directory).rglob("*.json"))]
    if select:
        cases = [c for c in cases if select in c.name or select in c.category]
    return sorted(cases, key=lambda c: (category_rank(c.category), c.category, c.name))


def category_rank(category: str) -> int:
    """Where ``category`` sorts in the matrix: the order of docs/conformance.md, then the rest."""
    return CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)


def parse_case(raw: Mapping[str, Any]) -> Case:
    """A case from an already-parsed mapping (tests, generated cases)."""
    return _parse(dict(raw), None)
