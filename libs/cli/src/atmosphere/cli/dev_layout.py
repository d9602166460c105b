"""Which processes `atmosphere dev` runs, where each one listens and keeps its data, and whether it can.

By default one nats-server and one process per service, as always. With `--cluster 3`: a
3-node JetStream cluster and two replicas of every service, each replica with its own ports
and data directory (what two pods of a Deployment have), so that one of anything may die
while the stack keeps serving.

Every port is checked before anything starts (`port_conflicts`, `taken_ports`): a service
that cannot bind its port crash-loops, and another stack's answer on that port would pass for
its own.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atmosphere.cli.dev import DevOptions

SERVICES = ("governance", "memory", "tape", "sandbox", "dispatch", "ingress")
"""Start order: dependencies of a run first, the public door (ingress) last."""
MAX_PORT = 65535
SERVICE_REPLICAS_IN_CLUSTER = 2
"""Processes per service on a cluster: the fewest where one may die and the service still answers."""
MAX_STREAM_REPLICAS = 3
"""Stream replicas on a cluster: three survive one node's loss; more only cost writes."""


@dataclass(frozen=True, slots=True)
class Listener:
    """A port the stack listens on, what it is for and the command-line flag that moves it."""

    port: int
    purpose: str
    """E.g. "memory's probe port"."""
    flag: str
    """E.g. `--probe-base-port`."""


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
    """Dispatch's gRPC port (0: not dispatch, or a free one for a runtime pool's dispatch)."""
    pool: str = ""
    """A dispatch's runtime pool ("" the default pool)."""

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
        return [listener.port for listener in self.listeners()]

    def listeners(self) -> list[Listener]:
        """Every port the stack listens on (the model's aside), each with its purpose and flag."""
        found: list[Listener] = []
        for node in self.nodes:
            server = node.name if self.clustered else "nats-server"
            found.append(Listener(node.port, f"{server}'s client port", "--nats-port"))
            if node.cluster_port:
                found.append(Listener(node.cluster_port, f"{server}'s route port", "--nats-cluster-port"))
            if node.monitor_port:
                found.append(Listener(node.monitor_port, f"{server}'s monitoring port", "--nats-monitor-port"))
        for p in self.processes:
            if p.probe_port:
                found.append(Listener(p.probe_port, f"{p.name}'s probe port", "--probe-base-port"))
            if p.http_port:
                found.append(Listener(p.http_port, f"{p.name}'s HTTP port", "--http-port"))
            if p.grpc_port:
                found.append(Listener(p.grpc_port, f"{p.name}'s gRPC port", "--grpc-port"))
        return found


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
    # A dispatch per runtime pool (and replica), probed after every other worker; gRPC on a free
    # port (shown in its info): a client may call any dispatch for any agent.
    first_probe = options.probe_base_port + replicas * len(workers)
    for i, pool in enumerate(options.pools):
        for n in range(replicas):
            name = f"dispatch-{pool}" if replicas == 1 else f"dispatch-{pool}-{n + 1}"
            data_dir = home / "data" if replicas == 1 else home / f"data-{name}"
            processes.append(
                ServiceProcess(
                    name=name,
                    service="dispatch",
                    data_dir=data_dir,
                    workspace_root=data_dir / "workspace" if replicas > 1 else home / "workspace",
                    probe_port=first_probe + i * replicas + n,
                    pool=pool,
                )
            )
    return DevLayout(nodes=nodes, processes=tuple(processes), stream_replicas=min(options.cluster, MAX_STREAM_REPLICAS))


def stack_listeners(options: DevOptions) -> list[Listener]:
    """Every port the stack will listen on: the layout's, and the local model's when it runs."""
    found = dev_layout(options).listeners()
    if options.local_model:
        found.append(Listener(options.model_port, "the local model's port", "--model-port"))
    return found


def port_conflicts(options: DevOptions) -> list[str]:
    """What the options ask that no stack can do: ports counted up past 65535, one port for two listeners."""
    listeners = stack_listeners(options)
    problems: list[str] = []
    highest: dict[str, int] = {}
    for listener in listeners:
        if listener.port > MAX_PORT:
            highest[listener.flag] = max(highest.get(listener.flag, 0), listener.port)
    for flag, port in highest.items():
        given = getattr(options, flag.removeprefix("--").replace("-", "_"))
        problems.append(f"{flag} {given}: the ports counted up from it run to {port}, past {MAX_PORT}")
    owners: dict[int, Listener] = {}
    for listener in listeners:
        first = owners.setdefault(listener.port, listener)
        if first is not listener:
            problems.append(
                f"port {listener.port} is both {first.purpose} ({first.flag}) and {listener.purpose} ({listener.flag})"
            )
    return problems


def taken_ports(options: DevOptions) -> list[tuple[Listener, str]]:
    """The stack's ports that something else holds, each with why it cannot be used."""
    taken = []
    for listener in stack_listeners(options):
        if (reason := _unusable(options.host, listener.port)) is not None:
            taken.append((listener, reason))
    return taken


def _unusable(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, or None when it can.

    Both tests matter: a listener on another address of the port (0.0.0.0) answers a connect
    but may not stop a bind, and a socket bound without listening stops the bind but answers
    nothing.
    """
    with socket.socket() as probe:
        probe.settimeout(0.2)
        if probe.connect_ex((host, port)) == 0:
            return "is already in use"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return None  # the host itself is wrong: every service will say so
    with socket.socket(family, kind, proto) as probe:
        # As every server of the stack binds: a connection left in TIME_WAIT is no obstacle.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return None  # --host is no address of this machine: nats-server says so, once
            return "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on ({exc.strerror})"
    return None
