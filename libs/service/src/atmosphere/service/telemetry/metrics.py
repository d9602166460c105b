"""The process's Prometheus metrics: the bus's own, and how `/metrics` renders them all.

Each service declares its series in its own `metrics` module on this process-wide registry
(prometheus-client's default one, which also carries the process's CPU, memory and open-file
series). Labels are bounded by construction: agents, tools, models and policies are named by
the deployment, subjects are reduced to their family (`atmosphere.bus.telemetry.subject_family`),
error kinds are codes; never a run id, a user id or a conversation.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Histogram, generate_latest

from atmosphere.bus import telemetry

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "install_bus_metrics", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text exposition format `generate_latest` writes and every Prometheus server reads (spelled
here: prometheus-client names it differently across the versions this library accepts)."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds, from a bus hop (a millisecond) to a long model answer (minutes)."""

BUS_REQUEST_DURATION = Histogram(
    "atmosphere_bus_request_duration_seconds",
    "Time from sending a request on the bus to its reply, by subject family",
    ["family"],
    buckets=LATENCY_BUCKETS,
)
BUS_REQUEST_ERRORS = Counter(
    "atmosphere_bus_request_errors",
    "Requests on the bus that failed, by subject family and error (a remote code, or timeout/no_responders/...)",
    ["family", "error"],
)


class _BusMetrics:
    """The bus's `BusObserver`: every request's latency and failure."""

    def __init__(self) -> None:
        # Each family's child, looked up once (`labels()` costs microseconds, on every request).
        self._durations: dict[str, Histogram] = {}

    def request_done(self, family: str, seconds: float, error: str) -> None:
        duration = self._durations.get(family)
        if duration is None:
            duration = self._durations[family] = BUS_REQUEST_DURATION.labels(family)
        duration.observe(seconds)
        if error:
            BUS_REQUEST_ERRORS.labels(family, error).inc()


def install_bus_metrics() -> None:
    """Count this process's bus requests (idempotent)."""
    if telemetry.observer() is None:
        telemetry.install_observer(_BusMetrics())


def render() -> bytes:
    """Every series of this process in Prometheus's text format."""
    return generate_latest(REGISTRY)
