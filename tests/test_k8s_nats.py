"""The NATS StatefulSet and its nats.conf describe one 3-node cluster that can actually start.

The configuration is checked by a real `nats-server -t` (it parses the file, its include and
its variables as at start, and refuses an unknown field), and the manifest is held to it: routes
to every pod of the StatefulSet, the ports it listens on, the probes' port, the lame duck pid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from atmosphere.bus.permissions import write_credentials
from atmosphere.cli.nats_server import find_binary
from scripts.k8s_pods import named, pod_spec, workloads
from scripts.k8s_render import AUTH_FILE, BASE
from scripts.validate_k8s import rendered

CONFIG = BASE / "nats" / "nats.conf"
MOUNT = "/etc/nats"


def nats_test(directory: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    """`nats-server --config directory/nats.conf -t`: parse everything, start nothing."""
    command = [str(find_binary()), "--config", str(directory / CONFIG.name), "-t"]
    env = {"PATH": os.environ.get("PATH", ""), **environment}
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=30, env=env)


@pytest.fixture
def mounted(tmp_path: Path) -> Path:
    """The config directory as a pod sees it: nats.conf beside the generated nats-auth.conf."""
    write_credentials(tmp_path)  # `atmosphere bus-credentials --out tmp_path`
    shutil.copy(CONFIG, tmp_path / CONFIG.name)
    return tmp_path


def nats(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return workloads(documents)["nats"]


def setting(name: str) -> str:
    match = re.search(rf"^{name}: (\S+)$", CONFIG.read_text(), re.MULTILINE)
    assert match is not None, name
    return match.group(1)


def test_nats_server_accepts_the_configuration_with_its_credentials(mounted: Path) -> None:
    result = nats_test(mounted, SERVER_NAME="nats-0")
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stdout + result.stderr


def test_nats_server_refuses_it_without_the_credentials_or_a_server_name(mounted: Path) -> None:
    assert "SERVER_NAME" in nats_test(mounted).stderr
    (mounted / AUTH_FILE).write_text('authorization { users = [ {user: "a", passwrd: "b"} ] }\n')
    assert "passwrd" in nats_test(mounted, SERVER_NAME="nats-0").stderr
    (mounted / AUTH_FILE).unlink()
    refused = nats_test(mounted, SERVER_NAME="nats-0")
    assert refused.returncode != 0
    assert AUTH_FILE in refused.stderr


def test_the_routes_name_every_pod_of_the_statefulset_on_its_ports() -> None:
    text = CONFIG.read_text()
    routes = set(re.findall(r"^\s+(nats://\S+)$", text, re.MULTILINE))
    cluster_port = int(re.search(r"cluster \{\n\s+name: \w+\n\s+listen: 0\.0\.0\.0:(\d+)", text).group(1))  # type: ignore[union-attr]
    for documents in rendered().values():
        statefulset = nats(documents)
        headless = named(documents, "Service")[statefulset["spec"]["serviceName"]]
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["publishNotReadyAddresses"] is True  # a node is ready only once it met the others
        pods = [f"nats-{i}" for i in range(statefulset["spec"]["replicas"])]
        assert routes == {f"nats://{pod}.{headless['metadata']['name']}:{cluster_port}" for pod in pods}
        [container] = pod_spec(statefulset)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {
            "client": int(setting("listen").rsplit(":", 1)[1]),
            "cluster": cluster_port,
            "monitor": int(setting("http").rsplit(":", 1)[1]),
        }
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz?js-enabled-only=true", "port": "monitor"}
        assert {"name": "SERVER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]


def test_each_node_reads_the_config_and_the_credentials_from_one_directory() -> None:
    for documents in rendered().values():
        spec = pod_spec(nats(documents))
        [container] = spec["containers"]
        assert container["command"] == ["nats-server", "--config", f"{MOUNT}/{CONFIG.name}"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        [config] = [v for v in spec["volumes"] if v["name"] == mounts[MOUNT]]
        configmap, secret = (s.get("configMap") or s["secret"] for s in config["projected"]["sources"])
        assert CONFIG.name in named(documents, "ConfigMap")[configmap["name"]]["data"]
        assert AUTH_FILE in named(documents, "Secret")[secret["name"]]["data"]
        assert named(documents, "ConfigMap")[configmap["name"]]["data"][CONFIG.name] == CONFIG.read_text()


def test_the_lame_duck_hook_signals_the_pid_file_on_a_writable_volume() -> None:
    pid_file = setting("pid_file")
    for documents in rendered().values():
        spec = pod_spec(nats(documents))
        [container] = spec["containers"]
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["nats-server", "--signal", f"ldm={pid_file}"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = next(v for v in spec["volumes"] if v["name"] == mounts[str(Path(pid_file).parent)])
        assert "emptyDir" in volume
