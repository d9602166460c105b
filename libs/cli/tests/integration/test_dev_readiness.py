"""`atmosphere dev` tells the truth: every port checked before anything starts, readiness of its own children."""

import asyncio
import contextlib
import io
import json
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from atmosphere.cli import dev
from atmosphere.cli.dev import DevOptions, run_dev, wait_for_ready
from atmosphere.cli.supervisor import ChildSpec, Supervisor
from atmosphere.testing import free_port, free_port_block


def readyz_answering(
    body: dict[str, object],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A server that answers every request 200 with `body`, as another stack's probe would."""
    payload = json.dumps(body).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        await writer.drain()
        writer.close()

    return answer


@contextlib.asynccontextmanager
async def another_stacks_probes(base: int, count: int) -> AsyncIterator[None]:
    servers = [
        await asyncio.start_server(readyz_answering({"ready": True}), "127.0.0.1", base + i) for i in range(count)
    ]
    try:
        yield
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()


def options(home: Path, **overrides: object) -> DevOptions:
    ports: dict[str, object] = {
        "nats_port": free_port(),
        "http_port": free_port(),
        "grpc_port": free_port(),
        "probe_base_port": free_port_block(5),
        "nats_cluster_port": free_port_block(3),
        "nats_monitor_port": free_port_block(3),
    }
    return DevOptions(app="examples.echo:app", home=home, no_model=True, **{**ports, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_preflight(_options: DevOptions) -> str | None:
        raise AssertionError("the ports are checked before the app check")

    def no_children(_options: DevOptions) -> list[ChildSpec]:
        raise AssertionError("the ports are checked before any child is started")

    monkeypatch.setattr(dev, "preflight", no_preflight)
    monkeypatch.setattr(dev, "child_specs", no_children)


@pytest.mark.usefixtures("nothing_starts")
async def test_probe_ports_answering_readyz_stop_the_stack_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = options(tmp_path / "home")
    async with another_stacks_probes(chosen.probe_base_port, 5):
        assert await run_dev(chosen) == 1
    err = capsys.readouterr().err
    memory = chosen.probe_base_port + 2  # dispatch, governance, memory, sandbox, tape (sorted)
    assert f"port 127.0.0.1:{memory} (memory's probe port) is already in use" in err
    assert "is another stack running?" in err
    assert "--probe-base-port" in err
    assert not (tmp_path / "home").exists()


@pytest.mark.usefixtures("nothing_starts")
@pytest.mark.parametrize(
    ("which", "flag", "purpose"),
    [
        ("nats_cluster_port", "--nats-cluster-port", "nats-1's route port"),
        ("nats_monitor_port", "--nats-monitor-port", "nats-1's monitoring port"),
    ],
)
async def test_every_port_of_a_cluster_is_checked(
    which: str, flag: str, purpose: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = options(tmp_path / "home", cluster=3)
    busy = getattr(chosen, which) + 1
    with socket.create_server(("127.0.0.1", busy)):
        assert await run_dev(chosen) == 1
    err = capsys.readouterr().err
    assert f"port 127.0.0.1:{busy} ({purpose}) is already in use" in err
    assert flag in err


@pytest.mark.usefixtures("nothing_starts")
async def test_a_port_bound_without_listening_is_in_use_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chosen = options(tmp_path / "home")
    with socket.socket() as held:
        held.bind(("127.0.0.1", chosen.grpc_port))  # bound, not listening: nothing answers a connect
        assert await run_dev(chosen) == 1
    assert f"port 127.0.0.1:{chosen.grpc_port} (dispatch's gRPC port) is already in use" in capsys.readouterr().err


async def test_wait_for_ready_counts_only_the_instance_it_started() -> None:
    ours = await asyncio.start_server(readyz_answering({"ready": True, "instance": "here:42"}), "127.0.0.1", 0)
    theirs = await asyncio.start_server(readyz_answering({"ready": True, "instance": "here:7"}), "127.0.0.1", 0)
    anonymous = await asyncio.start_server(readyz_answering({"ready": True}), "127.0.0.1", 0)
    ports = {name: s.sockets[0].getsockname()[1] for name, s in [("a", ours), ("b", theirs), ("c", anonymous)]}
    async with ours, theirs, anonymous:
        late = await wait_for_ready("127.0.0.1", ports, 0.5, instance_of=lambda _name: "here:42")
        assert late == ["b", "c"]
        assert await wait_for_ready("127.0.0.1", ports, 0.5) == []  # without identities: any 200 (nats /healthz)


def python_child(name: str, code: str) -> ChildSpec:
    return ChildSpec(name=name, argv=[sys.executable, "-c", code], stop_timeout=2)


def stand_in_stack(monkeypatch: pytest.MonkeyPatch, services: Callable[[DevOptions], list[ChildSpec]]) -> None:
    """The real `run_dev` over stand-in children: a broker that only listens, services from `services`."""

    async def no_preflight(_options: DevOptions) -> str | None:
        return None

    def specs(options: DevOptions) -> list[ChildSpec]:
        broker = f"import socket, time; s = socket.create_server(('127.0.0.1', {options.nats_port})); time.sleep(60)"
        return [python_child("nats", broker), *services(options)]

    monkeypatch.setattr(dev, "preflight", no_preflight)
    monkeypatch.setattr(dev, "child_specs", specs)


@pytest.mark.timeout(30)
async def test_a_service_crash_looping_while_the_stack_starts_stops_it_without_a_banner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def services(_options: DevOptions) -> list[ChildSpec]:
        return [python_child(name, "raise SystemExit(1)") for name in dev.SERVICES]

    stand_in_stack(monkeypatch, services)
    assert await run_dev(options(tmp_path / "home")) == 1
    captured = capsys.readouterr()
    assert "Ctrl-C stops everything" not in captured.out  # no banner
    assert "crash-looping while the stack started" in captured.err
    # Every service crashes; whichever reached the count first is named (the order is the machine's).
    named = re.findall(r"(\w+) \(exit 1\)", captured.err)
    assert named, captured.err
    assert set(named) <= set(dev.SERVICES)


@pytest.mark.timeout(30)
async def test_services_not_ready_in_time_stop_the_stack_and_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def services(_options: DevOptions) -> list[ChildSpec]:
        # Alive, but never answering /readyz (like a service that cannot bind its probe port).
        return [python_child(name, "import time; time.sleep(60)") for name in dev.SERVICES]

    stand_in_stack(monkeypatch, services)
    monkeypatch.setattr(dev, "READY_TIMEOUT", 1.0)
    assert await run_dev(options(tmp_path / "home")) == 1
    captured = capsys.readouterr()
    assert "Ctrl-C stops everything" not in captured.out
    assert f"not ready after 1 s: {', '.join(sorted(dev.SERVICES))}" in captured.err


async def test_the_supervisor_knows_each_childs_pid_and_exits() -> None:
    supervisor = Supervisor()
    await supervisor.start(python_child("sleeper", "import time; time.sleep(60)"))
    await supervisor.start(python_child("quitter", "raise SystemExit(5)"))
    for _ in range(100):
        if supervisor.exits("quitter"):
            break
        await asyncio.sleep(0.05)
    try:
        assert supervisor.pid("sleeper") in supervisor.pids
        assert supervisor.exits("sleeper") == 0
        assert supervisor.exits("quitter") >= 1
        assert supervisor.last_exit_code("quitter") == 5
    finally:
        await supervisor.stop()


def test_every_service_stops_the_stack_on_invalid_settings(tmp_path: Path) -> None:
    from atmosphere.service import EXIT_APP_UNLOADABLE, EXIT_INVALID_SETTINGS

    assert dev.EXIT_INVALID_SETTINGS == EXIT_INVALID_SETTINGS
    specs = {s.name: s for s in dev.child_specs(DevOptions(app="a:b", home=tmp_path, no_model=True))}
    for name in dev.SERVICES:
        assert EXIT_INVALID_SETTINGS in specs[name].fatal_exit_codes
        assert (EXIT_APP_UNLOADABLE in specs[name].fatal_exit_codes) == (name in dev.APP_LOADERS)


def test_the_app_loaders_are_the_services_whose_code_imports_the_app() -> None:
    # An app loader left out is restarted on exit 4: under load it could be the first to fail,
    # and the stack said "restarting in" before the first loader listed stopped it.
    root = Path(__file__).resolve().parents[4]
    importing = {
        name
        for name in dev.SERVICES
        if any("load_service_app(" in source.read_text() for source in (root / "services" / name / "src").rglob("*.py"))
    }
    assert importing == dev.APP_LOADERS


@pytest.mark.timeout(30)
async def test_a_failed_provisioning_stops_the_stack_before_any_service_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "a-service-started"

    def services(_options: DevOptions) -> list[ChildSpec]:
        refused = python_child("provision", "print('jetstream refused the layout'); raise SystemExit(1)")
        refused.once = True
        started = f"open({str(marker)!r}, 'w').close(); import time; time.sleep(60)"
        return [refused, *(python_child(name, started) for name in dev.SERVICES)]

    stand_in_stack(monkeypatch, services)
    assert await run_dev(options(tmp_path / "home")) == 1
    captured = capsys.readouterr()
    assert "Error: provision failed (exit 1)" in captured.err
    assert "Ctrl-C stops everything" not in captured.out
    assert not marker.exists()


async def test_a_step_runs_to_its_end_before_run_once_returns() -> None:
    out = io.StringIO()
    supervisor = Supervisor(out=out)
    try:
        step = python_child("step", "print('made the layout'); raise SystemExit(3)")
        assert await supervisor.run_once(step, timeout=10) == 3
        assert "step      | made the layout" in out.getvalue()  # prefixed like every child's output
        assert await supervisor.run_once(python_child("slow", "import time; time.sleep(60)"), timeout=0.5) is None
        assert "slow      | did not finish in 0.5s; stopping it" in out.getvalue()
    finally:
        await supervisor.stop()
