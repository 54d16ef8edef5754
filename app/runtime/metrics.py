"""Prometheus metrics for ``GET /metrics`` (SPEC §2), kept off the per-frame hot path.

Why it is built this way:

* **prometheus-client**, the reference implementation, rather than hand-written
  exposition text: escaping, histogram buckets, content negotiation (text 0.0.4 or
  OpenMetrics) and thread safety are its job.
* **One** ``CollectorRegistry`` **per** :class:`GatewayMetrics`, never the global
  ``REGISTRY``: ``create_app`` runs many times in one test process, and registering the
  same metric name twice in one registry is an error. Each app owns its instance.
* **Recorded once per stream.** The session counts frames by event in a plain dict as it
  sends them and hands the totals to :meth:`GatewayMetrics.stream_finished`; a metric
  call (a lock and a label lookup) per frame would tax the hot path (STYLE convention 7).
* **Recording never raises.** Counters refuse negative increments and NaN would poison a
  series forever; a clock hiccup or a bad count is clamped to zero rather than allowed to
  break the end of a stream.
* **Label values must be bounded**: outcomes and codes from fixed sets, tool names from
  the registry. Never a stream id, a model's text or a user string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["GatewayMetrics"]


def _amount(value: float) -> float:
    """A counter increment or observation that cannot raise or poison a series."""
    return value if math.isfinite(value) and value > 0 else 0.0


class GatewayMetrics:
    """The gateway's metrics, in a registry of their own.

    ``stream_started()`` when a stream begins, ``stream_finished(...)`` exactly once when it
    ends (whatever the outcome: the active gauge depends on the pairing), and
    ``upstream_error``/``tool_call`` as those happen. :meth:`render` is the body and
    content type for ``GET /metrics``.
    """

    TTFT_BUCKETS: ClassVar[tuple[float, ...]] = (
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
    )
    """Time to first token, 1 ms to 30 s: a warm local model answers in milliseconds, a cold
    one loading weights or a queued remote one in seconds. Slower lands in ``+Inf``."""

    DURATION_BUCKETS: ClassVar[tuple[float, ...]] = (
        0.01,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
        60.0,
        120.0,
        300.0,
        600.0,
    )
    """Whole-stream duration, 10 ms to 10 min: several tool round trips with 8 s tool
    timeouts and 15 s frame timeouts (SPEC §3) make minutes-long streams legitimate."""

    def __init__(self, *, process_metrics: bool = True) -> None:
        """``process_metrics`` adds the usual ``process_*`` (CPU, memory, file
        descriptors) and ``python_info`` series that the global registry would have had."""
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        if process_metrics:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        # Counter names are given without "_total": prometheus-client appends it.
        self.streams = Counter(
            "toolforge_streams",
            "Streams finished, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.streams_active = Gauge(
            "toolforge_streams_active", "Streams currently open.", registry=registry
        )
        self.frames = Counter(
            "toolforge_frames",
            "Frames sent to clients, by SSE event name.",
            ["event"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "toolforge_upstream_errors",
            "Upstream failures, by error code.",
            ["code"],
            registry=registry,
        )
        self.ttft = Histogram(
            "toolforge_ttft_seconds",
            "Time from request to the first upstream token.",
            buckets=self.TTFT_BUCKETS,
            registry=registry,
        )
        self.stream_duration = Histogram(
            "toolforge_stream_duration_seconds",
            "Time from request to the done frame.",
            buckets=self.DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_paused = Counter(
            "toolforge_queue_paused_seconds",
            "Time upstream reading was paused because the frame queue was full (SPEC §4).",
            registry=registry,
        )
        self.tokens = Counter(
            "toolforge_tokens", "Tokens generated by upstream models.", registry=registry
        )
        self.tool_calls = Counter(
            "toolforge_tool_calls",
            "Tool calls, by tool name and outcome.",
            ["name", "outcome"],
            registry=registry,
        )

        self.guardrails = Counter(
            "toolforge_guardrail_actions",
            "What the small-model guardrails did (rescued, nudge, respond, ...), by kind.",
            ["action"],
            registry=registry,
        )

    def guardrail_actions(self, counts: Mapping[str, int]) -> None:
        """A stream's guardrail actions (``done.guardrails``), counted by kind."""
        for action, count in counts.items():
            self.guardrails.labels(action=action).inc(count)

    def stream_started(self) -> None:
        """A stream opened."""
        self.streams_active.inc()

    def stream_finished(
        self,
        outcome: str,
        duration_s: float,
        ttft_s: float | None,
        frame_counts: Mapping[str, int],
        tokens: int,
        paused_s: float,
    ) -> None:
        """A stream ended: everything it did, recorded at once.

        ``outcome`` is a bounded word (``"completed"``, ``"error"``, ``"cancelled"``,
        ``"disconnected"``, ...); ``ttft_s`` is ``None`` when no token ever arrived;
        ``frame_counts`` maps SSE event names to how many were sent.
        """
        self.streams_active.dec()
        self.streams.labels(outcome=outcome).inc()
        self.stream_duration.observe(_amount(duration_s))
        if ttft_s is not None:
            self.ttft.observe(_amount(ttft_s))
        for event, count in frame_counts.items():
            if count > 0:
                self.frames.labels(event=event).inc(count)
        self.tokens.inc(_amount(tokens))
        self.queue_paused.inc(_amount(paused_s))

    def upstream_error(self, code: str) -> None:
        """An upstream failure, by its ``ErrorCode`` (a ``StrEnum``, so passed as is)."""
        self.upstream_errors.labels(code=str(code)).inc()

    def tool_call(self, name: str, outcome: str) -> None:
        """One finished tool call (``outcome`` e.g. ``"ok"``, ``"error"``, ``"timeout"``)."""
        self.tool_calls.labels(name=name, outcome=outcome).inc()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type.

        ``accept`` is the scrape's ``Accept`` header: OpenMetrics when the scraper asks for
        it, Prometheus text 0.0.4 otherwise (the same negotiation as prometheus-client's
        own ASGI app).
        """
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
