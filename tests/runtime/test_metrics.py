"""Gateway metrics: per-instance registries, values visible in the exposition text."""

from __future__ import annotations

import math

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from toolforge.errors import ErrorCode
from toolforge.runtime.metrics import GatewayMetrics


def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(metrics: GatewayMetrics, sample: str, **labels: str) -> float:
    return samples(metrics)[(sample, tuple(sorted(labels.items())))]


M = {"model": "SmolLM2-135M-Instruct", "mode": "constrained"}


def finish(metrics: GatewayMetrics, **overrides: object) -> None:
    arguments: dict[str, object] = {
        **M,
        "outcome": "completed",
        "duration_s": 1.2,
        "ttft_s": 0.003,
        "frame_counts": {"stream.begin": 1, "text.delta": 40, "done": 1, "ping": 0},
        "tokens": 57,
        "paused_s": 0.25,
    }
    arguments.update(overrides)
    metrics.stream_finished(**arguments)  # type: ignore[arg-type]


def test_the_rendered_text_holds_what_was_recorded() -> None:
    metrics = GatewayMetrics()
    metrics.stream_started()
    metrics.stream_started()
    finish(metrics)
    metrics.upstream_error(ErrorCode.UPSTREAM_TIMEOUT)
    metrics.tool_call("places.search", "ok")
    metrics.tool_call("places.search", "ok")
    metrics.tool_call("bookings.create", "error")

    assert value(metrics, "toolforge_streams_active") == 1
    assert value(metrics, "toolforge_streams_total", outcome="completed", **M) == 1
    assert value(metrics, "toolforge_frames_total", event="text.delta") == 40
    assert value(metrics, "toolforge_frames_total", event="done") == 1
    assert ("toolforge_frames_total", (("event", "ping"),)) not in samples(metrics)
    assert value(metrics, "toolforge_upstream_errors_total", code="UPSTREAM_TIMEOUT") == 1
    assert value(metrics, "toolforge_tokens_total", **M) == 57
    assert value(metrics, "toolforge_queue_paused_seconds_total") == 0.25
    assert value(metrics, "toolforge_tool_calls_total", name="places.search", outcome="ok") == 2
    assert (
        value(metrics, "toolforge_tool_calls_total", name="bookings.create", outcome="error") == 1
    )
    # Histograms: 3 ms lands in the 5 ms bucket, not the 2.5 ms one; 1.2 s below 2.5 s.
    assert value(metrics, "toolforge_ttft_seconds_bucket", le="0.0025", **M) == 0
    assert value(metrics, "toolforge_ttft_seconds_bucket", le="0.005", **M) == 1
    assert value(metrics, "toolforge_ttft_seconds_count", **M) == 1
    assert value(metrics, "toolforge_stream_duration_seconds_bucket", le="2.5", **M) == 1
    assert value(metrics, "toolforge_stream_duration_seconds_sum", **M) == 1.2


def test_ttft_buckets_span_a_millisecond_to_thirty_seconds() -> None:
    buckets = GatewayMetrics.TTFT_BUCKETS
    assert buckets[0] == 0.001 and buckets[-1] == 30.0 and list(buckets) == sorted(buckets)


def test_two_instances_share_nothing() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.stream_started()
    finish(first, outcome="error", tokens=5)
    second.tool_call("time.now", "ok")
    assert value(first, "toolforge_streams_total", outcome="error", **M) == 1
    assert not any(name == "toolforge_streams_total" for name, _ in samples(second))
    assert not any(name == "toolforge_tokens_total" for name, _ in samples(second))
    assert ("toolforge_tool_calls_total", (("name", "time.now"), ("outcome", "ok"))) not in (
        samples(first)
    )
    # And neither touched the process-global registry.
    assert REGISTRY.get_sample_value("toolforge_tokens_total") is None


def test_many_instances_in_one_process_do_not_collide() -> None:
    # create_app runs once per test; duplicate names in a shared registry would raise.
    instances = [GatewayMetrics() for _ in range(20)]
    assert len({id(m.registry) for m in instances}) == 20


def test_a_stream_without_tokens_records_no_ttft() -> None:
    metrics = GatewayMetrics()
    metrics.stream_started()
    finish(metrics, outcome="cancelled", ttft_s=None, frame_counts={})
    assert value(metrics, "toolforge_ttft_seconds_count", **M) == 0
    assert value(metrics, "toolforge_streams_total", outcome="cancelled", **M) == 1
    assert value(metrics, "toolforge_streams_active") == 0


def test_bad_numbers_are_clamped_not_raised() -> None:
    metrics = GatewayMetrics()
    metrics.stream_started()
    finish(metrics, duration_s=-0.5, ttft_s=math.nan, tokens=-3, paused_s=math.inf)
    assert value(metrics, "toolforge_tokens_total", **M) == 0
    assert value(metrics, "toolforge_queue_paused_seconds_total") == 0
    assert value(metrics, "toolforge_stream_duration_seconds_sum", **M) == 0
    assert value(metrics, "toolforge_ttft_seconds_sum", **M) == 0


def test_openmetrics_is_served_when_asked_for() -> None:
    metrics = GatewayMetrics(process_metrics=False)
    metrics.tool_call("fs.read", "ok")
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert b'toolforge_tool_calls_total{name="fs.read",outcome="ok"} 1.0' in body


def test_process_metrics_are_optional() -> None:
    with_process = {name for name, _ in samples(GatewayMetrics())}
    without = {name for name, _ in samples(GatewayMetrics(process_metrics=False))}
    assert "python_info" in with_process and "python_info" not in without
    assert all(name.startswith("toolforge_") for name in without)


def test_model_labels_are_bounded() -> None:
    metrics = GatewayMetrics(process_metrics=False)
    for i in range(GatewayMetrics.MAX_MODELS + 5):
        metrics.stream_started()
        finish(metrics, model=f"client-named-{i}")
    models = {dict(labels)["model"] for name, labels in samples(metrics)
              if name == "toolforge_streams_total"}  # fmt: skip
    assert len(models) == GatewayMetrics.MAX_MODELS + 1 and "other" in models
    other = (("mode", "constrained"), ("model", "other"), ("outcome", "completed"))
    assert samples(metrics)[("toolforge_streams_total", other)] == 5


def test_prompt_tokens_and_tool_latency() -> None:
    metrics = GatewayMetrics(process_metrics=False)
    metrics.stream_started()
    finish(metrics, prompt_tokens=1200, tokens=57)
    metrics.tool_call("places.search", "ok", 0.0032)
    metrics.tool_call("places.search", "refused")  # never ran: no latency
    assert value(metrics, "toolforge_prompt_tokens_total", **M) == 1200
    assert value(metrics, "toolforge_tokens_total", **M) == 57
    tool = {"name": "places.search"}
    assert value(metrics, "toolforge_tool_duration_seconds_count", **tool) == 1
    assert value(metrics, "toolforge_tool_duration_seconds_bucket", le="0.001", **tool) == 0
    assert value(metrics, "toolforge_tool_duration_seconds_bucket", le="0.005", **tool) == 1


def test_queue_depth_gauges_are_read_when_scraped() -> None:
    metrics = GatewayMetrics(process_metrics=False)
    assert value(metrics, "toolforge_frame_queue_depth") == 0
    depth = {"frames": 0, "tools": 0}
    metrics.watch_queues(frames=lambda: depth["frames"], tools=lambda: depth["tools"])
    depth.update(frames=17, tools=3)
    assert value(metrics, "toolforge_frame_queue_depth") == 17
    assert value(metrics, "toolforge_tool_queue_depth") == 3
