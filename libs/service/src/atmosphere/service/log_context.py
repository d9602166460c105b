"""What a service's log line says about the work under way: its run, and its trace span.

`atmosphere.service.run` gives `log_context` to `atmosphere.config.configure_logging`, so that
every line names the run the logging code works for (`atmosphere.bus.telemetry.bind_run`: a
handler answering a run's request, dispatch executing it, ingress following it) and, when
tracing is on, the span it runs in. Called once per line written, on the logging code's own
task: a context-variable read and, without tracing, OpenTelemetry's no-op span.
"""

from __future__ import annotations

from opentelemetry import trace

from atmosphere.bus.telemetry import current_run

__all__ = ["log_context"]


def log_context() -> dict[str, str]:
    """The bound run's `run_id` and `agent`, the current span's `trace_id` (32 hex) and `span_id` (16 hex), if any."""
    fields: dict[str, str] = {}
    run = current_run()
    if run is not None:
        fields["run_id"] = run.run_id
        if run.agent:
            fields["agent"] = run.agent
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        fields["trace_id"] = trace.format_trace_id(span.trace_id)
        fields["span_id"] = trace.format_span_id(span.span_id)
    return fields
