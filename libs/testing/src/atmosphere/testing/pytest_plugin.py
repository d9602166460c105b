"""Pytest fixtures: real NATS for every test that needs one, isolated per test."""

from __future__ import annotations

import fcntl
import gc
import os
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from atmosphere.bus import NatsBus, connect
from atmosphere.testing.nats_server import NatsCluster, NatsServer
from atmosphere.testing.scripted_model import ScriptedModel

NATS_URL_ENV = "ATMOSPHERE_TEST_NATS_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--nats-url`: use a running server instead of starting one."""
    group = parser.getgroup("atmosphere")
    group.addoption(
        "--nats-url",
        default=None,
        help=f"use this NATS server (JetStream on) instead of starting one; also ${NATS_URL_ENV}",
    )
    group.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the soak tests (marked `soak`: minutes long, `make soak`); skipped otherwise",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers this plugin understands."""
    config.addinivalue_line("markers", "docker: needs a Docker engine (skipped when none answers)")
    config.addinivalue_line("markers", "cluster: runs on a 3-node nats-server cluster (the `nats_cluster` fixture)")
    config.addinivalue_line("markers", "soak: minutes long; runs only with --soak (`make soak`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests on a cluster `cluster` (`-m "not cluster"` leaves them out); skip soak tests without --soak."""
    skip_soak = pytest.mark.skip(reason="a soak test: run it with --soak (`make soak`)")
    for item in items:
        if "nats_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
        if item.get_closest_marker("soak") and not config.getoption("--soak"):
            item.add_marker(skip_soak)


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a JetStream-enabled nats-server shared by the whole session.

    Tests isolate themselves with `bus_namespace`, so sharing one server is safe and cheap.
    """
    override = request.config.getoption("--nats-url") or os.environ.get(NATS_URL_ENV)
    if override:
        yield str(override)
        return
    server = NatsServer(tmp_path_factory.mktemp("nats")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A 3-node nats-server cluster with JetStream, shared by the tests of a module.

    Started only for a test that asks for it; ready once a JetStream meta leader is elected.
    Tests isolate themselves with `bus_namespace`; one that kills a node (`kill(i)`) starts it
    again (`start(i)`) before it ends, so the next test finds every node up.
    """
    cluster = NatsCluster(tmp_path_factory.mktemp("nats-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def fake_provider() -> AsyncIterator[ScriptedModel]:
    """A `ScriptedModel` with an empty script, served on loopback (`base_url`); script it with `script(...)`."""
    async with ScriptedModel().serving() as model:
        yield model


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own, for tests that kill, stop or restart the broker."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


SANDBOX_USER_LOCK = Path(tempfile.gettempdir()) / f"atmosphere-sandbox-user-{os.getuid()}.lock"
"""The host-wide lock `sandbox_user` takes (a file every test process on the host can flock)."""


@pytest.fixture
def sandbox_user() -> Iterator[None]:
    """The sandbox user (uid 65534) to this test alone, among every test process on the host.

    Without a pids control group a sandbox's process limit (RLIMIT_NPROC) counts every process
    of that user on the host, so two tests' sandboxes at once (parallel workers, the floors'
    lane beside the suite) could make each other's launches fail. Waits for the other's end.
    """
    with SANDBOX_USER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def bus_namespace() -> str:
    """A subject and stream prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def nats_bus(nats_url: str, bus_namespace: str) -> AsyncIterator[NatsBus]:
    """A connected bus in this test's namespace; its streams are deleted afterwards."""
    async with connect(nats_url, name="pytest", namespace=bus_namespace) as bus:
        try:
            yield bus
        finally:
            await delete_namespace_streams(bus, bus_namespace)


async def delete_namespace_streams(bus: NatsBus, namespace: str) -> None:
    """Delete every stream (and key-value or object bucket) created under `namespace`."""
    js = bus.client.jetstream()
    prefix = bus.stream_name("")
    for info in await js.streams_info():
        name = info.config.name or ""
        if name.startswith((prefix, f"KV_{prefix}", f"OBJ_{prefix}")):
            await js.delete_stream(name)


def docker_unavailable() -> str:
    """Why Docker-backed tests cannot run here, or "" when an engine answers."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        return f"no Docker engine: {host} does not exist (these machines have only the docker client)"
    import docker  # noqa: PLC0415 - only docker-marked tests need it

    # The docker SDK leaks a socket when the engine refuses; keep that out of the test's warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=3)
            client.ping()
            client.close()
        except Exception as exc:
            return f"no Docker engine answers at {host} ({type(exc).__name__})"
        finally:
            gc.collect()
    return ""


@pytest.fixture
def docker_nats_url() -> Iterator[str]:
    """A NATS container from testcontainers; skips when no Docker engine answers."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    from testcontainers.core.container import DockerContainer  # noqa: PLC0415
    from testcontainers.core.waiting_utils import wait_for_logs  # noqa: PLC0415

    container = DockerContainer("nats:2.11-alpine").with_command("-js").with_exposed_ports(4222)
    with container:
        wait_for_logs(container, "Server is ready", timeout=30)
        yield f"nats://{container.get_container_host_ip()}:{container.get_exposed_port(4222)}"
