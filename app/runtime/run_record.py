"""What a stream's driver records besides its frames: timings, the decided values, the
tool calls, and at the end the summary, the ``done`` frame and the run's artifacts.

Kept apart from :mod:`toolforge.runtime.session` so that the driver reads as what it is (the
engine's actions, done); everything here is bookkeeping about a run, none of it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolforge.core.engine import ConversationStats
from toolforge.core.protocol.frames import Done, DoneMetrics
from toolforge.errors import ToolForgeError
from toolforge.log import ARTIFACTS_WRITE_FAILED, get_logger
from toolforge.runtime.artifacts import EncodedFrames, RunArtifacts
from toolforge.runtime.frame_log import FrameLog

__all__ = ["RunRecord"]

log = get_logger(__name__)


@dataclass(slots=True)
class RunRecord:
    """One stream's record; the conversation counts the rest (:class:`ConversationStats`)."""

    started: float = 0.0
    first_token_at: float | None = None
    turn_started: float | None = None  # until the open turn's first token arrives
    # Time to first token of each turn: the first is the stream's TTFT, the others show
    # what a resume after a tool costs (prompt cache or not).
    turn_ttft_ms: list[float] = field(default_factory=list)
    degraded_ids: set[int] = field(default_factory=set)  # frame numbers marked degraded
    # The RESULT and OBJECT values, for result.json (the log keeps only encoded frames).
    results: list[object] = field(default_factory=list)
    objects: list[object] = field(default_factory=list)
    tool_logs: list[dict[str, object]] = field(default_factory=list)

    def token(self, now: float) -> None:
        """A delta with text arrived at ``now``: the turn's first one times its TTFT."""
        if self.turn_started is not None:
            self.turn_ttft_ms.append(round((now - self.turn_started) * 1e3, 3))
            self.turn_started = None
            if self.first_token_at is None:
                self.first_token_at = now

    def summary(
        self,
        ended: float,
        counts: ConversationStats,
        frames: FrameLog,
        *,
        queue_max_frames: int,
        budget: Mapping[str, Any] | None,
        context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """metrics.json's body (and what ``done.metrics`` and the logs take from it)."""
        usage = counts.usage
        tokens = int(usage.get("completion_tokens", counts.chunks)) if usage else counts.chunks
        first = self.first_token_at
        generating = ended - first if first is not None else 0.0
        return {
            "ttft_ms": None if first is None else round((first - self.started) * 1e3, 3),
            "duration_ms": round((ended - self.started) * 1e3, 3),
            "tokens": tokens,
            "upstream_chunks": counts.chunks,
            "tokens_per_s": round(tokens / generating, 2) if generating > 0 else None,
            "frames": frames.last_id + 1,  # the done frame included
            "frame_counts": dict(frames.event_counts),
            "turns": counts.turns,
            "tool_calls": counts.tool_calls,
            "repairs": counts.repairs,
            "degraded_frames": counts.degraded_frames,
            "queue_high_water": frames.high_water,
            "queue_max_frames": queue_max_frames,
            "queue_paused_ms": round(frames.paused_s * 1e3, 3),
            "bytes_written": frames.bytes_written,
            "budget": budget,
            "turn_ttft_ms": self.turn_ttft_ms,
            "upstream_timings": counts.upstream_timings,
            "guardrails": dict(counts.guardrails),
            "context": context,
            # The workflow's steps, iterations and nudges (None: no workflow).
            "workflow": counts.workflow.to_dict() if counts.workflow is not None else None,
        }

    @staticmethod
    def done(reason: str, counts: ConversationStats, summary: Mapping[str, Any]) -> Done:
        """The stream's last frame (docs/protocol.md): usage summed over its model calls."""
        usage = counts.usage if counts.usage is not None else {"completion_chunks": counts.chunks}
        metrics = DoneMetrics(
            ttft_ms=summary["ttft_ms"],
            duration_ms=summary["duration_ms"],
            tokens_per_s=summary["tokens_per_s"],
            frames=summary["frames"],
        )
        return Done(
            reason=reason,
            usage=usage,
            metrics=metrics,
            guardrails=dict(counts.guardrails) if counts.guardrails else None,
            workflow=counts.workflow.to_dict() if counts.workflow is not None else None,
        )

    async def write(
        self,
        artifacts: RunArtifacts,
        frames: FrameLog,
        *,
        stream_id: str,
        reason: str,
        error: ToolForgeError | None,
        prompt: Mapping[str, Any],
        summary: Mapping[str, Any],
    ) -> None:
        """The run's artifacts (docs/protocol.md); a failure is logged: the client has its
        stream."""
        result = {
            "stream_id": stream_id,
            "reason": reason,
            "error": error.to_dict() if error is not None else None,
            "results": self.results,
            "objects": self.objects,
        }
        try:
            await artifacts.write(
                # Read in the writer's thread, from a copy of the frame log's bytes: a long
                # stream's frames never cost the event loop a second time.
                frames=EncodedFrames(frames.encoded(), frozenset(self.degraded_ids)),
                prompt=dict(prompt),
                result=result,
                tool_logs=self.tool_logs,
                metrics={"stream_id": stream_id, "reason": reason, **summary},
            )
        except Exception:  # the stream is already complete for the client; log, go on
            log.exception(ARTIFACTS_WRITE_FAILED, stream_id=stream_id)
