"""Whether the rendered objects refer to each other correctly: what a cluster would reject later.

kustomize builds a reference to a Secret that does not exist, a Service that selects nothing, or
a probe on a port no container opens without a word; a cluster accepts most of them too, and the
pods then never start or never become ready.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scripts.k8s_network import selects
from scripts.k8s_pods import named, pod_labels, pod_spec, workloads

Document = dict[str, Any]
REFERENCES = (("ConfigMap", "configMapRef"), ("Secret", "secretRef"))


def duplicates(documents: list[Document]) -> list[str]:
    """Each object defined twice."""
    ids = [(d["kind"], d["metadata"]["name"]) for d in documents]
    return [f"{kind} {name} is defined twice" for kind, name in sorted(set(ids)) if ids.count((kind, name)) > 1]


def _volume_sources(volume: Document) -> Iterator[tuple[str, str]]:
    """(kind, name) of every object a volume reads."""
    if "configMap" in volume:
        yield "ConfigMap", volume["configMap"]["name"]
    if "secret" in volume:
        yield "Secret", volume["secret"]["secretName"]
    if "persistentVolumeClaim" in volume:
        yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
    for source in volume.get("projected", {}).get("sources", []):
        yield from (("ConfigMap", source["configMap"]["name"]),) if "configMap" in source else ()
        yield from (("Secret", source["secret"]["name"]),) if "secret" in source else ()


def _container_references(container: Document, documents: list[Document]) -> Iterator[str]:
    for source in container.get("envFrom", []):
        for kind, key in REFERENCES:
            ref = source.get(key)
            # A Secret the user creates is optional by design; anything else must be shipped.
            if ref and not ref.get("optional") and ref["name"] not in named(documents, kind):
                yield f"{kind} {ref['name']} does not exist"
    ports = {p["name"] for p in container.get("ports", [])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = container.get(probe, {}).get("httpGet", {}).get("port")
        if isinstance(port, str) and port not in ports:
            yield f"{probe} uses unknown port {port}"


def workload_references(documents: list[Document]) -> Iterator[str]:
    """Volumes, environment sources and probe ports of every workload."""
    for name, workload in workloads(documents).items():
        where = f"{workload['kind']} {name}"
        for volume in pod_spec(workload).get("volumes", []):
            known = {"configMap", "secret", "persistentVolumeClaim", "projected", "emptyDir"}
            if not volume.keys() & known:
                yield f"{where}: volume {volume['name']} has a source this check does not know"
            for kind, source in _volume_sources(volume):
                if source not in named(documents, kind):
                    yield f"{where}: {kind} {source} does not exist"
        for container in pod_spec(workload)["containers"]:
            yield from (
                f"{where}: container {container['name']}: {p}" for p in _container_references(container, documents)
            )


def selected(selector: Document, documents: list[Document]) -> list[str]:
    """The workloads whose pods `selector` selects."""
    return [name for name, w in workloads(documents).items() if selects(selector, pod_labels(w))]


def service_references(documents: list[Document]) -> Iterator[str]:
    """Every Service selects one workload and targets ports it opens; each StatefulSet's is headless."""
    services = named(documents, "Service")
    for name, service in services.items():
        targets = selected({"matchLabels": service["spec"]["selector"]}, documents)
        if len(targets) != 1:
            yield f"Service {name}: selects {len(targets)} workloads, not one"
            continue
        containers = pod_spec(workloads(documents)[targets[0]])["containers"]
        ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in {*ports, *ports.values()}:
                yield f"Service {name}: port {port['name']} targets {port['targetPort']}, which no container opens"
    for name, statefulset in named(documents, "StatefulSet").items():
        governing = services.get(statefulset["spec"]["serviceName"])
        if governing is None or governing["spec"].get("clusterIP") != "None":
            yield f"StatefulSet {name}: its serviceName names no headless Service"


def budget_references(documents: list[Document]) -> Iterator[str]:
    """Every PodDisruptionBudget selects one workload; every autoscaler's target exists."""
    for name, budget in named(documents, "PodDisruptionBudget").items():
        count = len(selected(budget["spec"]["selector"], documents))
        if count != 1:
            yield f"PodDisruptionBudget {name}: selects {count} workloads, not one"
    for name, autoscaler in named(documents, "HorizontalPodAutoscaler").items():
        target = autoscaler["spec"]["scaleTargetRef"]
        if target["name"] not in named(documents, target["kind"]):
            yield f"HorizontalPodAutoscaler {name}: {target['kind']} {target['name']} does not exist"


def reference_problems(documents: list[Document]) -> list[str]:
    """Every dangling or ambiguous reference between the objects."""
    claimed = {
        v["persistentVolumeClaim"]["claimName"]
        for w in workloads(documents).values()
        for v in pod_spec(w).get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    unused = sorted(set(named(documents, "PersistentVolumeClaim")) - claimed)
    return [
        *duplicates(documents),
        *workload_references(documents),
        *service_references(documents),
        *budget_references(documents),
        *(f"PersistentVolumeClaim {c} is used by no workload" for c in unused),
    ]
