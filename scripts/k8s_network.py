"""What the rendered NetworkPolicies let a pod reach, and who may reach it.

Kubernetes' own semantics, kept small: a policy applies to the pods its `podSelector` selects,
for the directions named in `policyTypes`; traffic is allowed when any rule of any policy that
applies allows it. A rule without `to` / `from` allows every peer, one without `ports` every port.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Document = dict[str, Any]
Port = tuple[str, int | str]
"""(protocol, port number or name)."""
DNS_PORTS = frozenset({("UDP", 53), ("TCP", 53)})
KUBE_SYSTEM = {"kubernetes.io/metadata.name": "kube-system"}
KUBE_DNS = {"k8s-app": "kube-dns"}


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects an object with `labels` (an empty selector selects all)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        holds = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not holds:
            return False
    return True


@dataclass(frozen=True)
class Allowance:
    """One rule of one policy that applies to a pod: the peers and ports it allows."""

    policy: str
    peers: tuple[Document, ...] | None
    """None: every peer (the rule names none)."""
    ports: frozenset[Port] | None
    """None: every port (the rule names none)."""


def _types(policy: Document) -> list[str]:
    spec = policy["spec"]
    # Without policyTypes, Ingress always applies and Egress when the policy has egress rules.
    return list(spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])])


def allowances(labels: Mapping[str, str], policies: list[Document], direction: str) -> Iterator[Allowance]:
    """Every rule that allows traffic `direction` ("Ingress" or "Egress") for a pod with `labels`."""
    key, peer_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in policies:
        if direction not in _types(policy) or not selects(policy["spec"]["podSelector"], labels):
            continue
        for rule in policy["spec"].get(key, []):
            peers = tuple(rule[peer_key]) if rule.get(peer_key) else None
            ports = (
                frozenset((p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]) if rule.get("ports") else None
            )
            yield Allowance(policy["metadata"]["name"], peers, ports)


def denies_by_default(policies: list[Document]) -> bool:
    """Whether one policy selects every pod for both directions and allows nothing."""
    return any(
        p["spec"]["podSelector"] == {}
        and {"Ingress", "Egress"} <= set(_types(p))
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
        for p in policies
    )


def reachable_from_outside(labels: Mapping[str, str], policies: list[Document]) -> bool:
    """Whether anything but the namespace's own pods may open a connection to a pod with `labels`."""
    return any(
        a.peers is None or any("ipBlock" in peer or "namespaceSelector" in peer for peer in a.peers)
        for a in allowances(labels, policies, "Ingress")
    )


def reaches(
    labels: Mapping[str, str],
    policies: list[Document],
    workloads: Mapping[str, Mapping[str, str]],
    target: str,
    port: Port,
) -> bool:
    """Whether a pod with `labels` may reach `port` on the pods of the workload `target`.

    Only a rule naming `port` and a peer of the namespace that selects `target`'s pods counts.
    """
    for allowance in allowances(labels, policies, "Egress"):
        if allowance.ports is None or port not in allowance.ports:
            continue
        for peer in allowance.peers or ():
            if (
                "podSelector" in peer
                and "namespaceSelector" not in peer
                and selects(peer["podSelector"], workloads[target])
            ):
                return True
    return False


def egress_beyond(
    labels: Mapping[str, str], policies: list[Document], workloads: Mapping[str, Mapping[str, str]], allowed: Port
) -> list[str]:
    """What a pod with `labels` may reach besides the cluster DNS and `allowed` on the NATS pods.

    `workloads` maps each workload's name to its pods' labels: a peer must select the NATS pods and
    nothing else. Empty when the pod may reach nothing more.
    """
    found: list[str] = []
    for allowance in allowances(labels, policies, "Egress"):
        where = f"NetworkPolicy {allowance.policy}"
        if allowance.peers is None:
            found.append(f"{where} allows egress to any address")
            continue
        for peer in allowance.peers:
            if "ipBlock" in peer:
                found.append(f"{where} allows egress to {peer['ipBlock']['cidr']}")
            elif "namespaceSelector" in peer:
                dns = peer["namespaceSelector"] == {"matchLabels": KUBE_SYSTEM} and peer.get("podSelector") == {
                    "matchLabels": KUBE_DNS
                }
                if not dns or allowance.ports is None or not allowance.ports <= DNS_PORTS:
                    found.append(f"{where} allows egress to another namespace beyond DNS: {peer}")
            else:
                selected = {name for name, pod in workloads.items() if selects(peer["podSelector"], pod)}
                if selected != {"nats"} or allowance.ports is None or not allowance.ports <= {allowed}:
                    ports = "every port" if allowance.ports is None else sorted(allowance.ports, key=str)
                    found.append(f"{where} allows egress to {sorted(selected)} on {ports}")
    return found
