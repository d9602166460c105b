"""What a service tells its operators: Prometheus metrics and OpenTelemetry traces.

`metrics` holds the process's registry and the bus's series; each service declares its own
series beside its code. `tracing` installs OpenTelemetry when the `OTEL_*` variables ask for it.
"""

from atmosphere.service.telemetry.metrics import CONTENT_TYPE, LATENCY_BUCKETS, install_bus_metrics, render
from atmosphere.service.telemetry.tracing import (
    active,
    configure_tracing,
    format_traceparent,
    install_provider,
    provider,
    shutdown_tracing,
    span,
    start_span,
    tracing_requested,
)

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "active",
    "configure_tracing",
    "format_traceparent",
    "install_bus_metrics",
    "install_provider",
    "provider",
    "render",
    "shutdown_tracing",
    "span",
    "start_span",
    "tracing_requested",
]
