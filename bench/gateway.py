"""B1-B4: the gateway beside the direct upstream, in the same run, reported as ratios.

Run with ``make bench`` (or ``python -m bench.gateway``; ``--quick`` for a ~30 s smoke run
that does not touch RESULTS.md). Three processes: the scripted upstream
(``toolforge.eval.scripted_upstream``) and the gateway (uvicorn + httptools, as ``toolforge
serve`` runs it) each in their own (``bench._procs``), and the load generator here, which
speaks HTTP/1.1 over raw asyncio sockets and timestamps every read with
``time.perf_counter_ns`` the moment it returns. "Direct" is the same client asking the
upstream's ``/v1/chat/completions`` for the same script the gateway gets. "Proxy" is the
gateway's OpenAI-compatible ``/v1/chat/completions`` (docs/proxy.md) asked with the very
body the direct client sends (``stream: true``, no tools): its chunks are the direct
arm's format, read by the same code, plus one role chunk first.

- B1: added time to first event. Direct and proxy: request sent → first ``data:`` chunk
  with content (the proxy's role chunk, ``"content":""``, does not count); gateway:
  request sent → first ``text.delta`` frame of ``POST /v1/stream``. Sequential requests on
  a kept-alive connection, direct, gateway, proxy and a bare TCP relay (uvloop, in a
  process of its own: the floor of one more hop on this machine) taking turns. The
  gateway's CPU per request is counted per arm (``/proc`` schedstat, from each of its
  requests to the next one it serves, so the artifacts written after ``done`` count too).
- B2: one long stream at full speed; tokens/s direct vs gateway vs proxy, gateway CPU µs
  per upstream token (utime + stime from /proc while the stream runs; the artifacts written
  after ``done`` are reported apart), plain text and text with an OBJECT frame every 50
  tokens (through the proxy, which has no sentinel frames, the same text as content).
- B3: gap fidelity at 4 ± 2 ms (seeded): each gap between two tokens as the client saw it,
  minus the same gap as the upstream wrote it, in the same stream (the scripted upstream
  records when each step went out, on the clock this process reads too); two direct runs
  give the floor of the method (the client's own wake-ups).
- B4: 200 concurrent streams at ~50 tokens/s; delivered %, gateway RSS, then leaks: active
  streams (``GET /metrics``) and the gateway's sockets to the upstream (/proc) after the
  clients finished, and after 200 clients hung up mid-stream (each such stream waits
  ``DISCONNECT_GRACE_MS``, 10 s by default, for a resume before it is cancelled: the
  check waits that long and 5 s more).
- ``--formats``: B1 and B2 once more for every wire format (the Responses API, AG-UI, the
  AI SDK UI stream, the WebSocket) beside ``/v1/stream`` and the direct upstream, reported
  as ratios to ``/v1/stream`` (``bench.formats``); the budget: each format at most 10 %
  more gateway CPU per token than ``/v1/stream``.

Targets (issue text): B1 added p50 ≤ 0.5 ms, p99 ≤ 1.2 ms, for ``/v1/stream`` and the
proxy (B1p) alike (an earlier 1 ms / 3 ms, tightened for one worker's load); B2 ratio ≥ 0.5
(aim 0.8) and ≤ 15 µs gateway CPU per plain-text token; B3 p99 |Δgap| ≤ 1 ms and zero
bursts; B4 ≥ 99 % delivered, ≤ 50 KB RSS per stream, zero active streams and upstream
sockets afterwards.
The proxy (B2p): plain-text throughput ratio ≥ 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import http.client
import importlib.metadata
import itertools
import os
import platform
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench._procs import (
    WRITTEN,
    Proc,
    cpu_ns,
    cpu_seconds,
    frames_tokens,
    paced_delays,
    plain_tokens,
    rss_kb,
    scratch,
    settle_cpu,
    sockets_to,
    spawn_gateway,
    spawn_proxy,
    spawn_upstream,
)
from bench._results import RESULTS, load_average, section_text, write_section

HEADING = "## Gateway (bench/gateway.py)"
MS = 1_000_000  # ns
PAUSE_S = 0.01  # B1: idle time after each request
B1_ADDED_P50_MS = 0.5  # /v1/stream and the proxy alike
B1_ADDED_P99_MS = 1.2


# -- a minimal HTTP/1.1 + SSE client --------------------------------------------------


class Sink:
    """Receives the SSE events completed by one read, with that read's timestamp."""

    def events(self, events: list[bytes], ts: int) -> None:
        raise NotImplementedError


class _Conn(asyncio.Protocol):
    """One kept-alive connection; one request at a time; chunked or sized bodies."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._raw = bytearray()
        self._sse = b""
        self._sink: Sink | None = None
        self._done: asyncio.Future[int] | None = None
        self._head = True
        self._chunked = False
        self._left = 0  # bytes left in the current chunk, or of a sized body
        self._crlf = False  # a chunk's trailing CRLF is still to skip
        self.status = 0
        self.last = False  # the response said Connection: close (the server's keep-alive cap)
        self.body = bytearray()  # non-streamed bodies (errors, /metrics)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError("connection closed mid-response"))

    def send(self, request: bytes, sink: Sink | None) -> tuple[int, asyncio.Future[int]]:
        assert self.transport is not None
        self._sink = sink
        self._done = asyncio.get_running_loop().create_future()
        self._head, self._chunked, self._left, self._crlf = True, False, 0, False
        self._sse = b""
        self.body = bytearray()
        t0 = time.perf_counter_ns()
        self.transport.write(request)
        return t0, self._done

    def data_received(self, data: bytes) -> None:
        ts = time.perf_counter_ns()
        raw = self._raw
        raw += data
        if self._head:
            while raw.startswith(b"\r\n"):  # a previous body's last CRLF, if it came late
                del raw[:2]
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(raw[:end]).decode("latin-1").lower()
            del raw[: end + 4]
            self.status = int(head.split(" ", 2)[1])
            self.last = "\r\nconnection: close" in head
            self._chunked = "transfer-encoding: chunked" in head
            if not self._chunked:
                match = re.search(r"content-length: *(\d+)", head)
                self._left = int(match.group(1)) if match else 0
            self._head = False
        if self._chunked:
            body, finished = self._dechunk()
        else:
            take = min(self._left, len(raw))
            body, finished = bytes(raw[:take]), self._left == take
            self._left -= take
            del raw[:take]
        if body:
            if self.status != 200 or self._sink is None:
                self.body += body
            else:
                sse = self._sse + body
                if b"\n\n" in sse:
                    events = sse.split(b"\n\n")
                    self._sse = events.pop()
                    self._sink.events(events, ts)
                else:
                    self._sse = sse
        if finished and self._done is not None and not self._done.done():
            self._done.set_result(ts)

    def _dechunk(self) -> tuple[bytes, bool]:
        raw, pos, out = self._raw, 0, []
        n = len(raw)
        finished = False
        while True:
            if self._left:
                take = min(self._left, n - pos)
                if not take:
                    break
                out.append(raw[pos : pos + take])
                pos += take
                self._left -= take
                if self._left:
                    break
                self._crlf = True
            if self._crlf:
                if n - pos < 2:
                    break
                pos += 2
                self._crlf = False
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(raw[pos:eol]).split(b";")[0], 16)
            if size == 0:
                if n - eol < 4:  # wait for the empty trailer's CRLF
                    break
                pos = eol + 4
                finished = True
                break
            pos = eol + 2
            self._left = size
        del raw[:pos]
        return b"".join(out), finished


async def _connect(port: int) -> _Conn:
    _, conn = await asyncio.get_running_loop().create_connection(_Conn, "127.0.0.1", port)
    return conn


class Client:
    """``await Client.open(port)``; ``await c.stream(path, body, sink)`` per request."""

    def __init__(self, port: int, conn: _Conn) -> None:
        self.port = port
        self.conn = conn

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(port, await _connect(port))

    def request_bytes(self, path: str, body: bytes, auth: str | None = None) -> bytes:
        """The request; ``auth``: an API key, sent as ``Authorization: Bearer``."""
        bearer = f"Authorization: Bearer {auth}\r\n" if auth is not None else ""
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Accept: text/event-stream\r\nContent-Type: application/json\r\n"
            f"{bearer}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def stream(self, request: bytes, sink: Sink, timeout_s: float = 60.0) -> tuple[int, int]:
        """Send, read the whole response; (t_sent_ns, t_end_ns)."""
        t0, done = self.conn.send(request, sink)
        async with asyncio.timeout(timeout_s):
            t_end = await done
        if self.conn.status != 200:
            raise RuntimeError(f"HTTP {self.conn.status}: {bytes(self.conn.body[:300])!r}")
        if self.conn.last:  # the gateway's KEEPALIVE_MAX_REQUESTS: a new connection, untimed
            self.close()
            self.conn = await _connect(self.port)
        return t0, t_end

    def close(self) -> None:
        if self.conn.transport is not None:
            self.conn.transport.close()


def direct_body(model: str) -> bytes:
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )


def gateway_body(model: str) -> bytes:
    # Sentinel mode explicitly: ``auto`` would probe the upstream once per model name, and
    # every scenario here is a model name of its own.
    return orjson.dumps({"input": "hi", "model": model, "mode": "sentinel"})


@dataclass
class Target:
    """Where a client goes: the upstream directly, the bare relay, the gateway's
    ``/v1/stream``, or the gateway's OpenAI-compatible proxy (``proxy``)."""

    name: str
    port: int
    path: str
    body: Callable[[str], bytes]
    proxy: bool = False
    auth: str | None = None  # an API key for a gateway started with API_KEYS (bench.ab --auth)

    @property
    def direct(self) -> bool:
        """The upstream's own stream format (direct, through the bare relay, or from the
        proxy); every ``/v1/stream`` target (``bench.ab`` has two) is the gateway's."""
        return self.path != "/v1/stream"

    @property
    def on_gateway(self) -> bool:
        """Served by the gateway: its CPU, and its artifacts after ``done``, count."""
        return self.proxy or not self.direct


def _text_of(event: bytes, direct: bool) -> str | None:
    """The text a content event carries, else None."""
    if direct:
        if event.startswith(b"data: {") and b'"content"' in event:
            obj = orjson.loads(event[6:])
            return str(obj["choices"][0]["delta"]["content"])
        return None
    if b"\nevent: text.delta\n" in event:
        return str(orjson.loads(event[event.index(b"\ndata: ") + 7 :])["chunk"])
    return None


class FirstText(Sink):
    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.ts: int | None = None

    def events(self, events: list[bytes], ts: int) -> None:
        if self.ts is None and any(_text_of(e, self.direct) for e in events):
            self.ts = ts


class Counter(Sink):
    """Counts content events cheaply (B2); the client must not be the bottleneck. The
    proxy's chunks take the direct arm's path, the same two tests per event (its role
    chunk, ``"content":""``, is one more content event)."""

    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.text = 0
        self.json_end = 0
        self.done = False

    def events(self, events: list[bytes], ts: int) -> None:
        if self.direct:
            for e in events:
                if b'"content"' in e:
                    self.text += 1
                elif e == b"data: [DONE]":
                    self.done = True
        else:
            for e in events:
                if b"\nevent: text.delta\n" in e:
                    self.text += 1
                elif b"\nevent: json.end\n" in e:
                    self.json_end += 1
                elif b"\nevent: done\n" in e:
                    self.done = True


class Timeline(Sink):
    """(timestamp, characters) per content event; token times follow from the text."""

    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.reads: list[tuple[int, int]] = []
        self.first_ts: int | None = None
        self.finished = False  # set by the caller once the response ended or it hung up

    def events(self, events: list[bytes], ts: int) -> None:
        chars = 0
        for e in events:
            text = _text_of(e, self.direct)
            if text:
                chars += len(text)
        if chars:
            if self.first_ts is None:
                self.first_ts = ts
            self.reads.append((ts, chars))

    def token_times(self, tokens: list[str]) -> list[int]:
        """When the last character of each token reached the client (ns)."""
        ends = list(itertools.accumulate(len(t) for t in tokens))
        got = list(itertools.accumulate(c for _, c in self.reads))
        out: list[int] = []
        for end in ends:
            i = bisect.bisect_left(got, end)
            if i == len(got):
                break  # not delivered
            out.append(self.reads[i][0])
        return out


# -- /metrics and /proc ---------------------------------------------------------------


def http_call(port: int, path: str, body: bytes | None = None) -> tuple[int, str]:
    """GET ``path`` (or POST ``body`` to it) on 127.0.0.1:``port``: status and text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET" if body is None else "POST", path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def streams_active(port: int) -> float:
    _, text = http_call(port, "/metrics")
    match = re.search(r"^toolforge_streams_active (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


# -- statistics ------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def median(values: list[float]) -> float:
    return pct(values, 50)


def gaps(times: list[int]) -> list[float]:
    return [(b - a) / MS for a, b in itertools.pairwise(times)]


def bursts(times: list[int], within_ns: int = MS) -> int:
    """Clusters of ≥ 3 consecutive tokens that reached the client within 1 ms."""
    count, i = 0, 0
    while i + 2 < len(times):
        if times[i + 2] - times[i] < within_ns:
            count += 1
            j = i + 2
            while j + 1 < len(times) and times[j + 1] - times[i] < within_ns:
                j += 1
            i = j + 1
        else:
            i += 1
    return count


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


# -- the benchmarks --------------------------------------------------------------------


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    targets: list[tuple[str, bool]] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)
        for line in lines:
            print(line, flush=True)

    def target(self, text: str, ok: bool) -> None:
        self.targets.append((text, ok))
        self.add(f"- {text}: **{verdict(ok)}**")


async def b1(
    rep: Report,
    direct: Target,
    gateway: Target,
    proxy: Target,
    relay: Target,
    gw: Proc,
    n: int,
    warmup: int,
) -> None:
    targets = (direct, gateway, proxy, relay)
    clients = {t.name: await Client.open(t.port) for t in targets}
    requests = {t.name: clients[t.name].request_bytes(t.path, t.body("ttft")) for t in targets}
    ttft: dict[str, list[float]] = {t.name: [] for t in targets}
    # The gateway's CPU per arm: from each request it serves to the next one it serves.
    cpu_ns_of = {t.name: 0 for t in targets if t.on_gateway}
    last: tuple[str, int] | None = None
    try:
        for i in range(warmup + n):
            if i == warmup:
                await asyncio.to_thread(settle_cpu, gw.pid)  # the warm-up's tail work
                last = None
            k = i % len(targets)  # every order in turn
            order = targets[k:] + targets[:k]
            for t in order:
                if i >= warmup and t.on_gateway:
                    now = cpu_ns(gw.pid)
                    if last is not None:
                        cpu_ns_of[last[0]] += now - last[1]
                    last = (t.name, now)
                sink = FirstText(t.direct)
                t0, _ = await clients[t.name].stream(requests[t.name], sink, timeout_s=10)
                assert sink.ts is not None, f"{t.name}: no content event"
                if i >= warmup:
                    ttft[t.name].append((sink.ts - t0) / MS)
                # Let each side finish its tail work (the gateway writes artifacts after
                # `done`) so that it does not slow the other path's next request.
                await asyncio.sleep(PAUSE_S)
    finally:
        for c in clients.values():
            c.close()
    await asyncio.to_thread(settle_cpu, gw.pid)
    if last is not None:
        cpu_ns_of[last[0]] += cpu_ns(gw.pid) - last[1]
    cpu_req = {name: ns / n / MS for name, ns in cpu_ns_of.items()}
    rep.facts["b1_cpu_ms"] = cpu_req[gateway.name]
    rep.facts["b1p_cpu_ms"] = cpu_req[proxy.name]
    d, g, o, r = (ttft[t.name] for t in targets)

    def added(v: list[float], base: list[float], label: str, bold: bool = False) -> str:
        b = "**" if bold else ""
        return (
            f"| {label} | {b}{median(v) - median(base):.3f}{b} | "
            f"{pct(v, 90) - pct(base, 90):.3f} | {b}{pct(v, 99) - pct(base, 99):.3f}{b} | |"
        )

    added50, added99 = median(g) - median(d), pct(g, 99) - pct(d, 99)
    proxy50, proxy99 = median(o) - median(d), pct(o, 99) - pct(d, 99)
    rep.facts["b1p_over_stream_ms"] = median(o) - median(g)
    rep.add(
        "",
        f"### B1 — time to first event ({n} sequential requests each, alternating, "
        f"{PAUSE_S * 1e3:.0f} ms apart, after {warmup} warm-up)",
        "",
        "| path | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {median(v):.3f} | {pct(v, 90):.3f} | {pct(v, 99):.3f} | {max(v):.3f} |"
            for name, v in (
                ("direct (first `data:` chunk)", d),
                ("gateway `/v1/stream` (first `text.delta`)", g),
                ("proxy: the gateway's `/v1/chat/completions` (first content chunk)", o),
                ("bare TCP relay (uvloop; first `data:` chunk)", r),
            )
        ),
        added(g, d, "**added by the gateway** (`/v1/stream`)", bold=True),
        added(o, d, "**added by the proxy** (`/v1/chat/completions`)", bold=True),
        added(o, g, "proxy − gateway `/v1/stream`"),
        added(r, d, "added by the bare relay (the floor of one more process on this machine)"),
        "",
        f"Gateway CPU per request (a 3-token stream, including the artifacts written after "
        f"`done`): {cpu_req[gateway.name]:.2f} ms for `/v1/stream`, "
        f"{cpu_req[proxy.name]:.2f} ms for the proxy.",
        "",
    )
    p50, p99 = B1_ADDED_P50_MS, B1_ADDED_P99_MS
    rep.target(f"B1 added p50 {added50:.3f} ms ≤ {p50:g} ms", added50 <= p50)
    rep.target(f"B1 added p99 {added99:.3f} ms ≤ {p99:g} ms", added99 <= p99)
    rep.target(f"B1p proxy added p50 {proxy50:.3f} ms ≤ {p50:g} ms", proxy50 <= p50)
    rep.target(f"B1p proxy added p99 {proxy99:.3f} ms ≤ {p99:g} ms", proxy99 <= p99)


@dataclass
class Run:
    seconds: float
    tokens: int
    gw_cpu_s: float = 0.0
    gw_after_s: float = 0.0
    up_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    json_end: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


async def one_stream(
    t: Target, model: str, expect_tokens: int, gw: Proc, up: Proc, expect_frames: int = 0
) -> Run:
    client = await Client.open(t.port)
    try:
        sink = Counter(t.direct)
        request = client.request_bytes(t.path, t.body(model), t.auth)
        cpu0, up0, me0 = cpu_seconds(gw.pid), cpu_seconds(up.pid), time.process_time()
        t0, t1 = await client.stream(request, sink, timeout_s=120)
        cpu1, up1, me1 = cpu_seconds(gw.pid), cpu_seconds(up.pid), time.process_time()
    finally:
        client.close()
    want = expect_tokens + t.proxy  # the proxy's role chunk first
    assert sink.done, f"{t.name}: stream did not end with done"
    assert sink.text == want, f"{t.name}: {sink.text} text events, want {want}"
    assert sink.json_end == expect_frames or t.direct, f"{t.name}: {sink.json_end} objects"
    after = settle_cpu(gw.pid) - cpu1 if t.on_gateway else 0.0
    return Run((t1 - t0) / 1e9, 0, cpu1 - cpu0, after, up1 - up0, me1 - me0, sink.json_end)


def b2_streams(n: int, every: int = 50) -> list[tuple[str, str, int, int, int]]:
    """B2's two streams of ``n`` tokens: (label, scenario, upstream tokens, ``text.delta``
    frames expected, ``json.end`` expected); also run by ``bench.ab``."""
    tokens_f, frames = frames_tokens(n, every)
    return [
        ("plain text", f"plain:{n}", n, n, 0),
        (f"OBJECT frame every {every} tokens", f"frames:{n}:{every}", len(tokens_f),
         every * frames, frames),
    ]  # fmt: skip


async def b2(
    rep: Report,
    direct: Target,
    gateway: Target,
    proxy: Target,
    gw: Proc,
    up: Proc,
    n: int,
    repeats: int,
) -> None:
    variants = b2_streams(n)
    arms = (direct, gateway, proxy)
    labels = {
        direct.name: "direct",
        gateway.name: "gateway `/v1/stream`",
        proxy.name: "proxy `/v1/chat/completions`",
    }
    rep.add(
        "",
        f"### B2 — one stream at full speed (median of {repeats}, the three paths taking "
        "turns; upstream steps without delay, i.e. `pace=False`)",
        "",
        "| stream | upstream tokens | path | tok/s | **ratio to direct** | gateway CPU µs/token | "
        "+ after `done` (artifacts) | upstream CPU µs/token | client CPU µs/token |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    results: dict[tuple[str, str], tuple[float, float]] = {}
    for label, model, total, expect_text, nframes in variants:
        runs: dict[str, list[Run]] = {t.name: [] for t in arms}
        for r in range(repeats):
            k = r % len(arms)  # who goes first changes
            for t in arms[k:] + arms[:k]:
                # The proxy has no sentinel frames: each upstream token is a content chunk.
                expect = total if t.direct else expect_text
                run = await one_stream(t, model, expect, gw, up, nframes)
                run.tokens = total
                runs[t.name].append(run)
        mid = {name: sorted(rs, key=lambda r: r.rate)[len(rs) // 2] for name, rs in runs.items()}
        d = mid[direct.name]
        for t in arms:
            m = mid[t.name]
            ratio = m.rate / d.rate
            cpu_tok = m.gw_cpu_s / total * 1e6
            results[label, t.name] = (ratio, cpu_tok)
            gw_cells = (
                f"**{ratio:.2f}** | {cpu_tok:.1f} | {m.gw_after_s * 1e3:.0f} ms"
                if t.on_gateway
                else " | | "
            )
            rep.add(
                f"| {label} | {total:,} | {labels[t.name]} | {m.rate:,.0f} | {gw_cells} | "
                f"{m.up_cpu_s / total * 1e6:.1f} | {m.client_cpu_s / total * 1e6:.1f} |"
            )
        g = mid[gateway.name]
        rep.facts.setdefault("artifacts_us", g.gw_after_s / total * 1e6)
    rep.add("")
    ratio, cpu_tok = results["plain text", gateway.name]
    p_ratio, p_cpu_tok = results["plain text", proxy.name]
    rep.facts["b2_cpu_us"] = cpu_tok
    rep.facts["b2p_cpu_us"] = p_cpu_tok
    await breakdown(rep, up, min(n, 20_000), cpu_tok, p_cpu_tok)
    rep.target(f"B2 throughput ratio, plain text {ratio:.2f} ≥ 0.5 (aim 0.8)", ratio >= 0.5)
    rep.target(f"B2 gateway CPU {cpu_tok:.1f} µs per plain-text token ≤ 15 µs", cpu_tok <= 15)
    rep.target(
        f"B2p proxy throughput ratio, plain text {p_ratio:.2f} ≥ 0.8 (gateway CPU "
        f"{p_cpu_tok:.1f} µs per token)",
        p_ratio >= 0.8,
    )


async def breakdown(rep: Report, up: Proc, n: int, gw_cpu_us: float, proxy_cpu_us: float) -> None:
    """Where the gateway's CPU per plain-text token goes, for ``/v1/stream`` and for the
    proxy: the read path (httpx over the gateway's own transport) and the sans-IO stages
    measured alone in this process, the rest (ASGI server and SSE writes, asyncio tasks
    and generators between the stages) by difference."""
    import httpx

    from toolforge.core.engine.completion import PlainFramer
    from toolforge.core.framer import BodyClosed, Framer
    from toolforge.core.protocol.frames import Frame
    from toolforge.core.protocol.openai import ChunkWriter
    from toolforge.eval.scripted_upstream import Step
    from toolforge.runtime.frame_log import FrameLog
    from toolforge.upstream import openai_compat
    from toolforge.upstream.sse_decoder import UpstreamSSEDecoder
    from toolforge.upstream.transport import LeanTransport

    def best_of_3(fn: Callable[[], object]) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            fn()
            best = min(best, (time.process_time() - t0) / n * 1e6)
        return best

    # (stage, µs per token, on the /v1/stream path, on the proxy's)
    rows: list[tuple[str, float, bool, bool]] = []
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=None), transport=LeanTransport()
    ) as client:
        url = f"http://127.0.0.1:{up.port}/v1/chat/completions"
        best = float("inf")
        for _ in range(3):
            c0, chunks = time.process_time(), 0
            async with client.stream("POST", url, content=direct_body(f"plain:{n}")) as resp:
                async for _chunk in resp.aiter_raw():
                    chunks += 1
            best = min(best, (time.process_time() - c0) / n * 1e6)
    rows.append(
        ("httpx `aiter_raw()` over `LeanTransport` (an item per socket read)", best, True, True)
    )

    events = [b"".join(Step(text=t).encode("m")) for t in plain_tokens(n)]
    parse = getattr(openai_compat, "_parse_chunk", None)

    def decode() -> None:
        decoder = UpstreamSSEDecoder()
        for event in events:
            for message in decoder.feed(event):
                if parse is not None:
                    parse(message.data)

    texts = plain_tokens(n)
    frames: list[Frame] = []

    def frame() -> None:
        framer = Framer()
        frames.clear()
        for text in texts:
            frames.extend(f for f in framer.feed(text) if not isinstance(f, BodyClosed))

    def plain_frame() -> None:
        # The proxy's reader with no tools and no JSON answer: text passes at once, and
        # the reasoning guardrail watches for <think> (docs/proxy.md).
        framer = PlainFramer(hold=False, reasoning=True)
        for text in texts:
            framer.feed(text)

    encoded: list[bytes] = []  # the frames as the log holds them, for the proxy's writer

    def append() -> None:
        log = FrameLog(max_pending=1 << 30)
        for f in frames:
            log.append(f)
        if not encoded:  # in the first pass only, which the best of three leaves out
            encoded[:] = log.encoded_after(0)

    def openai_chunks() -> None:
        writer = ChunkWriter(
            stream_id="s_0", completion_id="chatcmpl-0", created=0, model="m",
            include_usage=False, mode="native",
        )  # fmt: skip
        writer.first()
        for one in encoded:
            writer.batch(one)

    for label, fn, stream, proxy in (
        ("SSE decoder + chunk JSON (`UpstreamSSEDecoder`, `_parse_chunk`)", decode, True, True),
        ("tokenizer + framer (`Framer.feed`)", frame, True, False),
        ("reasoning split + plain framer (`PlainFramer.feed`)", plain_frame, False, True),
        ("encode + log (`FrameLog.append`)", append, True, True),
        (
            "frames → OpenAI chunks (`ChunkWriter.batch`, a frame per batch)",
            openai_chunks,
            False,
            True,
        ),
    ):
        rows.append((label, best_of_3(fn), stream, proxy))
    rest = gw_cpu_us - sum(us for _, us, on, _ in rows if on)
    proxy_rest = proxy_cpu_us - sum(us for _, us, _, on in rows if on)
    rep.facts["read_us"], rep.facts["rest_us"] = rows[0][1], rest
    rep.facts["chunks_us"], rep.facts["proxy_rest_us"] = rows[-1][1], proxy_rest
    rep.add(
        "",
        "Where the gateway's CPU per plain-text token goes (each stage timed alone in the "
        "load generator; the remainder by difference):",
        "",
        "| stage | `/v1/stream` µs per token | proxy µs per token |",
        "|---|---|---|",
        *(
            f"| {label} | {f'{us:.1f}' if stream else ''} | {f'{us:.1f}' if proxy else ''} |"
            for label, us, stream, proxy in rows
        ),
        "| rest: uvicorn and the SSE writer, asyncio tasks and async generators between "
        f"the stages, per-read deadline | {rest:.1f} | {proxy_rest:.1f} |",
        f"| **total (B2, measured in the gateway process)** | **{gw_cpu_us:.1f}** | "
        f"**{proxy_cpu_us:.1f}** |",
        "",
    )


async def timeline(t: Target, model: str, tokens: list[str]) -> list[int]:
    client = await Client.open(t.port)
    try:
        sink = Timeline(t.direct)
        await client.stream(client.request_bytes(t.path, t.body(model)), sink, timeout_s=120)
    finally:
        client.close()
    times = sink.token_times(tokens)
    assert len(times) == len(tokens), f"{t.name}: {len(times)} of {len(tokens)} tokens"
    return times


def upstream_written(direct: Target, model: str) -> list[int]:
    """When the scripted upstream wrote each step of its latest answer to ``model``."""
    _, text = http_call(direct.port, direct.path, direct_body(WRITTEN + model))
    written = orjson.loads(text)
    assert isinstance(written, list), f"the upstream has no answer to {model} on record"
    return written


async def b3(rep: Report, direct: Target, gateway: Target, gw: Proc, n: int, seed: int) -> None:
    model = f"paced:{n}:{seed}"
    tokens = plain_tokens(n)
    nominal = paced_delays(n, seed)
    runs: dict[str, list[float]] = {}
    arrivals: dict[str, list[int]] = {}
    jitter: list[float] = []

    async def compare(name: str, times: list[int]) -> None:
        """The run's gaps against the same stream's gaps as the upstream wrote them."""
        written = await asyncio.to_thread(upstream_written, direct, model)
        sent = gaps(written[:n])  # the last step written is the finish chunk
        arrivals[name] = times
        runs[name] = [abs(c - u) for c, u in zip(gaps(times), sent, strict=True)]
        jitter.extend(abs(g - d) for g, d in zip(sent, nominal[1:], strict=True))

    await compare("direct A", await timeline(direct, model, tokens))
    cpu0 = settle_cpu(gw.pid)
    times = await timeline(gateway, model, tokens)
    cpu_tok = (cpu_seconds(gw.pid) - cpu0) / n * 1e6
    await compare("gateway", times)
    await compare("direct B", await timeline(direct, model, tokens))
    rep.facts["paced_cpu_us"] = cpu_tok
    rows = list(runs.items())
    rep.add(
        "",
        f"### B3 — gap fidelity ({n} tokens paced 4 ± 2 ms, seed {seed}; each gap at the "
        "client minus the same gap at the upstream, same stream)",
        "",
        "| run | p50 \\|Δgap\\| ms | p99 \\|Δgap\\| ms | max ms | bursts (≥ 3 tokens "
        "< 1 ms apart) |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {median(dl):.3f} | {pct(dl, 99):.3f} | {max(dl):.3f} | "
            f"{bursts(arrivals[name])} |"
            for name, dl in rows
        ),
        f"| (the upstream itself: \\|gap written − nominal delay\\|, all runs) | "
        f"{median(jitter):.3f} | {pct(jitter, 99):.3f} | {max(jitter):.3f} | |",
        "",
        "The direct runs are the floor of the method: the client's own wake-ups after each "
        "token, and the kernel's, on a shared 2-vCPU VM. The upstream's timer jitter is no "
        "longer part of the figure: each gap is compared with the same gap as written.",
        "",
        f"Gateway CPU per token while paced (every token its own read, frame and write): "
        f"**{cpu_tok:.0f} µs**, against {rep.facts.get('b2_cpu_us', float('nan')):.0f} µs "
        "at full speed, where reads and writes batch (B2).",
        "",
    )
    g = runs["gateway"]
    rep.target(f"B3 p99 |Δgap| gateway {pct(g, 99):.3f} ms ≤ 1 ms", pct(g, 99) <= 1.0)
    b = bursts(arrivals["gateway"])
    rep.target(f"B3 bursts via gateway: {b} (target 0)", b == 0)


async def _load(
    t: Target,
    model: str,
    tokens: list[str],
    streams: int,
    hang_up: Callable[[int], float] | None,
    sinks: list[Timeline] | None = None,
) -> list[list[int]]:
    """``streams`` concurrent requests; with ``hang_up``, client i closes after that many
    seconds. Returns each client's token times; ``sinks`` collects the live sinks."""

    async def one(i: int) -> list[int]:
        client = await Client.open(t.port)
        sink = Timeline(t.direct)
        if sinks is not None:
            sinks.append(sink)
        try:
            request = client.request_bytes(t.path, t.body(model))
            if hang_up is None:
                await client.stream(request, sink, timeout_s=60)
            else:
                with contextlib.suppress(TimeoutError):
                    await client.stream(request, sink, timeout_s=hang_up(i))
        finally:
            sink.finished = True
            client.close()
        return sink.token_times(tokens)

    return await asyncio.gather(*(one(i) for i in range(streams)))


def disconnect_grace_s() -> float:
    """How long the gateway keeps a dropped client's stream for a resume: its setting as
    this environment gives it (the bench's gateways inherit it), else the default."""
    from toolforge.settings import Settings

    default = Settings.model_fields["disconnect_grace_ms"].default
    return float(os.environ.get("DISCONNECT_GRACE_MS", default)) / 1000


async def _until(probe: Callable[[], float], limit_s: float) -> tuple[float, float]:
    """Poll ``probe`` until it returns 0; (seconds it took or the limit, last value)."""
    t0 = time.monotonic()
    while True:
        value = await asyncio.to_thread(probe)
        if value == 0 or time.monotonic() - t0 > limit_s:
            return time.monotonic() - t0, value
        await asyncio.sleep(0.02)


async def b4(
    rep: Report, direct: Target, gateway: Target, gw: Proc, up: Proc, streams: int, n: int
) -> None:
    delay_ms = 20.0
    model = f"steady:{n}:{delay_ms:g}"
    tokens = plain_tokens(n)
    times_d = await _load(direct, model, tokens, streams, None)

    rss0 = rss_kb(gw.pid)
    cpu0 = cpu_seconds(gw.pid)
    peak = [rss0, 0.0, 0.0, 0.0]  # peak RSS; most streams open at once, RSS then; metric
    sinks: list[Timeline] = []

    async def sample() -> None:
        probe_at = time.monotonic() + n * delay_ms / 1000 / 2
        while True:
            rss = rss_kb(gw.pid)
            peak[0] = max(peak[0], rss)
            # Open as the clients see it: a first token arrived, the response not ended.
            live = sum(1 for s in sinks if s.first_ts is not None and not s.finished)
            if live > peak[1] or (live == peak[1] and rss > peak[2]):
                peak[1], peak[2] = live, rss
            if probe_at and time.monotonic() > probe_at:
                probe_at = 0
                peak[3] = await asyncio.to_thread(streams_active, gateway.port)
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        times_g = await _load(gateway, model, tokens, streams, None, sinks)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    cpu1 = cpu_seconds(gw.pid)
    active_t, active = await _until(lambda: streams_active(gateway.port), 5.0)
    socks_after = sockets_to(gw.pid, up.port)
    rss1 = rss_kb(gw.pid)

    expected = streams * n
    delivered = {
        "direct": sum(len(x) for x in times_d) / expected * 100,
        "gateway": sum(len(x) for x in times_g) / expected * 100,
    }
    itl_d = [g for x in times_d for g in gaps(x)]
    itl_g = [g for x in times_g for g in gaps(x)]
    per_stream_kb = (peak[2] - rss0) / max(peak[1], 1)
    mid_active = peak[1]

    # Everyone hangs up mid-stream: streams must end and upstream sockets close.
    rng = random.Random(4)
    hang = [rng.uniform(0.3, 1.0) for _ in range(streams)]
    # By default a dropped client's stream waits DISCONNECT_GRACE_MS for a resume (on
    # its queue's bound) before it is cancelled: each must be gone by then and a little.
    grace_s = disconnect_grace_s()
    await _load(gateway, model, tokens, streams, lambda i: hang[i])
    drop_active_t, drop_active = await _until(lambda: streams_active(gateway.port), grace_s + 5.0)
    drop_sock_t, drop_socks = await _until(lambda: sockets_to(gw.pid, up.port), 2.0)
    # httpx closes idle pooled connections older than keepalive_expiry (5 s) on the next
    # request: afterwards only the probe's own connection may remain.
    await asyncio.sleep(5.5)
    await asyncio.to_thread(http_call, gateway.port, "/readyz")
    socks_expired = sockets_to(gw.pid, up.port)
    asgi_errors = gw.log().count("Exception in ASGI application")

    rep.add(
        "",
        f"### B4 — {streams} concurrent streams × {n} tokens at {1000 / delay_ms:.0f} tokens/s, "
        "one gateway worker",
        "",
        "| path | delivered | ITL p50 ms | ITL p99 ms | ITL max ms |",
        "|---|---|---|---|---|",
        f"| direct | {delivered['direct']:.2f} % | {median(itl_d):.2f} | {pct(itl_d, 99):.2f} | "
        f"{max(itl_d):.2f} |",
        f"| gateway | {delivered['gateway']:.2f} % | {median(itl_g):.2f} | {pct(itl_g, 99):.2f} | "
        f"{max(itl_g):.2f} |",
        "",
        "| gateway measure | value |",
        "|---|---|",
        f"| RSS before / with the most streams open / peak / after | {rss0 / 1024:.1f} / "
        f"{peak[2] / 1024:.1f} / {peak[0] / 1024:.1f} / {rss1 / 1024:.1f} MiB |",
        f"| most streams open at once (clients' view) / `toolforge_streams_active` "
        f"half-way | {mid_active:.0f} / {peak[3]:.0f} |",
        f"| RSS per open stream (with the most open − before) ÷ that count | "
        f"{per_stream_kb:.1f} KB |",
        f"| CPU per token under load | {(cpu1 - cpu0) / expected * 1e6:.1f} µs |",
        f"| clients finished: `toolforge_streams_active` | {active:.0f} (after {active_t:.2f} s) |",
        f"| clients finished: TCP sockets to the upstream | {socks_after} (keep-alive pool "
        "holds ≤ 100 idle) |",
        f"| {streams} clients hung up mid-stream: `toolforge_streams_active` | "
        f"{drop_active:.0f} (after {drop_active_t:.2f} s: each waits the "
        f"{grace_s:g} s grace for a resume first) |",
        f"| {streams} clients hung up mid-stream: TCP sockets to the upstream | "
        f"{drop_socks} (after {drop_sock_t:.2f} s) |",
        "| then keep-alive expiry (5.5 s) and one `GET /readyz`: TCP sockets to the upstream | "
        f"{socks_expired} (expected ≤ 1: the probe's own pooled connection) |",
        f"| 'Exception in ASGI application' tracebacks in the gateway's log | {asgi_errors} |",
        "",
    )
    itl_delta = pct(itl_g, 99) - pct(itl_d, 99)
    rep.facts["b4_cpu_us"] = (cpu1 - cpu0) / expected * 1e6
    rep.facts["b4_rate"] = expected / (n * delay_ms / 1000)
    rep.facts["socks_expired"] = socks_expired
    rep.facts["asgi_errors"] = asgi_errors
    rep.target(f"B4 delivered {delivered['gateway']:.2f} % ≥ 99 %", delivered["gateway"] >= 99)
    rep.target(f"B4 RSS {per_stream_kb:.1f} KB per stream ≤ 50 KB", per_stream_kb <= 50)
    rep.target(f"B4 p99 ITL gateway − direct {itl_delta:.2f} ms ≤ 5 ms", itl_delta <= 5)
    rep.target(
        f"B4 zero active streams after the clients went ({active:.0f}; {drop_active:.0f} after "
        "hang-ups)",
        active == 0 and drop_active == 0,
    )
    rep.target(
        f"B4 no upstream sockets left once idle keep-alives expired ({socks_expired}, ≤ 1 "
        "allowed for the probe)",
        socks_expired <= 1,
    )


# -- the report ------------------------------------------------------------------------


def notes(rep: Report) -> None:
    """Where the time goes, from this run's figures, for the targets that were missed."""
    f = rep.facts
    missed = {text.split(" ")[0] for text, ok in rep.targets if not ok}
    lines: list[str] = []
    if "B1" in missed:
        lines.append(
            f"- **B1.** The gateway spends {f.get('b1_cpu_ms', 0):.1f} ms of CPU per request, "
            "all threads, the artifacts thread after `done` included. The bare relay row is "
            "the floor of one more process and two more loopback hops on this machine; the "
            "rest of the added time is Python work per request, in order: uvicorn parsing "
            "the request, the handler (body, validation, plan, session), the session's "
            "first step up to the upstream request, and from the upstream's first bytes to "
            "our first `text.delta` write (docs/performance.md). After each idle gap this "
            "code runs with cold caches on a shared 2-vCPU VM, several times slower than "
            "the same code in a hot loop."
        )
    if "B1p" in missed:
        lines.append(
            f"- **B1p.** The proxy's first content chunk comes "
            f"{f.get('b1p_over_stream_ms', 0):+.3f} ms after `/v1/stream`'s first "
            f"`text.delta` (p50), at {f.get('b1p_cpu_ms', 0):.1f} ms of gateway CPU per "
            f"request against {f.get('b1_cpu_ms', 0):.1f}. Both run the same session, and "
            "from the upstream request on both take the same time; the difference is before "
            "it: FastAPI's stack (middleware, routing, the dependency), which `/v1/stream`'s "
            "fast path skips (`app/api/fastpath.py`), then parsing and planning an OpenAI "
            "body (`ChatCompletionRequest`, `plan_completion`). The hand-written subsection "
            "above, if there is one, takes it apart."
        )
    if "B2" in missed:
        lines.append(
            f"- **B2.** Per token at full speed: {f.get('read_us', 0):.0f} µs is the read "
            f"path alone and {f.get('rest_us', 0):.0f} µs the machinery between stages "
            "(async generator hops, the per-read deadline, task wake-ups, the ASGI writes). "
            f"The artifacts cost another {f.get('artifacts_us', 0):.0f} µs per token after "
            "`done`, in a thread that holds the GIL."
        )
    if "B2p" in missed:
        lines.append(
            f"- **B2p.** The proxy costs {f.get('b2p_cpu_us', 0):.1f} µs of gateway CPU per "
            f"token against {f.get('b2_cpu_us', 0):.1f} for `/v1/stream`; re-encoding the "
            f"frames as OpenAI chunks is {f.get('chunks_us', 0):.1f} µs of it (timed alone), "
            f"and the machinery between stages {f.get('proxy_rest_us', 0):.1f} µs."
        )
    if "B3" in missed:
        lines.append(
            "- **B3.** Compare the gateway row with the direct runs: what the direct runs show "
            "is the client's and the kernel's own delay after each token; the gateway's row "
            "adds its own per-token work and its wake-ups on top, on the same 2 cores."
        )
    if "B4" in missed:
        rate = f.get("b4_rate", 0)
        lines.append(
            f"- **B4 (CPU).** With every token its own read and write, the gateway costs "
            f"{f.get('paced_cpu_us', 0):.0f} µs per token (B3, one stream) and "
            f"{f.get('b4_cpu_us', 0):.0f} µs under load: {rate:,.0f} tokens/s need "
            f"{rate * f.get('b4_cpu_us', 0) / 1e6:.1f} CPU-seconds per second on one worker "
            "(the upstream and the clients share the same 2 cores), so the event loop falls "
            "behind and tokens leave in bursts; the ITL p99 shows it."
        )
        if f.get("socks_expired", 0) > 1:
            lines.append(
                f"- **B4 (leak).** {f['socks_expired']:.0f} sockets to the upstream stay "
                "ESTABLISHED after every stream ended and idle keep-alives expired. They are "
                "pool entries stuck ACTIVE: after `[DONE]` the adapter drains the body under a "
                "20 ms `asyncio.timeout` (`exchange.drain`); under load it fires during an "
                "httpcore read, and the native cancellation re-surfaces inside httpcore's cleanup "
                "(`_response_closed` → `_state_lock`), which then skips removing the request "
                "from the pool. Each one holds a slot of `max_connections=1000` for good."
            )
        if f.get("asgi_errors", 0):
            lines.append(
                f"- **B4 (log).** {f['asgi_errors']:.0f} clients that hung up before the gateway "
                "read their request body left an 'Exception in ASGI application' traceback "
                "(`starlette.requests.ClientDisconnect` from `_read_body`)."
            )
    if lines:
        rep.add("", "### Where the time goes", "", *lines)


def machine() -> list[str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pkgs = "fastapi uvicorn httptools uvloop starlette sse-starlette httpx orjson".split()
    versions = ", ".join(f"{pkg} {importlib.metadata.version(pkg)}" for pkg in pkgs)
    load = load_average()
    commit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        root = Path(__file__).resolve().parents[1]
        git = ["git", "-C", str(root)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "app"], capture_output=True)
        if head.returncode == 0:
            commit = head.stdout.decode().strip() + (
                " + uncommitted changes in app/" if dirty.stdout else ""
            )
    return [
        f"- machine: nproc {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}), {cpu}, "
        f"{platform.system()} {platform.release()}; load average at start {load}",
        f"- Python {platform.python_version()} ({sys.implementation.name}); {versions}",
        f"- code: {commit}",
    ]


GENERATED = ("### B1", "### B2", "### B3", "### B4", "### Where the time goes")


def _kept_subsections(old_section: str) -> list[str]:
    """Hand-written ``###`` subsections of the old Gateway section (a profile, notes):
    a rerun replaces only what this script generates."""
    parts = old_section.split("\n### ")[1:]
    return ["### " + p.rstrip() for p in parts if not ("### " + p).startswith(GENERATED)]


def write_results(body: list[str]) -> None:
    lines = list(body)
    kept = _kept_subsections(section_text(HEADING))
    if kept:
        at = (
            lines.index("### Where the time goes") - 1
            if "### Where the time goes" in lines
            else len(lines)
        )
        for sub in reversed(kept):
            lines[at:at] = ["", sub]
    write_section(HEADING, lines)


def _uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def run(args: argparse.Namespace, rep: Report) -> None:
    with scratch("toolforge-bench-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        gw = spawn_gateway(url, artifacts)
        procs.append(gw)
        direct = Target("direct", up.port, "/v1/chat/completions", direct_body)
        gateway = Target("gateway", gw.port, "/v1/stream", gateway_body)
        # The proxy: the direct arm's body, to the gateway's OpenAI-compatible route.
        proxy = Target("proxy", gw.port, "/v1/chat/completions", direct_body, proxy=True)
        relay_proc = spawn_proxy(up.port)
        procs.append(relay_proc)
        relay = Target("relay", relay_proc.port, "/v1/chat/completions", direct_body)
        if "b1" in args.only:
            await b1(rep, direct, gateway, proxy, relay, gw, args.b1_requests, args.b1_warmup)
            if args.formats:
                from bench.formats import b1_formats

                await b1_formats(rep, up.port, gw, args.b1_requests, args.b1_warmup)
        if "b2" in args.only:
            await b2(rep, direct, gateway, proxy, gw, up, args.b2_tokens, args.b2_repeats)
            if args.formats:
                from bench.formats import b2_formats

                await b2_formats(rep, up, gw, args.b2_tokens, args.b2_repeats)
        if "b3" in args.only:
            await b3(rep, direct, gateway, gw, args.b3_tokens, seed=11)
        if "b4" not in args.only:
            return
        # B4 on a fresh gateway: B1-B3's finished streams stay in its registry for
        # RESUME_TTL_S and would blur the memory figures.
        gw.stop()
        procs.remove(gw)
        gw = spawn_gateway(url, artifacts)
        procs.append(gw)
        gateway = Target("gateway", gw.port, "/v1/stream", gateway_body)
        warm = await Client.open(gw.port)
        try:
            request = warm.request_bytes("/v1/stream", gateway_body("ttft"))
            await warm.stream(request, Counter(False))
        finally:
            warm.close()
        await b4(rep, direct, gateway, gw, up, args.b4_streams, args.b4_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run; no RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument(
        "--only",
        default="b1,b2,b3,b4",
        help="comma-separated subset of b1,b2,b3,b4 to run (implies --no-write)",
    )
    parser.add_argument(
        "--formats",
        action="store_true",
        help="B1 and B2 for every wire format beside /v1/stream too (bench.formats)",
    )
    args = parser.parse_args()
    args.only = set(args.only.lower().split(","))
    if not args.only <= {"b1", "b2", "b3", "b4"}:
        parser.error(f"--only: unknown benchmark in {sorted(args.only)}")
    if args.only != {"b1", "b2", "b3", "b4"}:
        args.no_write = True
    q = args.quick
    args.b1_requests, args.b1_warmup = (60, 10) if q else (300, 30)
    args.b2_tokens, args.b2_repeats = (10_000, 1) if q else (50_000, 3)
    args.b3_tokens = 400 if q else 2_000
    args.b4_streams, args.b4_tokens = (200, 60) if q else (200, 150)

    command = "python -m bench.gateway" + (" --quick" if q else "")
    if args.only != {"b1", "b2", "b3", "b4"}:
        command += " --only " + ",".join(sorted(args.only))
    command += " --formats" if args.formats else ""
    rep = Report()
    rep.add(
        "",
        f"`{command}` — three processes on 127.0.0.1 (scripted upstream, gateway under "
        "uvicorn + httptools, this load generator on raw asyncio sockets); direct, gateway "
        "(`/v1/stream`) and proxy (the gateway's `/v1/chat/completions`) measured side by "
        "side in the same run.",
        "",
        *machine(),
    )
    started = time.monotonic()
    _uvloop()
    asyncio.run(run(args, rep))
    notes(rep)
    met = sum(ok for _, ok in rep.targets)
    took = time.monotonic() - started
    load = load_average()
    rep.add(
        "",
        f"{met} of {len(rep.targets)} targets met; the whole run took {took:.0f} s; load "
        f"average at the end {load} (the bench alone adds about 1; more means other work "
        "shared the 2 cores and the figures are noisier).",
    )
    if not q and not args.no_write:
        write_results(rep.lines)
        print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
