"""`atmosphere dev --cluster 3 --auth` as a user runs it: three nats-server nodes, two replicas of
every service each logged in as its own NATS user, a run through each ingress, a node killed
with SIGKILL and the runs still completing, and nothing left behind after Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import websockets

from atmosphere.bus import ConnectError, connect, subjects
from atmosphere.testing import free_port_block, wait_until

from .test_dev_command import alive, descendants, is_tool_worker, start, wait_for_banner
from .wsclient import ws_url

pytestmark = pytest.mark.timeout(480)

NODES = 3
SERVICE_PROCESSES = 12
"""Two replicas of each of the six services."""


def cluster_args(home: Path) -> tuple[list[str], dict[str, int]]:
    ports = {  # each a base the stack counts up from: a node's, an ingress's, a worker's
        "nats": free_port_block(NODES),
        "routes": free_port_block(NODES),
        "monitor": free_port_block(NODES),
        "http": free_port_block(2),
        "probe": free_port_block(SERVICE_PROCESSES),
        "grpc": free_port_block(2),
    }
    argv = [
        "--cluster",
        str(NODES),
        "--home",
        str(home),
        "--nats-port",
        str(ports["nats"]),
        "--nats-cluster-port",
        str(ports["routes"]),
        "--nats-monitor-port",
        str(ports["monitor"]),
        "--http-port",
        str(ports["http"]),
        "--probe-base-port",
        str(ports["probe"]),
        "--grpc-port",
        str(ports["grpc"]),
        "--no-model",
        "--auth",
    ]
    return argv, ports


def login(home: Path, role: str) -> dict[str, str]:
    """The user and password `atmosphere dev --auth` made for `role`."""
    lines = (home / "nats-credentials" / f"{role}.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    return {"user": env["ATMOSPHERE_NATS__USER"], "password": env["ATMOSPHERE_NATS__PASSWORD"]}


async def run_to_the_end(http_url: str, prompt: str, *, frame_timeout: float = 30.0) -> list[dict[str, Any]]:
    """The frames of one echo run through its terminal frame (patient: a node may just have died)."""
    async with websockets.connect(ws_url(http_url, "echo"), open_timeout=frame_timeout) as ws:
        await ws.send(prompt)
        frames: list[dict[str, Any]] = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), frame_timeout))
            frames.append(frame)
            if frame.get("type") in {"complete", "error"} and frame.get("seq", 0) > 0:
                return frames


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def processes(root: int) -> set[int]:
    return {pid for pid in alive(descendants(root)) if not is_tool_worker(pid)}


async def test_dev_cluster_serves_through_a_killed_node_and_leaves_no_orphans(tmp_path: Path) -> None:
    argv, ports = cluster_args(tmp_path / "home")
    with start([str(Path(sys.executable).parent / "atmosphere"), "dev", *argv], tmp_path) as (process, output):
        await wait_for_banner(output, timeout=360)
        assert "3-node NATS cluster, 2 replicas of every service" in output.read()
        ingresses = [f"http://127.0.0.1:{ports['http'] + n}" for n in range(2)]
        for n, url in enumerate(ingresses):
            assert (await run_to_the_end(url, f"hello through ingress {n + 1}"))[-1]["type"] == "complete"
        assert len(processes(process.pid)) == NODES + SERVICE_PROCESSES, output.read()

        # Kill the node leading the run queue, the one whose loss hurts most.
        urls = [f"nats://127.0.0.1:{ports['nats'] + i}" for i in range(NODES)]
        with pytest.raises(ConnectError, match="without credentials"):  # the bus is not open to anyone
            async with connect(urls, name="no-login", connect_timeout=5):
                pass
        async with connect(urls, name="dev-cluster-test", **login(tmp_path / "home", "dispatch")) as bus:
            info = await bus.client.jetstream().stream_info(subjects.RUNS_STREAM)
        assert info.config.num_replicas == NODES
        assert info.cluster is not None
        leader = info.cluster.leader
        node = next(pid for pid in processes(process.pid) if f"--server_name {leader} " in command_line(pid))
        os.kill(node, signal.SIGKILL)

        async def completes_without_it() -> bool:
            try:
                frames = await run_to_the_end(ingresses[0], "after a node died")
            except (TimeoutError, OSError, websockets.WebSocketException):
                return False
            return frames[-1]["type"] == "complete"

        await wait_until(completes_without_it, timeout=90, interval=1, what="a run to complete without the node")

        async def node_restarted() -> bool:
            return "restarting in" in output.read() and len(processes(process.pid)) == NODES + SERVICE_PROCESSES

        await wait_until(node_restarted, timeout=60, interval=0.5, what="the node to be restarted")
        assert (await run_to_the_end(ingresses[1], "with the node back"))[-1]["type"] == "complete"

        tree = descendants(process.pid)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert process.wait(90) == 0, output.read()
        deadline = time.monotonic() + 10
        while alive(tree) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert alive(tree) == set(), output.read()
