"""B1 for two versions of the gateway at once: a git revision against the working tree.

Run with ``python -m bench.ab REV`` (e.g. ``HEAD~3``). The shared benchmark VM changes
speed by half from hour to hour, so two ``bench.gateway`` runs made minutes apart cannot
resolve a 0.1 ms change in the time to first event. Here both gateways (REV, checked out
in a temporary git worktree, and the working tree) sit in front of the same scripted
upstream, and requests to the direct upstream and to each gateway take turns, in
rotating order, 10 ms apart, exactly as B1 does: machine drift hits all three alike.
Prints added p50/p99 per gateway and their CPU per request. Never writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench._procs import ROOT, cpu_seconds, scratch, spawn_gateway, spawn_upstream
from bench.gateway import (
    MS,
    PAUSE_S,
    Client,
    FirstText,
    _uvloop,
    direct_body,
    gateway_body,
    median,
    pct,
)


async def compare(base: Path, requests: int, warmup: int) -> list[str]:
    with scratch("toolforge-ab-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        gateways = {
            "base": spawn_gateway(url, artifacts, cwd=base),
            "work": spawn_gateway(url, artifacts),
        }
        procs += gateways.values()
        ports = {"direct": up.port, **{name: p.port for name, p in gateways.items()}}
        clients = {name: await Client.open(port) for name, port in ports.items()}
        sent = {
            name: clients[name].request_bytes("/v1/chat/completions", direct_body("ttft"))
            if name == "direct"
            else clients[name].request_bytes("/v1/stream", gateway_body("ttft"))
            for name in ports
        }
        ttft: dict[str, list[float]] = {name: [] for name in ports}
        names = list(ports)
        cpu0: dict[str, float] = {}
        for i in range(warmup + requests):
            if i == warmup:
                cpu0 = {name: cpu_seconds(p.pid) for name, p in gateways.items()}
            k = i % len(names)
            for name in names[k:] + names[:k]:
                sink = FirstText(name == "direct")
                t0, _ = await clients[name].stream(sent[name], sink, timeout_s=10)
                assert sink.ts is not None, f"{name}: no content event"
                if i >= warmup:
                    ttft[name].append((sink.ts - t0) / MS)
                await asyncio.sleep(PAUSE_S)
        await asyncio.sleep(0.5)  # the artifacts of the last streams
        for client in clients.values():
            client.close()
        d50, d99 = median(ttft["direct"]), pct(ttft["direct"], 99)
        lines = [f"direct p50 {d50:.3f} ms, p99 {d99:.3f} ms ({requests} requests each)"]
        for name, proc in gateways.items():
            g = ttft[name]
            cpu = (cpu_seconds(proc.pid) - cpu0[name]) / requests * 1e3
            lines.append(
                f"{name}: added p50 {median(g) - d50:.3f} ms, p99 {pct(g, 99) - d99:.3f} ms, "
                f"CPU {cpu:.2f} ms per request"
            )
        return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision to compare the working tree with")
    parser.add_argument("--requests", type=int, default=300, help="per side, after warm-up")
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    worktree = Path(tempfile.mkdtemp(prefix="toolforge-ab-rev-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(worktree), args.rev],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        _uvloop()
        lines = asyncio.run(compare(worktree, args.requests, args.warmup))
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(worktree)],
            cwd=ROOT,
            check=False,
            capture_output=True,
        )
        shutil.rmtree(worktree, ignore_errors=True)
    print(f"base = {args.rev}, work = the working tree")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
