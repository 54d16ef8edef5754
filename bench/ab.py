"""B1 and B2 for two versions of the gateway at once: a git revision against the working tree.

Run with ``python -m bench.ab REV`` (e.g. ``HEAD~3``). The shared benchmark VM changes
speed by half from hour to hour, so two ``bench.gateway`` runs made minutes apart cannot
resolve a 0.1 ms change in the time to first event. Here both gateways (REV, checked out
in a temporary git worktree, and the working tree) sit in front of the same scripted
upstream, and the direct upstream and each gateway take turns, in rotating order:
machine drift hits all three alike.

- B1, exactly as ``bench.gateway`` runs it: sequential requests, 10 ms apart. Prints added
  p50/p99 per gateway and its CPU per request.
- B2, ``bench.gateway``'s two streams at full speed (plain text, and an OBJECT frame every
  50 tokens): an untimed round, then ``--b2-rounds`` rounds of one stream each to direct,
  base and work. Prints, from the median tokens/s of each, every gateway's ratio to the
  direct upstream and the ratio work/base (with its range over the rounds' own ratios:
  the noise), and each gateway's CPU µs per upstream token.

``python -m bench.ab --redis`` compares the working tree with itself instead: base in
memory, work with ``REDIS_URL`` pointing at a ``redis-server`` started for the run (no
persistence, on loopback): what the shared state of docs/deployment.md costs a stream (its resume
buffer is mirrored to Redis while it runs).

``python -m bench.ab --auth`` likewise: base without API keys, work
with one key in ``API_KEYS`` and every request sending it (``Authorization: Bearer``): the
cost of the access check (docs/security.md, docs/deployment.md) as a ratio.

Never writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

from bench._procs import (
    ROOT,
    Proc,
    cpu_seconds,
    free_port,
    scratch,
    spawn_gateway,
    spawn_upstream,
)
from bench.gateway import (
    MS,
    PAUSE_S,
    Client,
    FirstText,
    Run,
    Target,
    _uvloop,
    b2_streams,
    direct_body,
    gateway_body,
    median,
    one_stream,
    pct,
)


def rotations(names: list[str], rounds: int) -> list[list[str]]:
    """``names`` in every order in turn, ``rounds`` times: who goes first changes."""
    return [names[k % len(names) :] + names[: k % len(names)] for k in range(rounds)]


async def b1(
    targets: dict[str, Target], gateways: dict[str, Proc], n: int, warmup: int
) -> list[str]:
    clients = {name: await Client.open(t.port) for name, t in targets.items()}
    sent = {
        name: clients[name].request_bytes(t.path, t.body("ttft"), t.auth)
        for name, t in targets.items()
    }
    ttft: dict[str, list[float]] = {name: [] for name in targets}
    cpu0: dict[str, float] = {}
    for i, order in enumerate(rotations(list(targets), warmup + n)):
        if i == warmup:
            cpu0 = {name: cpu_seconds(p.pid) for name, p in gateways.items()}
        for name in order:
            sink = FirstText(targets[name].direct)
            t0, _ = await clients[name].stream(sent[name], sink, timeout_s=10)
            assert sink.ts is not None, f"{name}: no content event"
            if i >= warmup:
                ttft[name].append((sink.ts - t0) / MS)
            await asyncio.sleep(PAUSE_S)
    await asyncio.sleep(0.5)  # the artifacts of the last streams
    for client in clients.values():
        client.close()
    d50, d99 = median(ttft["direct"]), pct(ttft["direct"], 99)
    lines = [f"B1: direct p50 {d50:.3f} ms, p99 {d99:.3f} ms ({n} requests each)"]
    for name, proc in gateways.items():
        g = ttft[name]
        cpu = (cpu_seconds(proc.pid) - cpu0[name]) / n * 1e3
        lines.append(
            f"  {name}: added p50 {median(g) - d50:.3f} ms, p99 {pct(g, 99) - d99:.3f} ms, "
            f"CPU {cpu:.2f} ms per request"
        )
    return lines


async def b2(targets: dict[str, Target], procs: dict[str, Proc], n: int, rounds: int) -> list[str]:
    """``procs``: the process behind each target, whose CPU each stream reports."""
    up = procs["direct"]
    lines: list[str] = []
    for label, model, total, expect_text, frames in b2_streams(n):
        runs: dict[str, list[Run]] = {name: [] for name in targets}
        for i, order in enumerate(rotations(list(targets), rounds + 1)):
            for name in order:
                t = targets[name]
                run = await one_stream(
                    t, model, total if t.direct else expect_text, procs[name], up, frames
                )
                run.tokens = total
                if i:  # round 0 warms the upstream's script and each gateway up
                    runs[name].append(run)
        rate = {name: median([r.rate for r in rs]) for name, rs in runs.items()}
        lines.append(f"B2, {label} ({total:,} tokens, median of {rounds} rounds):")
        lines.append(f"  direct {rate['direct']:,.0f} tokens/s")
        for name in ("base", "work"):
            cpu = median([r.gw_cpu_s for r in runs[name]]) / total * 1e6
            lines.append(
                f"  {name} {rate[name]:,.0f} tokens/s, ratio {rate[name] / rate['direct']:.3f}, "
                f"CPU {cpu:.1f} µs/token"
            )
        each = sorted(w.rate / b.rate for w, b in zip(runs["work"], runs["base"], strict=True))
        lines.append(
            f"  work/base {rate['work'] / rate['base']:.3f} "
            f"(each round: {each[0]:.3f} to {each[-1]:.3f})"
        )
    return lines


BENCH_KEY = "bench-key-0123456789abcdef"  # --auth: the work gateway's one API key


def _package_shim(checkout: Path) -> Path:
    """A folder that holds ``checkout``'s code as the ``toolforge`` package, for
    ``PYTHONPATH``: links laid out as its pyproject's ``package-dir`` maps the folders
    (``toolforge`` = ``app/``, ``toolforge.tools`` = ``tools/``, ...). Without it a gateway
    started in another checkout imports this one's ``toolforge`` (the editable install's
    finder maps the package to this checkout by absolute path), and base and work would
    run the same code."""
    config = tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))
    folders: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    root = checkout / ".ab-import"
    package = root / "toolforge"
    package.mkdir(parents=True, exist_ok=True)
    for entry in (checkout / folders["toolforge"]).iterdir():
        link = package / entry.name
        if not link.exists():
            link.symlink_to(entry)
    for name, folder in folders.items():
        parts = name.split(".")
        if len(parts) == 2 and not (package / parts[1]).exists():
            (package / parts[1]).symlink_to(checkout / folder)
    return root


async def compare(
    base: Path, args: argparse.Namespace, redis_url: str | None = None, auth: bool = False
) -> list[str]:
    """``base``: the checkout the base gateway runs; with ``redis_url`` or ``auth``, the
    work gateway gets ``REDIS_URL`` or ``API_KEYS`` (and its requests the key)."""
    with scratch("toolforge-ab-") as (artifacts, procs):
        up = spawn_upstream()
        procs.append(up)
        url = f"http://127.0.0.1:{up.port}/v1"
        env: dict[str, str] = {}
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        if auth:
            env["API_KEYS"] = BENCH_KEY
        # Another checkout's code must be imported from that checkout: the editable install
        # maps ``toolforge`` to this one's folders by absolute path (_package_shim).
        base_env = None if base == ROOT else {"PYTHONPATH": str(_package_shim(base))}
        gateways = {
            "base": spawn_gateway(url, artifacts, env=base_env, cwd=base),
            "work": spawn_gateway(url, artifacts, env=env or None),
        }
        procs += gateways.values()
        targets = {
            "direct": Target("direct", up.port, "/v1/chat/completions", direct_body),
            **{
                name: Target(
                    name,
                    p.port,
                    "/v1/stream",
                    gateway_body,
                    auth=BENCH_KEY if auth and name == "work" else None,
                )
                for name, p in gateways.items()
            },
        }
        lines = await b1(targets, gateways, args.requests, args.warmup)
        if args.b2_rounds:
            lines += await b2(targets, {"direct": up, **gateways}, args.b2_tokens, args.b2_rounds)
        return lines


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A ``redis-server`` on a free loopback port for the run; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--redis needs redis-server on PATH (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="toolforge-ab-redis-") as workdir:
        args = ["--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(
            [binary, *args, "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.2),
                ):
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", help="the git revision to compare the working tree with")
    parser.add_argument(
        "--redis",
        action="store_true",
        help="instead of a revision: the working tree in memory (base) and with REDIS_URL",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="no REV: the working tree without API keys (base) vs with one (work)",
    )
    parser.add_argument("--requests", type=int, default=300, help="B1, per side, after warm-up")
    parser.add_argument("--warmup", type=int, default=30, help="B1")
    parser.add_argument("--b2-rounds", type=int, default=5, help="per stream; 0 skips B2")
    parser.add_argument("--b2-tokens", type=int, default=50_000)
    args = parser.parse_args()
    if args.redis:
        _uvloop()
        with redis_server() as url:
            lines = asyncio.run(compare(ROOT, args, redis_url=url))
        print("base = the working tree in memory, work = the working tree with REDIS_URL")
        print("\n".join(lines))
        return
    if args.auth:
        _uvloop()
        lines = asyncio.run(compare(ROOT, args, auth=True))
        print("base = the working tree without API keys, work = with one (--auth)")
        print("\n".join(lines))
        return
    if args.rev is None:
        parser.error("name a revision, or --redis, or --auth")
    worktree = Path(tempfile.mkdtemp(prefix="toolforge-ab-rev-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(worktree), args.rev],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        _uvloop()
        lines = asyncio.run(compare(worktree, args))
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
