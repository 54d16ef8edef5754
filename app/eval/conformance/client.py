"""The client side of a conformance case: what the client does, and what it saw.

Each mode drives a live gateway over HTTP and returns an :class:`Observation`: the HTTP
status, the stream the case's expectations apply to (``main``), other streams it made
(checked against the protocol invariants too), timings, and the mode's own findings.

========== ===============================================================================
mode       what the client does (keys)
========== ===============================================================================
read_all   POST /v1/stream and read to the end (the default)
stall      raw socket with a small receive buffer; stop reading for ``stall_ms``, then
           read ``read_bytes`` at a time, ``pause_ms`` apart (``rcvbuf``), or with
           ``abort`` hang up instead of reading; ``slow`` is another name for it
cancel     read until ``after_frames`` frames or the first ``after_event``, POST
           ``/cancel`` (its answer must say ``cancelled``: ``expect_cancelled``, default
           true), then read on to the end, or with ``resume`` drop the connection and
           resume with ``Last-Event-ID``
disconnect read until ``after_frames`` / ``after_event``, drop the connection; with
           ``resume``, GET the stream with ``Last-Event-ID`` (the rest must arrive exactly
           once); the stream checked is the gateway's full record (resume from id 0)
resume     read to the end, then resume from each id in ``at`` (negative: from the end)
           with ``Last-Event-ID`` (or ``?after=`` with ``query``): exactly the frames after
           it must come back
replay     POST with ``Idempotency-Key: key``, then again (``second_request`` for another
           body, ``during`` while the first still runs, after ``wait_ms``); ``second`` says
           what the second answer must be: ``status``, ``error``, ``replayed`` (byte for
           byte the same stream), ``frames``, ``count``
approve    read, and at each ``tool.call`` answer ``decisions``: ``{"on": call id,
           "call_id" (default: on), "approve", "status" (default 200), "delay_ms"}``
repeat     the same request ``times`` times (``concurrent`` or one after the other); with
           ``identical`` (default) the streams must be equal but for ids and timings
seeds      the request once per seed (``seeds``: a list, or ``{"from", "count"}``), the
           seed put in ``sampling.seed``; every run must be free of ``error`` frames and of
           degraded values (a model kept to well-formed frames, docs/protocol.md constrained mode)
========== ===============================================================================

Every mode also takes ``then``: HTTP requests made after the stream ended, each
``{"method", "path" ("{stream_id}" is filled in), "headers", "json", "delay_ms", "status",
"body"}``, where ``body`` is matched against the JSON answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import orjson

from toolforge.core.protocol.frames import PING_BYTES
from toolforge.eval.conformance.case import Case
from toolforge.eval.conformance.match import comparable, first_difference, matches
from toolforge.eval.loopback import Event, Harness, frames, open_raw_stream

__all__ = ["Observation", "SSEReader", "Stream", "drive", "frame_dicts", "run_followups"]

_DEFAULT_SECOND: Final = {"status": 200, "replayed": True}


@dataclass
class Stream:
    """One SSE stream as a client received it."""

    events: list[Event] = field(default_factory=list)  # pings included
    raw: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # wire-format findings

    @property
    def stream_id(self) -> str | None:
        begin = next((e for e in self.events if e.event == "stream.begin"), None)
        if begin is not None and isinstance(begin.data, dict):
            return str(begin.data.get("stream_id"))
        return self.headers.get("x-stream-id")

    def numbered(self) -> list[Event]:
        return frames(self.events)


@dataclass
class Observation:
    """What the client saw."""

    status: int = 0
    error_body: Any = None
    main: Stream | None = None
    others: list[Stream] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class SSEReader:
    """An incremental ``text/event-stream`` parser (the WHATWG rules the gateway needs:
    ``field: value`` lines, one optional space, events end at a blank line)."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._tail = b""
        self._fields: dict[str, str] = {}

    def feed(self, data: bytes) -> list[Event]:
        self._tail += data
        *lines, self._tail = self._tail.split(b"\n")
        out: list[Event] = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if not line:
                event = self._dispatch()
                if event is not None:
                    out.append(event)
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data" and "data" in self._fields:
                    value = self._fields["data"] + "\n" + value
                self._fields[name] = value
        return out

    def _dispatch(self) -> Event | None:
        fields, self._fields = self._fields, {}
        if not fields:
            return None
        extra = set(fields) - {"id", "event", "data"}
        if extra:
            self._stream.problems.append(f"unexpected SSE fields {sorted(extra)}")
        try:
            data = orjson.loads(fields.get("data", ""))
        except orjson.JSONDecodeError:
            self._stream.problems.append(f"event data is not JSON: {fields.get('data', '')!r}")
            data = None
        return Event(fields.get("id", ""), fields.get("event", "message"), data)


def frame_dicts(events: list[Event]) -> list[dict[str, Any]]:
    """Numbered frames as ``{"id": int, "event", "data"}`` (pings left out)."""
    out = []
    for e in frames(events):
        out.append({"id": int(e.id) if e.id.isdigit() else e.id, "event": e.event, "data": e.data})
    return out


class _ModeFailure(Exception):
    """The client could not do what the mode asks (reported as a failure)."""


Stop = Callable[[Stream], bool]
OnEvent = Callable[[Event], Awaitable[None]]


def _stop_condition(client: Mapping[str, Any]) -> Stop:
    after_frames = client.get("after_frames")
    after_event = client.get("after_event")
    if after_frames is None and after_event is None:
        raise _ModeFailure("this client mode needs 'after_frames' or 'after_event'")

    def stop(stream: Stream) -> bool:
        numbered = stream.numbered()
        if after_frames is not None and len(numbered) >= after_frames:
            return True
        return bool(after_event is not None and numbered and numbered[-1].event == after_event)

    return stop


class _Reading:
    """Reads one response into a :class:`Stream`, and can stop and go on later without
    losing the events that arrived in the same chunk as the one it stopped at."""

    def __init__(self, response: httpx.Response, stream: Stream) -> None:
        self.stream = stream
        self._chunks = response.aiter_raw()
        self._parser = SSEReader(stream)
        self._pending: deque[Event] = deque()

    async def until(self, stop: Stop | None = None, on_event: OnEvent | None = None) -> bool:
        """Read to the end (False) or until ``stop`` holds (True)."""
        while True:
            while self._pending:
                event = self._pending.popleft()
                self.stream.events.append(event)
                if on_event is not None:
                    await on_event(event)
                if stop is not None and stop(self.stream):
                    return True
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                return False
            self.stream.raw += chunk
            self._pending.extend(self._parser.feed(chunk))

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]


async def _error_body(response: httpx.Response) -> Any:
    content = await response.aread()
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", "replace")


@contextlib.asynccontextmanager
async def _open(
    gw: Harness,
    case: Case,
    obs: Observation | None,
    *,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[int, Any, _Reading | None]]:
    """POST /v1/stream: yields the status, the error body (not 200) or a reading (200).

    With ``obs``, the stream becomes ``obs.main`` at once, so the frames seen so far are
    reported even if the case fails further on. Leaving the block drops the connection.
    """
    request = dict(body if body is not None else case.request)
    all_headers = {**case.headers, **(headers or {})}
    async with gw.client.stream(
        "POST", f"{gw.url}/v1/stream", json=request, headers=all_headers
    ) as response:
        stream = Stream(headers={k.lower(): v for k, v in response.headers.items()})
        if response.status_code != 200:
            yield response.status_code, await _error_body(response), None
            return
        if obs is not None:
            obs.status, obs.main = 200, stream
        reading = _Reading(response, stream)
        try:
            yield 200, None, reading
        finally:
            await reading.aclose()


async def _post(
    gw: Harness,
    case: Case,
    obs: Observation | None,
    *,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    stop: Stop | None = None,
    on_event: OnEvent | None = None,
) -> tuple[int, Any, Stream]:
    """POST and read to the end, or until ``stop`` (then the connection is dropped)."""
    async with _open(gw, case, obs, body=body, headers=headers) as (status, error, reading):
        if reading is None:
            return status, error, Stream()
        stopped = await reading.until(stop, on_event)
        if stop is not None and not stopped:
            raise _ModeFailure("the stream ended before the client's stop condition")
        return status, None, reading.stream


# -- modes ----------------------------------------------------------------------------------


async def _read_all(gw: Harness, case: Case, obs: Observation) -> None:
    obs.status, obs.error_body, obs.main = await _post(gw, case, obs)


def _dechunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while (nl := data.find(b"\r\n", at)) >= 0:
        size = int(data[at:nl].split(b";")[0], 16)
        if size == 0:
            break
        out += data[nl + 2 : nl + 2 + size]
        at = nl + 2 + size + 2
    return bytes(out)


async def _stall(gw: Harness, case: Case, obs: Observation) -> None:
    client = case.client
    reader, writer = await open_raw_stream(
        gw,
        dict(case.request),
        rcvbuf=client.get("rcvbuf", 4096),
        close=True,
        headers=dict(case.headers),
    )
    data = bytearray()
    try:
        obs.status, headers = _http_head(await reader.readuntil(b"\r\n\r\n"))
        if obs.status == 200:
            await asyncio.sleep(client.get("stall_ms", 0) / 1000)
            if client.get("abort", False):
                writer.transport.abort()  # gone while the gateway waits for it to read
                await gw.settle()
                obs.main = await _get_stream(gw, headers["x-stream-id"], "0")  # the record
                return
        size, pause = client.get("read_bytes", 1 << 16), client.get("pause_ms", 0) / 1000
        while chunk := await reader.read(size):
            data += chunk
            if pause:
                await asyncio.sleep(pause)
    finally:
        writer.close()
    body = _dechunk(bytes(data)) if headers.get("transfer-encoding") == "chunked" else data
    if obs.status != 200:
        obs.error_body = orjson.loads(body) if body else None
        return
    stream = Stream(headers=headers)
    stream.raw += body
    stream.events = SSEReader(stream).feed(bytes(body))
    obs.main = stream


def _http_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and the (lower-cased) headers of a raw HTTP/1.1 response head."""
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ")[1]), headers


async def _cancel(gw: Harness, case: Case, obs: Observation) -> None:
    client = case.client
    expect_cancelled = client.get("expect_cancelled", True)
    async with _open(gw, case, obs) as (status, error, reading):
        if reading is None:
            obs.status, obs.error_body = status, error
            return
        if not await reading.until(_stop_condition(client)):
            raise _ModeFailure("the stream ended before the client's stop condition")
        started = time.perf_counter()
        answer = await gw.client.post(f"{gw.url}/v1/streams/{reading.stream.stream_id}/cancel")
        obs.timings["cancel_ms"] = (time.perf_counter() - started) * 1000
        said = answer.json()
        if answer.status_code != 200 or said.get("cancelled") is not expect_cancelled:
            obs.failures.append(
                f"cancel answered HTTP {answer.status_code} {said}; "
                f"expected cancelled={expect_cancelled}"
            )
        if not client.get("resume", False):
            await reading.until()  # the same connection carries the stream to its done
            return
    await _resume_rest(gw, reading.stream)


async def _resume_rest(gw: Harness, seen: Stream) -> None:
    """Resume after the last frame ``seen`` got; append the rest to it."""
    numbered = seen.numbered()
    rest = await _get_stream(gw, str(seen.stream_id), numbered[-1].id if numbered else "0")
    seen.events += rest.events
    seen.problems += rest.problems


async def _get_stream(gw: Harness, stream_id: str, after: str, *, query: bool = False) -> Stream:
    stream = Stream()
    url = f"{gw.url}/v1/streams/{stream_id}"
    kwargs: dict[str, Any] = (
        {"params": {"after": after}} if query else {"headers": {"Last-Event-ID": after}}
    )
    async with gw.client.stream("GET", url, **kwargs) as response:
        if response.status_code != 200:
            raise _ModeFailure(f"resume after id {after} answered HTTP {response.status_code}")
        stream.headers = {k.lower(): v for k, v in response.headers.items()}
        reading = _Reading(response, stream)
        try:
            await reading.until()
        finally:
            await reading.aclose()
    return stream


async def _disconnect(gw: Harness, case: Case, obs: Observation) -> None:
    obs.status, obs.error_body, seen = await _post(
        gw, case, None, stop=_stop_condition(case.client)
    )
    if obs.status != 200:
        return
    started = time.perf_counter()
    if "upstream_closed_within_ms" in case.expect:
        async with asyncio.timeout(2):
            await gw.upstream.wait_connections_closed()
        obs.timings["upstream_closed_ms"] = (time.perf_counter() - started) * 1000
    await gw.settle()
    whole = await _get_stream(gw, str(seen.stream_id), "0")  # the gateway's full record
    obs.main = whole
    received = frame_dicts(seen.events)
    if frame_dicts(whole.events)[: len(received)] != received:
        obs.failures.append("what the client received is not the start of the stream")
    if case.client.get("resume", False):
        await _resume_rest(gw, seen)
        diff = first_difference(frame_dicts(seen.events), frame_dicts(whole.events))
        if diff is not None:
            obs.failures.append(f"received + resumed is not the stream exactly once: {diff}")


async def _resume(gw: Harness, case: Case, obs: Observation) -> None:
    await _read_all(gw, case, obs)
    if obs.main is None or obs.status != 200:
        return
    whole = frame_dicts(obs.main.events)
    query = bool(case.client.get("query", False))
    for at in case.client.get("at", [0]):
        after = at if at >= 0 else max(0, len(whole) + at)
        got = await _get_stream(gw, str(obs.main.stream_id), str(after), query=query)
        diff = first_difference(frame_dicts(got.events), whole[after:])
        if diff is not None:
            obs.failures.append(f"resume after id {after}: {diff}")


def _strip_pings(raw: bytes) -> bytes:
    return raw.replace(b"\n" + PING_BYTES, b"\n").removeprefix(PING_BYTES)


async def _replay(gw: Harness, case: Case, obs: Observation) -> None:
    client = case.client
    headers = {"Idempotency-Key": client.get("key", "conformance-key")}
    second_body = client.get("second_request", case.request)
    want = {**_DEFAULT_SECOND, **client.get("second", {})}
    if client.get("during", False):
        first = asyncio.create_task(_post(gw, case, obs, headers=headers))
        async with asyncio.timeout(5):
            await gw.upstream.wait_for_requests(1)
        status, error, second = await _post(gw, case, None, body=second_body, headers=headers)
        obs.status, obs.error_body, obs.main = await first
    else:
        obs.status, obs.error_body, obs.main = await _post(gw, case, obs, headers=headers)
        await asyncio.sleep(client.get("wait_ms", 0) / 1000)
        status, error, second = await _post(gw, case, None, body=second_body, headers=headers)
    if status != want["status"]:
        obs.failures.append(f"second request: HTTP {status}, expected {want['status']} ({error})")
        return
    if "error" in want and not (
        isinstance(error, dict) and matches(want["error"], error.get("error"))
    ):
        obs.failures.append(f"second request: error {error} does not match {want['error']}")
    if status != 200 or obs.main is None:
        return
    replayed = second.headers.get("idempotent-replayed") == "true"
    if replayed != want["replayed"]:
        obs.failures.append(f"second request: Idempotent-Replayed is {replayed}")
    if want["replayed"]:
        if second.headers.get("x-stream-id") != obs.main.headers.get("x-stream-id"):
            obs.failures.append("the replay has another X-Stream-Id")
        if _strip_pings(bytes(second.raw)) != _strip_pings(bytes(obs.main.raw)):
            obs.failures.append("the replay is not byte-identical to the first stream")
    else:
        if second.stream_id == obs.main.stream_id:
            obs.failures.append("the second request replayed the first stream")
        obs.others.append(second)
    numbered = frame_dicts(second.events)
    for pattern in want.get("frames", []):
        if not any(_frame_matches(pattern, f) for f in numbered):
            obs.failures.append(f"second stream: no frame matches {pattern}")
    for event, n in want.get("count", {}).items():
        got = sum(1 for f in numbered if f["event"] == event)
        if got != n:
            obs.failures.append(f"second stream: {got} {event} frames, expected {n}")


def _frame_matches(pattern: Mapping[str, Any], frame: Mapping[str, Any]) -> bool:
    return frame["event"] == pattern["event"] and matches(pattern.get("data", {}), frame["data"])


async def _approve(gw: Harness, case: Case, obs: Observation) -> None:
    decisions = list(case.client.get("decisions", []))
    done: list[Mapping[str, Any]] = []

    async def on_event(event: Event) -> None:
        if event.event != "tool.call" or not isinstance(event.data, dict):
            return
        stream_id = obs.main.stream_id if obs.main is not None else None
        for decision in decisions:
            if decision["on"] != event.data.get("id") or decision in done:
                continue
            done.append(decision)
            await asyncio.sleep(decision.get("delay_ms", 0) / 1000)
            call_id = decision.get("call_id", decision["on"])
            answer = await gw.client.post(
                f"{gw.url}/v1/streams/{stream_id}/approvals/{call_id}",
                json={"approve": decision.get("approve", True)},
            )
            want_status = decision.get("status", 200)
            if answer.status_code != want_status:
                obs.failures.append(
                    f"approval of {call_id}: HTTP {answer.status_code}, expected {want_status}"
                )
            elif want_status == 200 and answer.json() != {
                "stream_id": stream_id,
                "call_id": call_id,
                "approved": decision.get("approve", True),
            }:
                obs.failures.append(f"approval of {call_id} answered {answer.json()}")

    obs.status, obs.error_body, obs.main = await _post(gw, case, obs, on_event=on_event)
    for decision in decisions:
        if decision not in done:
            obs.failures.append(f"no tool.call {decision['on']!r} came to decide on")


async def _repeat(gw: Harness, case: Case, obs: Observation) -> None:
    client = case.client
    times = client.get("times", 2)
    if client.get("concurrent", False):
        runs = await asyncio.gather(*(_post(gw, case, None) for _ in range(times)))
    else:
        runs = [await _post(gw, case, None) for _ in range(times)]
    obs.status, obs.error_body, obs.main = runs[0]
    obs.others = [stream for _, _, stream in runs[1:]]
    for i, (status, _, _) in enumerate(runs):
        if status != obs.status:
            obs.failures.append(f"run {i + 1}: HTTP {status}, run 1: HTTP {obs.status}")
    if client.get("identical", True):
        first = comparable(frame_dicts(obs.main.events))
        for i, other in enumerate(obs.others, start=2):
            diff = first_difference(first, comparable(frame_dicts(other.events)))
            if diff is not None:
                obs.failures.append(f"run {i} is not identical to run 1: {diff}")


async def _seeds(gw: Harness, case: Case, obs: Observation) -> None:
    spec = case.client["seeds"]
    seeds = range(spec["from"], spec["from"] + spec["count"]) if isinstance(spec, dict) else spec
    runs = []
    for seed in seeds:
        sampling = {**case.request.get("sampling", {}), "seed": seed}
        runs.append(
            (seed, await _post(gw, case, None, body={**case.request, "sampling": sampling}))
        )
    (_, (obs.status, obs.error_body, obs.main)), *rest = runs
    obs.others = [stream for _, (_, _, stream) in rest]
    for seed, (_, _, stream) in runs:
        for e in frames(stream.events):
            data = e.data if isinstance(e.data, dict) else {}
            if e.event == "error":
                obs.failures.append(f"seed {seed}: error frame {data.get('code')}: {data}")
            elif e.event in ("json.end", "result.end") and data.get("degraded"):
                obs.failures.append(f"seed {seed}: {e.event} {data.get('id')} degraded")


_MODES: Final[dict[str, Callable[[Harness, Case, Observation], Awaitable[None]]]] = {
    "read_all": _read_all,
    "stall": _stall,
    "slow": _stall,
    "cancel": _cancel,
    "disconnect": _disconnect,
    "resume": _resume,
    "replay": _replay,
    "approve": _approve,
    "repeat": _repeat,
    "seeds": _seeds,
}


async def drive(gw: Harness, case: Case, obs: Observation) -> None:
    """Run ``case``'s client mode against ``gw``, filling ``obs`` as it goes."""
    try:
        await _MODES[case.mode](gw, case, obs)
    except _ModeFailure as exc:
        obs.failures.append(str(exc))


async def run_followups(gw: Harness, case: Case, obs: Observation) -> None:
    """The case's ``then`` requests, once the stream has ended."""
    stream_id = obs.main.stream_id if obs.main is not None else None
    for step in case.client.get("then", []):
        await asyncio.sleep(step.get("delay_ms", 0) / 1000)
        path = str(step["path"]).replace("{stream_id}", str(stream_id))
        answer = await gw.client.request(
            step.get("method", "GET"),
            f"{gw.url}{path}",
            headers=step.get("headers"),
            json=step.get("json"),
        )
        what = f"{step.get('method', 'GET')} {path}"
        if answer.status_code != step.get("status", 200):
            obs.failures.append(
                f"{what}: HTTP {answer.status_code}, expected {step.get('status', 200)}"
            )
            continue
        if "body" in step:
            try:
                body = answer.json()
            except ValueError:
                body = answer.text
            if not matches(step["body"], body):
                obs.failures.append(f"{what}: {body} does not match {step['body']}")
