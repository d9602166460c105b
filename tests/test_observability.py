"""The observability profile of docker-compose.yml, its Prometheus and Grafana, and the pods' scrape annotations.

Held to the code: Prometheus scrapes every service of compose on the port its `/metrics` answers
on, the dashboard queries only series the services declare (the names read from the process's
Prometheus registry once every `metrics` module is imported), the services send traces to the
profile's collector only when `OTEL_EXPORTER_OTLP_ENDPOINT` says so, and every pod of the
manifests says where Prometheus finds its `/metrics`.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from atmosphere.service.telemetry import tracing_requested
from scripts.k8s_pods import pod_spec, workloads
from scripts.k8s_render import POOLS, ROOT, SERVICES
from scripts.strict_yaml import strict_load
from scripts.validate_compose import load
from scripts.validate_k8s import rendered
from tests.test_deploy import OBSERVABILITY, POOL_SERVICES

Document = dict[str, Any]
OBSERVABILITY_DIR = ROOT / "deploy" / "observability"
DASHBOARD = OBSERVABILITY_DIR / "grafana" / "atmosphere.json"
METRICS_MODULES = (
    "atmosphere.service.telemetry.metrics",
    "atmosphere.service.replica_metrics",
    "atmosphere.dispatch.metrics",
    "atmosphere.ingress.metrics",
    "atmosphere.governance.metrics",
    "atmosphere.sandbox.metrics",
    "atmosphere.memory.metrics",
    "atmosphere.tape.metrics",
)
"""Where the services declare their series (each service's `metrics` module, and the libraries')."""
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
"""The series Prometheus reads of each type of metric (a counter's `_created` is never queried)."""
_FUNCTIONS = {"sum", "rate", "increase", "max", "min", "avg", "histogram_quantile"}


@pytest.fixture(scope="module")
def compose() -> Document:
    return load()


@pytest.fixture(scope="module")
def declared() -> set[str]:
    """Every series name the services expose, by the registry's own account."""
    for module in METRICS_MODULES:
        importlib.import_module(module)
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def application(compose: Document) -> dict[str, Document]:
    """The services of compose that stay up, from an image built here (not the one-shot `provision`)."""
    return {n: s for n, s in compose["services"].items() if "build" in s and "healthcheck" in s}


def metrics_port(service: Document) -> int:
    """The port a compose service answers `/metrics` on: its probe port, or ingress's HTTP port."""
    environment = service["environment"]
    return int(environment.get("ATMOSPHERE_PROBE_PORT") or environment["ATMOSPHERE_INGRESS__PORT"])


def test_the_profile_runs_pinned_images_published_on_loopback_only(compose: Document) -> None:
    services = compose["services"]
    assert {n for n, s in services.items() if s.get("profiles")} == set(OBSERVABILITY)
    for name in OBSERVABILITY:
        service = services[name]
        assert service["profiles"] == ["observability"], name
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", service["image"]), service["image"]
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (ROOT / source).exists(), (name, source)
    # Scrapes and traces cross `bus`; Grafana and Jaeger are not on it.
    assert {n for n in OBSERVABILITY if "bus" in services[n]["networks"]} == {"prometheus", "otel-collector"}
    assert compose["networks"]["observability"] == {}


def test_prometheus_scrapes_every_service_on_the_port_its_metrics_answer_on(compose: Document) -> None:
    config = strict_load((OBSERVABILITY_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    scraped = {}
    for name, job in jobs.items():
        [discovery] = job["dns_sd_configs"]
        assert discovery["names"] == [name]
        assert discovery["type"] == "A"
        assert job.get("metrics_path", "/metrics") == "/metrics"
        scraped[name] = discovery["port"]
    services = application(compose)
    assert set(services) == {*SERVICES, *POOL_SERVICES}
    assert scraped == {name: metrics_port(service) for name, service in services.items()}
    # Ingress's /metrics asks for the admin token when one is set: the file the profile writes it to.
    token_file = jobs["ingress"]["authorization"]["credentials_file"]
    assert jobs["ingress"]["authorization"]["type"] == "Bearer"
    [command] = compose["services"]["prometheus"]["command"]
    assert f'"$ATMOSPHERE_ADMIN_TOKEN" > {token_file}' in command
    assert "--config.file=/etc/prometheus/prometheus.yml" in command
    assert (
        "./deploy/observability/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
        in (compose["services"]["prometheus"]["volumes"])
    )
    assert {"path": "deploy/compose/ingress.env", "required": False} in compose["services"]["prometheus"]["env_file"]


def test_the_services_send_traces_to_the_collector_only_when_told(compose: Document) -> None:
    for name, service in application(compose).items():
        assert not tracing_requested(service["environment"]), name
    example = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy/compose/observability.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert example["COMPOSE_PROFILES"] == "observability"
    traced = load({"OTEL_EXPORTER_OTLP_ENDPOINT": example["OTEL_EXPORTER_OTLP_ENDPOINT"]})
    for name, service in application(traced).items():
        assert tracing_requested(service["environment"]), name
    # The endpoint is the collector's OTLP/HTTP receiver (the services' default protocol).
    collector = strict_load((OBSERVABILITY_DIR / "otel-collector.yaml").read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert example["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{http.rsplit(':', 1)[1]}"
    assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"
    [pipeline] = collector["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"]
    assert set(pipeline["exporters"]) == set(collector["exporters"]) == {"debug", "otlp/jaeger"}
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"


def test_grafana_is_provisioned_with_the_dashboard_and_its_data_source(compose: Document) -> None:
    provisioning = OBSERVABILITY_DIR / "grafana" / "provisioning"
    [source] = strict_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    [provider] = strict_load((provisioning / "dashboards" / "atmosphere.yaml").read_text())["providers"]
    grafana = compose["services"]["grafana"]
    mounted = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    assert mounted["./deploy/observability/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert Path(mounted["./deploy/observability/grafana/atmosphere.json"]).parent == Path(provider["options"]["path"])
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {p["datasource"]["uid"] for p in panels} == {source["uid"]}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def series_of(expression: str) -> set[str]:
    """The series an expression reads: the names followed by a selector or a range, or standing alone."""
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?=\s*[\[{])", expression))
    # `(name)` alone is a series, unless it is the label list of `by (...)` / `without (...)`.
    alone = r"(?<!by )(?<!without )\(([a-zA-Z_:][a-zA-Z0-9_:]*)\)"
    names |= {n for n in re.findall(alone, expression) if n not in _FUNCTIONS}
    return names


def test_the_dashboard_queries_only_series_the_services_declare(declared: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = set().union(*(series_of(e) for e in expressions))
    assert used - declared == set()
    # What the dashboard is for (the list): each of these is on it.
    for wanted in (
        "atmosphere_runs_total",
        "atmosphere_ai_prompt_duration_seconds_bucket",
        "atmosphere_ai_response_duration_seconds_bucket",
        "atmosphere_ai_tokens_total",
        "atmosphere_ai_cost_sum",
        "atmosphere_ai_errors_total",
        "atmosphere_ai_tool_duration_seconds_bucket",
        "atmosphere_ai_active_sessions",
        "atmosphere_run_queue_depth",
        "atmosphere_run_redeliveries_total",
        "atmosphere_bus_request_duration_seconds_bucket",
        "atmosphere_bus_request_errors_total",
        "atmosphere_governance_decisions_total",
        "atmosphere_sandbox_executions_total",
        "atmosphere_sandbox_kills_total",
        "atmosphere_replica_lag",
        "atmosphere_ingress_websockets",
        "atmosphere_ingress_run_streams",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert wanted in used, wanted


def test_the_observability_page_lists_every_series_the_services_declare(declared: set[str]) -> None:
    # `declared` imported every metrics module: the registry holds every family.
    page = (ROOT / "docs" / "observability.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_:]+)` \|", page, re.M))
    ours = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
        if family.name.startswith(("atmosphere_", "gen_ai_"))
    }
    assert declared
    assert listed == ours


def test_the_series_reader_finds_names_in_every_position() -> None:
    expression = (
        "histogram_quantile(0.95, sum by (le, tool) (rate(a_bucket[5m]))) + sum(b) / max(c{x='1'})"
        " - sum by (le) (d) + sum without (model) (e)"
    )
    assert series_of(expression) == {"a_bucket", "b", "c", "d", "e"}


def test_every_pod_says_where_prometheus_finds_its_metrics() -> None:
    for overlay in ("dev", "production"):
        found = workloads(rendered()[overlay])
        services = {f"atmosphere-{s}" for s in SERVICES} | {f"atmosphere-dispatch-{p}" for p in POOLS}
        assert services <= set(found)
        for name in services:
            annotations = found[name]["spec"]["template"]["metadata"]["annotations"]
            [container] = pod_spec(found[name])["containers"]
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            wanted = ports["http"] if name == "atmosphere-ingress" else ports["probes"]
            assert annotations["prometheus.io/scrape"] == "true", name
            assert annotations["prometheus.io/port"] == str(wanted), name
            assert annotations["prometheus.io/path"] == "/metrics", name
