"""What the system as a whole must have: a budget and an autoscaler per service, the network rules.

- every service and NATS: a PodDisruptionBudget letting one pod go at a time;
- every service: an `autoscaling/v2` HorizontalPodAutoscaler on CPU, never below `min_replicas`;
- NetworkPolicies: everything denied by default, every bus client may reach NATS, the sandbox
  reaches nothing but NATS and DNS, and nothing but ingress is reachable from outside;
- the namespace enforces the restricted Pod Security profile and holds every object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scripts.k8s_network import denies_by_default, egress_beyond, reachable_from_outside, reaches, selects
from scripts.k8s_pods import named, pod_labels, workloads

Document = dict[str, Any]
NATS = "nats"
NATS_CLIENT_PORT = ("TCP", 4222)
PUBLIC = "atmosphere-ingress"
SANDBOX = "atmosphere-sandbox"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def _budget_problems(name: str, workload: Document, documents: list[Document]) -> Iterator[str]:
    budgets = [
        b
        for b in named(documents, "PodDisruptionBudget").values()
        if selects(b["spec"]["selector"], pod_labels(workload))
    ]
    if len(budgets) != 1:
        yield f"{name}: {len(budgets)} PodDisruptionBudgets, not one"
    elif not (
        {"maxUnavailable": 1}.items() <= budgets[0]["spec"].items() or budgets[0]["spec"].get("minAvailable") == 1
    ):
        yield f"{name}: its PodDisruptionBudget is neither maxUnavailable: 1 nor minAvailable: 1"


def _autoscaler_problems(name: str, workload: Document, documents: list[Document], min_replicas: int) -> Iterator[str]:
    scalers = [
        a
        for a in named(documents, "HorizontalPodAutoscaler").values()
        if a["spec"]["scaleTargetRef"]["name"] == name and a["spec"]["scaleTargetRef"]["kind"] == workload["kind"]
    ]
    if len(scalers) != 1:
        yield f"{name}: {len(scalers)} HorizontalPodAutoscalers, not one"
        return
    spec = scalers[0]["spec"]
    if scalers[0]["apiVersion"] != "autoscaling/v2":
        yield f"{name}: its autoscaler is {scalers[0]['apiVersion']}, not autoscaling/v2"
    if not any(m.get("resource", {}).get("name") == "cpu" for m in spec.get("metrics", [])):
        yield f"{name}: its autoscaler does not scale on CPU"
    low, high = spec.get("minReplicas", 1), spec["maxReplicas"]
    if not min_replicas <= low <= high:
        yield f"{name}: its autoscaler's range {low}..{high} starts below {min_replicas}"
    if workload["spec"].get("replicas", 1) < low:
        yield f"{name}: starts with fewer replicas than its autoscaler's minimum"


def scaling_problems(documents: list[Document], services: tuple[str, ...], *, min_replicas: int) -> list[str]:
    """A budget for every service and NATS, an autoscaler for every service."""
    found: list[str] = []
    every = workloads(documents)
    wanted = [f"atmosphere-{s}" for s in services]
    found += [f"{name}: no such workload" for name in [*wanted, NATS] if name not in every]
    for name in (n for n in [*wanted, NATS] if n in every):
        found += _budget_problems(name, every[name], documents)
    for name in (n for n in wanted if n in every):
        found += _autoscaler_problems(name, every[name], documents, min_replicas)
    return found


def network_problems(documents: list[Document]) -> list[str]:
    """Default deny; NATS reachable by its clients; the sandbox and the outside world kept apart."""
    policies = list(named(documents, "NetworkPolicy").values())
    pods = {name: pod_labels(w) for name, w in workloads(documents).items()}
    found = [] if denies_by_default(policies) else ["no NetworkPolicy denies all traffic by default"]
    for name, labels in pods.items():
        if reachable_from_outside(labels, policies) != (name == PUBLIC):
            found.append(f"{name}: reachable from outside is {name != PUBLIC}, should be {name == PUBLIC}")
        if labels.get("atmosphere-bus-client") == "true" and not reaches(
            labels, policies, pods, NATS, NATS_CLIENT_PORT
        ):
            found.append(f"{name}: a bus client that may not reach NATS")
    if SANDBOX in pods:
        found += [f"{SANDBOX}: {p}" for p in egress_beyond(pods[SANDBOX], policies, pods, NATS_CLIENT_PORT)]
    else:
        found.append(f"{SANDBOX}: no such workload")
    return found


def namespace_problems(documents: list[Document]) -> list[str]:
    """One Namespace, under the restricted profile, holding every namespaced object."""
    namespaces = named(documents, "Namespace")
    if len(namespaces) != 1:
        return [f"{len(namespaces)} Namespaces, not one"]
    [(name, namespace)] = namespaces.items()
    labels = namespace["metadata"].get("labels", {})
    found = (
        [] if RESTRICTED.items() <= labels.items() else [f"Namespace {name} does not enforce the restricted profile"]
    )
    outside = [d for d in documents if d["kind"] != "Namespace" and d["metadata"].get("namespace") != name]
    return found + [f"{d['kind']} {d['metadata']['name']} is not in namespace {name}" for d in outside]
