"""OpenTelemetry traces (the otel extra), switched on by OTEL_* variables: a request span,
a span per upstream call and per tool, in the GenAI semantic conventions, with the
upstream call's context sent upstream as ``traceparent``. Recorded with the SDK's
in-memory exporter; the provider is the process's global one, as an application that
configured OpenTelemetry itself would have it."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.api.conftest import HarnessFactory, assert_well_formed, sentinel_reply
from toolforge.core.events import FrameKind
from toolforge.core.protocol import sentinels
from toolforge.eval.scripted_upstream import Script
from toolforge.runtime.tracing import tracing_wanted

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _global_provider() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)
    current = trace.get_tracer_provider()
    assert isinstance(current, TracerProvider)
    if current is not provider:
        current.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _call() -> str:
    args = orjson.dumps({"query": "pizza"}).decode()
    return sentinels.frame(FrameKind.TOOL_CALL, "t1", "places.search", args)


def _scripts() -> list[Script]:
    return [
        Script.from_tokens([_call()]),
        Script.from_tokens(
            [sentinel_reply("Roma.")], usage={"prompt_tokens": 321, "completion_tokens": 7}
        ),
    ]


def test_the_standard_variables_switch_it_on_and_off() -> None:
    assert not tracing_wanted({})
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    )


async def test_a_stream_with_a_tool_call_is_traced(
    make_gateway: HarnessFactory,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # the global provider is kept
    gw = await make_gateway(_scripts(), model_id="scripted-model")
    events = await gw.stream({"input": "Find pizza", "profile": "demo"})
    assert_well_formed(events)
    stream_id = next(e.data for e in events if e.event == "stream.begin")["stream_id"]

    finished = spans.get_finished_spans()
    by_name: dict[str, list] = {}  # type: ignore[type-arg]
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    (root,) = by_name["invoke_agent toolforge"]
    chats = by_name["chat scripted-model"]
    (tool,) = by_name["execute_tool places.search"]
    assert len(chats) == 2  # the call up to the tool call's END, then the answer

    assert root.kind is trace.SpanKind.SERVER and root.parent is None
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == stream_id
    assert root.attributes["gen_ai.request.model"] == "scripted-model"
    assert root.attributes["gen_ai.usage.input_tokens"] == 321
    assert root.attributes["gen_ai.usage.output_tokens"] == 7
    for chat in chats:
        assert chat.kind is trace.SpanKind.CLIENT
        assert chat.parent is not None and chat.parent.span_id == root.context.span_id
        assert chat.attributes is not None
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["server.address"] == "127.0.0.1"
    assert tool.parent is not None and tool.parent.span_id == root.context.span_id
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "places.search"
    assert tool.attributes["gen_ai.tool.call.id"] == "t1"
    assert tool.status.is_ok
    # Spans in order: the tool ran after the first call and before the second.
    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    assert (first.start_time or 0) <= (tool.start_time or 0) <= (second.start_time or 0)

    # traceparent upstream: each chat request carries its own span's context.
    sent = [r.headers.get("traceparent") for r in gw.upstream.requests]
    expected = [
        f"00-{c.context.trace_id:032x}-{c.context.span_id:016x}-{int(c.context.trace_flags):02x}"
        for c in (first, second)
    ]
    assert sent == expected


async def test_off_by_default_and_nothing_sent_upstream(
    make_gateway: HarnessFactory,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    gw = await make_gateway(_scripts())
    events = await gw.stream({"input": "Find pizza", "profile": "demo"})
    assert_well_formed(events)
    assert spans.get_finished_spans() == ()
    assert all("traceparent" not in r.headers for r in gw.upstream.requests)
