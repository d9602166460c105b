"""The runtime pools of a rendered overlay: each a dispatch of its own, all known to every dispatch.

A pool is a Deployment whose container sets `ATMOSPHERE_DISPATCH__POOL` (deploy/k8s/components/
pool-<runtime>). What keeps it working, and apart:

- the shared ConfigMap's `ATMOSPHERE_DISPATCH__POOLS` names exactly the pools deployed: the
  provisioner makes the queues of those it names, and a pool whose queue is missing never starts
  (one named but not deployed leaves its agents' runs waiting for nobody); no pod overrides it;
- each is `atmosphere-dispatch-<runtime>`, runs its own image `atmosphere-dispatch-<runtime>`
  (its framework is in no other) and logs in as the `dispatch` role; but where every Atmosphere
  container runs one image, an app's own (deploy/k8s/components/app-image), a pool runs it too:
  the app chose which frameworks it holds;
- nothing may reach it (its gRPC is not exposed: the default pool's serves every agent), and it
  may reach what the default pool may, and nothing more: NATS, DNS and the model provider.
"""

from __future__ import annotations

from typing import Any

from scripts.k8s_network import Allowance, allowances
from scripts.k8s_pods import named, pod_labels, pod_spec, workloads

Document = dict[str, Any]
DISPATCH = "atmosphere-dispatch"
POOL = "ATMOSPHERE_DISPATCH__POOL"
POOLS = "ATMOSPHERE_DISPATCH__POOLS"
CONFIG = "atmosphere-config-"
"""The shared ConfigMap, by the prefix kustomize keeps before its content hash."""
DISPATCH_LOGIN = "atmosphere-nats-dispatch-"
PROVISIONER = "atmosphere-provision"


def _env(container: Document) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _reads_config(container: Document) -> bool:
    return any(
        s["configMapRef"]["name"].startswith(CONFIG) for s in container.get("envFrom", []) if "configMapRef" in s
    )


def deployed_pools(documents: list[Document]) -> dict[str, str]:
    """The pool each pool workload serves, by the workload's name."""
    return {
        name: pool
        for name, workload in workloads(documents).items()
        for container in pod_spec(workload)["containers"]
        if (pool := _env(container).get(POOL))
    }


def configured_pools(documents: list[Document]) -> list[str]:
    """The pools the shared ConfigMap's `ATMOSPHERE_DISPATCH__POOLS` names, as written."""
    configs = [c for n, c in named(documents, "ConfigMap").items() if n.startswith(CONFIG)]
    text = configs[0].get("data", {}).get(POOLS, "") if configs else ""
    return [p.strip() for p in text.split(",") if p.strip()]


def _egress(labels: dict[str, str], policies: list[Document]) -> set[tuple[Any, ...]]:
    """What a pod may reach, whichever policy allows it: (peers, ports) pairs."""

    def key(allowance: Allowance) -> tuple[Any, ...]:
        peers = None if allowance.peers is None else tuple(sorted(map(repr, allowance.peers)))
        ports = None if allowance.ports is None else tuple(sorted(allowance.ports, key=repr))
        return peers, ports

    return {key(a) for a in allowances(labels, policies, "Egress")}


def one_image(documents: list[Document]) -> str | None:
    """The image every Atmosphere container runs, when they all run the same one (an app's own)."""
    images = {
        str(container.get("image", ""))
        for name, workload in workloads(documents).items()
        if name.startswith("atmosphere-")
        for container in pod_spec(workload)["containers"]
    }
    return images.pop() if len(images) == 1 else None


def _pool_problems(name: str, pool: str, documents: list[Document]) -> list[str]:
    workload = workloads(documents)[name]
    found = []
    if name != f"{DISPATCH}-{pool}":
        found.append(f"{name} serves the pool {pool}: name it {DISPATCH}-{pool}")
    shared = one_image(documents)
    for container in pod_spec(workload)["containers"]:
        image = str(container.get("image", "")).split(":", 1)[0].rsplit("/", 1)[-1]
        if image != f"{DISPATCH}-{pool}" and container.get("image") != shared:
            found.append(f"{name} runs {container.get('image')}, not its own image {DISPATCH}-{pool}")
        refs = [s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s]
        if not any(r.startswith(DISPATCH_LOGIN) for r in refs):
            found.append(f"{name} does not log in as the dispatch role")
        if not _reads_config(container):
            found.append(f"{name} does not read the shared {CONFIG.rstrip('-')} (the pools, the bus)")
    policies = list(named(documents, "NetworkPolicy").values())
    labels = pod_labels(workload)
    admitted = sorted({a.policy for a in allowances(labels, policies, "Ingress")})
    if admitted:
        found.append(f"{name}: NetworkPolicies {admitted} let traffic in; a pool's pods take none")
    default = workloads(documents).get(DISPATCH)
    if default is not None and _egress(labels, policies) != _egress(pod_labels(default), policies):
        found.append(f"{name} may reach other peers or ports than {DISPATCH}")
    return found


def pool_problems(documents: list[Document]) -> list[str]:
    """What keeps the runtime pools from being provisioned, served and kept apart."""
    found: list[str] = []
    pools = deployed_pools(documents)
    configured = configured_pools(documents)
    if set(configured) != set(pools.values()):
        found.append(f"{POOLS} names {sorted(configured)}, but the pools deployed are {sorted(pools.values())}")
    for name, workload in workloads(documents).items():
        if any(POOLS in _env(c) for c in pod_spec(workload)["containers"]):
            found.append(f"{workload['kind']} {name} sets {POOLS} of its own: every dispatch reads the shared one")
    job = workloads(documents).get(PROVISIONER)
    if job is not None and not all(_reads_config(c) for c in pod_spec(job)["containers"]):
        found.append(f"Job {PROVISIONER} does not read the shared {CONFIG.rstrip('-')}: it would make no pool's queue")
    for name, pool in sorted(pools.items()):
        found += _pool_problems(name, pool, documents)
    return found
