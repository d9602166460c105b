"""Which processes `atmosphere dev` runs, and where each one listens and keeps its data.

By default one nats-server and one process per service, as always. With `--cluster 3`: a
3-node JetStream cluster and two replicas of every service, each replica with its own ports
and data directory (what two pods of a Deployment have), so that one of anything may die
while the stack keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atmosphere.cli.dev import DevOptions

SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")
"""Start order: dependencies of a run first, the public door (ingress) last."""
SERVICE_REPLICAS_IN_CLUSTER = 2
"""Processes per service on a cluster: the fewest where one may die and the service still answers."""
MAX_STREAM_REPLICAS = 3
"""Stream replicas on a cluster: three survive one node's loss; more only cost writes."""


@dataclass(frozen=True, slots=True)
class NatsNode:
    """One nats-server of the stack."""

    name: str
    """Its child name and, on a cluster, its server name: `nats` alone, `nats-<i>` in a cluster."""
    port: int
    store_dir: Path
    cluster_port: int = 0
    """Its route port (0: not clustered)."""
    monitor_port: int = 0
    """Its monitoring port, where `/healthz` says whether JetStream is ready (0: none)."""

    def url(self, host: str) -> str:
        """The client URL."""
        return f"nats://{host}:{self.port}"

    def route(self, host: str) -> str:
        """The route URL the other nodes connect to."""
        return f"nats://{host}:{self.cluster_port}"


@dataclass(frozen=True, slots=True)
class ServiceProcess:
    """One process (replica) of a service."""

    name: str
    """Its child name: the service alone, `<service>-<n>` as one of several replicas."""
    service: str
    data_dir: Path
    """Its own: a replica's state (and the replica name kept in it) is never another's."""
    workspace_root: Path
    probe_port: int = 0
    """The `/healthz` + `/readyz` listener of a worker service (0: ingress, which answers on its HTTP port)."""
    http_port: int = 0
    """Ingress's public HTTP port (0: not ingress)."""
    grpc_port: int = 0
    """Dispatch's gRPC port (0: not dispatch)."""

    @property
    def ready_port(self) -> int:
        """Where its `/readyz` answers."""
        return self.http_port or self.probe_port


@dataclass(frozen=True, slots=True)
class DevLayout:
    """Every process of the stack, in start order."""

    nodes: tuple[NatsNode, ...]
    processes: tuple[ServiceProcess, ...]
    stream_replicas: int
    """`ATMOSPHERE_JETSTREAM__REPLICAS` of every service (1 on one node)."""

    @property
    def clustered(self) -> bool:
        """Whether the broker is a cluster."""
        return len(self.nodes) > 1

    def nats_url(self, host: str) -> str:
        """`ATMOSPHERE_NATS__URL`: every node's client URL, comma-separated."""
        return ",".join(node.url(host) for node in self.nodes)

    def of(self, service: str) -> list[ServiceProcess]:
        """The processes of `service`."""
        return [p for p in self.processes if p.service == service]

    def ports(self) -> list[int]:
        """Every port the stack listens on (the model's aside)."""
        nodes = [port for n in self.nodes for port in (n.port, n.cluster_port, n.monitor_port) if port]
        return nodes + [port for p in self.processes for port in (p.probe_port, p.http_port, p.grpc_port) if port]


def dev_layout(options: DevOptions) -> DevLayout:
    """The processes `options` ask for: ports counted up from each base port, one per replica."""
    home = options.home
    if options.cluster == 1:
        nodes: tuple[NatsNode, ...] = (NatsNode("nats", options.nats_port, home / "nats"),)
    else:
        nodes = tuple(
            NatsNode(
                f"nats-{i}",
                options.nats_port + i,
                home / f"nats-{i}",
                cluster_port=options.nats_cluster_port + i,
                monitor_port=options.nats_monitor_port + i,
            )
            for i in range(options.cluster)
        )
    replicas = 1 if options.cluster == 1 else SERVICE_REPLICAS_IN_CLUSTER
    workers = sorted(s for s in SERVICES if s != "ingress")
    processes: list[ServiceProcess] = []
    for service in SERVICES:
        for n in range(replicas):
            if replicas == 1:
                name, data_dir, workspace = service, home / "data", home / "workspace"
            else:
                name = f"{service}-{n + 1}"
                data_dir = home / f"data-{name}"
                workspace = data_dir / "workspace"
            processes.append(
                ServiceProcess(
                    name=name,
                    service=service,
                    data_dir=data_dir,
                    workspace_root=workspace,
                    # Replica n's worker probes follow replica n-1's: base .. base+4, base+5 .. base+9.
                    probe_port=0
                    if service == "ingress"
                    else options.probe_base_port + n * len(workers) + workers.index(service),
                    http_port=options.http_port + n if service == "ingress" else 0,
                    grpc_port=options.grpc_port + n if service == "dispatch" else 0,
                )
            )
    return DevLayout(nodes=nodes, processes=tuple(processes), stream_replicas=min(options.cluster, MAX_STREAM_REPLICAS))
