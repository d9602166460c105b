"""`atmosphere dev --cluster 3`: three nats-server nodes and two replicas of every service, each with its own ports."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from atmosphere.cli import __main__ as cli_main
from atmosphere.cli.dev import SERVICES, DevOptions, banner, child_specs
from atmosphere.cli.dev_layout import dev_layout


def cluster_options(home: Path) -> DevOptions:
    return DevOptions(
        app="examples.echo:app",
        home=home,
        nats_port=5000,
        nats_cluster_port=5100,
        nats_monitor_port=5200,
        http_port=5300,
        probe_base_port=5400,
        grpc_port=5500,
        no_model=True,
        cluster=3,
    )


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_three_nodes_routed_to_each_other_each_with_its_own_store(tmp_path: Path) -> None:
    specs = child_specs(cluster_options(tmp_path))
    nodes = specs[:3]
    assert [s.name for s in nodes] == ["nats-0", "nats-1", "nats-2"]
    routes = "nats://127.0.0.1:5100,nats://127.0.0.1:5101,nats://127.0.0.1:5102"
    for i, node in enumerate(nodes):
        argv = list(node.argv)
        assert "-js" in argv
        assert value(argv, "-p") == str(5000 + i)
        assert value(argv, "--cluster") == f"nats://127.0.0.1:{5100 + i}"
        assert value(argv, "-m") == str(5200 + i)
        assert value(argv, "--server_name") == f"nats-{i}"
        assert value(argv, "--routes") == routes
        assert value(argv, "-sd") == str(tmp_path / f"nats-{i}")
        assert (tmp_path / f"nats-{i}").is_dir()


def test_two_replicas_of_every_service_with_distinct_ports_and_data(tmp_path: Path) -> None:
    provision, *specs = child_specs(cluster_options(tmp_path))[3:]
    assert provision.once
    assert provision.env["ATMOSPHERE_JETSTREAM__REPLICAS"] == "3"  # the layout as every service expects it
    assert [s.name for s in specs] == [f"{service}-{n}" for service in SERVICES for n in (1, 2)]
    urls = "nats://127.0.0.1:5000,nats://127.0.0.1:5001,nats://127.0.0.1:5002"
    assert {s.env["ATMOSPHERE_NATS__URL"] for s in specs} == {urls}
    assert {s.env["ATMOSPHERE_JETSTREAM__REPLICAS"] for s in specs} == {"3"}
    data_dirs = [s.env["ATMOSPHERE_DATA_DIR"] for s in specs]
    assert data_dirs == [str(tmp_path / f"data-{s.name}") for s in specs]
    by_name = {s.name: s.env for s in specs}
    assert (by_name["ingress-1"]["ATMOSPHERE_INGRESS__PORT"], by_name["ingress-2"]["ATMOSPHERE_INGRESS__PORT"]) == (
        "5300",
        "5301",
    )
    grpc = (
        by_name["dispatch-1"]["ATMOSPHERE_DISPATCH__GRPC_PORT"],
        by_name["dispatch-2"]["ATMOSPHERE_DISPATCH__GRPC_PORT"],
    )
    assert grpc == ("5500", "5501")
    probes = sorted(int(env["ATMOSPHERE_PROBE_PORT"]) for env in by_name.values() if "ATMOSPHERE_PROBE_PORT" in env)
    assert probes == list(range(5400, 5410))
    every_port = dev_layout(cluster_options(tmp_path)).ports()
    assert not [port for port, n in Counter(every_port).items() if n > 1]
    assert len(every_port) == 3 * 3 + 10 + 2 + 2


def test_the_banner_names_every_address(tmp_path: Path) -> None:
    text = banner(cluster_options(tmp_path))
    assert "3-node NATS cluster, 2 replicas of every service" in text
    assert "http://127.0.0.1:5300, http://127.0.0.1:5301" in text
    assert "127.0.0.1:5500, 127.0.0.1:5501" in text
    assert "nats://127.0.0.1:5000,nats://127.0.0.1:5001,nats://127.0.0.1:5002" in text
    assert "3 replicas of every stream" in text
    for i in range(3):
        assert f"nats-{i} :{5000 + i} routes :{5100 + i} /healthz :{5200 + i}" in text
    for port in range(5400, 5410):
        assert f":{port}" in text


def test_one_node_is_todays_stack_exactly(tmp_path: Path) -> None:
    single = DevOptions(app="examples.echo:app", home=tmp_path, nats_port=5000, no_model=True)
    specs = child_specs(single)
    assert [s.name for s in specs] == ["nats", "provision", *SERVICES]
    assert "--cluster" not in specs[0].argv
    assert all("ATMOSPHERE_JETSTREAM__REPLICAS" not in s.env for s in specs[1:])
    assert {s.env["ATMOSPHERE_DATA_DIR"] for s in specs[2:]} == {str(tmp_path / "data")}
    assert {s.env["ATMOSPHERE_WORKSPACE_ROOT"] for s in specs[2:]} == {str(tmp_path / "workspace")}
    assert "cluster" not in banner(single)


def test_the_cluster_flags_reach_the_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[DevOptions] = []

    async def fake_run_dev(options: DevOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(cli_main, "run_dev", fake_run_dev)
    flags = ["--cluster", "3", "--nats-cluster-port", "7000", "--nats-monitor-port", "7100"]
    assert cli_main.main(["dev", "--home", str(tmp_path), *flags]) == 0
    assert cli_main.main(["dev", "--home", str(tmp_path)]) == 0
    assert [(o.cluster, o.nats_cluster_port, o.nats_monitor_port) for o in seen] == [(3, 7000, 7100), (1, 6222, 8222)]
