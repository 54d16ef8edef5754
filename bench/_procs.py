"""Processes for ``bench.gateway``: the scripted upstream, the gateway, and /proc probes.

Each server runs in a process of its own so that the load generator, the upstream and the
gateway do not share an event loop (or a GIL)::

    python -m bench._procs upstream --port P
    python -m bench._procs gateway --port P --upstream http://127.0.0.1:U/v1 --artifacts DIR

The upstream is ``toolforge.eval.scripted_upstream.ScriptedUpstream``; what it streams is chosen
by the request's ``model`` field (see :func:`script_for`), so a direct client and the
gateway, which forwards ``model`` as is, get byte-for-byte the same script. Steps without a
delay are written back to back (the same code path as ``pace=False``); paced scenarios set
``delay_ms`` per step.

The gateway is what ``toolforge serve`` runs: ``create_app(Settings(...))`` under
``toolforge.api.serve.run`` (uvicorn) with httptools, no access log, log level warning, and
uvloop when installed (``loop="auto"``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels

__all__ = [
    "CLK_TCK",
    "WRITTEN",
    "Proc",
    "cpu_ns",
    "cpu_seconds",
    "frames_tokens",
    "free_port",
    "paced_delays",
    "plain_tokens",
    "rss_kb",
    "settle_cpu",
    "sockets_to",
    "spawn_gateway",
    "spawn_proxy",
    "spawn_upstream",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[1]
_WORDS = (
    "the model streams tokens to a gateway which frames them for the client while "
    "tools wait and objects validate against their schema quickly"
).split()


# -- scenarios (shared by the upstream process and the load generator) -----------------


def plain_tokens(n: int) -> list[str]:
    """``n`` plain-text tokens (no sentinel character), each " word"."""
    return [" " + _WORDS[i % len(_WORDS)] for i in range(n)]


def frames_tokens(n: int, every: int) -> tuple[list[str], int]:
    """``n`` tokens of text with an OBJECT frame after every ``every`` text tokens.

    The frame (sentinels and a ~120-byte JSON body) is cut into 4-character tokens, as a
    model's tokenizer would; returns the tokens and the number of frames.
    """
    tokens: list[str] = []
    frames = 0
    while len(tokens) < n:
        tokens += plain_tokens(every)
        frames += 1
        body = (
            f'{{"id":{frames},"name":"Place {frames}","rating":4.5,"open":true,'
            f'"tags":["pizza","late"],"address":{{"street":"{frames} Main St","zip":"94110"}}}}'
        )
        frame = sentinels.frame(FrameKind.OBJECT, f"o{frames}", "Place", body)
        tokens += [frame[i : i + 4] for i in range(0, len(frame), 4)]
    return tokens, frames


def paced_delays(n: int, seed: int, mean_ms: float = 4.0, spread_ms: float = 2.0) -> list[float]:
    """Seeded per-token delays, uniform in mean ± spread (ms)."""
    rng = random.Random(seed)
    return [round(rng.uniform(mean_ms - spread_ms, mean_ms + spread_ms), 3) for _ in range(n)]


@functools.lru_cache(maxsize=16)
def _script(model: str) -> Any:
    """The script for a ``model`` name: ``kind:arg:arg`` (see the cases below)."""
    from toolforge.eval.scripted_upstream import Script, Step

    kind, *args = model.split(":")
    usage = {"prompt_tokens": 8}
    if kind == "ttft":  # first token at once, then a short answer
        return Script.from_tokens(["Hello", " there", "!"], usage=usage)
    if kind == "plain":  # plain:N, full speed
        return Script.from_tokens(plain_tokens(int(args[0])), usage=usage)
    if kind == "frames":  # frames:N:EVERY, full speed
        return Script.from_tokens(frames_tokens(int(args[0]), int(args[1]))[0], usage=usage)
    if kind == "paced":  # paced:N:SEED, 4 ± 2 ms between tokens
        n, seed = int(args[0]), int(args[1])
        steps = [
            Step(text=tok, delay_ms=d)
            for tok, d in zip(plain_tokens(n), paced_delays(n, seed), strict=True)
        ]
        return Script(steps=(*steps, Step(finish="stop", usage=usage)))
    if kind == "steady":  # steady:N:DELAY_MS
        return Script.from_tokens(plain_tokens(int(args[0])), delay_ms=float(args[1]), usage=usage)
    raise ValueError(f"unknown scenario {model!r}")


# The two-tool conversation: (text before the call, call id, tool, arguments) per turn.
_CALLS = (
    ("Searching. ", "t1", "places.search", '{"query": "pizza", "open_at": "19:00"}'),
    (
        "Booking. ",
        "t2",
        "bookings.create",
        '{"place_id": "trattoria-roma", "time": "19:00", "party_size": 2}',
    ),
)
_ANSWER = "Done. " + sentinels.frame(
    FrameKind.RESULT, "r1", "AssistantReply", '{"answer": "Booked Trattoria Roma at 19:00."}'
)
TOOL_TURNS = (
    *(
        text + sentinels.frame(FrameKind.TOOL_CALL, fid, name, args)
        for text, fid, name, args in _CALLS
    ),
    _ANSWER,
)
# The same text in one turn, with OBJECT frames where the tool calls were.
_NO_TOOLS_TURN = (
    "".join(
        text + sentinels.frame(FrameKind.OBJECT, fid, "Any", args) for text, fid, _, args in _CALLS
    )
    + _ANSWER
)


def _tool_script(request: dict[str, Any]) -> Any:
    """``tools2``: the two-tool conversation, one turn per upstream request (the turn is
    the number of tool results already in the messages). ``tools0``: the same text in
    one turn, with OBJECT frames where the tool calls were (bench.tool_roundtrip's baseline)."""
    from toolforge.eval.scripted_upstream import Script

    if request["model"] == "tools0":
        turn_text = _NO_TOOLS_TURN
    else:
        done = sum(
            1
            for m in request.get("messages", [])
            if isinstance(m, dict) and str(m.get("content", "")).startswith("Result of tool call")
        )
        turn_text = TOOL_TURNS[min(done, len(TOOL_TURNS) - 1)]
    tokens = [turn_text[i : i + 4] for i in range(0, len(turn_text), 4)]
    return Script.from_tokens(tokens, usage={"prompt_tokens": 8})


def script_for(request: Any) -> Any:
    """ScriptedUpstream's chooser: chat requests by ``model``; anything else (GET /models
    from the gateway's /readyz, the ``mode: auto`` probes) gets a small 200."""
    from toolforge.eval.scripted_upstream import Script

    if isinstance(request, dict) and request.get("model") in ("tools0", "tools2"):
        return _tool_script(request)
    if (
        isinstance(request, dict)
        and isinstance(request.get("model"), str)
        and "messages" in request  # a chat completion, not a probe such as /api/show
    ):
        return _script(request["model"])
    return Script(end="status", status=200, body='{"object":"list","data":[]}')


def _use_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


WRITTEN: Final = "written:"


async def _serve_upstream(port: int) -> None:
    from toolforge.eval.scripted_upstream import Script, ScriptedUpstream

    def choose(request: Any) -> Any:
        # model "written:M": when each step of the latest answer to model M went out
        # (perf_counter_ns, the clock the load generator reads too), as a JSON list.
        model = request.get("model") if isinstance(request, dict) else None
        if isinstance(model, str) and model.startswith(WRITTEN):
            wanted = model[len(WRITTEN) :]
            latest = next(
                (
                    r
                    for r in reversed(up.requests)
                    if isinstance(r.json, dict) and r.json.get("model") == wanted
                ),
                None,
            )
            body = orjson.dumps(latest.written_ns if latest is not None else None).decode()
            return Script(end="status", status=200, body=body)
        return script_for(request)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    up = ScriptedUpstream(script_for=choose, pace=True, port=port)
    async with up:
        print("ready", flush=True)
        await stop.wait()


def _serve_gateway(port: int, upstream: str, artifacts: str) -> None:
    from toolforge.api.app import create_app
    from toolforge.api.serve import run
    from toolforge.settings import Settings

    # bench.libraries' arms: the gateway with one of its hand-written parts replaced by
    # the library it replaced (TOOLFORGE_BENCH_ARM; unset: the gateway as it ships).
    arm = os.environ.get("TOOLFORGE_BENCH_ARM", "")
    if arm == "stock-httpx":
        _stock_httpx()
    settings = Settings(
        upstream_base_url=upstream, artifacts_dir=Path(artifacts), log_level="WARNING"
    )
    app: Any = create_app(settings)
    if arm == "sse-starlette":
        app = _event_source_front(app)
    run(app, host="127.0.0.1", port=port, http="httptools", loop="auto")


def _stock_httpx() -> None:
    """The upstream client as httpx ships it: its default transport (httpcore + h11), no
    lean ``post``: what app/upstream/transport.py replaced."""
    import httpx

    import toolforge.api.app as app_module
    from toolforge.upstream.transport import DEFAULT_LIMITS

    def stock(*, timeout: httpx.Timeout, transport: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout, limits=DEFAULT_LIMITS)

    app_module.UpstreamClient = stock  # type: ignore[assignment,misc]


def _event_source_front(app: Any) -> Any:
    """``POST /v1/stream`` written by sse-starlette's ``EventSourceResponse`` instead of
    toolforge.api.sse.FrameStreamResponse: the same session and the same (already
    encoded) frames, so the difference is the response class. Everything else goes to
    the app."""
    import secrets

    from sse_starlette import EventSourceResponse

    from toolforge.api.body import parse_stream_request as _parse
    from toolforge.api.body import read_body

    async def front(scope: Any, receive: Any, send: Any) -> None:
        if not (scope["type"] == "http" and scope["path"] == "/v1/stream"):
            await app(scope, receive, send)
            return
        gw = app.state.gateway
        declared = dict(scope["headers"]).get(b"content-length", b"").decode() or None
        body = await read_body(receive, declared, gw.settings.max_body_bytes)
        stream_id = "s_" + secrets.token_hex(10)
        session = gw.session(
            await gw.planner.plan(_parse(body, gw.settings.max_request_depth), stream_id, None)
        )
        session.log.attach_primary()
        gw.registry.start(session, idempotency_key=None, body_hash="")
        await asyncio.sleep(0)  # as start_stream: the upstream request goes out first
        response = EventSourceResponse(
            session.log.follow(primary=True),
            ping=int(gw.settings.ping_interval_s),
            headers={"X-Stream-Id": stream_id},
        )
        await response(scope, receive, send)

    front.state = app.state  # type: ignore[attr-defined]  # GatewayServer ends streams through it
    return front


class _ProxyUp(asyncio.Protocol):
    """The proxy's connection to the upstream: bytes back to the client as they come."""

    def __init__(self, down: asyncio.Transport) -> None:
        self.down = down

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.down.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.close()


class _ProxyDown(asyncio.Protocol):
    """The proxy's client side: one upstream connection per client connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.pending: list[bytes] = []
        self.up: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        up, _ = await loop.create_connection(
            lambda: _ProxyUp(self.transport), "127.0.0.1", self.upstream_port
        )
        self.up = up  # type: ignore[assignment]
        for data in self.pending:
            up.write(data)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.up is None:
            self.pending.append(data)
        else:
            self.up.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


async def _serve_proxy(port: int, upstream_port: int) -> None:
    """A bare TCP relay (uvloop): B1's floor for one more process and two more hops."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _ProxyDown(upstream_port), "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


# -- process control --------------------------------------------------------------------


def filesystem(path: Path) -> str:
    """The type of the file system ``path`` is on (``/proc/mounts``: the longest mount
    point above it), e.g. ``ext4`` or ``tmpfs``; ``unknown`` where that cannot be read."""
    target = str(path.resolve())
    best, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1].replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child server process; ``stop()`` always ends it (TERM, then KILL)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        port: int,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.name = name
        self.port = port
        # A file, not a pipe: nobody reads a pipe while the bench runs, and a server that
        # logs enough to fill one (64 KB) would block on stderr and freeze its event loop.
        self.stderr = tempfile.TemporaryFile()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench._procs", *args],
            cwd=cwd,  # the code that runs: this checkout's, or another's (bench.ab)
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env={**os.environ, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_listening(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                code = self.popen.returncode
                raise RuntimeError(f"{self.name} exited with {code}:\n{self.log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen on {self.port} within {timeout_s} s")

    def log(self) -> str:
        """What the process wrote to stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
        self.stderr.close()


@contextlib.contextmanager
def scratch(prefix: str, parent: Path | None = None) -> Iterator[tuple[Path, list[Proc]]]:
    """A temporary artifacts directory (under ``parent``, default the system's temporary
    directory) and a list for the child processes a run starts; on exit the processes are
    stopped, the newest first, and the directory removed."""
    artifacts = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    procs: list[Proc] = []
    try:
        yield artifacts, procs
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(artifacts, ignore_errors=True)


def _spawn(
    name: str, args: list[str], port: int, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Proc:
    proc = Proc(name, args, port, env, cwd)
    try:
        proc.wait_listening()
    except BaseException:
        proc.stop()
        raise
    return proc


def spawn_upstream() -> Proc:
    port = free_port()
    return _spawn("upstream", ["upstream", "--port", str(port)], port)


def spawn_proxy(upstream_port: int) -> Proc:
    """A bare TCP relay in front of the upstream, for B1's reference row."""
    port = free_port()
    args = ["proxy", "--port", str(port), "--upstream-port", str(upstream_port)]
    return _spawn("proxy", args, port)


def spawn_gateway(
    upstream_url: str, artifacts: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Proc:
    """A gateway process in front of ``upstream_url``; ``env``: more settings (docs/deployment.md);
    ``cwd``: the checkout whose code runs (bench.ab runs another revision's)."""
    port = free_port()
    args = ["gateway", "--port", str(port), "--upstream", upstream_url]
    args += ["--artifacts", str(artifacts)]
    return _spawn("gateway", args, port, env, cwd)


# -- /proc probes -----------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def cpu_ns(pid: int) -> int:
    """CPU time of the process's live threads in ns (``/proc/PID/task/*/schedstat``):
    precise enough for one request, where stat's utime and stime count 10 ms ticks. A
    thread that has exited is not counted (the gateway's worker threads live on)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError),
            open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
        ):
            total += int(f.read().split(None, 1)[0])
    return total


def settle_cpu(pid: int, limit_s: float = 15.0) -> float:
    """CPU seconds once the process stops using CPU (two still 100 ms samples)."""
    deadline = time.monotonic() + limit_s
    last, still = cpu_seconds(pid), 0
    while still < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = cpu_seconds(pid)
        still = still + 1 if now == last else 0
        last = now
    return last


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1])
    return 0


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _tcp_rows(pid: int) -> Iterator[list[str]]:
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                yield line.split()


def sockets_to(pid: int, port: int) -> int:
    """TCP sockets held by ``pid`` whose remote port is ``port`` (any state)."""
    inodes = _socket_inodes(pid)
    count = 0
    for row in _tcp_rows(pid):
        remote_port = int(row[2].rsplit(":", 1)[1], 16)
        if remote_port == port and row[9] in inodes:
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description="bench servers (run by bench.gateway)")
    sub = parser.add_subparsers(dest="what", required=True)
    up = sub.add_parser("upstream")
    up.add_argument("--port", type=int, required=True)
    gw = sub.add_parser("gateway")
    gw.add_argument("--port", type=int, required=True)
    gw.add_argument("--upstream", required=True)
    gw.add_argument("--artifacts", required=True)
    proxy = sub.add_parser("proxy")
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    if args.what == "upstream":
        _use_uvloop()
        asyncio.run(_serve_upstream(args.port))
    elif args.what == "proxy":
        _use_uvloop()
        asyncio.run(_serve_proxy(args.port, args.upstream_port))
    else:
        _serve_gateway(args.port, args.upstream, args.artifacts)


if __name__ == "__main__":
    main()
