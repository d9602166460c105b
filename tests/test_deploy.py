"""The container and Kubernetes descriptions match the code (checked without an engine)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings

from atmosphere.config import env_names

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")


def settings_class(service: str) -> type[BaseSettings]:
    module = importlib.import_module(f"atmosphere.{service}.settings")
    return getattr(module, f"{service.capitalize()}Settings")  # type: ignore[no-any-return]


def known(service: str) -> set[str]:
    return set(env_names(settings_class(service)))


def test_compose_runs_every_service_from_the_one_dockerfile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services: dict[str, Any] = compose["services"]
    assert set(services) == {"nats", *SERVICES}
    assert "-js" in services["nats"]["command"]
    for name in SERVICES:
        build = services[name]["build"]
        assert build["dockerfile"] == "deploy/docker/service.Dockerfile"
        assert build["args"]["SERVICE"] == name
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy"
        unknown = set(services[name].get("environment", {})) - known(name)
        assert not unknown, f"{name} sets unknown variables {unknown}"
    assert services["ingress"]["ports"] == ["8080:8080"]


def test_env_example_only_sets_real_variables() -> None:
    keys = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    everything = set().union(*(known(s) for s in SERVICES))
    assert keys <= everything, keys - everything


def test_dockerfile_builds_any_service_with_the_pinned_uv() -> None:
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    uv_version = re.search(r"^UV_VERSION := (\S+)$", makefile, re.M)
    assert uv_version is not None
    assert f"ghcr.io/astral-sh/uv:{uv_version.group(1)}" in dockerfile
    assert "--package atmosphere-${SERVICE}" in dockerfile
    assert "exec python -m atmosphere.$SERVICE" in dockerfile
    assert "USER 10001" in dockerfile


def k8s_documents() -> list[dict[str, Any]]:
    base = ROOT / "deploy/k8s/base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    documents: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        documents += [d for d in yaml.safe_load_all((base / resource).read_text()) if d]
    return documents


def test_kubernetes_has_a_deployment_per_service_with_working_probes() -> None:
    documents = k8s_documents()
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    deployments = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Deployment"}
    assert set(deployments) == {f"atmosphere-{s}" for s in SERVICES}
    # The shared ConfigMap may hold a variable only some services read, but no typo.
    assert set(config) <= set().union(*(known(s) for s in SERVICES))
    for service in SERVICES:
        container = deployments[f"atmosphere-{service}"]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        unknown = set(env) - known(service)
        assert not unknown, f"{service} sets unknown variables {unknown}"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        listening = int(env.get("ATMOSPHERE_INGRESS__PORT") or env["ATMOSPHERE_PROBE_PORT"])
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            assert container[probe]["httpGet"]["path"] == path
            assert ports[container[probe]["httpGet"]["port"]] == listening
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    assert services["atmosphere-dispatch"]["spec"]["ports"][0]["port"] == 50051
    assert set(services) == {"atmosphere-dispatch", "atmosphere-ingress"}
    claims = {d["metadata"]["name"] for d in documents if d["kind"] == "PersistentVolumeClaim"}
    assert claims == {f"atmosphere-{s}-data" for s in ("governance", "memory", "tape")}
