"""Run conformance cases against live gateways and say, for each, what went wrong.

Each case gets its own gateway: ``create_app`` with the case's settings, served by
uvicorn on an ephemeral loopback port, in front of its own scripted upstream (or the real
model server given to the runner), with a fresh tool registry and artifacts directory.
Nothing is shared between cases, so their order does not matter and one case cannot
make another pass or fail. Starting a gateway costs a few milliseconds; the suite's time
goes into the streams themselves.

A case ends in one of four states:

* ``passed``: the invariants and the case's expectations all hold;
* ``failed``: something does not hold (the messages say what), or the case file is
  broken, or it documents a known bug that no longer shows (so the file gets updated);
* ``known_bug``: the case documents a gateway bug (``known_bug`` in the file) and it
  failed the way that bug makes it fail;
* ``not_run``: it needs a real model server and none was given. Never counted as passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import httpx

from toolforge.eval.conformance.case import Case
from toolforge.eval.conformance.checks import (
    Findings,
    check_artifacts,
    check_expectations,
    check_stream,
)
from toolforge.eval.conformance.client import Observation, Stream, drive, frame_dicts, run_followups
from toolforge.eval.conformance.tool_pack import conformance_registry
from toolforge.eval.loopback import Harness, start_gateway
from toolforge.settings import Settings

__all__ = ["CaseResult", "RealUpstream", "Status", "run_case", "run_cases"]

Status = Literal["passed", "failed", "known_bug", "not_run"]

# The scripted upstream answers at once, so a stuck stream is a failure within seconds.
_SCRIPTED_TIMEOUTS: Final = {"first_byte_s": 2.0, "idle_s": 2.0}
# A real model on a CPU may take a while to process the prompt.
_REAL_TIMEOUTS: Final = {"first_byte_s": 120.0, "idle_s": 60.0}
_SETTING_NAMES: Final = frozenset(Settings.model_fields) | {"first_byte_s", "idle_s"}
_SETTLE_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class RealUpstream:
    """A real OpenAI-compatible model server for the ``"upstream": "real"`` cases."""

    base_url: str  # ending in /v1
    model: str | None = None
    api_key: str | None = None
    kind: str = "openai"  # UPSTREAM_KIND: "llama_server" allows constrained mode


@dataclass
class CaseResult:
    """What running one case gave."""

    name: str
    category: str
    description: str
    status: Status
    failures: list[str] = field(default_factory=list)
    duration_ms: float = 0.0
    frames: list[dict[str, Any]] = field(default_factory=list)  # the main stream
    schema_failures: int = 0
    note: str | None = None  # why not run, or the known bug

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        """The matrix entry (frames are written separately, for failures only)."""
        return {
            "name": self.name,
            "category": self.category,
            "description": self.description,
            "status": self.status,
            "duration_ms": round(self.duration_ms, 1),
            "failures": self.failures,
            "schema_failures": self.schema_failures,
            "note": self.note,
        }


def _gateway_settings(case: Case, real: RealUpstream | None) -> dict[str, Any]:
    unknown = set(case.settings) - _SETTING_NAMES
    if unknown:
        names = "Settings fields, first_byte_s, idle_s"
        raise ValueError(f"unknown settings {sorted(unknown)} ({names})")
    settings: dict[str, Any] = {"log_level": "ERROR"}
    if real is None:
        settings.update(_SCRIPTED_TIMEOUTS)
    else:
        settings.update(_REAL_TIMEOUTS, upstream_base_url=real.base_url, upstream_kind=real.kind)
        if real.model is not None:
            settings["model_id"] = real.model
        if real.api_key is not None:
            settings["upstream_api_key"] = real.api_key
    settings.update(case.settings)
    return settings


def _check_streams(case: Case, gw: Harness, obs: Observation, findings: Findings) -> None:
    streams: list[tuple[str, Stream]] = []
    if obs.main is not None and obs.status == 200:
        streams.append(("", obs.main))
    streams += [(f"stream {i}: ", s) for i, s in enumerate(obs.others, start=2)]
    scripts = None if case.real else case.script_texts
    tools = gw.gateway.executor.registry
    for label, stream in streams:
        for problem in stream.problems:
            findings.fail(f"{label}wire: {problem}")
        for event in stream.events:
            if (event.event == "ping") == bool(event.id):
                findings.fail(f"{label}wire: {event.event} {'has' if event.id else 'lacks'} an id")
        numbered = frame_dicts(stream.events)
        check_stream(numbered, case.request, findings, script_texts=scripts, label=label)
        if stream.stream_id is not None and numbered:
            run = gw.artifacts / "runs" / stream.stream_id
            check_artifacts(run, numbered, findings, tools=tools, label=label)


async def _run(
    case: Case, real: RealUpstream | None, workdir: Path, obs: Observation, findings: Findings
) -> None:
    settings = _gateway_settings(case, real)
    async with contextlib.AsyncExitStack() as stack:
        gw = await start_gateway(
            stack,
            workdir,  # the gateway's ARTIFACTS_DIR: runs/<stream_id>/ go here
            [] if case.upstream is None else case.upstream,
            tools=conformance_registry(with_pack=real is None),
            routes=dict(case.routes) or None,
            # A real model may think for longer than any fixed read timeout; the case's
            # own timeout_s bounds the whole case instead.
            client_timeout=10.0 if real is None else httpx.Timeout(10.0, read=None),
            **settings,
        )
        await drive(gw, case, obs)
        try:
            await gw.settle(
                upstream_closed=bool(case.expect.get("upstream_closed")), timeout_s=_SETTLE_S
            )
        except TimeoutError:
            findings.fail(f"streams still running (or upstream open) {_SETTLE_S} s after the end")
        await run_followups(gw, case, obs)
        findings.failures += obs.failures
        _check_streams(case, gw, obs, findings)
        main = obs.main if obs.status == 200 else None
        stream_id = main.stream_id if main is not None else None
        check_expectations(
            case,
            status=obs.status,
            error_body=obs.error_body,
            frames=frame_dicts(main.events) if main is not None else [],
            upstream_requests=gw.upstream.requests,
            run=gw.artifacts / "runs" / stream_id if stream_id else None,
            timings=obs.timings,
            findings=findings,
        )


async def run_case(
    case: Case, *, real_upstream: RealUpstream | None = None, workdir: Path | None = None
) -> CaseResult:
    """Run one case on a fresh gateway; never raises for anything the case does."""
    result = CaseResult(case.name, case.category, case.description, "failed")
    if case.error is not None:
        result.failures.append(f"case file: {case.error}")
        return result
    if case.real and real_upstream is None:
        result.status = "not_run"
        result.note = "needs a real model server (toolforge conformance --real-upstream URL)"
        return result
    obs, findings = Observation(), Findings()
    started = time.perf_counter()
    with contextlib.ExitStack() as cleanup:
        if workdir is None:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tf-conf-")))
        try:
            async with asyncio.timeout(case.timeout_s):
                await _run(case, real_upstream if case.real else None, workdir, obs, findings)
        except TimeoutError:
            findings.fail(f"the case did not finish within {case.timeout_s:g} s")
        except Exception as exc:  # the runner reports; a crash here must not stop the suite
            findings.fail(f"the runner failed: {type(exc).__name__}: {exc}")
    result.duration_ms = (time.perf_counter() - started) * 1000
    result.failures = findings.failures
    result.schema_failures = findings.schema_failures
    result.frames = frame_dicts(obs.main.events) if obs.main is not None else []
    if case.known_bug is None:
        result.status = "failed" if result.failures else "passed"
    elif result.failures:
        result.status, result.note = "known_bug", case.known_bug
    else:
        result.failures = [
            f"documented as a known bug ({case.known_bug}), but it passes now: "
            "drop known_bug from the case"
        ]
    return result


async def run_cases(
    cases: Iterable[Case],
    *,
    real_upstream: RealUpstream | None = None,
    workdir: Path | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` one after the other (each on its own gateway); report each to
    ``on_result`` as it finishes. ``workdir`` keeps the gateways' artifacts
    (``<workdir>/<case>/runs/<stream_id>/``); by default each case's go to a temporary
    directory that is removed afterwards."""
    results = []
    for case in cases:
        where = workdir / case.name if workdir is not None else None
        result = await run_case(case, real_upstream=real_upstream, workdir=where)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
