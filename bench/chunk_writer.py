"""The proxy's per-token writer, A/B: ``ChunkWriter.batch`` of a git revision against the
working tree's, in one process, taking turns.

Run with ``python -m bench.chunk_writer REV`` (e.g. ``HEAD~1``). ``bench.ab`` compares
whole gateways on ``/v1/stream``; this compares the one function the proxy runs per
``text.delta`` (toolforge.core.protocol.openai), where a change too small for a whole
gateway's noise would still show: ns per ``text.delta`` frame, in batches of 8 as the frame
log hands them over, median and minimum of rounds that alternate which side goes first.
``--workflow`` times the working tree's writer in workflow mode (text held back) too.

Never writes RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from toolforge.core.protocol import openai as work

ROOT = Path(__file__).resolve().parent.parent
MODULE = "app/core/protocol/openai.py"


def _revision(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:{MODULE}"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="toolforge-bench-")) / "openai_rev.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("openai_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _writer(module: ModuleType, **extra: Any) -> Any:
    return module.ChunkWriter(
        stream_id="s_bench",
        completion_id="chatcmpl-bench",
        created=0,
        model="m",
        include_usage=False,
        mode="native",
        **extra,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", default="HEAD", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=20_000, help="per round and side")
    parser.add_argument("--workflow", action="store_true")
    args = parser.parse_args()
    batch = b"".join(
        b"id: %d\nevent: text.delta\ndata: %s\n\n" % (i, orjson.dumps({"chunk": f"tok{i} "}))
        for i in range(8)
    )
    writers = {args.rev: _writer(_revision(args.rev)), "work": _writer(work)}
    if args.workflow:
        writers["work (workflow)"] = _writer(work, workflow=True)
    ns: dict[str, list[float]] = {name: [] for name in writers}
    for r in range(args.rounds):
        order = list(writers) if r % 2 else list(reversed(writers))
        for name in order:
            write = writers[name].batch
            start = time.perf_counter()
            for _ in range(args.batches):
                write(batch)
            ns[name].append((time.perf_counter() - start) / args.batches / 8 * 1e9)
    base = statistics.median(ns[args.rev])
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds x {args.batches} batches of 8")
    for name, values in ns.items():
        median = statistics.median(values)
        print(
            f"{name:18} ns per text.delta: median {median:6.1f}  min {min(values):6.1f}  "
            f"ratio to {args.rev}: {median / base:.3f}"
        )


if __name__ == "__main__":
    main()
