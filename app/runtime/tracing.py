"""Optional OpenTelemetry traces, in the GenAI semantic conventions.

Switched on by the standard ``OTEL_*`` variables alone (docs/observability.md): any of
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``; ``none`` is off), unless
``OTEL_SDK_DISABLED=true``. The packages are the ``otel`` extra
(``pip install 'toolforge[otel]'``); asked for without them, the gateway says so once and
serves untraced.

Per stream (``POST /v1/stream`` or the proxy's chat completion):

* a request span ``invoke_agent toolforge`` (SERVER): ``gen_ai.operation.name``,
  ``gen_ai.conversation.id`` (the stream id), ``gen_ai.request.model``, the mode,
  and at the end the finish reason and token usage;
* an upstream span per model call, ``chat <model>`` (CLIENT): ``gen_ai.provider.name``,
  ``server.address``/``server.port``, from the request to the end of the generation;
  its context goes upstream as ``traceparent`` (W3C Trace Context);
* a span per tool call, ``execute_tool <name>`` (INTERNAL): ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type`` and, on failure, ``error.type``.

When tracing is off the session holds ``None`` and checks it once per model call and per
tool call: nothing per token, and the upstream request is the same bytes as before.

An application that configured OpenTelemetry itself (a global SDK ``TracerProvider``,
e.g. ``opentelemetry-instrument``) keeps its provider and exporters; otherwise this module
builds one (``OTEL_SERVICE_NAME`` or ``toolforge``, ``OTEL_RESOURCE_ATTRIBUTES``, the
sampler from ``OTEL_TRACES_SAMPLER``, batch export as ``OTEL_BSP_*`` say).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from toolforge.log import get_logger
from toolforge.upstream.exchange import set_trace_injector

__all__ = ["Tracing", "tracing_from_env", "tracing_wanted"]

log = get_logger(__name__)


def tracing_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(
        exporters
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class Tracing:
    """The tracer, and the spans a stream makes (see the module docstring)."""

    def __init__(self, tracer: Any, provider: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._provider = provider  # ours to shut down, or None
        self.server_url: str | None = None  # the upstream's base URL, for server.address

    def stream_span(self, stream_id: str, model: str, mode: str) -> Any:
        return self._tracer.start_span(
            "invoke_agent toolforge",
            kind=self._trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "toolforge",
                "gen_ai.conversation.id": stream_id,
                "gen_ai.request.model": model,
                "toolforge.mode": mode,
            },
        )

    def end_stream(self, span: Any, reason: str, usage: Mapping[str, Any] | None) -> None:
        span.set_attribute("gen_ai.response.finish_reasons", [reason])
        if usage:
            for key, attribute in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("completion_tokens", "gen_ai.usage.output_tokens"),
            ):
                if isinstance(usage.get(key), int):
                    span.set_attribute(attribute, usage[key])
        if reason == "error":
            span.set_status(self._trace.StatusCode.ERROR)
        span.end()

    def model_span(self, parent: Any, model: str, base_url: str | None) -> tuple[Any, Any]:
        """A span for one model call, made current (so ``traceparent`` goes upstream):
        the span and the token to detach once the request is out."""
        from opentelemetry import context

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
        }
        if base_url:
            parts = urlsplit(base_url)
            if parts.hostname:
                attributes["server.address"] = parts.hostname
            if parts.port:
                attributes["server.port"] = parts.port
        ctx = self._trace.set_span_in_context(parent)
        span = self._tracer.start_span(
            f"chat {model}", context=ctx, kind=self._trace.SpanKind.CLIENT, attributes=attributes
        )
        token = context.attach(self._trace.set_span_in_context(span, ctx))
        return span, token

    @staticmethod
    def detach(token: Any) -> None:
        from opentelemetry import context

        context.detach(token)

    def end_model(self, span: Any, error: BaseException | None = None) -> None:
        if error is not None:
            span.set_attribute("error.type", getattr(error, "code", type(error).__name__))
            span.set_status(self._trace.StatusCode.ERROR, str(error)[:200])
        span.end()

    def tool_span(self, parent: Any, name: str, call_id: str, executor: str) -> Any:
        return self._tracer.start_span(
            f"execute_tool {name}",
            context=self._trace.set_span_in_context(parent),
            kind=self._trace.SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "extension" if executor == "client" else "function",
            },
        )

    def end_tool(self, span: Any, ok: bool, error_code: str | None = None) -> None:
        if not ok:
            span.set_attribute("error.type", error_code or "tool_error")
            span.set_status(self._trace.StatusCode.ERROR)
        span.end()

    def shutdown(self) -> None:
        """Flush and stop the provider this module built (not an application's own)."""
        if self._provider is not None:
            self._provider.shutdown()


def tracing_from_env(environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """Tracing as the ``OTEL_*`` variables ask, or ``None`` (off, or the packages missing)."""
    if not tracing_wanted(environ):
        set_trace_injector(None)
        return None
    try:
        from opentelemetry import propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "tracing.unavailable",
            reason="OTEL_* variables ask for traces but opentelemetry-sdk is not installed; "
            "pip install 'toolforge[otel]'",
        )
        set_trace_injector(None)
        return None
    from toolforge import __version__

    current = trace.get_tracer_provider()
    provider: Any = None
    if isinstance(current, TracerProvider):  # the application configured OpenTelemetry
        tracer = current.get_tracer("toolforge", __version__)
    else:
        defaults = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "toolforge"}
        provider = TracerProvider(resource=Resource.create(defaults))
        names = environ.get("OTEL_TRACES_EXPORTER", "otlp").lower()
        for name in [n.strip() for n in names.split(",") if n.strip()]:
            if name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            elif name == "otlp":
                try:
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                        OTLPSpanExporter,
                    )
                except ImportError:
                    log.warning(
                        "tracing.unavailable",
                        reason="OTLP export needs opentelemetry-exporter-otlp-proto-http; "
                        "pip install 'toolforge[otel]'",
                    )
                    continue
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            else:
                log.warning("tracing.unknown_exporter", exporter=name, known=["otlp", "console"])
        tracer = provider.get_tracer("toolforge", __version__)
    set_trace_injector(propagate.inject)
    return Tracing(tracer, provider)
