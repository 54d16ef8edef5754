"""B5 and B6: one gateway worker under many clients, beside the same clients direct.

Run with ``python -m bench.load`` (``--only b5`` or ``b6``, ``--n 500,1000``, ``--quick``;
a subset does not touch RESULTS.md). The processes are those of ``bench.gateway``: the
scripted upstream, the gateway (uvicorn + httptools, as ``toolforge serve`` runs it) and the
bare TCP relay each in their own, and here the load clients in ``--clients`` processes of
their own (default 2), so that the client side is not the gateway's bottleneck. Each
client process speaks HTTP/1.1 over raw asyncio sockets (``bench.gateway.Client``) under
uvloop and timestamps every read with ``time.perf_counter_ns`` (a clock every process on
the machine shares). The file-descriptor limit is raised to its hard limit first, and the
children inherit it.

- B5: N concurrent paced streams (N = 500, 1000, 2000): each a ``/v1/stream`` of 100 tokens
  at 10 tokens/s, the N starts spread evenly over ``max(1, N / 250)`` seconds (all N
  are open together before the first ends); then the same
  clients on the upstream directly. Reported: streams complete, the inter-token gap
  p50/p99 as the clients saw it (gateway minus direct), the gateway's CPU per paced token
  (utime + stime of its process from the first request until it is idle again, the
  artifacts written after ``done`` included, over every token delivered), and its RSS per
  open stream (RSS with the most streams open, as the clients saw them open, minus RSS
  before, over that count). A fresh gateway per N: finished streams stay in its registry
  for ``RESUME_TTL_S``. The RSS target is read on what each stream past the smallest N
  costs (the growth from the smallest N to the largest over the streams added): each N's
  own figure also holds the process's one-time growth under load, which falls as N grows.
- B6: 3-token streams (the ``ttft`` script, as B1) arriving at a fixed rate, open loop,
  on kept-alive connections (a new one whenever none is free), at increasing rates; at each
  rate the direct upstream, the bare relay and the gateway's ``/v1/stream`` in turn, a
  warm-up then a measured window. Reported per rate: time to first ``text.delta`` (first
  content chunk direct) p50/p99, the rate reached, failures, and the CPU per request of
  the gateway, the upstream and the client processes; the highest rate whose added p99
  (gateway minus direct, at the same rate) stays at or under 5 ms; and each path's
  ceiling on this machine (the usable CPUs over what one request costs every process on
  its path), so that a missed rate says whether the code or the machine ran out.
- ``--workers N`` (N > 1): B5 also on one worker with Redis (what the resume buffers cost)
  and on ``toolforge serve --workers N`` with a ``redis-server`` of the bench's own
  (``bench.workers``), each N beside one worker and the direct upstream in the same run;
  CPU and RSS are the whole process tree's. The scaling factor: the highest N the N
  workers hold with every stream complete and the added gap p99 within 10 ms, over the
  same for one worker (and for one worker with Redis).

Targets (issue text): B5 every stream complete at N = 2000; added gap p99 ≤ 10 ms at
N = 2000 and ≤ 5 ms at N = 1000; ≤ 25 µs gateway CPU per paced token; ≤ 40 KB RSS per
open stream. B6: at least 2000 requests/s with added p99 ≤ 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
import random
import resource
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._procs import (
    Proc,
    filesystem,
    plain_tokens,
    scratch,
    spawn_gateway,
    spawn_proxy,
    spawn_upstream,
)
from bench._results import load_average, write_section
from bench.gateway import (
    Client,
    Counter,
    Report,
    Target,
    Timeline,
    direct_body,
    gateway_body,
    machine,
    median,
    pct,
)
from bench.workers import (
    redis_server,
    settle_tree,
    spawn_workers,
    tree_cpu_seconds,
    tree_pids,
    tree_rss_kb,
)

HEADING = "## Load: many streams and many short requests on one worker (bench/load.py)"
B5_TOKENS = 100
B5_DELAY_MS = 100.0  # 10 tokens/s
# Streams start at this rate: N of them are then open together for (10 s − N / 250 s),
# and the starts (a plan, a session, an upstream request each) cost the gateway about as
# much CPU as a steady 250 requests/s.
RAMP_PER_S = 250
# B5 with --workers: the scaling factor is the ratio of the highest N each arm holds
# within this added gap p99 (the target at N = 2000).
B5_SCALING_P99_MS = 10.0
B6_ADDED_P99_MS = 5.0  # the highest rate whose added p99 stays at or under this


def raise_fd_limit() -> int:
    """The soft file-descriptor limit raised to the hard one (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# -- the client processes --------------------------------------------------------------


class _Paced(Timeline):
    """A stream's token times, and the code of an ``error`` frame if one came."""

    def __init__(self, direct: bool) -> None:
        super().__init__(direct)
        self.error = ""

    def events(self, events: list[bytes], ts: int) -> None:
        super().events(events, ts)
        for e in events:
            if b"\nevent: error\n" in e and not self.error:
                self.error = e[e.index(b"\ndata: ") + 7 :][:120].decode(errors="replace")


@dataclass
class PacedSpec:
    """One client process's share of a B5 arm: its streams' start offsets (s)."""

    target: Target
    model: str
    tokens: int
    offsets: list[float]
    start_at_ns: int  # perf_counter_ns, shared by every process on the machine


@dataclass
class PacedResult:
    complete: int = 0
    gaps_us: list[int] = field(default_factory=list)  # every inter-token gap, every stream
    spans: list[tuple[int, int]] = field(default_factory=list)  # (first token, end) ns
    errors: dict[str, int] = field(default_factory=dict)


def run_paced(spec: PacedSpec) -> PacedResult:
    """A client process's B5 streams (runs in a process of its own)."""
    _uvloop()
    return asyncio.run(_paced(spec))


async def _paced(spec: PacedSpec) -> PacedResult:
    tokens = plain_tokens(spec.tokens)
    out = PacedResult()
    t = spec.target
    body = t.body(spec.model)
    timeout_s = spec.tokens * B5_DELAY_MS / 1000 * 3 + 30

    def error(what: str) -> None:
        out.errors[what] = out.errors.get(what, 0) + 1

    async def one(offset_s: float) -> None:
        wait_ns = spec.start_at_ns + int(offset_s * 1e9) - time.perf_counter_ns()
        await asyncio.sleep(max(0.0, wait_ns / 1e9))
        sink = _Paced(t.direct)
        end = 0
        try:
            client = await Client.open(t.port)
        except OSError as exc:
            error(f"connect: {type(exc).__name__}")
            return
        try:
            _, end = await client.stream(client.request_bytes(t.path, body), sink, timeout_s)
        except (RuntimeError, ConnectionError, TimeoutError) as exc:
            error(str(exc)[:60] or type(exc).__name__)
        finally:
            client.close()
        if sink.error:
            error(f"error frame {sink.error}")
        times = sink.token_times(tokens)
        out.gaps_us.extend((b - a) // 1000 for a, b in itertools.pairwise(times))
        if sink.first_ts is not None:
            out.spans.append((sink.first_ts, end or time.perf_counter_ns()))
        if len(times) == len(tokens) and end:
            out.complete += 1

    await asyncio.gather(*(one(o) for o in spec.offsets))
    return out


@dataclass
class RateSpec:
    """One client process's share of a B6 arm: a request every ``1 / rate`` s."""

    target: Target
    rate: float  # this process's requests per second
    warmup_s: float
    measure_s: float
    start_at_ns: int


@dataclass
class RateResult:
    ttft_us: list[int] = field(default_factory=list)  # requests sent in the measured window
    sent: int = 0  # in the measured window
    late_us: list[int] = field(default_factory=list)  # send time − schedule (the client's lag)
    failures: dict[str, int] = field(default_factory=dict)
    connections: int = 0  # opened
    cpu_s: float = 0.0  # this client process's own CPU over its whole run, warm-up included


def run_rate(spec: RateSpec) -> RateResult:
    """A client process's B6 requests (runs in a process of its own)."""
    _uvloop()
    return asyncio.run(_rate(spec))


async def _rate(spec: RateSpec) -> RateResult:
    cpu0 = time.process_time()
    t = spec.target
    out = RateResult()
    idle: list[Client] = []
    request = b""
    body = t.body("ttft")
    interval_ns = int(1e9 / spec.rate)
    measure_from = spec.start_at_ns + int(spec.warmup_s * 1e9)
    end_ns = measure_from + int(spec.measure_s * 1e9)
    tasks: set[asyncio.Task[None]] = set()

    def failure(what: str) -> None:
        out.failures[what] = out.failures.get(what, 0) + 1

    async def one(scheduled: int) -> None:
        nonlocal request
        try:
            if idle:
                client = idle.pop()
            else:
                client = await Client.open(t.port)
                out.connections += 1
        except OSError as exc:
            failure(f"connect: {type(exc).__name__}")
            return
        request = request or client.request_bytes(t.path, body)
        sink = _FirstText(t.direct)
        try:
            t0, _ = await client.stream(request, sink, timeout_s=30)
        except (RuntimeError, ConnectionError, TimeoutError) as exc:
            failure(str(exc)[:60] or type(exc).__name__)
            client.close()
            return
        if scheduled >= measure_from:
            out.sent += 1
            out.late_us.append((t0 - scheduled) // 1000)
            if sink.ts is None:
                failure("no content event")
            else:
                out.ttft_us.append((sink.ts - t0) // 1000)
        idle.append(client)

    k = 0
    while True:
        scheduled = spec.start_at_ns + k * interval_ns
        if scheduled >= end_ns:
            break
        now = time.perf_counter_ns()
        if scheduled > now:
            await asyncio.sleep((scheduled - now) / 1e9)
        task = asyncio.create_task(one(scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        k += 1
    if tasks:
        await asyncio.wait(tasks, timeout=35)
    for client in idle:
        client.close()
    out.cpu_s = time.process_time() - cpu0
    return out


class _FirstText(Counter):
    """The first content event's read time (the first ``text.delta``; direct, the first
    chunk with content), counted as cheaply as B2 counts."""

    def __init__(self, direct: bool) -> None:
        super().__init__(direct)
        self.ts: int | None = None

    def events(self, events: list[bytes], ts: int) -> None:
        if self.ts is None:
            before = self.text
            super().events(events, ts)
            if self.text > before:
                self.ts = ts


class Clients:
    """``n`` client processes (spawned, each with one worker), started before the clock."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pools = [
            concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) for _ in range(n)
        ]
        # Started and imported before any arm's clock runs.
        for f in [p.submit(_warm) for p in self.pools]:
            f.result()

    def __len__(self) -> int:
        return len(self.pools)

    async def map(self, fn: Any, specs: list[Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(pool, fn, spec)
            for pool, spec in zip(self.pools, specs, strict=True)
        ]
        return list(await asyncio.gather(*futures))

    def close(self) -> None:
        for pool in self.pools:
            pool.shutdown(cancel_futures=True)


def _warm() -> int:
    import uvloop  # noqa: F401  # imported before the clock, as everything below

    return 0


def _start_at(lead_s: float = 0.3) -> int:
    return time.perf_counter_ns() + int(lead_s * 1e9)


# -- B5 --------------------------------------------------------------------------------


@dataclass
class PacedArm:
    n: int
    complete: int
    gaps_ms: list[float]
    errors: dict[str, int]
    cpu_us_token: float = float("nan")
    rss_kb_stream: float = float("nan")
    most_open: int = 0
    rss_before_kb: int = 0
    rss_peak_kb: int = 0


async def paced_arm(clients: Clients, t: Target, n: int, tokens: int, gw: Proc | None) -> PacedArm:
    """``n`` streams of ``tokens`` tokens at 10 tokens/s; with ``gw``, its CPU and RSS."""
    model = f"steady:{tokens}:{B5_DELAY_MS:g}"
    ramp_s = max(1.0, n / RAMP_PER_S)
    offsets = [i * ramp_s / n for i in range(n)]
    random.Random(n).shuffle(offsets)
    start = _start_at()
    share = len(clients)
    specs = [PacedSpec(t, model, tokens, offsets[w::share], start) for w in range(share)]
    samples: list[tuple[int, int]] = []  # (perf_counter_ns, RSS KB)
    pids = tree_pids(gw.pid) if gw is not None else []
    rss0 = tree_rss_kb(gw.pid, pids) if gw is not None else 0
    cpu0 = tree_cpu_seconds(gw.pid) if gw is not None else 0.0

    async def sample() -> None:
        assert gw is not None
        while True:
            samples.append((time.perf_counter_ns(), tree_rss_kb(gw.pid, pids)))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample()) if gw is not None else None
    try:
        results: list[PacedResult] = await clients.map(run_paced, specs)
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    errors: dict[str, int] = {}
    for r in results:
        for what, count in r.errors.items():
            errors[what] = errors.get(what, 0) + count
    arm = PacedArm(
        n=n,
        complete=sum(r.complete for r in results),
        gaps_ms=[g / 1000 for r in results for g in r.gaps_us],
        errors=errors,
    )
    if gw is None:
        return arm
    cpu1 = await asyncio.to_thread(settle_tree, gw.pid)
    delivered = len(arm.gaps_ms) + sum(1 for r in results for _ in r.spans)
    arm.cpu_us_token = (cpu1 - cpu0) / max(delivered, 1) * 1e6
    spans = [s for r in results for s in r.spans]
    best = (0, 0)  # (open streams, RSS)
    for ts, rss in samples:
        live = sum(1 for a, b in spans if a <= ts < b)
        best = max(best, (live, rss))
    arm.most_open, arm.rss_before_kb = best[0], rss0
    arm.rss_peak_kb = max((rss for _, rss in samples), default=rss0)
    arm.rss_kb_stream = (best[1] - rss0) / max(best[0], 1)
    return arm


def gateway_env(n: int) -> dict[str, str]:
    """Room for ``n`` streams: the server's own connection limit, and the upstream pool
    (``UPSTREAM_MAX_CONNECTIONS``, read only by a gateway that has that setting)."""
    room = str(max(1000, 2 * n + 100))
    return {"MAX_CONNECTIONS": room, "UPSTREAM_MAX_CONNECTIONS": room}


async def _warm_gateway(port: int) -> None:
    warm = await Client.open(port)
    try:
        await warm.stream(warm.request_bytes("/v1/stream", gateway_body("ttft")), Counter(False))
    finally:
        warm.close()


async def b5(
    rep: Report,
    clients: Clients,
    url: str,
    up: Proc,
    artifacts: Any,
    sizes: list[int],
    tokens: int,
    workers: int = 1,
    redis_url: str = "",
    relay: Proc | None = None,
) -> None:
    """B5; with ``workers`` > 1, each N also on ``toolforge serve --workers`` with Redis,
    and the scaling factor: the highest N each arm holds within the gap target. With
    ``relay``, the bare TCP relay's CPU per paced token too: what one read and one write
    per token cost a Python process on this machine with no work of its own between them,
    the floor under the gateway's figure."""
    direct = Target("direct", up.port, "/v1/chat/completions", direct_body)
    served = "one gateway worker"
    if workers > 1:
        served += f" beside `--workers {workers}` with Redis"
    rep.add(
        "",
        f"### B5 — N concurrent paced streams ({tokens} tokens at "
        f"{1000 / B5_DELAY_MS:.0f} tokens/s each), {served}, {len(clients)} client processes",
        "",
        "| N | path | complete | gap p50 ms | gap p99 ms | **added gap p50 / p99 ms** | "
        "gateway CPU µs per paced token | RSS per open stream KB (most open) | failures |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    # (workers, Redis): one worker as it ships; with --workers, one worker with Redis too
    # (what the resume buffers cost alone) and the N workers, which need it.
    arms = [(1, False)] if workers == 1 else [(1, False), (1, True), (workers, True)]
    held = dict.fromkeys(arms, 0)  # the highest N within B5_SCALING_P99_MS, per arm
    for n in sizes:
        d = await paced_arm(clients, direct, n, tokens, None)
        rep.add(
            f"| {n} | direct | {d.complete} | {median(d.gaps_ms):.2f} | "
            f"{pct(d.gaps_ms, 99):.2f} | | | | {_fails(d)} |"
        )
        if relay is not None:
            await asyncio.to_thread(settle_tree, relay.pid)
            target = Target("relay", relay.port, "/v1/chat/completions", direct_body)
            r = await paced_arm(clients, target, n, tokens, relay)
            rep.add(
                f"| {n} | bare TCP relay | {r.complete} | {median(r.gaps_ms):.2f} | "
                f"{pct(r.gaps_ms, 99):.2f} | "
                f"**{median(r.gaps_ms) - median(d.gaps_ms):+.2f} / "
                f"{pct(r.gaps_ms, 99) - pct(d.gaps_ms, 99):+.2f}** | "
                f"{r.cpu_us_token:.1f} | | {_fails(r)} |"
            )
            rep.facts[f"b5_{n}_relay_cpu"] = r.cpu_us_token
        for arm in arms:
            w, redis = arm
            env = gateway_env(n)
            name = "gateway `/v1/stream`"
            if w > 1:
                gw = spawn_workers(url, artifacts, w, redis_url, env)
                name += f", {w} workers + Redis"
            elif redis:
                gw = spawn_gateway(url, artifacts, env={**env, "REDIS_URL": redis_url})
                name += ", 1 worker + Redis"
            else:
                gw = spawn_gateway(url, artifacts, env=env)
            try:
                for _ in range(4 * w):  # every worker's first request before the clock
                    await _warm_gateway(gw.port)
                await asyncio.to_thread(settle_tree, gw.pid)
                gateway = Target("gateway", gw.port, "/v1/stream", gateway_body)
                g = await paced_arm(clients, gateway, n, tokens, gw)
            finally:
                gw.stop()
            add50 = median(g.gaps_ms) - median(d.gaps_ms)
            add99 = pct(g.gaps_ms, 99) - pct(d.gaps_ms, 99)
            rep.add(
                f"| {n} | {name} | {g.complete} | {median(g.gaps_ms):.2f} | "
                f"{pct(g.gaps_ms, 99):.2f} | **{add50:+.2f} / {add99:+.2f}** | "
                f"{g.cpu_us_token:.1f} | {g.rss_kb_stream:.1f} ({g.most_open}) | {_fails(g)} |"
            )
            if add99 <= B5_SCALING_P99_MS and g.complete == n and not g.errors:
                held[arm] = max(held[arm], n)
            if arm != (1, False):
                continue
            rep.facts[f"b5_{n}_add99"] = add99
            rep.facts[f"b5_{n}_complete"] = g.complete
            rep.facts[f"b5_{n}_cpu"] = g.cpu_us_token
            rep.facts[f"b5_{n}_rss"] = g.rss_kb_stream
            rep.facts[f"b5_{n}_rss_growth"] = g.rss_kb_stream * g.most_open
            rep.facts[f"b5_{n}_most_open"] = g.most_open
    rep.add(
        "",
        "Gap: each gap between two consecutive tokens of one stream as its client saw it, "
        "over every stream; added: the gateway's percentile minus the direct arm's. CPU "
        "per paced token: the gateway process's utime + stime from its first request "
        "until it is idle again (the artifacts after `done` included), over every token "
        "delivered. RSS per open stream: (RSS with the most streams open − RSS before) ÷ "
        "that count, the streams open as the clients saw them (first token in, response "
        "not ended), sampled every 100 ms; it holds the process's one-time growth under "
        "load too, so the target below is read on the growth from the smallest N to the "
        "largest over the streams added. With several workers, CPU and RSS are the whole "
        "process tree's (the parent holding the socket and every worker).",
        "",
    )
    if workers > 1:
        one, redis1, many = held[(1, False)], held[(1, True)], held[(workers, True)]

        def factor(base: int) -> str:
            return f"{many / base:.2f}" if base and many else "not measurable (an arm held none)"

        rep.add(
            f"Highest N with added gap p99 ≤ {B5_SCALING_P99_MS:g} ms and every stream "
            f"complete: one worker {one or 'none'}, one worker with Redis {redis1 or 'none'}, "
            f"{workers} workers with Redis {many or 'none'}; scaling factor {factor(one)} "
            f"over one worker, {factor(redis1)} over one worker with Redis.",
            "",
        )
    big = max(sizes)
    rep.target(
        f"B5 every stream complete at N = {big}: {rep.facts[f'b5_{big}_complete']:.0f} of {big}",
        rep.facts[f"b5_{big}_complete"] == big,
    )
    for n, limit in ((2000, 10.0), (1000, 5.0)):
        if n in sizes:
            add99 = rep.facts[f"b5_{n}_add99"]
            rep.target(
                f"B5 added gap p99 at N = {n}: {add99:+.2f} ms ≤ {limit:g} ms", add99 <= limit
            )
    cpu = max(rep.facts[f"b5_{n}_cpu"] for n in sizes)
    floor = ""
    if relay is not None:
        relay_cpu = max(rep.facts[f"b5_{n}_relay_cpu"] for n in sizes)
        floor = f" (the bare relay's, the floor: {relay_cpu:.1f} µs)"
    rep.target(f"B5 gateway CPU per paced token (worst N) {cpu:.1f} µs ≤ 25 µs{floor}", cpu <= 25)
    per_n = " / ".join(f"{rep.facts[f'b5_{n}_rss']:.1f}" for n in sizes)
    small, large = min(sizes), max(sizes)
    added = rep.facts[f"b5_{large}_most_open"] - rep.facts[f"b5_{small}_most_open"]
    if added > 0:
        # What one more open stream costs: the growth from the fewest streams to the most,
        # over the streams added. Each N's own figure also holds the process's one-time
        # growth under load (allocator arenas, tables sized at first use), which a larger
        # N divides more thinly: it falls as N grows.
        grown = rep.facts[f"b5_{large}_rss_growth"] - rep.facts[f"b5_{small}_rss_growth"]
        rss = grown / added
        rep.target(
            f"B5 RSS per open stream {rss:.1f} KB ≤ 40 KB (each stream past N = {small} "
            f"up to N = {large}; per N: {per_n} KB)",
            rss <= 40,
        )
    else:
        rss = max(rep.facts[f"b5_{n}_rss"] for n in sizes)
        rep.target(f"B5 RSS per open stream (worst N) {rss:.1f} KB ≤ 40 KB", rss <= 40)


def _fails(arm: PacedArm) -> str:
    return "; ".join(f"{k} ×{v}" for k, v in sorted(arm.errors.items())) or "0"


# -- B6 --------------------------------------------------------------------------------


@dataclass
class RateArm:
    rate: float
    ttft_ms: list[float]
    reached: float  # requests per second actually sent in the measured window
    failures: dict[str, int]
    late_p99_ms: float
    cpu_ms_request: float = float("nan")  # the gateway's (its arm only)
    upstream_cpu_ms_request: float = float("nan")
    clients_cpu_ms_request: float = float("nan")


async def rate_arm(
    clients: Clients,
    t: Target,
    rate: float,
    warmup_s: float,
    measure_s: float,
    gw: Proc | None,
    up: Proc,
) -> RateArm:
    start = _start_at()
    share = len(clients)
    specs = [RateSpec(t, rate / share, warmup_s, measure_s, start) for _ in range(share)]
    cpu0 = tree_cpu_seconds(gw.pid) if gw is not None else 0.0
    up0 = tree_cpu_seconds(up.pid)
    results: list[RateResult] = await clients.map(run_rate, specs)
    failures: dict[str, int] = {}
    for r in results:
        for what, count in r.failures.items():
            failures[what] = failures.get(what, 0) + count
    sent = sum(r.sent for r in results)
    arm = RateArm(
        rate=rate,
        ttft_ms=[u / 1000 for r in results for u in r.ttft_us],
        reached=sent / measure_s,
        failures=failures,
        late_p99_ms=pct([u / 1000 for r in results for u in r.late_us], 99),
    )
    total = max(rate * (warmup_s + measure_s), 1)  # every request of the arm's run
    arm.clients_cpu_ms_request = sum(r.cpu_s for r in results) / total * 1e3
    if gw is not None:
        cpu1 = await asyncio.to_thread(settle_tree, gw.pid)
        arm.cpu_ms_request = (cpu1 - cpu0) / total * 1e3
    # The upstream is idle once the gateway is (its last answers are in).
    arm.upstream_cpu_ms_request = (tree_cpu_seconds(up.pid) - up0) / total * 1e3
    return arm


async def b6(
    rep: Report,
    clients: Clients,
    up: Proc,
    gw: Proc,
    relay: Proc,
    rates: list[float],
    warmup_s: float,
    measure_s: float,
) -> None:
    arms = (
        Target("direct", up.port, "/v1/chat/completions", direct_body),
        Target("relay", relay.port, "/v1/chat/completions", direct_body),
        Target("gateway", gw.port, "/v1/stream", gateway_body),
    )
    rep.add(
        "",
        f"### B6 — sustained short requests (3-token streams, open loop; {warmup_s:g} s "
        f"warm-up then {measure_s:g} s measured per rate and path), one gateway worker, "
        f"{len(clients)} client processes",
        "",
        "| rate /s | path | reached /s | first event p50 ms | p99 ms | **added p99 ms** | "
        "failures | client lag p99 ms | CPU ms per request: gateway / upstream / clients |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    best = 0.0
    over = 0
    runs: list[dict[str, RateArm]] = []
    for rate in rates:
        got: dict[str, RateArm] = {}
        for t in arms:
            got[t.name] = await rate_arm(
                clients, t, rate, warmup_s, measure_s, gw if t.name == "gateway" else None, up
            )
        runs.append(got)
        d = got["direct"]
        added = {
            name: pct(a.ttft_ms, 99) - pct(d.ttft_ms, 99) for name, a in got.items() if a is not d
        }
        for name, a in got.items():
            fails = "; ".join(f"{k} ×{v}" for k, v in sorted(a.failures.items())) or "0"
            add = f"**{added[name]:+.2f}**" if name in added else ""
            gw_cpu = f"{a.cpu_ms_request:.2f}" if name == "gateway" else "–"
            cpu = f"{gw_cpu} / {a.upstream_cpu_ms_request:.2f} / {a.clients_cpu_ms_request:.2f}"
            rep.add(
                f"| {rate:,.0f} | {name} | {a.reached:,.0f} | {median(a.ttft_ms):.2f} | "
                f"{pct(a.ttft_ms, 99):.2f} | {add} | {fails} | {a.late_p99_ms:.2f} | {cpu} |"
            )
        g = got["gateway"]
        ok = added["gateway"] <= B6_ADDED_P99_MS and not g.failures and g.reached >= 0.95 * rate
        if ok:
            best = max(best, rate)
            over = 0
        else:
            over += 1
            if over >= 2:  # two rates past the knee: the rest only queue further
                break
    rep.facts["b6_best"] = best
    rep.add(
        "",
        "First event: request written → first `text.delta` (direct and relay: the first "
        "chunk with content), as B1 measures it, on kept-alive connections. Added p99: the "
        "path's p99 minus the direct arm's at the same rate. Client lag: how late the "
        "client processes wrote a request against its schedule (their own saturation). "
        "CPU per request: each process's utime + stime over the rate's requests, warm-up "
        "included (the gateway's until it is idle again, artifacts included; the clients' "
        "summed over their processes).",
        "",
    )
    cpus = len(os.sched_getaffinity(0))
    ceiling = b6_ceiling(runs, cpus)
    rep.facts.update({f"b6_ceiling_{name}": v for name, v in ceiling.items()})
    rep.add(
        f"The machine's ceiling, from the CPU each path's request costs every process on it "
        f"(median over the rates run), {cpus} usable CPUs over it: "
        f"direct {ceiling['direct']:,.0f}/s, bare relay {ceiling['relay']:,.0f}/s, gateway "
        f"{ceiling['gateway']:,.0f}/s; the gateway's process alone on a CPU of its own: "
        f"{ceiling['gateway_alone']:,.0f}/s. A rate above a path's ceiling queues whatever "
        "the code does: on a machine that also runs the upstream and the clients, B6's rate "
        "is bounded by the sum.",
        "",
    )
    rep.target(
        f"B6 highest rate with added p99 ≤ {B6_ADDED_P99_MS:g} ms and nothing failed: "
        f"{best:,.0f} requests/s ≥ 2000",
        best >= 2000,
    )


def b6_ceiling(runs: list[dict[str, RateArm]], cpus: int) -> dict[str, float]:
    """Requests per second each path could reach if CPU were all it took: ``cpus`` over
    the CPU one request costs the processes it passes through (the clients and the
    upstream always; the gateway on its path; the bare relay's own CPU is not measured,
    so its figure is an upper bound), each the median over ``runs``. ``gateway_alone``:
    the gateway's process on one CPU of its own."""

    def per_request(name: str, *parts: str) -> float:
        return sum(median([getattr(got[name], p) for got in runs]) for p in parts)

    both = ("upstream_cpu_ms_request", "clients_cpu_ms_request")

    def rate(ms: float, on: int) -> float:
        return on * 1e3 / ms if ms > 0 else float("inf")

    return {
        "direct": rate(per_request("direct", *both), cpus),
        "relay": rate(per_request("relay", *both), cpus),
        "gateway": rate(per_request("gateway", "cpu_ms_request", *both), cpus),
        "gateway_alone": rate(per_request("gateway", "cpu_ms_request"), 1),
    }


# -- the run ---------------------------------------------------------------------------


@contextlib.contextmanager
def client_processes(n: int) -> Iterator[Clients]:
    clients = Clients(n)
    try:
        yield clients
    finally:
        clients.close()


async def run(args: argparse.Namespace, rep: Report) -> None:
    parent = args.artifacts_dir
    with (
        scratch("toolforge-load-", parent) as (artifacts, procs),
        client_processes(args.clients) as cl,
    ):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        relay = spawn_proxy(up.port)  # B5's floor and B6's reference row
        procs.append(relay)
        if "b5" in args.only and args.workers > 1:
            with redis_server() as redis_url:
                await b5(
                    rep,
                    cl,
                    url,
                    up,
                    artifacts,
                    args.n,
                    args.b5_tokens,
                    args.workers,
                    redis_url,
                    relay=relay,
                )
        elif "b5" in args.only:
            await b5(rep, cl, url, up, artifacts, args.n, args.b5_tokens, relay=relay)
        if "b6" in args.only:
            gw = spawn_gateway(url, artifacts, env=gateway_env(max(args.rates)))
            procs.append(gw)
            await _warm_gateway(gw.port)
            await b6(rep, cl, up, gw, relay, args.rates, args.b6_warmup, args.b6_measure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run; no RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument("--only", default="b5,b6", help="b5, b6 or both (a subset: --no-write)")
    parser.add_argument("--n", default="", help="B5's stream counts, comma-separated")
    parser.add_argument("--rates", default="", help="B6's request rates, comma-separated")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument(
        "--artifacts-dir",
        type=Path,
        default=None,
        help="where the gateways write their runs (a fresh directory inside it; default the "
        "system's temporary directory). The file system's own cost per run is the "
        "gateway's CPU too: /dev/shm measures the gateway without it (docs/performance.md)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="B5 also on `toolforge serve --workers N` with Redis, beside one worker "
        "(N > 1: --no-write)",
    )
    args = parser.parse_args()
    args.only = set(args.only.lower().split(","))
    if not args.only <= {"b5", "b6"}:
        parser.error(f"--only: unknown benchmark in {sorted(args.only)}")
    q = args.quick
    default_n = "50,100" if q else "500,1000,2000"
    default_rates = "100,200" if q else "100,200,300,400,500,750,1000,1500,2000"
    if args.only != {"b5", "b6"} or args.n or args.rates or args.workers > 1:
        args.no_write = True
    if args.artifacts_dir is not None:
        args.artifacts_dir.mkdir(parents=True, exist_ok=True)
    args.n = [int(x) for x in (args.n or default_n).split(",")]
    args.rates = [float(x) for x in (args.rates or default_rates).split(",")]
    args.b5_tokens = 20 if q else B5_TOKENS
    args.b6_warmup, args.b6_measure = (0.3, 1.0) if q else (0.5, 2.0)

    fds = raise_fd_limit()
    command = "python -m bench.load" + (" --quick" if q else "")
    if args.workers > 1:
        command += f" --workers {args.workers}"
    if args.artifacts_dir is not None:
        command += f" --artifacts-dir {args.artifacts_dir}"
    where = args.artifacts_dir or Path(tempfile.gettempdir())
    rep = Report()
    rep.add(
        "",
        f"`{command}` — the scripted upstream, the gateway (uvicorn + httptools, one "
        "worker), the bare TCP relay and the load clients each in processes of their own on "
        f"127.0.0.1; file-descriptor limit {fds}; the runs' artifacts on "
        f"{filesystem(where)}.",
        "",
        *machine(),
    )
    started = time.monotonic()
    _uvloop()
    asyncio.run(run(args, rep))
    met = sum(ok for _, ok in rep.targets)
    took = time.monotonic() - started
    rep.add(
        "",
        f"{met} of {len(rep.targets)} targets met; the whole run took {took:.0f} s; load "
        f"average at the end {load_average()}.",
    )
    if not q and not args.no_write:
        write_section(HEADING, rep.lines)
        print("\nwritten to bench/RESULTS.md")


if __name__ == "__main__":
    main()
