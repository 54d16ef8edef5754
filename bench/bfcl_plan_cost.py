"""What the proxy's plain-request rules cost per request, on BFCL ``simple_python``'s 400.

Run with ``python -m bench.bfcl_plan_cost [--rev REV] [--rounds 3]``. Each case's body (as
``bench.bfcl`` sends it) is planned by the gateway's own planner on a ``llama_server``
upstream, as the proxy's route plans it (the user's message read, the function narrowed
by provenance, the first turn's grammar written), in one process, ``--rounds`` times; the
times are this process's CPU time per request (the machine's other load does not add to
it). It prints p50, p95 and max, and the grammar's size.

The model is not involved: this is the cost the rules add before the first token is asked
for, the number docs/proxy.md and bench/RESULTS.md quote beside the accuracy the rules buy.
``--rev`` plans with that commit's code (``bench.bfcl.code_at``), so two revisions compare
in one sitting: run it once per revision.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.bfcl import ROOT, code_at, data_dir, load_cases, request_body


async def measure(rounds: int, limit: int | None = None) -> dict[str, Any]:
    """Each case's plan ``rounds`` times (the first ``limit`` cases): CPU ms per request
    (p50, p95, max) and the first turn's grammar size."""
    from tests.runtime.plan_cases import plan_proxy, planner

    cases = load_cases(data_dir())[:limit]
    p = planner("llama_server")
    times: list[float] = []
    sizes: list[int] = []
    for round_ in range(rounds):
        for case in cases:
            body = request_body(case, "m")
            start = time.process_time()
            plan = await plan_proxy(p, body)
            asked = plan.mode.turn_request(
                plan.chat, plan.chat.messages, seen_ids=set(), tools_left=True
            )
            times.append(time.process_time() - start)
            if round_ == 0:
                sizes.append(len(asked.extra.get("grammar", "")))
    times.sort()
    return {
        "requests": len(times),
        "p50_ms": round(statistics.median(times) * 1e3, 2),
        "p95_ms": round(times[int(len(times) * 0.95)] * 1e3, 2),
        "max_ms": round(times[-1] * 1e3, 2),
        "grammar_p50_chars": int(statistics.median(sizes)),
        "grammar_max_chars": max(sizes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rev", help="plan with this git revision's code (e.g. HEAD~1)")
    parser.add_argument("--rounds", type=int, default=3, help="times each case is planned")
    parser.add_argument("--limit", type=int, help="the first N cases only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.rounds, args.limit))))
        return
    with code_at(args.rev) as (env, code):
        child = subprocess.run(
            [
                *(sys.executable, "-m", "bench.bfcl_plan_cost", "--child"),
                *("--rounds", str(args.rounds)),
                *(() if args.limit is None else ("--limit", str(args.limit))),
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
        )
    if child.returncode:
        sys.exit(child.stderr[-4000:])
    out = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"code {code}, load average {os.getloadavg()[0]:.2f}: {json.dumps(out)}")


if __name__ == "__main__":
    main()
