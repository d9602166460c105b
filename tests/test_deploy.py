"""The container and Kubernetes descriptions match the code.

The Kubernetes base is built with the real kustomize (`kubectl kustomize`, pinned and installed
by scripts/install_kubectl.py) and every YAML file is read with a loader that rejects duplicate
keys: PyYAML alone keeps the last of two equal keys, which once hid a doubled `volumes` list and
a doubled claim that the real builder refuses.
"""

from __future__ import annotations

import copy
import importlib
import re
import subprocess
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from atmosphere.config import env_names
from atmosphere.ingress.settings import IngressOptions
from scripts.install_kubectl import kubectl_binary

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")
BASE = ROOT / "deploy/k8s/base"
Document = dict[str, Any]
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with the same key twice, as kustomize does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        # A merge (`<<: *anchor`) may be overridden by a key written beside it; only keys
        # written twice in the mapping itself are a mistake.
        for key_node, _ in (pair for pair in node.value if pair[0].tag != MERGE_TAG):
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def strict_load(text: str) -> Any:
    return yaml.load(text, Loader=StrictLoader)


def strict_load_all(text: str) -> list[Document]:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]


def settings_class(service: str) -> type[BaseSettings]:
    module = importlib.import_module(f"atmosphere.{service}.settings")
    return getattr(module, f"{service.capitalize()}Settings")  # type: ignore[no-any-return]


def known(service: str) -> set[str]:
    return set(env_names(settings_class(service)))


def test_compose_runs_every_service_from_the_one_dockerfile() -> None:
    compose = strict_load((ROOT / "docker-compose.yml").read_text())
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
    assert "--package atmosphere-ai-${SERVICE}" in dockerfile
    assert "exec python -m atmosphere.$SERVICE" in dockerfile
    assert "USER 10001" in dockerfile


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    command = [str(kubectl_binary()), "kustomize", str(directory)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=50)


@pytest.fixture(scope="module")
def built() -> list[Document]:
    """What `kubectl kustomize deploy/k8s/base` renders, read strictly."""
    result = kustomize(BASE)
    assert result.returncode == 0, result.stderr
    return strict_load_all(result.stdout)


def named(documents: list[Document], kind: str) -> dict[str, Document]:
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == kind}


def pod_spec(deployment: Document) -> Document:
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def problems(documents: list[Document]) -> list[str]:
    """Everything in rendered manifests that a cluster would reject or that could never work."""
    found = _duplicates(documents)
    for name, deployment in named(documents, "Deployment").items():
        found += [f"Deployment {name}: {p}" for p in _deployment_problems(deployment, documents)]
    for name, service in named(documents, "Service").items():
        found += [f"Service {name}: {p}" for p in _service_problems(service, documents)]
    claimed = {v["persistentVolumeClaim"]["claimName"] for v in _volumes(documents) if "persistentVolumeClaim" in v}
    unused = sorted(set(named(documents, "PersistentVolumeClaim")) - claimed)
    return found + [f"PersistentVolumeClaim {c} is used by no Deployment" for c in unused]


def _duplicates(documents: list[Document]) -> list[str]:
    ids = [(d["kind"], d["metadata"]["name"]) for d in documents]
    return [f"{kind} {name} is defined twice" for kind, name in sorted(set(ids)) if ids.count((kind, name)) > 1]


def _volumes(documents: list[Document]) -> Iterator[Document]:
    for deployment in named(documents, "Deployment").values():
        yield from pod_spec(deployment).get("volumes", [])


def _deployment_problems(deployment: Document, documents: list[Document]) -> list[str]:
    spec = pod_spec(deployment)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    found = [] if deployment["spec"]["selector"]["matchLabels"].items() <= labels.items() else ["selector misses pods"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounted = {m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
    found += [f"mounts undeclared volume {v}" for v in sorted(mounted - set(volumes))]
    found += [f"declares unmounted volume {v}" for v in sorted(set(volumes) - mounted)]
    found += [p for v in volumes.values() for p in _volume_source_problems(v, documents)]
    for container in spec["containers"]:
        found += [f"container {container['name']}: {p}" for p in _container_problems(container, documents)]
    return found


def _volume_source_problems(volume: Document, documents: list[Document]) -> list[str]:
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        return [] if claim in named(documents, "PersistentVolumeClaim") else [f"claim {claim} does not exist"]
    if "configMap" in volume:
        config = volume["configMap"]["name"]
        return [] if config in named(documents, "ConfigMap") else [f"ConfigMap {config} does not exist"]
    return [f"volume {volume['name']} has a source this check does not know"]


def _container_problems(container: Document, documents: list[Document]) -> list[str]:
    found = [] if container.get("image") else ["no image"]
    found += [f"env {e.get('name')} has no value" for e in container.get("env", []) if "value" not in e]
    for source in container.get("envFrom", []):
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(key)
            # A Secret the user creates is optional by design; anything else must be shipped.
            if ref and not ref.get("optional") and ref["name"] not in named(documents, kind):
                found.append(f"{kind} {ref['name']} does not exist")
    ports = {p["name"] for p in container.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("httpGet", {}).get("port")
        if port is not None and port not in ports:
            found.append(f"{probe} uses unknown port {port}")
    return found


def _service_problems(service: Document, documents: list[Document]) -> list[str]:
    selector = service["spec"]["selector"].items()
    targets = [
        d
        for d in named(documents, "Deployment").values()
        if selector <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    if len(targets) != 1:
        return [f"selects {len(targets)} Deployments, not one"]
    ports = {p["name"]: p["containerPort"] for c in pod_spec(targets[0])["containers"] for p in c.get("ports", [])}
    wrong = [p for p in service["spec"]["ports"] if p["targetPort"] not in {*ports, *ports.values()}]
    return [f"port {p['name']} targets {p['targetPort']}, which no container opens" for p in wrong]


def test_the_strict_loader_rejects_duplicate_keys_at_any_depth() -> None:
    assert strict_load("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    assert strict_load("x: &x {a: 1, b: 2}\ny:\n  <<: *x\n  b: 3\n")["y"] == {"a": 1, "b": 3}
    for text in ("a: 1\na: 2\n", "spec:\n  volumes: []\n  volumes: []\n"):
        with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key"):
            strict_load(text)


def test_every_deploy_file_has_unique_keys() -> None:
    for path in (*sorted(BASE.glob("*.yaml")), ROOT / "docker-compose.yml"):
        assert strict_load_all(path.read_text()), path


def test_kustomization_lists_every_manifest_of_the_base() -> None:
    kustomization = strict_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_the_builder_refuses_an_object_defined_twice(tmp_path: Path) -> None:
    # The defect the old tests missed: the same claim in two documents must fail the build.
    claim = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: twice\nspec: {}\n"
    (tmp_path / "claims.yaml").write_text(f"{claim}---\n{claim}")
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - claims.yaml\n")
    result = kustomize(tmp_path)
    assert result.returncode != 0
    assert "already registered id" in result.stderr


def test_the_base_builds_into_objects_that_refer_to_each_other(built: list[Document]) -> None:
    assert problems(built) == []
    assert {d["kind"] for d in built} == {"ConfigMap", "Deployment", "Service", "PersistentVolumeClaim"}
    # The kustomization's labels reached every object, so the build really applied it.
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "atmosphere" for d in built)


def test_the_consistency_check_names_each_dangling_reference(built: list[Document]) -> None:
    broken = [d for d in copy.deepcopy(built) if d["kind"] != "PersistentVolumeClaim"]
    ingress = named(broken, "Deployment")["atmosphere-ingress"]
    container = pod_spec(ingress)["containers"][0]
    container["image"] = ""
    container["ports"][0]["name"] = "web"
    container["envFrom"][0]["configMapRef"]["name"] = "missing"
    found = problems([*broken, broken[0]])
    assert "Deployment atmosphere-memory: claim atmosphere-memory-data does not exist" in found
    assert "Deployment atmosphere-ingress: container ingress: no image" in found
    assert "Deployment atmosphere-ingress: container ingress: ConfigMap missing does not exist" in found
    assert "Deployment atmosphere-ingress: container ingress: readinessProbe uses unknown port http" in found
    assert "Service atmosphere-ingress: port http targets http, which no container opens" in found
    assert f"{broken[0]['kind']} {broken[0]['metadata']['name']} is defined twice" in found


def test_kubernetes_has_a_deployment_per_service_with_working_probes(built: list[Document]) -> None:
    config = next(d for d in built if d["kind"] == "ConfigMap")["data"]
    deployments = named(built, "Deployment")
    assert set(deployments) == {f"atmosphere-{s}" for s in SERVICES}
    # The shared ConfigMap may hold a variable only some services read, but no typo.
    assert set(config) <= set().union(*(known(s) for s in SERVICES))
    for service in SERVICES:
        container = pod_spec(deployments[f"atmosphere-{service}"])["containers"][0]
        assert container["image"] == f"atmosphere-{service}:latest"
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        unknown = set(env) - known(service)
        assert not unknown, f"{service} sets unknown variables {unknown}"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        listening = int(env.get("ATMOSPHERE_INGRESS__PORT") or env["ATMOSPHERE_PROBE_PORT"])
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            assert container[probe]["httpGet"]["path"] == path
            assert ports[container[probe]["httpGet"]["port"]] == listening
    services = named(built, "Service")
    assert services["atmosphere-dispatch"]["spec"]["ports"][0]["port"] == 50051
    assert set(services) == {"atmosphere-dispatch", "atmosphere-ingress"}
    claims = set(named(built, "PersistentVolumeClaim"))
    assert claims == {f"atmosphere-{s}-data" for s in ("governance", "memory", "tape")}


def test_kubernetes_waits_for_ingress_to_drain(built: list[Document]) -> None:
    # Ingress tells open streams to resume elsewhere within its drain grace; a pod killed
    # before that grace ends would drop them all the same.
    spec = pod_spec(named(built, "Deployment")["atmosphere-ingress"])
    env = {e["name"]: e["value"] for e in spec["containers"][0].get("env", [])}
    grace = float(env.get("ATMOSPHERE_INGRESS__DRAIN_GRACE", IngressOptions.model_fields["drain_grace"].default))
    assert grace < spec["terminationGracePeriodSeconds"]
