"""B1 and B2 for every wire format, beside ``/v1/stream`` in the same run (``bench.gateway
--formats``).

The same engine serves ``POST /v1/stream``'s frames, the Responses API (``POST
/v1/responses``, ``stream: true``), AG-UI (``POST /v1/agui``), the AI SDK's UI message
stream (``POST /v1/ui/chat``) and the WebSocket (``GET /v1/stream/ws``, two arms: one
frame per message, and with the subprotocol ``toolforge.frames.v1`` one message per batch
of frames, as JSON lines); each format is an encoder over the frames the session logs.
What a format costs is therefore what its route and its encoder add, and the figures here
are ratios to ``/v1/stream``:

- B1: time to first text event (the first ``text.delta`` frame, ``response.output_text.delta``,
  ``TEXT_MESSAGE_CONTENT``, ``text-delta``, or the socket's ``text.delta`` message) and the
  gateway's CPU per request, every arm taking turns with the direct upstream, as
  ``bench.gateway``'s B1 does.
- B2: one plain-text stream at full speed per arm, taking turns: tokens/s and the gateway's
  CPU per upstream token (the budget: at most 10 % above ``/v1/stream``'s).

The HTTP arms use ``bench.gateway``'s raw-socket client; the WebSocket arm a minimal
RFC 6455 client on the same footing (one kept-open socket, every read timestamped when it
returns, a ``start`` message per stream, the stream over at its ``done`` frame; a batched
message split into its frames).
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from bench._procs import Proc, cpu_ns, cpu_seconds, settle_cpu
from bench.gateway import (
    MS,
    PAUSE_S,
    Client,
    Report,
    Run,
    Sink,
    direct_body,
    gateway_body,
    median,
    pct,
)
from toolforge.core.protocol.socket_messages import SUBPROTOCOL

__all__ = ["FORMATS", "Arm", "b1_formats", "b2_formats"]

BUDGET = 1.10  # an adapter's CPU per token may be at most 10 % above /v1/stream's


def _responses_body(model: str) -> bytes:
    return orjson.dumps({"model": model, "input": "hi", "stream": True})


def _agui_body(model: str) -> bytes:
    return orjson.dumps(
        {
            "threadId": "t1",
            "runId": "r1",
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {"model": model},
            "messages": [{"id": "u1", "role": "user", "content": "hi"}],
        }
    )


def _ui_body(model: str) -> bytes:
    return orjson.dumps(
        {
            "id": "c1",
            "trigger": "submit-message",
            "model": model,
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
    )


def _ws_body(model: str) -> bytes:
    return orjson.dumps({"type": "start", "request": orjson.loads(gateway_body(model))})


@dataclass(frozen=True)
class Arm:
    """One path to the same stream: where it goes, what it sends, and the bytes that mark
    a text event and the last event in what comes back (an SSE block, or a socket
    message)."""

    name: str
    label: str
    path: str
    body: Callable[[str], bytes]
    text: bytes
    done: bytes
    on_gateway: bool = True
    ws: bool = False
    subprotocol: str | None = None  # the socket's, offered and required in the answer


DIRECT = Arm(
    "direct",
    "direct upstream (`data:` chunks)",
    "/v1/chat/completions",
    direct_body,
    b'"content"',
    b"data: [DONE]",
    on_gateway=False,
)
STREAM = Arm(
    "stream",
    "`/v1/stream` (`text.delta` frames)",
    "/v1/stream",
    gateway_body,
    b"\nevent: text.delta\n",
    b"\nevent: done\n",
)
FORMATS = (
    Arm(
        "responses",
        "Responses `/v1/responses` (`response.output_text.delta`)",
        "/v1/responses",
        _responses_body,
        b"event: response.output_text.delta\n",
        b"event: response.completed\n",
    ),
    Arm(
        "agui",
        "AG-UI `/v1/agui` (`TEXT_MESSAGE_CONTENT`)",
        "/v1/agui",
        _agui_body,
        b'"type":"TEXT_MESSAGE_CONTENT"',
        b'"type":"RUN_FINISHED"',
    ),
    Arm(
        "ui",
        "UI message stream `/v1/ui/chat` (`text-delta`)",
        "/v1/ui/chat",
        _ui_body,
        b'"type":"text-delta"',
        b"data: [DONE]",
    ),
    Arm(
        "ws",
        "WebSocket `/v1/stream/ws` (`text.delta` message)",
        "/v1/stream/ws",
        _ws_body,
        b'"event":"text.delta"',
        b'"event":"done"',
        ws=True,
    ),
    Arm(
        "ws_lines",
        f"WebSocket `{SUBPROTOCOL}` (`text.delta` lines)",
        "/v1/stream/ws",
        _ws_body,
        b'"event":"text.delta"',
        b'"event":"done"',
        ws=True,
        subprotocol=SUBPROTOCOL,
    ),
)


# -- sinks -----------------------------------------------------------------------------


class FirstText(Sink):
    def __init__(self, arm: Arm) -> None:
        self.marker = arm.text
        self.ts: int | None = None

    def events(self, events: list[bytes], ts: int) -> None:
        if self.ts is None and any(self.marker in e for e in events):
            self.ts = ts


class Counter(Sink):
    """Counts text events and notes the last one; one substring test per event."""

    def __init__(self, arm: Arm) -> None:
        self.marker, self.end = arm.text, arm.done
        self.text = 0
        self.done = False

    def events(self, events: list[bytes], ts: int) -> None:
        marker, end = self.marker, self.end
        for e in events:
            if marker in e:
                self.text += 1
            elif end in e:
                self.done = True


# -- a minimal WebSocket client --------------------------------------------------------


class _WsConn(asyncio.Protocol):
    """One socket: the upgrade, then the server's (unmasked, unfragmented) text messages
    handed to the sink per read, each frame apart (a batched message split into its
    lines); a stream ends at its ``done`` frame."""

    def __init__(self, done_marker: bytes, subprotocol: str | None) -> None:
        self.transport: asyncio.Transport | None = None
        self._raw = bytearray()
        self._upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sink: Sink | None = None
        self._done: asyncio.Future[int] | None = None
        self._end = done_marker
        self._subprotocol = subprotocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in (self._upgraded, self._done):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError("socket closed"))

    def data_received(self, data: bytes) -> None:
        ts = time.perf_counter_ns()
        raw = self._raw
        raw += data
        if not self._upgraded.done():
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(raw[:end])
            del raw[: end + 4]
            if not head.startswith(b"HTTP/1.1 101"):
                self._upgraded.set_exception(RuntimeError(f"no upgrade: {head[:200]!r}"))
                return
            want = self._subprotocol
            if want is not None and f"sec-websocket-protocol: {want}".encode() not in head.lower():
                self._upgraded.set_exception(RuntimeError(f"{want} not selected: {head!r}"))
                return
            self._upgraded.set_result(None)
        messages: list[bytes] = []
        lines = self._subprotocol is not None
        pos, n = 0, len(raw)
        while n - pos >= 2:
            b0, b1 = raw[pos], raw[pos + 1] & 0x7F
            at = pos + 2
            if b1 == 126:
                if n - at < 2:
                    break
                b1, at = int.from_bytes(raw[at : at + 2], "big"), at + 2
            elif b1 == 127:
                if n - at < 8:
                    break
                b1, at = int.from_bytes(raw[at : at + 8], "big"), at + 8
            if n - at < b1:
                break
            if b0 & 0x0F == 0x1:  # a text message; the gateway never fragments one
                if lines:
                    messages += bytes(raw[at : at + b1]).split(b"\n")
                else:
                    messages.append(bytes(raw[at : at + b1]))
            pos = at + b1
        del raw[:pos]
        if not messages or self._sink is None:
            return
        self._sink.events(messages, ts)
        done = self._done
        if done is not None and not done.done():
            for m in messages:
                if m.startswith(b'{"type":"error"'):
                    done.set_exception(RuntimeError(m[:300].decode()))
                elif self._end in m:
                    done.set_result(ts)

    def send(self, request: bytes, sink: Sink) -> tuple[int, asyncio.Future[int]]:
        assert self.transport is not None
        self._sink = sink
        self._done = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter_ns()
        self.transport.write(request)
        return t0, self._done


class WsClient:
    """``Client``'s interface over one WebSocket: a ``start`` message per stream."""

    def __init__(self, conn: _WsConn) -> None:
        self.conn = conn

    @classmethod
    async def open(
        cls, port: int, path: str, done_marker: bytes, subprotocol: str | None = None
    ) -> WsClient:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: _WsConn(done_marker, subprotocol), "127.0.0.1", port
        )
        key = base64.b64encode(os.urandom(16)).decode()
        offer = "" if subprotocol is None else f"Sec-WebSocket-Protocol: {subprotocol}\r\n"
        assert conn.transport is not None
        conn.transport.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n{offer}"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        async with asyncio.timeout(10):
            await conn._upgraded
        return cls(conn)

    def request_bytes(self, path: str, body: bytes, auth: str | None = None) -> bytes:
        """``body`` as one masked text frame (a client's frames are masked)."""
        mask = os.urandom(4)
        n = len(body)
        head = bytes([0x81]) + (
            bytes([0x80 | n])
            if n < 126
            else bytes([0x80 | 126]) + n.to_bytes(2, "big")
            if n < 1 << 16
            else bytes([0x80 | 127]) + n.to_bytes(8, "big")
        )
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        masked = (int.from_bytes(body, "big") ^ key).to_bytes(n, "big")
        return head + mask + masked

    async def stream(self, request: bytes, sink: Sink, timeout_s: float = 60.0) -> tuple[int, int]:
        t0, done = self.conn.send(request, sink)
        async with asyncio.timeout(timeout_s):
            t_end = await done
        return t0, t_end

    def close(self) -> None:
        if self.conn.transport is not None:
            self.conn.transport.close()


async def _open(arm: Arm, port: int) -> Client | WsClient:
    if arm.ws:
        return await WsClient.open(port, arm.path, arm.done, arm.subprotocol)
    return await Client.open(port)


# -- B1 and B2 -------------------------------------------------------------------------


async def b1_formats(
    rep: Report, up_port: int, gw: Proc, n: int, warmup: int, formats: tuple[Arm, ...] = FORMATS
) -> None:
    """Time to first text event and gateway CPU per request, the direct upstream,
    ``/v1/stream`` and every format taking turns (a 3-token answer each)."""
    arms = (DIRECT, STREAM, *formats)
    ports = {a.name: up_port if not a.on_gateway else gw.port for a in arms}
    clients = {a.name: await _open(a, ports[a.name]) for a in arms}
    requests = {a.name: clients[a.name].request_bytes(a.path, a.body("ttft")) for a in arms}
    ttft: dict[str, list[float]] = {a.name: [] for a in arms}
    cpu_of = {a.name: 0 for a in arms if a.on_gateway}
    last: tuple[str, int] | None = None
    try:
        for i in range(warmup + n):
            if i == warmup:
                await asyncio.to_thread(settle_cpu, gw.pid)
                last = None
            k = i % len(arms)
            for a in arms[k:] + arms[:k]:
                if i >= warmup and a.on_gateway:
                    now = cpu_ns(gw.pid)
                    if last is not None:
                        cpu_of[last[0]] += now - last[1]
                    last = (a.name, now)
                sink = FirstText(a)
                t0, _ = await clients[a.name].stream(requests[a.name], sink, timeout_s=10)
                assert sink.ts is not None, f"{a.name}: no text event"
                if i >= warmup:
                    ttft[a.name].append((sink.ts - t0) / MS)
                await asyncio.sleep(PAUSE_S)
    finally:
        for c in clients.values():
            c.close()
    await asyncio.to_thread(settle_cpu, gw.pid)
    if last is not None:
        cpu_of[last[0]] += cpu_ns(gw.pid) - last[1]
    cpu_req = {name: ns / n / MS for name, ns in cpu_of.items()}
    d50 = median(ttft[DIRECT.name])
    s = ttft[STREAM.name]
    s_added = median(s) - d50
    rows = []
    for a in arms:
        v = ttft[a.name]
        added = median(v) - d50
        cells = (
            f"{added:.3f} | **{added / s_added:.2f}** | {median(v) - median(s):+.3f} | "
            f"{cpu_req[a.name]:.2f} | **{cpu_req[a.name] / cpu_req[STREAM.name]:.2f}**"
            if a.on_gateway
            else " | | | | "
        )
        rows.append(f"| {a.label} | {median(v):.3f} | {pct(v, 99):.3f} | {cells} |")
        if a in formats:
            rep.facts[f"b1f_{a.name}_added_ratio"] = added / s_added
            rep.facts[f"b1f_{a.name}_cpu_ratio"] = cpu_req[a.name] / cpu_req[STREAM.name]
    rep.add(
        "",
        f"### B1 — wire formats beside `/v1/stream` ({n} sequential requests each, taking "
        f"turns, {PAUSE_S * 1e3:.0f} ms apart, after {warmup} warm-up; a 3-token answer)",
        "",
        "| path (first text event) | p50 ms | p99 ms | added p50 ms | **÷ `/v1/stream`'s "
        "added** | − `/v1/stream` p50 ms | gateway CPU ms per request | **÷ `/v1/stream`'s** |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    )


async def b2_formats(
    rep: Report,
    up: Proc,
    gw: Proc,
    n: int,
    repeats: int,
    formats: tuple[Arm, ...] = FORMATS,
) -> None:
    """One plain-text stream of ``n`` tokens at full speed per arm, the arms taking turns;
    the median of ``repeats`` by tokens/s. Every format's CPU per token against
    ``/v1/stream``'s, within the budget."""
    arms = (DIRECT, STREAM, *formats)
    model = f"plain:{n}"
    runs: dict[str, list[Run]] = {a.name: [] for a in arms}
    for r in range(repeats):
        k = r % len(arms)
        for a in arms[k:] + arms[:k]:
            runs[a.name].append(await _one(a, up if not a.on_gateway else gw, model, n, gw, up))
    mid = {name: sorted(rs, key=lambda r: r.rate)[len(rs) // 2] for name, rs in runs.items()}
    d, s = mid[DIRECT.name], mid[STREAM.name]
    # A tiny run can read no CPU time at all for /v1/stream (the clock's resolution): the
    # ratios then have nothing to divide by, and are reported as such.
    s_cpu = max(s.gw_cpu_s / n * 1e6, 1e-9)
    rows = []
    for a in arms:
        m = mid[a.name]
        cpu = m.gw_cpu_s / n * 1e6
        cells = (
            f"{cpu:.1f} | **{cpu / s_cpu:.2f}** | {m.gw_after_s * 1e3:.0f} ms"
            if a.on_gateway
            else " | | "
        )
        rows.append(f"| {a.label} | {m.rate:,.0f} | {m.rate / d.rate:.2f} | {cells} |")
    rep.add(
        "",
        f"### B2 — wire formats beside `/v1/stream` (one plain-text stream of {n:,} tokens "
        f"per path, median of {repeats}, the paths taking turns; upstream without delay)",
        "",
        "| path | tok/s | ratio to direct | gateway CPU µs/token | **÷ `/v1/stream`'s** | "
        "+ after the end (artifacts) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    )
    for a in formats:
        ratio = mid[a.name].gw_cpu_s / n * 1e6 / s_cpu
        rep.facts[f"b2f_{a.name}_cpu_ratio"] = ratio
        rep.target(
            f"B2f {a.name}: gateway CPU per token {ratio:.2f} × `/v1/stream`'s ≤ {BUDGET:.2f}",
            ratio <= BUDGET,
        )


async def _one(a: Arm, server: Proc, model: str, n: int, gw: Proc, up: Proc) -> Run:
    client = await _open(a, server.port)
    try:
        sink = Counter(a)
        request = client.request_bytes(a.path, a.body(model))
        cpu0, up0, me0 = cpu_seconds(gw.pid), cpu_seconds(up.pid), time.process_time()
        t0, t1 = await client.stream(request, sink, timeout_s=120)
        cpu1, up1, me1 = cpu_seconds(gw.pid), cpu_seconds(up.pid), time.process_time()
    finally:
        client.close()
    assert sink.done, f"{a.name}: the stream did not end"
    assert sink.text == n, f"{a.name}: {sink.text} text events, want {n}"
    after = settle_cpu(gw.pid) - cpu1 if a.on_gateway else 0.0
    return Run((t1 - t0) / 1e9, n, cpu1 - cpu0, after, up1 - up0, me1 - me0)
