"""BFCL ``simple_python`` through the gateway's proxy, beside llama-server alone.

Run with ``python -m bench.bfcl`` (``make bench-bfcl``). The cases are the Berkeley
Function-Calling Leaderboard's ``simple_python`` category, all 400 of them, from the
``bfcl-eval`` wheel's data (fetched from PyPI into the cache once, as the schema corpus
tests fetch it: ``tests/corpora.py``). Each case is one user question and one Python
function that answers it; ``possible_answer`` lists, per parameter, every value accepted.

The gateway runs as ``make run`` serves it: ``toolforge serve`` with no
``UPSTREAM_BASE_URL``, so it starts its embedded default, a managed llama-server with
SmolLM2-135M. Each case goes, with the same body (the question as ``messages``, the
function as the one tool, the default ``tool_choice``, temperature 0, a fixed seed,
``max_tokens`` bounded), to two arms:

* ``proxy``: the gateway's ``POST /v1/chat/completions``, every guardrail at its default;
* ``alone``: that same llama-server's own ``POST /v1/chat/completions``.

The function is offered as bfcl-eval offers it to an OpenAI-style endpoint: its types in
JSON Schema's words (``dict`` → ``object``, ``float`` → ``number`` with ``format: float``
and a note in the description, ``tuple`` → ``array``), " Note that the provided function
is in Python 3 syntax." after its description, and ``.`` in its name written ``_`` (OpenAI
names allow no dot: ``math.factorial`` is offered as ``math_factorial``; the checker maps
it back).

Two scores per arm, over every case (a reply that is not a call fails both):

* **parse rate**: the reply holds exactly one tool call, to the offered function, whose
  arguments are a JSON object carrying every ``required`` parameter;
* **AST accuracy**: bfcl-eval's own AST verdict against the possible answers
  (``bench/bfcl_checker.py``: a port of its Python rules, since its checker module imports
  every model vendor's SDK).

``--rev REV`` serves the gateway from that commit (``git archive`` into a temporary
directory, put first on ``PYTHONPATH``), not from the working tree, so that a result
names the code it measured while others edit the checkout. ``--out`` writes one JSON line
per case and arm (what came back and its verdict); by default under ``bench/results/``.
A full run (no ``--limit``) replaces this bench's section of bench/RESULTS.md.

Temperature 0 is greedy decoding, but not bit-for-bit repeatable on llama.cpp (a cached
prompt can sample differently from a fresh one: tests/integration/test_determinism.py),
so a case near its tipping point can flip between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import httpx

from bench._results import load_average, write_section
from bench.bfcl_checker import check_simple

__all__ = [
    "Case",
    "Verdict",
    "data_dir",
    "load_cases",
    "main",
    "openai_tool",
    "request_body",
    "score",
]

ROOT: Final = Path(__file__).resolve().parents[1]
RESULTS_DIR: Final = ROOT / "bench" / "results"
HEADING: Final = "## BFCL simple_python (bench/bfcl.py)"
CATEGORY: Final = "BFCL_v4_simple_python.json"
CASES: Final = 400  # the category's size in bfcl-eval's data
SEED: Final = 7
MAX_TOKENS: Final = 256  # a call is under 100 tokens; prose stops here (bounds each request)
TIMEOUT_S: Final = 300.0  # one request, a nudge included, on a loaded 2-core machine
READY_S: Final = 900.0  # the first start builds llama-server and fetches the model
ARMS: Final = ("proxy", "alone")
TARGETS: Final = {"parsed": 0.98, "accurate": 0.50}  # what the proxy aims for on this model
PYTHON_HINT: Final = " Note that the provided function is in Python 3 syntax."

# bfcl-eval's GORILLA_TO_OPENAPI: BFCL's type names in JSON Schema's words.
_OPENAPI_TYPES: Final = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}
# What the gateway must not inherit: it would then serve another upstream, not the embedded default.
_UPSTREAM_ENV: Final = ("UPSTREAM_BASE_URL", "GROQ_BASE_URL", "MODEL_ID", "UPSTREAM_KIND")


# -- the data ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One BFCL case: the question, the function (BFCL's dialect) and the possible answer
    (``{name: {parameter: [accepted values]}}``)."""

    id: str
    messages: list[dict[str, Any]]
    function: dict[str, Any]
    answer: dict[str, dict[str, list[Any]]]


def data_dir() -> Path:
    """bfcl-eval's ``data`` folder, downloaded into the cache the first time."""
    from tests.corpora import bfcl_data  # the one place that knows the wheel and its cache

    return bfcl_data()


def load_cases(data: Path) -> list[Case]:
    """Every ``simple_python`` case of ``data`` (bfcl-eval's data folder), in file order,
    each with its possible answer."""
    answers: dict[str, dict[str, Any]] = {}
    for entry in _json_lines(data / "possible_answer" / CATEGORY):
        (answers[entry["id"]],) = entry["ground_truth"]  # simple: exactly one call
    cases = []
    for entry in _json_lines(data / CATEGORY):
        (messages,) = entry["question"]  # simple: one turn
        (function,) = entry["function"]
        cases.append(Case(entry["id"], messages, function, answers[entry["id"]]))
    return cases


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def offered_name(function: Mapping[str, Any]) -> str:
    """The name the function is offered under (OpenAI names allow no ``.``)."""
    return str(function["name"]).replace(".", "_")


def openai_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """``function`` as bfcl-eval offers it to an OpenAI-style endpoint (its
    ``convert_to_tool`` and ``_func_doc_language_specific_pre_processing`` for Python)."""
    fn = copy.deepcopy(dict(function))
    fn["name"] = offered_name(function)
    fn["description"] = fn.get("description", "") + PYTHON_HINT
    params = fn["parameters"]
    params["type"] = "object"
    params["properties"] = _openapi_properties(params.get("properties", {}))
    return {"type": "function", "function": fn}


def _openapi_properties(properties: dict[str, Any]) -> dict[str, Any]:
    for value in properties.values():
        kind = value.get("type")
        if kind is None:
            value["type"] = "string"
        else:
            if kind == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = _OPENAPI_TYPES.get(kind, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _openapi_properties(value["properties"])
            elif "items" in value:
                items = value["items"]
                items["type"] = _OPENAPI_TYPES.get(items.get("type", "string"), "string")
                if items["type"] == "array" and "items" in items:
                    inner = items["items"]
                    inner["type"] = _OPENAPI_TYPES.get(inner.get("type", "string"), "string")
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _openapi_properties(items["properties"])
    return properties


def request_body(case: Case, model: str) -> dict[str, Any]:
    """The body both arms get for ``case``."""
    return {
        "model": model,
        "messages": case.messages,
        "tools": [openai_tool(case.function)],
        "temperature": 0,
        "seed": SEED,
        "max_tokens": MAX_TOKENS,
    }


# ``--guardrail NAME=off``: the proxy arm's body switches these guardrails off
# (``toolforge.guardrails``, docs/proxy.md), e.g. provenance=off for its ablation.
GUARDRAILS_OFF: dict[str, bool] = {}


# -- the scores -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """Both scores of one reply; ``reason``: the first thing that failed ("" if none)."""

    parsed: bool
    accurate: bool
    reason: str = ""


def score(case: Case, message: Mapping[str, Any] | None) -> Verdict:
    """The verdict on ``message`` (the reply's ``choices[0].message``; None: no reply)."""
    if message is None:
        return Verdict(False, False, "no reply")
    calls = message.get("tool_calls") or []
    if not calls:
        return Verdict(False, False, "no call" + (": text" if message.get("content") else ""))
    offered = offered_name(case.function)
    decoded: list[dict[str, Any]] = []
    problem = ""
    for call in calls:
        fn = call.get("function") or {}
        name, args = fn.get("name"), _arguments(fn.get("arguments"))
        if not isinstance(args, dict):
            problem = problem or (
                "arguments not JSON" if args is None else "arguments not an object"
            )
            continue
        decoded.append({case.function["name"] if name == offered else str(name): args})
    if len(calls) != 1:
        reason = f"{len(calls)} calls"
    elif problem:
        reason = problem
    elif calls[0].get("function", {}).get("name") != offered:
        reason = f"called {calls[0].get('function', {}).get('name')!r}"
    else:
        args = next(iter(decoded[0].values()))
        missing = [p for p in case.function["parameters"].get("required", []) if p not in args]
        reason = f"missing required {', '.join(missing)}" if missing else ""
    parsed = not reason
    if problem:  # bfcl-eval cannot decode such a reply: not accurate
        return Verdict(parsed, False, reason)
    check = check_simple(case.function, decoded, case.answer)
    return Verdict(parsed, check.valid, reason or ("" if check.valid else check.error_type))


def _arguments(raw: object) -> object:
    """A call's arguments: the JSON string decoded (None when it is not JSON)."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


# -- the gateway ------------------------------------------------------------------------


@contextlib.contextmanager
def code_at(rev: str | None) -> Iterator[tuple[dict[str, str], str]]:
    """The environment that makes a child import ``toolforge`` from ``rev`` (the working
    tree when None), and the code's name for the report."""
    git = ["git", "-C", str(ROOT)]
    if rev is None:
        head = _git_out([*git, "rev-parse", "--short", "HEAD"])
        dirty = _git_out([*git, "status", "--porcelain", "app", "tools", "prompts", "schemas"])
        yield {}, head + (" + uncommitted changes (working tree)" if dirty else "")
        return
    commit = _git_out([*git, "rev-parse", "--short", f"{rev}^{{commit}}"])
    with tempfile.TemporaryDirectory(prefix="toolforge-bfcl-rev-") as tmp:
        src, shim = Path(tmp) / "src", Path(tmp) / "shim" / "toolforge"
        src.mkdir()
        shim.mkdir(parents=True)
        paths = ["app", "tools", "prompts", "schemas", "workflows"]
        archive = subprocess.run(
            [*git, "archive", "--format=tar", commit, *paths], capture_output=True, check=True
        )
        with tarfile.open(fileobj=_bytes_io(archive.stdout)) as tar:
            tar.extractall(src, filter="data")
        # The editable install maps toolforge to app/ (and its data packages to their
        # folders); a package of links on PYTHONPATH comes first on sys.path.
        for entry in (src / "app").iterdir():
            (shim / entry.name).symlink_to(entry)
        for data in paths[1:]:
            if (src / data).is_dir():
                (shim / data).symlink_to(src / data)
        yield {"PYTHONPATH": str(shim.parent)}, commit


def _bytes_io(data: bytes) -> IO[bytes]:
    import io

    return io.BytesIO(data)


def _git_out(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()


@dataclass(slots=True)
class Gateway:
    """A ``toolforge serve`` process on the embedded default, and its llama-server."""

    url: str
    server_url: str
    model: str
    server: dict[str, Any]


@contextlib.asynccontextmanager
async def embedded_gateway(env: Mapping[str, str], artifacts: Path) -> Any:
    """Start ``toolforge serve`` (no upstream: the embedded default) and wait until it is
    ready; yields a :class:`Gateway`. On exit the gateway is stopped, and with it its
    llama-server (ended by pid if it outlives the gateway)."""
    from bench._procs import free_port

    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in _UPSTREAM_ENV}
    child_env.update(ARTIFACTS_DIR=str(artifacts), LOG_LEVEL="WARNING", **env)
    script = Path(sys.executable).with_name("toolforge")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "toolforge.cli"]
    argv += ["serve", "--host", "127.0.0.1", "--port", str(port)]
    log = tempfile.TemporaryFile()
    # Started once per run, before any request: the blocking call costs nothing measured.
    proc = subprocess.Popen(  # noqa: ASYNC220
        argv, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    server_pid: int | None = None
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            deadline = time.monotonic() + READY_S
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-3000:]
                    raise RuntimeError(f"the gateway exited with {proc.returncode}:\n{tail}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway was not ready within {READY_S:.0f} s")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{url}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.5)
            servers = (await client.get(f"{url}/v1/servers")).json()["servers"]
        (server,) = [s for s in servers if s.get("backend") == "llama-server"]
        server_pid = server.get("pid")
        yield Gateway(url, str(server["base_url"]), str(server["model"]), server)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if server_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server_pid, signal.SIGTERM)


# -- the run ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One case on one arm: what came back and its verdict (a line of the JSONL)."""

    id: str
    arm: str
    verdict: Verdict
    seconds: float
    status: int | None
    message: dict[str, Any] | None
    finish_reason: str | None
    error: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "arm": self.arm,
            "parsed": self.verdict.parsed,
            "accurate": self.verdict.accurate,
            "reason": self.verdict.reason,
            "seconds": round(self.seconds, 3),
            "status": self.status,
            "finish_reason": self.finish_reason,
            "content": (self.message or {}).get("content"),
            "tool_calls": (self.message or {}).get("tool_calls"),
            "error": self.error,
        }


Judge = Callable[[Case, Mapping[str, Any] | None], Verdict]


async def ask(
    client: httpx.AsyncClient,
    url: str,
    arm: str,
    case: Case,
    model: str,
    *,
    judge: Judge = score,
) -> Record:
    """Send ``case`` to ``url`` (an arm's chat completions) and judge the reply (``judge``:
    this category's rules; :func:`score` for ``simple_python``)."""
    started = time.perf_counter()
    status: int | None = None
    try:
        body = request_body(case, model)
        if arm == "proxy" and GUARDRAILS_OFF:
            body["toolforge"] = {"guardrails": dict(GUARDRAILS_OFF)}
        try:
            response = await client.post(url, json=body)
        except httpx.RemoteProtocolError:  # a kept-alive connection closed just then: again
            response = await client.post(url, json=body)
        status = response.status_code
        reply = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        took = time.perf_counter() - started
        error = f"{type(exc).__name__}: {exc}"
        return Record(case.id, arm, Verdict(False, False, "error"), took, status, None, None, error)
    took = time.perf_counter() - started
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if status != 200 or not choices:
        error = json.dumps(reply)[:500]
        verdict = Verdict(False, False, f"HTTP {status}")
        return Record(case.id, arm, verdict, took, status, None, None, error)
    message = choices[0].get("message") or {}
    verdict = judge(case, message)
    return Record(case.id, arm, verdict, took, status, message, choices[0].get("finish_reason"), "")


async def measure(
    cases: Sequence[Case],
    gateway: Gateway,
    concurrency: int,
    out: IO[str],
    arms: Sequence[str] = ARMS,
) -> dict[str, list[Record]]:
    """Every case on each of ``arms`` (in alternating order, ``concurrency`` cases at once);
    each record is written to ``out`` as it comes."""
    urls = {
        "proxy": f"{gateway.url}/v1/chat/completions",
        "alone": f"{gateway.server_url}/v1/chat/completions",
    }
    records: dict[str, dict[str, Record]] = {arm: {} for arm in arms}
    gate = asyncio.Semaphore(concurrency)
    done = 0
    timeout = httpx.Timeout(TIMEOUT_S, connect=10)
    limits = httpx.Limits(max_connections=2 * concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def one(i: int, case: Case) -> None:
            nonlocal done
            async with gate:
                marks = []
                for arm in arms if i % 2 == 0 else arms[::-1]:
                    record = await ask(client, urls[arm], arm, case, gateway.model)
                    records[arm][case.id] = record
                    out.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
                    out.flush()
                    v = record.verdict
                    marks.append(f"{arm} {'P' if v.parsed else '-'}{'A' if v.accurate else '-'}")
                done += 1
                print(
                    f"{done:3}/{len(cases)} {case.id:<20} " + "  ".join(sorted(marks)), flush=True
                )

        await asyncio.gather(*(one(i, case) for i, case in enumerate(cases)))
    return {arm: [records[arm][c.id] for c in cases] for arm in arms}


# -- the report -------------------------------------------------------------------------


def rates(records: Sequence[Record]) -> tuple[int, int]:
    """(parsed, accurate) counts."""
    return sum(r.verdict.parsed for r in records), sum(r.verdict.accurate for r in records)


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}×" if b else f"∞ (alone {b})"


def _target(score: str, rate: float) -> str:
    wanted = TARGETS[score]
    return f"≥ {wanted:.0%}: **{'MET' if rate >= wanted else 'MISSED'}**"


def report(
    *,
    command: str,
    code: str,
    server: str,
    results: Mapping[str, Sequence[Record]],
    out: Path,
    seconds: float,
    load_at_start: str,
) -> list[str]:
    """The RESULTS.md section's lines (under :data:`HEADING`)."""
    n = len(results["proxy"])
    counts = {arm: rates(results[arm]) for arm in ARMS}
    (pp, pa), (ap, aa) = counts["proxy"], counts["alone"]
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    median_s = {
        arm: sorted(r.seconds for r in results[arm])[len(results[arm]) // 2] for arm in ARMS
    }
    try:
        shown_out = out.resolve().relative_to(ROOT)
    except ValueError:
        shown_out = out
    lines = [
        "",
        f"Run on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC at commit `{code}`.",
        f"Command: `{command}`.",
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} usable cores ({cpu}), "
        f"CPython {platform.python_version()}; load average at start {load_at_start}, at the "
        f"end {load_average()} (the cores are shared). The gateway as `make run` serves it "
        f"(`toolforge serve`, no `UPSTREAM_BASE_URL`): its managed llama-server with "
        f"{server}, which the `alone` arm calls directly. Temperature 0, seed {SEED}, "
        f"max_tokens {MAX_TOKENS}, "
        "the function offered as bfcl-eval offers it to OpenAI-style endpoints.",
        "",
        f"| {n} cases | llama-server alone | through the proxy | proxy ÷ alone | target |",
        "|---|---|---|---|---|",
        f"| parse rate (one call to the function, JSON, every required argument) | "
        f"{ap}/{n} ({ap / n:.0%}) | **{pp}/{n} ({pp / n:.0%})** | {_ratio(pp, ap)} | "
        f"{_target('parsed', pp / n)} |",
        f"| AST accuracy (bfcl-eval's checker, possible answers) | {aa}/{n} ({aa / n:.0%}) | "
        f"**{pa}/{n} ({pa / n:.0%})** | {_ratio(pa, aa)} | "
        f"{_target('accurate', pa / n)} |",
        f"| seconds per request, median | {median_s['alone']:.1f} | {median_s['proxy']:.1f} | | |",
        "",
        "Why the cases failed (the first failing rule; parse failures, then the AST's):",
        "",
    ]
    for arm in ARMS:
        why = Counter(r.verdict.reason for r in results[arm] if not r.verdict.accurate)
        listed = ", ".join(
            f"{reason or 'parsed, AST failed'} {k}" for reason, k in why.most_common()
        )
        lines.append(f"- {arm}: {listed or 'none'}")
    lines += [
        "",
        f"Raw results, one line per case and arm: `{shown_out}`. The run took {seconds:.0f} s.",
    ]
    return lines


def default_out(code: str) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M")
    return RESULTS_DIR / f"bfcl-simple_python-{stamp}-{code.split()[0]}.jsonl"


async def run(args: argparse.Namespace) -> None:
    cases = load_cases(data_dir())
    if len(cases) != CASES:
        raise RuntimeError(f"expected {CASES} simple_python cases, found {len(cases)}")
    if args.limit is not None:
        cases = cases[: args.limit]
    if args.stride is not None:
        cases = cases[:: args.stride]
    load_at_start = load_average()
    started = time.monotonic()
    kept: list[str] = []
    if args.resume is not None:
        # The cases the interrupted run finished on both arms are kept; the rest run again.
        lines_by_case: dict[str, list[str]] = {}
        for line in args.resume.read_text(encoding="utf-8").splitlines():
            if line.strip():
                lines_by_case.setdefault(json.loads(line)["id"], []).append(line)
        finished = {case for case, lines in lines_by_case.items() if len(lines) == len(ARMS)}
        kept = [line for c in cases if c.id in finished for line in lines_by_case[c.id]]
        cases = [c for c in cases if c.id not in finished]
    arms: Sequence[str] = ARMS
    if args.alone_from is not None:
        # llama-server alone does not run the gateway's code: its replies to the same
        # cases, model and server flags are taken from an earlier run, and only the proxy
        # arm is asked (half the time: the alone arm's prose runs to max_tokens).
        kept = alone_lines(args.alone_from, cases)
        arms = ("proxy",)
    with code_at(args.rev) as (env, code), tempfile.TemporaryDirectory() as artifacts:
        out: Path = args.resume or args.out or default_out(code)
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"bfcl: {len(cases)} cases, code {code}, raw results to {out}", flush=True)
        env = {
            **env,
            "LLAMA_THREADS": str(args.llama_threads),
            "LLAMA_NICE": str(args.llama_nice),
            "LLAMA_PARALLEL": str(args.llama_parallel),
        }
        async with embedded_gateway(env, Path(artifacts)) as gateway:
            print(f"bfcl: gateway {gateway.url}, llama-server {gateway.server_url}", flush=True)
            with out.open("w", encoding="utf-8") as sink:
                sink.writelines(line + "\n" for line in kept)
                results = await measure(cases, gateway, args.concurrency, sink, arms)
    if kept:
        results = rescore(out)  # the kept cases and the new ones, in the data's order
    command = " ".join(["python -m bench.bfcl", *sys.argv[1:]])
    lines = report(
        command=command,
        code=code,
        server=f"{gateway.model} (args `{' '.join(gateway.server.get('args') or [])}`)",
        results=results,
        out=out,
        seconds=time.monotonic() - started,
        load_at_start=load_at_start,
    )
    print("\n".join([HEADING, *lines]))
    if args.limit is None and args.stride is None and not args.no_write:
        write_section(HEADING, lines)


def alone_lines(path: Path, cases: Sequence[Case]) -> list[str]:
    """The alone arm's raw lines of ``cases`` in ``path``, in the cases' order; SystemExit
    naming the first case it lacks."""
    alone: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and (record := json.loads(line))["arm"] == "alone":
            alone[record["id"]] = line
    missing = [c.id for c in cases if c.id not in alone]
    if missing:
        raise SystemExit(
            f"--alone-from {path}: no alone reply for {len(missing)} cases (first: {missing[0]})"
        )
    return [alone[c.id] for c in cases]


def rescore(path: Path) -> dict[str, list[Record]]:
    """The records of a raw results file, each reply judged again (by this checker)."""
    cases = {c.id: c for c in load_cases(data_dir())}
    results: dict[str, list[Record]] = {arm: [] for arm in ARMS}
    for line in _json_lines(path):
        message = None
        if line["status"] == 200 and not line["error"]:
            message = {"content": line["content"], "tool_calls": line["tool_calls"]}
        verdict = (
            score(cases[line["id"]], message) if message else Verdict(False, False, line["reason"])
        )
        results[line["arm"]].append(
            Record(
                line["id"],
                line["arm"],
                verdict,
                line["seconds"],
                line["status"],
                message,
                line["finish_reason"],
                line["error"],
            )
        )
    order = {case_id: i for i, case_id in enumerate(cases)}
    return {arm: sorted(records, key=lambda r: order[r.id]) for arm, records in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="the first N cases only (RESULTS.md untouched)")
    parser.add_argument(
        "--stride", type=int, help="every Nth case only, a sample (RESULTS.md untouched)"
    )
    parser.add_argument(
        "--alone-from",
        type=Path,
        help="the llama-server-alone arm from this earlier raw results file; ask the proxy only",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="cases in flight at once (default 2: llama-server's slots, so no more cores)",
    )
    parser.add_argument(
        "--out", type=Path, help="the JSONL of raw results (default: bench/results/)"
    )
    parser.add_argument("--rev", help="serve the gateway from this git revision (e.g. HEAD)")
    parser.add_argument(
        "--llama-threads",
        type=int,
        default=1,
        help="llama-server's threads (LLAMA_THREADS; default 1: one core of a shared machine)",
    )
    parser.add_argument(
        "--llama-nice",
        type=int,
        default=0,
        help="llama-server's niceness (LLAMA_NICE; default 0: its fair share of that core)",
    )
    parser.add_argument(
        "--llama-parallel",
        type=int,
        default=2,
        help="llama-server's slots (LLAMA_PARALLEL; default 2, the gateway's): with "
        "--concurrency as high, one thread decodes that many cases at once",
    )
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument(
        "--report", type=Path, help="judge the replies of this raw results file again; print"
    )
    parser.add_argument(
        "--resume", type=Path, help="go on with this raw results file (an interrupted run's)"
    )
    parser.add_argument(
        "--guardrail",
        action="append",
        default=[],
        metavar="NAME=off",
        help="switch a guardrail off on the proxy arm (an ablation: provenance=off)",
    )
    args = parser.parse_args()
    for item in args.guardrail:
        name, _, value = item.partition("=")
        if value != "off" or not name:
            parser.error(f"--guardrail takes NAME=off, not {item!r}")
        GUARDRAILS_OFF[name] = False
    if args.report is not None:
        results = rescore(args.report)
        lines = report(
            command=f"python -m bench.bfcl --report {args.report}",
            code="(as the file's run)",
            server="(as the file's run)",
            results=results,
            out=args.report,
            seconds=0.0,
            load_at_start=load_average(),
        )
        print("\n".join([HEADING, *lines]))
        return
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.stride is not None and args.stride < 1:
        parser.error("--stride must be at least 1")
    if args.alone_from is not None and args.resume is not None:
        parser.error("--alone-from and --resume do not go together")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
