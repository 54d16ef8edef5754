"""A gateway of several worker processes for the load benches, and the probes that read
its CPU and memory as one.

``toolforge serve --workers N`` (docs/deployment.md, Workers) needs Redis: each worker is a
replica of its own. :func:`redis_server` starts a ``redis-server`` of the bench's own on a
free loopback port (no persistence, its files in a scratch directory); :func:`spawn_workers`
starts the gateway exactly as a user would, with ``REDIS_URL`` pointing at it. The
process tree (the parent that holds the socket, the N workers, and whatever they start)
is measured as one gateway: :func:`tree_cpu_seconds` and :func:`tree_rss_kb` sum
``/proc`` over every process under the parent, so that one worker and N workers read the
same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench._procs import CLK_TCK, Proc, free_port

__all__ = [
    "redis_server",
    "settle_tree",
    "spawn_workers",
    "tree_cpu_seconds",
    "tree_pids",
    "tree_rss_kb",
]


def tree_pids(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _cpu(pid: int) -> float:
    # A process that has just exited counts nothing more.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    return 0.0


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of ``root`` and every process below it, all threads, in seconds."""
    return sum(_cpu(pid) for pid in tree_pids(root))


def tree_rss_kb(root: int, pids: list[int] | None = None) -> int:
    """The resident memory of ``root`` and every process below it, KB (``pids``: that
    tree as :func:`tree_pids` found it, for a sampler that reads it often)."""
    total = 0
    for pid in tree_pids(root) if pids is None else pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    total += int(line.split()[1])
                    break
    return total


def settle_tree(root: int, limit_s: float = 15.0) -> float:
    """The tree's CPU seconds once it stops using CPU (two still 100 ms samples)."""
    deadline = time.monotonic() + limit_s
    last, still = tree_cpu_seconds(root), 0
    while still < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = tree_cpu_seconds(root)
        still = still + 1 if now == last else 0
        last = now
    return last


class _Server(Proc):
    """A child process that is not one of ``bench._procs``' servers."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str]) -> None:
        self.name = name
        self.port = port
        self.stderr = tempfile.TemporaryFile()
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env={**os.environ, **env},
        )


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A ``redis-server`` of the bench's own; yields its URL, stops it on exit."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise SystemExit("--workers > 1 needs redis-server (apt-get install redis-server)")
    workdir = Path(tempfile.mkdtemp(prefix="toolforge-load-redis-"))
    port = free_port()
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly"]
    argv += ["no", "--dir", str(workdir), "--logfile", str(workdir / "redis.log")]
    proc = _Server("redis-server", argv, port, {})
    try:
        proc.wait_listening()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def spawn_workers(
    upstream_url: str, artifacts: Path, workers: int, redis_url: str, env: dict[str, str]
) -> Proc:
    """``toolforge serve --workers N`` in front of ``upstream_url``, with Redis; ``env``:
    more settings. Returns once the port accepts connections and every worker answers."""
    port = free_port()
    toolforge = str(Path(sys.executable).with_name("toolforge"))
    argv = [toolforge, "serve", "--port", str(port), "--workers", str(workers)]
    argv += ["--upstream", upstream_url]
    settings = {
        "ARTIFACTS_DIR": str(artifacts),
        "REDIS_URL": redis_url,
        "LOG_LEVEL": "WARNING",
        **env,
    }
    proc = _Server(f"gateway ×{workers}", argv, port, settings)
    try:
        proc.wait_listening(timeout_s=60.0)
        # The parent binds the port before the workers start: wait for them all.
        deadline = time.monotonic() + 60.0
        while len(tree_pids(proc.pid)) <= workers and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:
        proc.stop()
        raise
    return proc
