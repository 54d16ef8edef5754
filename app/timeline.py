"""``toolforge demo``'s timeline: stream the demo request to a running gateway and draw it.

One line per event, each with the milliseconds since the request went out: the model's
text as it streams, tool calls with their arguments and results, OBJECT and RESULT
values, nudges, compactions, errors, and the ``done`` frame's timings. Colours when the
output is a terminal (and ``NO_COLOR`` is not set), plain text otherwise.

It reads the stream with httpx and httpx-sse, the gateway's own dependencies, so that it
works wherever ``toolforge`` is installed; the Python SDK (``clients/python``) is for
applications, and brings client-side tools and resume, which a demo does not need.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TextIO

import httpx
import orjson
from httpx_sse import connect_sse

__all__ = ["DEMO_BODY", "DEMO_INPUT", "Timeline", "run_demo", "use_color"]

DEMO_INPUT: Final = "Find pizza near me; book a table for 2 at 7pm if open."
# The README's demo request: the booking workflow (workflows/book_a_table.json) makes the
# model search first and book only a place the search returned (docs/workflows.md).
DEMO_BODY: Final[Mapping[str, Any]] = {
    "input": DEMO_INPUT,
    "workflow": "book_a_table",
    "profile": "demo",
}
_VALUE_CHARS: Final = 240
_RESET: Final = "\x1b[0m"
_STYLES: Final = {
    "time": "\x1b[2m",  # dim
    "begin": "\x1b[1;36m",  # bold cyan
    "text": "\x1b[0m",
    "reasoning": "\x1b[2;3m",  # dim italic
    "call": "\x1b[1;33m",  # bold yellow
    "ok": "\x1b[1;32m",  # bold green
    "fail": "\x1b[1;31m",  # bold red
    "object": "\x1b[1;35m",  # bold magenta
    "result": "\x1b[1;32m",
    "nudge": "\x1b[1;34m",  # bold blue
    "error": "\x1b[1;31m",
    "done": "\x1b[1m",
    "dim": "\x1b[2m",
}

ColorChoice = Literal["auto", "always", "never"]


def use_color(choice: ColorChoice, out: TextIO) -> bool:
    """Colours for ``always``; for ``auto``, when ``out`` is a terminal and ``NO_COLOR``
    (no-color.org) is not set."""
    if choice != "auto":
        return choice == "always"
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def _compact(value: Any, limit: int = _VALUE_CHARS) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Timeline:
    """Draws a stream's events on ``out``, one line each (text streams inline)."""

    out: TextIO
    color: bool
    started: float = field(default_factory=time.perf_counter)
    _inline: str | None = None  # "text" or "reasoning" while a run of deltas is open
    frames: int = 0
    error: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    _schemas: dict[str, str] = field(default_factory=dict)  # frame id -> its schema

    def _paint(self, style: str, text: str) -> str:
        return f"{_STYLES[style]}{text}{_RESET}" if self.color else text

    def _stamp(self) -> str:
        ms = (time.perf_counter() - self.started) * 1000
        return self._paint("time", f"{ms:9.1f} ms")

    def _close_inline(self) -> None:
        if self._inline is not None:
            self.out.write("\n")
            self._inline = None

    def line(self, style: str, label: str, rest: str = "") -> None:
        self._close_inline()
        body = f"  {rest}" if rest else ""
        self.out.write(f"{self._stamp()}  {self._paint(style, f'{label:<12}')}{body}\n")
        self.out.flush()

    def _stream_text(self, kind: str, chunk: str) -> None:
        if self._inline != kind:
            self._close_inline()
            label = "text" if kind == "text" else "reasoning"
            self.out.write(f"{self._stamp()}  {self._paint(kind, f'{label:<12}')}  ")
            self._inline = kind
        indent = "\n" + " " * 28
        self.out.write(self._paint(kind, chunk.replace("\n", indent)))
        self.out.flush()

    def event(self, event: str, data: Mapping[str, Any]) -> None:
        """Draw one event (pings and partial bodies are left out)."""
        if event == "ping":
            return
        self.frames += 1
        if event == "text.delta":
            self._stream_text("text", str(data.get("chunk", "")))
        elif event == "reasoning.delta":
            self._stream_text("reasoning", str(data.get("chunk", "")))
        elif event == "stream.begin":
            budget = data.get("budget_tokens")
            self.line(
                "begin",
                "stream",
                f"{data.get('stream_id')}  model {data.get('model')}  mode {data.get('mode')}"
                + (f"  budget {budget} tokens" if budget is not None else ""),
            )
        elif event == "tool.call":
            flags = [
                flag
                for flag, on in (
                    (data.get("executor", "server"), data.get("executor") == "client"),
                    ("needs approval", data.get("needs_approval")),
                    ("rescued", data.get("rescued")),
                )
                if on
            ]
            note = f"  ({', '.join(str(f) for f in flags)})" if flags else ""
            self.line(
                "call",
                "tool.call",
                f"{data.get('id')} {data.get('name')} {_compact(data.get('args'))}{note}",
            )
        elif event == "tool.result":
            self._tool_result(data)
        elif event in ("json.end", "result.end"):
            style, label = ("object", "object") if event == "json.end" else ("result", "result")
            flags = [f for f in ("repaired", "degraded") if data.get(f)]
            note = f"  ({', '.join(flags)})" if flags else ""
            fid = str(data.get("id"))
            schema = self._schemas.get(fid, "?")
            self.line(style, label, f"{fid} {schema} {_compact(data.get('value'))}{note}")
        elif event in ("json.begin", "result.begin"):
            self._schemas[str(data.get("id"))] = str(data.get("schema"))  # drawn at its END
        elif event in ("json.delta", "result.delta"):
            pass
        elif event == "step.nudge":
            call = f" (call {data['call_id']})" if data.get("call_id") else ""
            self.line(
                "nudge",
                "nudge",
                f"{data.get('kind')} tier {data.get('tier')}{call}: {data.get('message')}",
            )
        elif event == "context.compacted":
            self.line(
                "nudge",
                "compacted",
                f"phase {data.get('phase')}: {data.get('tokens_before')} -> "
                f"{data.get('tokens_after')} tokens (budget {data.get('budget_tokens')}), "
                f"{data.get('messages_before')} -> {data.get('messages_after')} messages",
            )
        elif event == "error":
            self.error = dict(data)
            retry = " (retryable)" if data.get("retryable") else ""
            self.line("error", "error", f"{data.get('code')}: {data.get('message')}{retry}")
        elif event == "done":
            self.done = dict(data)
            self._done(data)
        else:  # an event this version does not know: shown as it came
            self.line("dim", event, _compact(dict(data)))

    def _tool_result(self, data: Mapping[str, Any]) -> None:
        took = f"{data.get('duration_ms', 0):.1f} ms"
        extra = [
            f
            for f, on in (("cached", data.get("cached")), ("slow", data.get("performance_warning")))
            if on
        ]
        note = f"  ({', '.join(extra)})" if extra else ""
        head = f"{data.get('id')} {data.get('name')}"
        if data.get("ok"):
            self.line(
                "ok", "tool.result", f"{head} ok in {took}: {_compact(data.get('result'))}{note}"
            )
        else:
            err = data.get("error") or {}
            self.line(
                "fail",
                "tool.result",
                f"{head} failed in {took}: {err.get('code')}: {err.get('message')}{note}",
            )

    def _done(self, data: Mapping[str, Any]) -> None:
        metrics = data.get("metrics") or {}
        parts = [str(data.get("reason"))]
        for key, label, unit in (
            ("ttft_ms", "first token", " ms"),
            ("duration_ms", "total", " ms"),
            ("tokens_per_s", "", " tokens/s"),
        ):
            value = metrics.get(key)
            if isinstance(value, int | float):
                parts.append(f"{label} {value:.1f}{unit}".strip())
        if metrics.get("frames") is not None:
            parts.append(f"{metrics['frames']} frames")
        usage = data.get("usage") or {}
        if usage:
            parts.append("usage " + _compact(usage, 120))
        if data.get("guardrails"):
            parts.append("guardrails " + _compact(data["guardrails"], 120))
        self.line("done", "done", "  ".join(parts))


def run_demo(
    url: str,
    *,
    out: TextIO,
    err: TextIO,
    color: bool,
    body: Mapping[str, Any] = DEMO_BODY,
    api_key: str | None = None,
    timeout_s: float = 60.0,
) -> int:
    """Stream ``body`` to the gateway at ``url`` and draw it on ``out``. The exit status:
    0 when the stream ended without an error frame, 1 otherwise (the reason on ``err``)."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeline = Timeline(out, color)
    out.write(f"POST {base}/v1/stream  {json.dumps(dict(body), ensure_ascii=False)}\n")
    out.flush()
    timeline.started = time.perf_counter()
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client,
            connect_sse(
                client, "POST", f"{base}/v1/stream", json=dict(body), headers=headers
            ) as source,
        ):
            response = source.response
            if response.status_code >= 400:
                response.read()
                err.write(f"toolforge demo: the gateway answered {response.status_code}: ")
                err.write(f"{_http_error(response)}\n")
                return 1
            for sse in source.iter_sse():
                timeline.event(sse.event, orjson.loads(sse.data) if sse.data else {})
    except httpx.ConnectError as exc:
        timeline._close_inline()
        err.write(
            f"toolforge demo: cannot reach a gateway at {base} ({exc}); start one with "
            "`toolforge serve`, or give its address with --url\n"
        )
        return 1
    except httpx.HTTPError as exc:
        timeline._close_inline()
        err.write(f"toolforge demo: the stream broke off: {type(exc).__name__}: {exc}\n")
        return 1
    timeline._close_inline()
    if timeline.done is None:
        err.write("toolforge demo: the stream ended without its done frame\n")
        return 1
    return 1 if timeline.error is not None else 0


def _http_error(response: httpx.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.text[:500]
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return f"{error.get('code')}: {error.get('message')}"
    return _compact(payload, 500)
