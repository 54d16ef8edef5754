"""Where every stream starts, is found again, and takes its commands: one sequence for
every front door (``POST /v1/stream``, the OpenAI-compatible proxy, and any entry point
added later), on this replica or, with ``REDIS_URL``, on any of them.

Starting a stream (:meth:`Streams.open`) is always the same five steps:

1. **idempotency**: a request with an ``Idempotency-Key`` that was seen already replays
   the stored stream (here, or from another replica's resume buffer); the same key with
   another body, or while its stream still runs, is refused;
2. **plan**: the caller's own planning, given the new stream's id;
   then **admission** (:mod:`toolforge.runtime.admission`): one of the upstream's slots,
   waited for in a fair queue for at most ``ADMISSION_TIMEOUT_MS``, held until the
   stream ends; refused (503, ``Retry-After``) before anything of the stream is sent;
3. **claim**: the key is claimed in Redis, so two replicas given it at once start one
   stream;
4. **session**: the session is built from the plan and started, with backpressure from
   its first frame when a client reads it live (``primary``);
5. **tracking**: its frames are mirrored into Redis, so any replica can resume it.

Commands (:mod:`toolforge.runtime.commands`) are applied by :meth:`Streams.command`: here
when this replica runs the stream, else forwarded to the replica that does. Nothing here
knows HTTP: refusals are :class:`~toolforge.errors.RequestError` values, which each
front door answers in its own shape.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from toolforge.errors import ErrorCode, RequestError
from toolforge.runtime.admission import Admission
from toolforge.runtime.artifacts import ArtifactStore
from toolforge.runtime.cluster import RedisCluster, RemoteStream
from toolforge.runtime.commands import Command, apply, check_caller, from_wire, to_wire
from toolforge.runtime.executor import ToolExecutor
from toolforge.runtime.metrics import GatewayMetrics
from toolforge.runtime.planner import SessionLimits, StreamPlan
from toolforge.runtime.session import StreamSession
from toolforge.runtime.stream_ids import new_stream_id
from toolforge.runtime.streams import StreamRegistry
from toolforge.runtime.tracing import Tracing
from toolforge.upstream.base import Upstream

__all__ = [
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "Opened",
    "Replayed",
    "SessionParts",
    "Started",
    "Streams",
    "new_stream_id",
    "request_hash",
]

# The draft standard sets no bound; ours keeps a client's key from growing our records.
MAX_IDEMPOTENCY_KEY_CHARS: Final = 255


def request_hash(request: Any) -> str:
    """The idempotency hash of a parsed request (JSON-ready data): keys sorted, so the
    same request sent with other spacing or key order is the same request."""
    return hashlib.sha256(orjson.dumps(request, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionParts:
    """Everything a session needs besides its plan: built once per app."""

    upstream: Upstream
    limits: SessionLimits
    artifacts: ArtifactStore
    metrics: GatewayMetrics
    executor: ToolExecutor
    repair_template: str
    tracing: Tracing | None = None

    def session(self, plan: StreamPlan) -> StreamSession:
        """A new stream for ``plan`` (not started)."""
        return StreamSession(
            plan,
            upstream=self.upstream,
            limits=self.limits,
            artifacts=self.artifacts.run(plan.stream_id),
            metrics=self.metrics,
            executor=self.executor,
            repair_template=self.repair_template,
            tracing=self.tracing,
        )


@dataclass(frozen=True, slots=True)
class Started:
    """A new stream, running."""

    session: StreamSession


@dataclass(frozen=True, slots=True)
class Replayed:
    """The stream an Idempotency-Key was first used for, to be sent again from frame 1:
    run (or ran) here, or known from another replica's resume buffer."""

    stream: StreamSession | RemoteStream


Opened = Started | Replayed

Planner = Callable[[str], Awaitable[StreamPlan]]
"""``stream id -> plan``: an entry point's own planning of its request."""


class Streams:
    """This replica's streams: the registry, and the other replicas when there are some."""

    def __init__(
        self,
        parts: SessionParts,
        registry: StreamRegistry,
        cluster: RedisCluster | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.parts = parts
        self.registry = registry
        self.cluster = cluster
        self.admission = admission  # None: streams are not counted (an embedder's choice)

    async def start(self) -> None:
        """Join the other replicas (with Redis): their commands for our streams come in."""
        if self.cluster is not None:
            await self.cluster.start(self._forwarded)

    async def aclose(self) -> None:
        """Every running stream ends (``done``, artifacts), then its last frames reach
        Redis."""
        await self.registry.aclose()
        if self.cluster is not None:
            await self.cluster.aclose()

    async def open(
        self,
        plan: Planner,
        *,
        owner: str | None = None,
        idempotency_key: str | None = None,
        body_hash: str = "",
        primary: bool = True,
    ) -> Opened:
        """Start a stream, or replay the one ``idempotency_key`` names (module docstring).

        ``plan``: called once with the new stream's id, after the idempotency check (a
        replay plans nothing). ``owner``: the API key name that starts it (None without
        keys): an Idempotency-Key is that key's own. ``body_hash``: the request's
        :func:`request_hash`, with a key. ``primary``: a client reads the stream live as
        it starts (backpressure from the first frame); False for a caller that waits for
        the end (a non-streaming completion). Refusals: ``BAD_REQUEST`` (a key over
        :data:`MAX_IDEMPOTENCY_KEY_CHARS`), ``IDEMPOTENCY_KEY_REUSED``,
        ``IDEMPOTENCY_IN_FLIGHT``, ``REDIS_UNAVAILABLE``, ``AdmissionRefused`` (no
        upstream slot within ``ADMISSION_TIMEOUT_MS``), and whatever ``plan`` raises.
        """
        key = idempotency_key
        if key is not None:
            if len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
                raise RequestError(
                    ErrorCode.BAD_REQUEST,
                    f"Idempotency-Key is {len(key)} characters; at most "
                    f"{MAX_IDEMPOTENCY_KEY_CHARS} are allowed",
                    http_status=422,
                )
            if owner is not None:  # another key's record is never replayed
                key = f"{owner}:{key}"
            stored = self.registry.replay_for(key, body_hash)
            if stored is not None:
                return Replayed(stored)
            if self.cluster is not None:
                remote = await self.cluster.idempotency.replay_for(key, body_hash)
                if remote is not None:
                    return Replayed(remote)
        stream_id = new_stream_id()
        built = await plan(stream_id)
        admission = self.admission
        if admission is None:
            session = await self._start(built, key, owner, body_hash, primary)
        else:
            await admission.acquire()  # AdmissionRefused: nothing started, nothing held
            try:
                session = await self._start(built, key, owner, body_hash, primary)
            except BaseException:
                admission.release()
                raise
        if self.cluster is not None:
            self.cluster.buffers.track(session, key)  # its resume buffer, in Redis
        # One turn of the loop for the session before the caller goes on: it sends the
        # upstream request first, so the model starts while the writer is set up (TTFT).
        await asyncio.sleep(0)
        return Started(session)

    async def _start(
        self, built: StreamPlan, key: str | None, owner: str | None, body_hash: str, primary: bool
    ) -> StreamSession:
        """Claim the key (Redis), then start the session; with admission, its task gives
        the slot back when it ends."""
        if key is not None and self.cluster is not None:
            claimed = await self.cluster.idempotency.claim(key, body_hash, built.stream_id, owner)
            if claimed is not None:  # another replica started it since we looked
                held_hash, holder = claimed
                if held_hash != body_hash:
                    raise StreamRegistry.key_reused()
                raise StreamRegistry.in_flight(holder)
        session = self.parts.session(built)
        if primary:
            session.log.attach_primary()  # backpressure from the first frame on
        task = self.registry.start(session, idempotency_key=key, body_hash=body_hash)
        admission = self.admission
        if admission is not None:
            task.add_done_callback(lambda _: admission.release())
        return session

    async def find(self, stream_id: str, caller: str | None) -> StreamSession | RemoteStream:
        """The stream to resume: run here, or known to Redis; ``NOT_FOUND`` otherwise,
        ``FORBIDDEN`` for a caller (an API key name) other than the one that started it."""
        session = self.registry.find(stream_id)
        if session is None and self.cluster is not None:  # run by another replica, or was
            remote = await self.cluster.buffers.find_announced(stream_id)
            if remote is not None:
                check_caller(caller, remote.key, stream_id)
                return remote
        if session is None:
            session = self.registry.get(stream_id)  # the NOT_FOUND
        check_caller(caller, session.plan.owner, stream_id)
        return session

    async def command(self, stream_id: str, command: Command, caller: str | None) -> dict[str, Any]:
        """Apply ``command`` from ``caller`` (an API key name, None without keys) to the
        stream, wherever it runs: its answer, or the refusal as a ``ToolForgeError``."""
        session = self.registry.find(stream_id)
        if session is not None:
            check_caller(caller, session.plan.owner, stream_id)
            return await apply(session, command)
        if self.cluster is not None:
            wire = {**to_wire(command), "caller": caller}
            answer = await self.cluster.commands.send(stream_id, wire)
            if answer is not None:
                return answer
        raise self.registry.not_found(stream_id)

    async def _forwarded(self, stream_id: str, wire: dict[str, Any]) -> dict[str, Any]:
        """A command another replica forwarded for a stream run here."""
        session = self.registry.get(stream_id)
        check_caller(wire.get("caller"), session.plan.owner, stream_id)
        return await apply(session, from_wire(wire))
