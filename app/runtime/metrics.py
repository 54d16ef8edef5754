"""Prometheus metrics for ``GET /metrics`` (docs/protocol.md), kept off the per-frame hot path.

Why it is built this way:

* **prometheus-client**, the reference implementation, rather than hand-written
  exposition text: escaping, histogram buckets, content negotiation (text 0.0.4 or
  OpenMetrics) and thread safety are its job.
* **One** ``CollectorRegistry`` **per** :class:`GatewayMetrics`, never the global
  ``REGISTRY``: ``create_app`` runs many times in one test process, and registering the
  same metric name twice in one registry is an error. Each app owns its instance.
* **Recorded once per stream.** The session counts frames by event in a plain dict as it
  sends them and hands the totals to :meth:`GatewayMetrics.stream_finished`; a metric
  call (a lock and a label lookup) per frame would tax the hot path (docs/performance.md).
* **Recording never raises.** Counters refuse negative increments and NaN would poison a
  series forever; a clock hiccup or a bad count is clamped to zero rather than allowed to
  break the end of a stream.
* **Label values must be bounded**: outcomes and codes from fixed sets, tool names from
  the registry, modes from the planner's. Never a stream id, a model's text or a user
  string. The model label is the model a stream was served by, which a client can name
  (``model`` in any request): the gateway gives the names it knows (``MODEL_ID``, the
  managed model, ``METRICS_MODELS``) and every other name counts as ``other``, so a
  client sending a thousand names adds one series, not a thousand. Tool names are bounded
  the same way (a client-side tool's name is the client's). Without a list of names (a
  bare :class:`GatewayMetrics`), the first :attr:`GatewayMetrics.MAX_MODELS` distinct
  models keep their own series.
* **Failed authentication is counted**, by a reason from a fixed set
  (:attr:`GatewayMetrics.AUTH_REASONS`), never by the key or the address.
* **Gauges read at scrape time.** The queue depths (frames buffered for clients across the
  open streams, docs/protocol.md; tool calls waiting for a slot, docs/tools.md) are callbacks that
  prometheus-client calls when ``/metrics`` is read: nothing on the stream's path.
* **Content negotiation** is prometheus-client's own: OpenMetrics when the scrape's
  ``Accept`` asks for ``application/openmetrics-text``, Prometheus text 0.0.4 otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["GatewayMetrics"]


OTHER: Final = "other"
"""The label value for a model or tool name the gateway was not told about."""


def _amount(value: float) -> float:
    """A counter increment or observation that cannot raise or poison a series."""
    return value if math.isfinite(value) and value > 0 else 0.0


class _ModelSeries(NamedTuple):
    """One (model, mode)'s series that every stream's end adds to."""

    duration: Histogram
    ttft: Histogram
    tokens: Counter
    prompt_tokens: Counter


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
    timeouts and 15 s frame timeouts (docs/protocol.md) make minutes-long streams legitimate."""

    TOOL_BUCKETS: ClassVar[tuple[float, ...]] = (
        0.0005,
        0.001,
        0.005,
        0.01,
        0.05,
        0.1,
        0.5,
        1.0,
        2.5,
        5.0,
        8.0,
        15.0,
        30.0,
        120.0,
    )
    """A tool call, 0.5 ms (the demo pack's in-process tools) to 2 min (a client-side tool,
    ``CLIENT_TOOL_TIMEOUT_MS``); 5 s is the soft target and 8 s the default timeout."""

    ADMISSION_BUCKETS: ClassVar[tuple[float, ...]] = (
        0.001,
        0.005,
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
    )
    """A wait for an upstream slot, 1 ms (a slot freed at once) to 30 s (a long
    ``ADMISSION_TIMEOUT_MS``); only requests that found every slot held are observed."""

    MAX_MODELS: ClassVar[int] = 32
    """Without known names: distinct model label values kept; later ones count as ``other``."""

    AUTH_REASONS: ClassVar[frozenset[str]] = frozenset({"missing", "wrong", "throttled"})
    """Why an API-key check failed: no key sent, a key the gateway does not know, or the
    client's address refused for too many failures."""

    def __init__(
        self,
        *,
        process_metrics: bool = True,
        models: Iterable[str] | None = None,
        tools: Iterable[str] | None = None,
    ) -> None:
        """``process_metrics`` adds the usual ``process_*`` (CPU, memory, file
        descriptors) and ``python_info`` series that the global registry would have had.
        ``models`` and ``tools``: the names that keep their own label (any other is
        ``other``); more models may be added with :meth:`know_models`."""
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        if process_metrics:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        # Counter names are given without "_total": prometheus-client appends it.
        self._models: set[str] = set(models or ())
        self._models_fixed = models is not None
        self._tools: frozenset[str] | None = None if tools is None else frozenset(tools)
        # The labelled series a stream's end adds to, looked up once per label value:
        # ``labels()`` checks and joins its arguments under a lock on every call. Bounded
        # as the labels are (models, modes, outcomes, event names).
        self._per_model: dict[tuple[str, str], _ModelSeries] = {}
        self._finished: dict[tuple[str, str, str], Counter] = {}
        self._frame_series: dict[str, Counter] = {}
        self.streams = Counter(
            "toolforge_streams",
            "Streams finished, by outcome, model and mode.",
            ["outcome", "model", "mode"],
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
            ["model", "mode"],
            buckets=self.TTFT_BUCKETS,
            registry=registry,
        )
        self.stream_duration = Histogram(
            "toolforge_stream_duration_seconds",
            "Time from request to the done frame.",
            ["model", "mode"],
            buckets=self.DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_paused = Counter(
            "toolforge_queue_paused_seconds",
            "Time upstream reading was paused because the frame queue was full (docs/protocol.md).",
            registry=registry,
        )
        self.tokens = Counter(
            "toolforge_tokens",
            "Tokens generated by upstream models (completion tokens), by model and mode.",
            ["model", "mode"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "toolforge_prompt_tokens",
            "Prompt tokens the upstream reported processing, by model and mode.",
            ["model", "mode"],
            registry=registry,
        )
        self.tool_calls = Counter(
            "toolforge_tool_calls",
            "Tool calls, by tool name and outcome.",
            ["name", "outcome"],
            registry=registry,
        )
        self.tool_duration = Histogram(
            "toolforge_tool_duration_seconds",
            "Tool call latency (every attempt and retry wait included), by tool name.",
            ["name"],
            buckets=self.TOOL_BUCKETS,
            registry=registry,
        )
        self.frame_queue_depth = Gauge(
            "toolforge_frame_queue_depth",
            "Frames buffered for clients now, over every open stream (docs/protocol.md).",
            registry=registry,
        )
        self.tool_queue_depth = Gauge(
            "toolforge_tool_queue_depth",
            "Tool calls waiting for an executor slot now (docs/tools.md).",
            registry=registry,
        )
        self.frame_queue_depth.set_function(lambda: 0.0)
        self.tool_queue_depth.set_function(lambda: 0.0)
        # Admission (docs/deployment.md): requests waiting for an upstream slot, the slots
        # held, and each wait's length, by whether it ended admitted or refused (503).
        self.admission_queue_depth = Gauge(
            "toolforge_admission_queue_depth",
            "Requests waiting for an upstream slot now (UPSTREAM_MAX_CONNECTIONS).",
            registry=registry,
        )
        self.admission_active = Gauge(
            "toolforge_admission_slots_in_use",
            "Upstream slots held now: streams admitted and not yet ended.",
            registry=registry,
        )
        self.admission_queue_depth.set_function(lambda: 0.0)
        self.admission_active.set_function(lambda: 0.0)
        self.admission_wait = Histogram(
            "toolforge_admission_wait_seconds",
            "How long a request waited for an upstream slot, by outcome (admitted, refused).",
            ["outcome"],
            buckets=self.ADMISSION_BUCKETS,
            registry=registry,
        )
        for outcome in ("admitted", "refused"):  # both series from the start
            self.admission_wait.labels(outcome=outcome)

        self.guardrails = Counter(
            "toolforge_guardrail_actions",
            "What the small-model guardrails did (rescued, nudge, respond, ...), by kind.",
            ["action"],
            registry=registry,
        )
        self.auth_failures = Counter(
            "toolforge_auth_failures",
            "Requests refused by the API-key check, by reason (missing, wrong, throttled).",
            ["reason"],
            registry=registry,
        )
        for reason in sorted(self.AUTH_REASONS):  # every series from the start, at 0
            self.auth_failures.labels(reason=reason)

    def watch_queues(
        self, *, frames: Callable[[], float] | None = None, tools: Callable[[], float] | None = None
    ) -> None:
        """Where the queue-depth gauges read from when scraped (the stream registry's
        buffered frames, the tool executor's waiting calls)."""
        if frames is not None:
            self.frame_queue_depth.set_function(frames)
        if tools is not None:
            self.tool_queue_depth.set_function(tools)

    def watch_admission(self, *, depth: Callable[[], float], active: Callable[[], float]) -> None:
        """Where the admission gauges read from when scraped (the admission's queue)."""
        self.admission_queue_depth.set_function(depth)
        self.admission_active.set_function(active)

    def admission_waited(self, wait_s: float, *, admitted: bool) -> None:
        """A request that had to wait for an upstream slot got one, or was refused."""
        outcome = "admitted" if admitted else "refused"
        self.admission_wait.labels(outcome=outcome).observe(_amount(wait_s))

    def know_models(self, names: Iterable[str | None]) -> None:
        """Give ``names`` their own model label (the models this gateway serves)."""
        self._models.update(name for name in names if name)
        self._models_fixed = True

    def know_tools(self, names: Iterable[str]) -> None:
        """Give ``names`` (the tool registry's) their own tool label; any other is ``other``."""
        self._tools = frozenset(names) | (self._tools or frozenset())

    def _model(self, model: str) -> str:
        if model in self._models:
            return model
        if not self._models_fixed and len(self._models) < self.MAX_MODELS:
            self._models.add(model)
            return model
        return OTHER

    def auth_failed(self, reason: str) -> None:
        """A request the API-key check refused (``reason``: one of :attr:`AUTH_REASONS`)."""
        self.auth_failures.labels(reason=reason if reason in self.AUTH_REASONS else OTHER).inc()

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
        *,
        model: str = "unknown",
        mode: str = "unknown",
        prompt_tokens: int = 0,
    ) -> None:
        """A stream ended: everything it did, recorded at once.

        ``outcome`` is a bounded word (``"completed"``, ``"error"``, ``"cancelled"``,
        ``"disconnected"``, ...); ``ttft_s`` is ``None`` when no token ever arrived;
        ``frame_counts`` maps SSE event names to how many were sent; ``tokens`` are the
        completion tokens, ``prompt_tokens`` the prompt's (the upstream's usage).
        """
        model = self._model(model)
        self.streams_active.dec()
        finished = self._finished.get((outcome, model, mode))
        if finished is None:
            finished = self.streams.labels(outcome=outcome, model=model, mode=mode)
            self._finished[(outcome, model, mode)] = finished
        finished.inc()
        series = self._per_model.get((model, mode))
        if series is None:  # the ttft series exists from the start, observed or not
            series = self._per_model[(model, mode)] = _ModelSeries(
                self.stream_duration.labels(model=model, mode=mode),
                self.ttft.labels(model=model, mode=mode),
                self.tokens.labels(model=model, mode=mode),
                self.prompt_tokens.labels(model=model, mode=mode),
            )
        series.duration.observe(_amount(duration_s))
        if ttft_s is not None:
            series.ttft.observe(_amount(ttft_s))
        frames = self._frame_series
        for event, count in frame_counts.items():
            if count > 0:
                counter = frames.get(event)
                if counter is None:
                    counter = frames[event] = self.frames.labels(event=event)
                counter.inc(count)
        series.tokens.inc(_amount(tokens))
        series.prompt_tokens.inc(_amount(prompt_tokens))
        self.queue_paused.inc(_amount(paused_s))

    def upstream_error(self, code: str) -> None:
        """An upstream failure, by its ``ErrorCode`` (a ``StrEnum``, so passed as is)."""
        self.upstream_errors.labels(code=str(code)).inc()

    def tool_call(self, name: str, outcome: str, duration_s: float | None = None) -> None:
        """One finished tool call (``outcome`` e.g. ``"ok"``, ``"error"``, ``"timeout"``)
        and, when it ran, how long it took."""
        if self._tools is not None and name not in self._tools:
            name = OTHER
        self.tool_calls.labels(name=name, outcome=outcome).inc()
        if duration_s is not None:
            self.tool_duration.labels(name=name).observe(_amount(duration_s))

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type.

        ``accept`` is the scrape's ``Accept`` header: OpenMetrics when the scraper asks for
        it, Prometheus text 0.0.4 otherwise (the same negotiation as prometheus-client's
        own ASGI app).
        """
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
