"""OpenTelemetry traces, when the standard `OTEL_*` variables ask for them; nothing otherwise.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`) or an OTLP
endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The SDK reads the rest itself: the
endpoint, headers and timeout of the exporter, `OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`
(`http/protobuf` by default, or `grpc`), the sampler (`OTEL_TRACES_SAMPLER`), the batch
processor's delays (`OTEL_BSP_*`) and the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`; the service name defaults to `atmosphere-<service>`).

Off, no provider is installed: `span()` is one boolean test, the bus sends no `traceparent`,
and a run's events never carry trace headers on or off (`atmosphere.bus.telemetry`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from atmosphere.bus import telemetry

__all__ = [
    "active",
    "configure_tracing",
    "format_traceparent",
    "install_provider",
    "provider",
    "shutdown_tracing",
    "span",
    "start_span",
    "tracing_requested",
]

log = logging.getLogger("atmosphere.telemetry")

_INSTRUMENTATION = "atmosphere"
_PROPAGATOR = TraceContextTextMapPropagator()
_GETTER: DefaultGetter = DefaultGetter()

_provider: TracerProvider | None = None


def _exporters_named(env: Mapping[str, str]) -> list[str]:
    named = [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    if named:
        return [] if named == ["none"] else named
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return ["otlp"] if endpoint else []


def tracing_requested(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the `OTEL_*` variables of `env` ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(_exporters_named(env))


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415 - only when chosen
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

    return OTLPSpanExporter()


def configure_tracing(service: str, *, instance: str = "", env: Mapping[str, str] = os.environ) -> bool:
    """Install the tracer provider `env` asks for (see the module); returns whether tracing is on.

    Call once per process, before the service starts; `shutdown_tracing` flushes what is left.
    """
    if _provider is not None or not tracing_requested(env):
        return _provider is not None
    attributes: dict[str, Any] = {}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = f"atmosphere-{service}"
    if instance:
        attributes[SERVICE_INSTANCE_ID] = instance
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in _exporters_named(env):
        if name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(env)))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER names %r, which this service does not ship; ignored", name)
    trace.set_tracer_provider(provider)  # for the instrumentations that read the global one
    install_provider(provider)
    log.info("%s: tracing on (exporters: %s)", service, ", ".join(_exporters_named(env)))
    return True


def install_provider(provider: TracerProvider | None) -> None:
    """Record spans with `provider` in this process (None: tracing off).

    `configure_tracing` calls it; a test passes a provider with an in-memory exporter, and None
    afterwards (OpenTelemetry's global provider can be set only once per process: ours is not it).
    """
    global _provider  # noqa: PLW0603 - one provider per process
    _provider = provider
    telemetry.install_tracer(_BusTracer() if provider is not None else None)


def provider() -> TracerProvider | None:
    """The provider spans are recorded with, None when tracing is off."""
    return _provider


def shutdown_tracing() -> None:
    """Export the spans still buffered and stop (the process is about to exit)."""
    installed = _provider
    if installed is None:
        return
    install_provider(None)
    installed.shutdown()


def active() -> bool:
    """Whether spans are recorded in this process."""
    return _provider is not None


def format_traceparent(span_: Span) -> str:
    """`span_`'s W3C `traceparent`, or "" when it is not a valid span."""
    context = span_.get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    traceparent: str = "",
) -> Iterator[Span | None]:
    """A span named `name`, child of `traceparent` when given (else of the current span).

    Yields None when tracing is off. A span whose parent is neither given nor current is not
    started: nothing of ours makes an orphan trace (a health ping is not a trace).
    """
    if _provider is None:
        yield None
        return
    if traceparent:
        parent = _PROPAGATOR.extract({"traceparent": traceparent}, getter=_GETTER)
    elif trace.get_current_span().get_span_context().is_valid:
        parent = None
    else:
        yield None
        return
    tracer = _provider.get_tracer(_INSTRUMENTATION)
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=dict(attributes or {})) as started:
        yield started


def start_span(
    name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> Span | None:
    """A span, child of the current one, that the caller ends (`span.end()`); None when there is none.

    For work that starts and ends in different calls (a model call's hooks); `span` otherwise.
    """
    if _provider is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    return _provider.get_tracer(_INSTRUMENTATION).start_span(name, kind=kind, attributes=dict(attributes or {}))


class _BusTracer:
    """The bus's spans: a CLIENT span per request made inside a trace, a SERVER span per handled one."""

    def traceparent(self) -> str:
        return format_traceparent(trace.get_current_span())

    def client_span(self, subject: str) -> contextlib.AbstractContextManager[Any]:
        family = telemetry.subject_family(subject)
        return span(f"request {family}", kind=SpanKind.CLIENT, attributes=_messaging(subject, "send"))

    def server_span(self, subject: str, traceparent: str) -> contextlib.AbstractContextManager[Any]:
        if not traceparent:
            return contextlib.nullcontext()
        family = telemetry.subject_family(subject)
        return span(
            f"handle {family}", kind=SpanKind.SERVER, attributes=_messaging(subject, "process"), traceparent=traceparent
        )


def _messaging(subject: str, operation: str) -> dict[str, str]:
    return {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": operation,
    }
