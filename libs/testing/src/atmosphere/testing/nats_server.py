"""Real `nats-server` processes for tests: one server or a cluster, JetStream on, restartable in place."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from atmosphere.cli.nats_server import cluster_node_args, find_binary, server_args
from atmosphere.testing.ports import free_port


class NatsServerError(RuntimeError):
    """The server did not start; the message carries the tail of its log."""


class NatsServer:
    """One `nats-server` with JetStream, storing under `store_dir`.

    The first `start()` lets the kernel choose the port; later starts (after `stop()` or
    `kill()`) reuse that port and the same store, so clients reconnect to the "same" broker
    and durable streams survive.
    """

    def __init__(self, store_dir: Path, *, startup_timeout: float = 10.0, extra_args: Sequence[str] = ()) -> None:
        """Prepare (not start) a server storing under `store_dir`.

        `extra_args` are added to the command line, e.g. `("-c", "limits.conf")` for settings
        that only a configuration file sets (such as a lower `max_payload`).
        """
        self.store_dir = store_dir
        self.port: int | None = None
        self._startup_timeout = startup_timeout
        self._extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path = store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        """The client URL (after `start()`)."""
        if self.port is None:
            msg = "the server has not been started"
            raise NatsServerError(msg)
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id (after `start()`)."""
        if self._process is None:
            msg = "the server is not running"
            raise NatsServerError(msg)
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.store_dir.glob("*.ports"):
            stale.unlink()
        args = [
            *server_args(port=self.port if self.port is not None else -1, store_dir=self.store_dir),
            *self._extra_args,
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
                [str(find_binary()), *args], stdout=log, stderr=subprocess.STDOUT
            )
        self.port = self._wait_for_port()
        return self

    def _wait_for_port(self) -> int:
        assert self._process is not None
        ports_file = self.store_dir / f"nats-server_{self._process.pid}.ports"
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                url = json.loads(ports_file.read_text())["nats"][0]
                return int(url.rsplit(":", 1)[1])
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not start in {self._startup_timeout:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after 5 s)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """Kill abruptly (SIGKILL), as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None

    def restart(self) -> None:
        """Stop and start again on the same port with the same store."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log (for failure messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


_SEED_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class _Ports:
    """Where one cluster node listens (chosen by the kernel at its first start, kept after)."""

    client: int
    cluster: int
    monitor: int


class _Node:
    """One node of a `NatsCluster`: its process, store and log."""

    def __init__(self, name: str, store_dir: Path) -> None:
        self.name = name
        self.store_dir = store_dir
        self.log_path = store_dir / "nats-server.log"
        self.ports: _Ports | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self, args: Sequence[str]) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.store_dir.glob("*.ports"):
            stale.unlink()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
                [str(find_binary()), *args], stdout=log, stderr=subprocess.STDOUT
            )

    def read_ports(self, timeout: float) -> _Ports:
        """The ports from the node's ports file, written once every listener is up."""
        assert self.process is not None
        ports_file = self.store_dir / f"nats-server_{self.process.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                found = json.loads(ports_file.read_text())
                return _Ports(*(int(found[kind][0].rsplit(":", 1)[1]) for kind in ("nats", "cluster", "monitoring")))
            except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
                time.sleep(0.02)
        raise NatsServerError(f"{self.name} did not start in {timeout:g}s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        """Whether `/healthz` answers 200: JetStream knows its meta leader and this node is current."""
        assert self.ports is not None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.monitor}/healthz", timeout=1) as answer:
                return int(answer.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def end(self, *, graceful: bool) -> None:
        if self.process is not None and self.process.poll() is None:
            if graceful:
                self.process.terminate()
                try:
                    self.process.wait(5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
            else:
                self.process.kill()
            self.process.wait()
        self.process = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class NatsCluster:
    """`size` `nats-server` nodes (3 by default) with JetStream, routed into one cluster.

    At the first `start()` the kernel chooses every port (client, route, monitoring; read from
    each node's ports file, so nothing races for a free port): the first node is the seed the
    others route to, and the cluster's gossip meshes them. `kill(i)` and `start(i)` take one
    node down and bring it back on the same ports and store, routed to every other node, as a
    crashed server restarted by its supervisor. Node `i` is named `n<i>` (its JetStream server
    name, which stream and consumer info report as leader and replicas).
    """

    def __init__(self, root: Path, *, size: int = 3, startup_timeout: float = 30.0) -> None:
        """Prepare (not start) `size` nodes storing under `root/n<i>`."""
        if size < 1:
            msg = "a cluster has at least one node"
            raise ValueError(msg)
        self._nodes = [_Node(f"n{i}", root / f"n{i}") for i in range(size)]
        self._startup_timeout = startup_timeout

    @property
    def size(self) -> int:
        """How many nodes the cluster has."""
        return len(self._nodes)

    @property
    def names(self) -> list[str]:
        """The server names, by index."""
        return [node.name for node in self._nodes]

    @property
    def urls(self) -> list[str]:
        """Every node's client URL, by index (after the first `start()`)."""
        return [f"nats://127.0.0.1:{self._ports(i).client}" for i in range(self.size)]

    @property
    def url(self) -> str:
        """Every client URL, comma-separated: what `ATMOSPHERE_NATS__URL` and `connect` take."""
        return ",".join(self.urls)

    def index_of(self, name: str) -> int:
        """The index of the node whose server name is `name` (e.g. a stream's leader)."""
        return self.names.index(name)

    def pid(self, index: int) -> int:
        """The process id of node `index` (while it runs)."""
        process = self._nodes[index].process
        if process is None or process.poll() is not None:
            msg = f"{self._nodes[index].name} is not running"
            raise NatsServerError(msg)
        return process.pid

    def running(self, index: int) -> bool:
        """Whether node `index` is alive."""
        return self._nodes[index].running

    def _ports(self, index: int) -> _Ports:
        ports = self._nodes[index].ports
        if ports is None:
            msg = "the cluster has not been started"
            raise NatsServerError(msg)
        return ports

    def start(self, index: int | None = None) -> NatsCluster:
        """Start every node (`index` None) or node `index` again; return once the cluster is healthy.

        Healthy means every running node answers `/healthz`: a JetStream meta leader is elected
        and the node has caught up with it, so streams can be created and are current.
        """
        try:
            if index is not None:
                self._restart_node(index)
            elif any(node.ports is None for node in self._nodes):
                self._first_start()
            else:
                for i in range(self.size):
                    self._restart_node(i)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _first_start(self) -> None:
        seed = self._start_seed(self._nodes[0])
        for node in self._nodes[1:]:
            node.spawn(
                cluster_node_args(
                    name=node.name, port=-1, cluster_port=-1, monitor_port=-1, routes=[seed], store_dir=node.store_dir
                )
            )
            node.ports = node.read_ports(self._startup_timeout)

    def _start_seed(self, node: _Node) -> str:
        """Start the first node on a route port of its own; return its route URL.

        The one port not left to the kernel: a clustered JetStream server refuses to start
        without a configured route, and the seed's only route can be to itself (ignored once
        connected). A port taken between choosing and binding fails the start: another is tried.
        """
        for _ in range(_SEED_ATTEMPTS):
            route = f"nats://127.0.0.1:{free_port()}"
            node.spawn(
                cluster_node_args(
                    name=node.name,
                    port=-1,
                    cluster_port=int(route.rsplit(":", 1)[1]),
                    monitor_port=-1,
                    routes=[route],
                    store_dir=node.store_dir,
                )
            )
            try:
                node.ports = node.read_ports(self._startup_timeout)
            except NatsServerError:
                if "Error listening on router port" not in node.log_tail():
                    raise
                node.end(graceful=False)
                continue
            return route
        msg = f"{node.name}: no free route port in {_SEED_ATTEMPTS} attempts:\n{node.log_tail()}"
        raise NatsServerError(msg)

    def _restart_node(self, index: int) -> None:
        node = self._nodes[index]
        if node.running:
            return
        ports = self._ports(index)
        routes = [f"nats://127.0.0.1:{self._ports(i).cluster}" for i in range(self.size) if i != index]
        node.spawn(
            cluster_node_args(
                name=node.name,
                port=ports.client,
                cluster_port=ports.cluster,
                monitor_port=ports.monitor,
                routes=routes,
                store_dir=node.store_dir,
            )
        )
        node.read_ports(self._startup_timeout)

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running node answers `/healthz` with 200."""
        limit = self._startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            waiting = [node for node in self._nodes if node.running and not node.healthy()]
            if not waiting:
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(f"--- {node.name}\n{node.log_tail()}" for node in waiting)
                msg = f"{', '.join(n.name for n in waiting)} not healthy after {limit:g}s:\n{tails}"
                raise NatsServerError(msg)
            time.sleep(0.1)

    def kill(self, index: int) -> None:
        """Kill node `index` abruptly (SIGKILL), as a crash would; `start(index)` brings it back."""
        self._nodes[index].end(graceful=False)

    def stop(self, index: int | None = None) -> None:
        """Stop node `index`, or every node, gracefully (SIGTERM, then SIGKILL after 5 s)."""
        for node in self._nodes if index is None else [self._nodes[index]]:
            node.end(graceful=True)

    def log_tail(self, index: int, lines: int = 30) -> str:
        """The last lines of node `index`'s log (for failure messages)."""
        return self._nodes[index].log_tail(lines)
