"""`atmosphere provision`: the provisioner's login makes the layout the services then find."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from atmosphere.bus import PROVISIONED_BY, JetStreamLayout, connect, subjects
from atmosphere.bus.permissions import PASSWORD_ENV, USER_ENV, Role, role_layout, user_name, write_credentials
from atmosphere.bus.run_queue import durable_name
from atmosphere.cli import __main__ as cli_main
from atmosphere.testing import NatsServer, free_port


def test_the_provisioners_login_makes_the_layout_stamped_with_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_credentials(tmp_path / "creds", namespace="prov")
    server = NatsServer(tmp_path / "nats", extra_args=("-c", str(files.server_config))).start()
    try:
        provisioner = files.credentials[Role.PROVISIONER].env()
        monkeypatch.setenv("ATMOSPHERE_NATS__URL", server.url)
        monkeypatch.setenv("ATMOSPHERE_NATS__NAMESPACE", "prov")
        monkeypatch.setenv(USER_ENV, provisioner[USER_ENV])
        monkeypatch.setenv(PASSWORD_ENV, provisioner[PASSWORD_ENV])
        monkeypatch.setenv("ATMOSPHERE_DISPATCH__RUN_ACK_WAIT", "9")
        assert cli_main.main(["provision"]) == 0
        asyncio.run(_check(server.url, files.credentials[Role.DISPATCH].env()))
    finally:
        server.stop()


async def _check(url: str, dispatch: dict[str, str]) -> None:
    async with connect(
        url, name="dispatch", namespace="prov", user=dispatch[USER_ENV], password=dispatch[PASSWORD_ENV]
    ) as bus:
        # Dispatch, with its own login, finds every stream and consumer its role uses.
        assert await bus.verify(role_layout(Role.DISPATCH, JetStreamLayout()), timeout=5) == user_name(
            Role.PROVISIONER, "prov"
        )
        info = await bus.client.jetstream().stream_info(bus.stream_name(subjects.RUNS_STREAM))
        assert (info.config.metadata or {})[PROVISIONED_BY] == "prov.atmo-provisioner"
        worker = await bus.client.jetstream().consumer_info(bus.stream_name(subjects.RUNS_STREAM), durable_name(0))
        assert worker.config.ack_wait == 9  # dispatch's setting, read from the same environment


def test_without_a_broker_it_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__URL", f"nats://127.0.0.1:{free_port()}")
    monkeypatch.setenv("ATMOSPHERE_NATS__CONNECT_TIMEOUT", "0.5")
    assert cli_main.main(["provision"]) == 2


def test_invalid_settings_exit_78(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__RUN_ACK_WAIT", "soon")
    assert cli_main.main(["provision"]) == 78
