"""One stream, end to end: upstream deltas -> framer -> frame log (SPEC §3-§4).

A ``StreamSession`` owns exactly one producer task. The task reads the upstream, feeds
the text to the sans-IO ``Framer`` and appends the resulting frames to the session's
``FrameLog``, waiting whenever the client is ``QUEUE_MAX_FRAMES`` behind (backpressure).
Whatever happens — the model finishes, the upstream dies, the model breaks the
protocol, the client goes, someone cancels — the task ends the same way: an ``error``
frame if something failed, then exactly one ``done``, then the artifacts.

Cancellation is cooperative and owned: ``cancel(reason)`` cancels the task, which
closes the upstream response (and with it the TCP connection) at its next await, well
within the 50 ms SPEC §4 allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.framer import Framer
from app.core.wire import DONE, ERROR, STREAM_BEGIN, Frame
from app.errors import ErrorCode, ModelBehaviorError, ToolForgeError, UpstreamError
from app.log import CLIENT_DISCONNECTED, STREAM_FINISHED, STREAM_STARTED, get_logger
from app.runtime.artifacts import RunArtifacts
from app.runtime.frame_log import FrameLog
from app.runtime.metrics import GatewayMetrics
from app.upstream.base import ChatRequest, Upstream

__all__ = ["SessionLimits", "StreamPlan", "StreamSession"]

log = get_logger(__name__)

DisconnectPolicy = Literal["cancel", "continue"]


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """Everything a session needs, resolved from the HTTP request."""

    stream_id: str
    chat: ChatRequest
    mode: str
    on_disconnect: DisconnectPolicy = "cancel"
    budget_tokens: int | None = None
    prompt_record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    queue_max_frames: int = 128
    max_frame_bytes: int = 64 * 1024
    max_json_depth: int = 16
    frame_timeout_s: float = 15.0


class StreamSession:
    """The producer of one stream and the log its readers follow."""

    def __init__(
        self,
        plan: StreamPlan,
        *,
        upstream: Upstream,
        limits: SessionLimits,
        artifacts: RunArtifacts | None,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.id = plan.stream_id
        self._upstream = upstream
        self._limits = limits
        self._artifacts = artifacts
        self._metrics = metrics
        self._clock = clock
        self.log = FrameLog(max_pending=limits.queue_max_frames, clock=clock)
        self._framer = Framer(
            max_frame_bytes=limits.max_frame_bytes, max_depth=limits.max_json_depth
        )
        self._task: asyncio.Task[None] | None = None
        self._cancel_reason: str | None = None
        self.finished = asyncio.Event()  # set once done is appended and artifacts written
        self.reason: str | None = None
        self.finished_at: float | None = None
        self.stats: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("a session starts once")
        self._task = asyncio.create_task(self._run(), name=f"stream:{self.id}")

    @property
    def running(self) -> bool:
        return self._task is not None and not self.log.closed

    def cancel(self, reason: str = "cancelled") -> bool:
        """Stop the stream: upstream closed, ``done`` with ``reason``. False if already over."""
        if self._task is None or self._task.done() or self.log.closed:
            return False
        if self._cancel_reason is None:
            self._cancel_reason = reason
        self._task.cancel()
        return True

    def client_left(self) -> None:
        """The primary client disconnected: cancel, or keep going for a resume."""
        self.log.detach_primary()
        if self.running:
            log.info(CLIENT_DISCONNECTED, stream_id=self.id, policy=self.plan.on_disconnect)
            if self.plan.on_disconnect == "cancel":
                self.cancel("client_disconnected")

    async def wait(self) -> None:
        """Until the stream ended and its artifacts are written."""
        await self.finished.wait()

    # -- the producer ------------------------------------------------------------------

    async def _push(self, frame: Frame) -> None:
        log_ = self.log
        if log_.pending() >= self._limits.queue_max_frames:
            await log_.wait_for_room()
        log_.append(frame)

    async def _run(self) -> None:
        started = self._clock()
        first_token_at: float | None = None
        chunks = 0
        usage: dict[str, Any] | None = None
        finish: str | None = None
        error: ToolForgeError | None = None
        frame_opened_at: float | None = None
        framer = self._framer
        frame_timeout = self._limits.frame_timeout_s
        if self._metrics is not None:
            self._metrics.stream_started()
        log.info(STREAM_STARTED, stream_id=self.id, model=self.plan.chat.model, mode=self.plan.mode)
        self.log.append(
            Frame(
                STREAM_BEGIN,
                {
                    "stream_id": self.id,
                    "model": self.plan.chat.model,
                    "mode": self.plan.mode,
                    "budget_tokens": self.plan.budget_tokens,
                },
            )
        )
        deltas = self._upstream.stream(self.plan.chat)
        try:
            async for delta in deltas:
                if delta.text:
                    now = self._clock()
                    if first_token_at is None:
                        first_token_at = now
                    chunks += 1
                    for frame in framer.feed(delta.text):
                        await self._push(frame)
                    if framer.error is not None:
                        break
                    # FRAME_TIMEOUT_MS: a frame that stays open this long is abandoned,
                    # so a model that trickles forever cannot hold a tool call hostage.
                    if framer.open_frame_id is None:
                        frame_opened_at = None
                    elif frame_opened_at is None:
                        frame_opened_at = now
                    elif now - frame_opened_at > frame_timeout:
                        raise ModelBehaviorError(
                            ErrorCode.FRAME_TIMEOUT,
                            f"frame {framer.open_frame_id!r} stayed open longer than "
                            f"{frame_timeout * 1000:.0f} ms (FRAME_TIMEOUT_MS)",
                            frame_id=framer.open_frame_id,
                        )
                if delta.finish_reason is not None:
                    finish = delta.finish_reason
                if delta.usage is not None:
                    usage = delta.usage
            else:
                for frame in framer.close():
                    await self._push(frame)
            if framer.error is not None:
                error = framer.error
        except ToolForgeError as exc:
            error = exc
            self.log.append(Frame(ERROR, exc.to_dict()))
            if isinstance(exc, UpstreamError) and self._metrics is not None:
                self._metrics.upstream_error(str(exc.code))
        except asyncio.CancelledError:
            # Our own cancel (client gone, cancel endpoint, shutdown): end the stream
            # properly below instead of vanishing. The task was asked to stop, not to
            # die silently, so it finishes its bookkeeping and returns.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if self._cancel_reason is None:
                self._cancel_reason = "shutdown"
        except Exception as exc:  # a bug of ours: still end the stream with a frame
            log.exception("stream.internal_error", stream_id=self.id)
            error = ToolForgeError(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            self.log.append(Frame(ERROR, error.to_dict()))
        finally:
            # Leaving the loop early (a protocol error, a cancel) must close the upstream
            # response now, not whenever the generator is garbage-collected.
            aclose = getattr(deltas, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        ended = self._clock()
        if self._cancel_reason is not None:
            reason = self._cancel_reason
        elif error is not None:
            reason = "error"
        else:
            reason = finish or "stop"
        self.reason = reason
        self.stats = self._stats(started, first_token_at, ended, chunks, usage)
        self.log.append(
            Frame(
                DONE,
                {
                    "reason": reason,
                    "usage": usage if usage is not None else {"completion_chunks": chunks},
                    "metrics": {
                        k: self.stats[k]
                        for k in ("ttft_ms", "duration_ms", "tokens_per_s", "frames")
                    },
                },
            )
        )
        self.log.close()
        self.finished_at = self._clock()
        log.info(STREAM_FINISHED, stream_id=self.id, reason=reason, **self._log_stats())
        if self._metrics is not None:
            self._metrics.stream_finished(
                reason,
                (ended - started),
                None if first_token_at is None else first_token_at - started,
                self._frame_counts(),
                usage.get("completion_tokens", chunks) if usage else chunks,
                self.log.paused_s,
            )
        await self._write_artifacts(reason, error)
        self.finished.set()

    # -- accounting --------------------------------------------------------------------

    def _frame_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for frame in self.log.frames:
            counts[frame.event] = counts.get(frame.event, 0) + 1
        return counts

    def _stats(
        self,
        started: float,
        first_token_at: float | None,
        ended: float,
        chunks: int,
        usage: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        tokens = int(usage.get("completion_tokens", chunks)) if usage else chunks
        generating = ended - first_token_at if first_token_at is not None else 0.0
        return {
            "ttft_ms": None
            if first_token_at is None
            else round((first_token_at - started) * 1e3, 3),
            "duration_ms": round((ended - started) * 1e3, 3),
            "tokens": tokens,
            "upstream_chunks": chunks,
            "tokens_per_s": round(tokens / generating, 2) if generating > 0 else None,
            "frames": self.log.last_id + 1,  # the done frame included
            "frame_counts": self._frame_counts(),
            "queue_high_water": self.log.high_water,
            "queue_max_frames": self._limits.queue_max_frames,
            "queue_paused_ms": round(self.log.paused_s * 1e3, 3),
            "bytes_written": self.log.bytes_written,
            "degraded_frames": 0,
            "repairs": 0,
        }

    def _log_stats(self) -> dict[str, Any]:
        return {k: self.stats[k] for k in ("ttft_ms", "duration_ms", "tokens", "frames")}

    async def _write_artifacts(self, reason: str, error: ToolForgeError | None) -> None:
        if self._artifacts is None:
            return
        frames = [
            {"id": seq, "event": f.event, "data": f.data}
            for seq, f in enumerate(self.log.frames, start=1)
        ]
        result = {
            "stream_id": self.id,
            "reason": reason,
            "error": error.to_dict() if error is not None else None,
            "results": [f.data for f in self.log.frames if f.event == "result.end"],
            "objects": [f.data for f in self.log.frames if f.event == "json.end"],
        }
        try:
            await self._artifacts.write(
                frames=frames,
                prompt=dict(self.plan.prompt_record),
                result=result,
                tool_logs=[],
                metrics={"stream_id": self.id, "reason": reason, **self.stats},
            )
        except Exception:  # the stream is already complete for the client; log, go on
            log.exception("artifacts.write_failed", stream_id=self.id)
