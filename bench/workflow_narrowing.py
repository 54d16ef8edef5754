"""Workflow narrowing: does SmolLM2-135M book a place the search returned?

The target (docs/workflows.md): on the embedded model, the booking workflow
(``workflows/book_a_table.json``) books an id that ``places.search`` returned in ≥ 90 % of
20 runs when its argument-matched prerequisite narrows constrained mode's grammar
(``place_id`` reduced to the ids the search's results hold).

Run with ``python -m bench.workflow_narrowing`` (``--runs N``, ``--wide-runs N``, ``--arms``).
One gateway, the embedded default (``toolforge obtain``'s llama-server and model, started
by the ServerManager), in this process; each run is the README's demo request with
``"workflow": "book_a_table"``, ``mode: constrained``, the ``demo`` profile (temperature
0.2, max_tokens 384) and seed = the run's number, so the two arms see the same seeds:

* ``narrow``: the workflow as shipped (``narrow: true``);
* ``wide``: the same workflow inline with ``narrow: false``: the grammar keeps the
  schema's own ``place_id`` (a slug pattern), the runner still refuses a made-up id with a
  ``step.nudge`` and the model may try again.

Per run: the first booking attempt's ``place_id`` (was it an id the search returned?), and
whether the workflow ended with a booking of such an id (``done.reason`` stop). Prints
the rates and a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from toolforge.api.app import create_app
from toolforge.eval.loopback import Event, Served, serve
from toolforge.settings import Settings
from toolforge.tools.places import load_places

__all__ = ["main", "run_arm"]

PROMPT = "Find pizza near me; book a table for 2 at 7pm if open."
ASKED = {"time": "19:00", "party_size": 2}  # what PROMPT asks for
# ... and where: a place that serves pizza (the fixture's tags say which).
PIZZA = frozenset(p.id for p in load_places() if "pizza" in p.tags)


def _request(arm: str, seed: int, workflow: dict[str, Any]) -> dict[str, Any]:
    flow: object = "book_a_table"
    if arm == "wide":
        flow = {k: v for k, v in workflow.items() if k != "source"} | {"narrow": False}
    return {
        "input": PROMPT,
        "workflow": flow,
        "mode": "constrained",
        "profile": "demo",  # temperature 0.2, max_tokens 384, as the README's request
        "sampling": {"seed": seed},
    }


def _judge(events: list[Event]) -> dict[str, Any]:
    ids: set[str] = set()
    searches: list[str] = []  # each search's query and how many places it returned
    first: str | None = None
    booked: str | None = None
    booking: dict[str, Any] = {}
    calls: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.event == "tool.call":
            calls[event.data["id"]] = event.data
        if (
            event.event == "tool.result"
            and not event.data["ok"]
            and event.data["name"] == "places.search"
        ):
            error = event.data.get("error") or {}
            searches.append(f"error {error.get('code')}: {str(error.get('message'))[:80]}")
        if (
            event.event == "tool.result"
            and event.data["ok"]
            and event.data["name"] == "places.search"
        ):
            ids |= {p["id"] for p in event.data["result"]["places"]}
            found = event.data["result"]
            searches.append(f"{found.get('query')!r}: {found.get('count')}")
        if event.event == "tool.result" and event.data["name"] == "bookings.create":
            call = calls.get(event.data["id"])
            place = call["args"].get("place_id") if call is not None else None
            if first is None:
                first = place if place is not None else "(refused before running)"
        if event.event == "step.nudge" and first is None and event.data["kind"] == "prerequisite":
            first = "(made up: refused)"
        if event.event == "result.end":
            booking = event.data["value"]
            booked = booking.get("place_id")
    done = next(e.data for e in events if e.event == "done")
    errors = [e.data["code"] for e in events if e.event == "error"]
    return {
        "error": errors[0] if errors else None,
        "searches": searches,
        "first": first,
        "first_ok": first in ids,
        "booked": booked,
        "at": [booking.get("time"), booking.get("party_size")] if booking else None,
        "ok": done["reason"] == "stop" and booked in ids,
        "as_asked": done["reason"] == "stop"
        and booked in ids
        and all(booking.get(k) == v for k, v in ASKED.items()),
        "pizza": done["reason"] == "stop" and booked in PIZZA,
        "reason": done["reason"],
        "iterations": (done.get("workflow") or {}).get("iterations"),
        "nudges": (done.get("workflow") or {}).get("nudges"),
    }


async def run_arm(
    served: Served, arm: str, runs: int, concurrency: int = 2
) -> list[dict[str, Any]]:
    """``runs`` runs of ``arm``, ``concurrency`` at a time (llama-server's slots)."""
    listed = (await served.client.get(f"{served.url}/v1/workflows")).json()["workflows"]
    workflow = next(w for w in listed if w["name"] == "book_a_table")
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> dict[str, Any]:
        async with gate:
            started = time.perf_counter()
            events = await served.stream(_request(arm, seed, workflow))
            verdict = _judge([e for e in events if e.event != "ping"])
            verdict["seed"] = seed
            verdict["seconds"] = round(time.perf_counter() - started, 1)
            print(arm, orjson.dumps(verdict).decode(), flush=True)
            return verdict

    return list(await asyncio.gather(*(one(seed) for seed in range(1, runs + 1))))


async def _main(runs: dict[str, int], arms: list[str]) -> None:
    for name in ("UPSTREAM_BASE_URL", "MODEL_ID", "UPSTREAM_KIND"):
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory() as tmp:
        # The timeouts: a loaded 2-CPU machine (other jobs beside) reads a prompt in minutes
        # and generates a few tokens a second; a call's arguments can take longer than
        # FRAME_TIMEOUT_MS's default 15 s (the token limit still ends a turn).
        settings = Settings(
            artifacts_dir=Path(tmp),
            log_level="WARNING",
            log_json=False,
            frame_timeout_ms=600_000,
            upstream_first_byte_timeout_s=900,
            upstream_idle_timeout_s=300,
            llama_nice=0,  # not below the other jobs of a shared machine: it is the bench
        )
        app = create_app(settings)
        async with serve(app, start_timeout_s=300) as url, httpx.AsyncClient(timeout=600) as client:
            served = Served(url, app, client, Path(tmp))
            results = {arm: await run_arm(served, arm, runs[arm]) for arm in arms}
    day = time.strftime("%Y-%m-%d")
    print()
    print(f"### Booking workflow on SmolLM2-135M ({day})")
    print()
    print(
        f"`python -m bench.workflow_narrowing --runs {runs['narrow']} --wide-runs "
        f"{runs['wide']}` on {platform.machine()}, {os.cpu_count()} CPUs; constrained mode, "
        "the demo profile (temperature 0.2), seeds 1..N."
    )
    print()
    print(
        "| arm | runs | first booking uses a searched id | workflow ends with a searched id "
        "| ... at 19:00 for 2, as asked | ... a pizza place | median iterations | nudges |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arm, rows in results.items():
        n = len(rows)
        first = sum(r["first_ok"] for r in rows)
        ok = sum(r["ok"] for r in rows)
        asked = sum(r["as_asked"] for r in rows)
        pizza = sum(r["pizza"] for r in rows)
        its = sorted(r["iterations"] or 0 for r in rows)
        nudges = sum(r["nudges"] or 0 for r in rows)
        print(
            f"| {arm} | {n} | {first}/{n} ({100 * first / n:.0f} %) | {ok}/{n} "
            f"({100 * ok / n:.0f} %) | {asked}/{n} | {pizza}/{n} | {its[len(its) // 2]} "
            f"| {nudges} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of the narrow arm")
    parser.add_argument("--wide-runs", type=int, default=20, help="runs of the wide arm")
    parser.add_argument("--arms", default="narrow,wide")
    args = parser.parse_args()
    runs = {"narrow": args.runs, "wide": args.wide_runs}
    asyncio.run(_main(runs, args.arms.split(",")))


if __name__ == "__main__":
    main()
