"""OpenTelemetry tracing (the optional `tracing` extra), built at the edge from recorded times.

Each request gets a SERVER span that continues the caller's W3C `traceparent` (a new trace
without one); under it, per model run, the spans `prepare`, `queue`, and per batch `forward`
and `postprocess`, placed with the engine's own timestamps (`model_registry.runtime.timing`), so the
engine needs no OpenTelemetry at all. The response carries the server span's `traceparent`.

`server.tracing: true` sends spans to the global tracer provider, which `setup_provider` builds
for `infinity-server serve`: OTLP over HTTP, configured by the standard `OTEL_*` variables.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.types import Scope

from model_registry import StageTimes
from model_registry.errors import ConfigError

log = logging.getLogger(__name__)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Tracing:
    """Starts and ends the spans of one request; `provider` is an OpenTelemetry TracerProvider."""

    def __init__(self, provider: Any | None = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise ConfigError(
                "server.tracing is true but OpenTelemetry is not installed; "
                "install the extra: pip install 'infinity-server[tracing]'"
            ) from None
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._tracer = (provider or trace.get_tracer_provider()).get_tracer("infinity_server")

    def start(self, scope: Scope, started: float) -> Any:
        """The request's SERVER span, a child of the caller's `traceparent` when there is one."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        context = self._propagator.extract(carrier)
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        name = f"{scope['method']} {scope['path']}"
        kind = self._trace.SpanKind.SERVER
        return self._tracer.start_span(name, context, kind, attributes, start_time=_ns(started))

    @staticmethod
    def traceparent(span: Any) -> str | None:
        """The span's W3C `traceparent`; None for a span that records nothing (no SDK installed)."""
        context = span.get_span_context()
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    def finish(self, span: Any, scope: Scope, stages: Sequence[StageTimes], status: int, ended: float) -> None:
        """Add the engine's stage spans under `span`, name it by its route, then end it."""
        route = getattr(scope.get("route"), "path", None)
        parent = self._trace.set_span_in_context(span)
        for times in stages:
            common = {"infinity.model": times.model, "infinity.items": times.items, "infinity.tokens": times.tokens}
            self._span("prepare", parent, times.prepare_start, times.enqueued, common)
            first = min((b.forward_start for b in times.batches), default=times.finished)
            self._span("queue", parent, times.enqueued, max(times.enqueued, first), common)
            for batch in times.batches:
                attributes = {
                    "infinity.model": times.model,
                    "infinity.batch.items": batch.items,
                    "infinity.batch.cost": batch.cost,
                    "infinity.batch.tokens": batch.tokens,
                }
                self._span("forward", parent, batch.forward_start, batch.forward_end, attributes)
                self._span("postprocess", parent, batch.forward_end, batch.postprocess_end, attributes)
        span.set_attribute("http.response.status_code", status)
        if route is not None:
            span.set_attribute("http.route", route)
            span.update_name(f"{scope['method']} {route}")
        if status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end(end_time=_ns(ended))

    def _span(self, name: str, parent: Any, start: float, end: float, attributes: dict[str, Any]) -> None:
        child = self._tracer.start_span(name, parent, attributes=attributes, start_time=_ns(start))
        child.end(end_time=_ns(end))


def setup_provider() -> None:
    """The global provider for `serve`: batched OTLP/HTTP export (endpoint from `OTEL_*` variables)."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            "server.tracing is true but the OpenTelemetry SDK or OTLP exporter is missing; "
            "install the extra: pip install 'infinity-server[tracing]'"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": "infinity-server"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans over OTLP/HTTP")
