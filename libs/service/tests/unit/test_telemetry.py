"""The service side of telemetry: when tracing is on, `/metrics` on the probe port, spans without orphans."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY, Counter
from prometheus_client.parser import text_string_to_metric_families

from atmosphere.bus.testing import FakeBus
from atmosphere.service import Health
from atmosphere.service._probes import probe_response
from atmosphere.service.telemetry import configure_tracing, install_provider, span, tracing_requested


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),  # compose's `${VAR:-}` when the profile is off
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_ask(env: dict[str, str], on: bool) -> None:
    assert tracing_requested(env) is on


def test_without_the_variables_nothing_is_installed() -> None:
    assert configure_tracing("memory", env={}) is False
    with span("anything") as started:
        assert started is None


def test_the_probe_port_serves_every_series_in_prometheus_text() -> None:
    # Registered for this test only: the process's registry is what the docs' table is checked against.
    probed = Counter("test_probed", "A series of this test, to find in the scrape", ["kind"])
    try:
        probed.labels("probe").inc()
        reply = probe_response(Health("memory", FakeBus()), "GET", "/metrics")
    finally:
        REGISTRY.unregister(probed)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Type: text/plain; version=0.0.4" in head
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    assert families["test_probed"].samples[0].value >= 1
    assert "process_cpu_seconds" in families  # the process's own series come with it
    assert probe_response(Health("memory", FakeBus()), "HEAD", "/metrics").endswith(b"\r\n\r\n")


def test_a_span_needs_a_parent_given_or_current() -> None:
    provider = TracerProvider()
    install_provider(provider)
    try:
        with span("orphan") as orphan:
            assert orphan is None  # a health ping is not a trace
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with span("continued", traceparent=parent) as continued:
            assert continued is not None
            assert f"{continued.get_span_context().trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
            with span("child") as child:
                assert child is not None
                assert child.get_span_context().trace_id == continued.get_span_context().trace_id
    finally:
        install_provider(None)
        provider.shutdown()
