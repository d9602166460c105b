"""`atmosphere bus-credentials` and `dev_credentials`: the files, their modes, and a server that takes them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from atmosphere.bus import ConnectError, JetStreamLayout, connect
from atmosphere.bus.permissions import AUTH_CONFIG_FILE, PASSWORD_ENV, USER_ENV, Role, role_layout, user_name
from atmosphere.cli import __main__ as cli_main
from atmosphere.cli.credentials import DEV_CREDENTIALS_DIR, dev_credentials
from atmosphere.config import ServiceSettings, env_names
from atmosphere.testing import NatsServer


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_the_command_writes_private_files_for_every_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATMOSPHERE_NATS__NAMESPACE", raising=False)
    out = tmp_path / "creds"
    assert cli_main.main(["bus-credentials", "--out", str(out), "--namespace", "team"]) == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted([AUTH_CONFIG_FILE, *(f"{role}.env" for role in Role)])
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert read_env(out / "memory.env")[USER_ENV] == user_name(Role.MEMORY, "team")
    printed = capsys.readouterr().out
    assert str(out / AUTH_CONFIG_FILE) in printed
    assert "the memory service" in printed
    assert "outside readers of run events" in printed
    assert read_env(out / "provisioner.env")[USER_ENV] == user_name(Role.PROVISIONER, "team")
    assert "`atmosphere provision`, which makes the JetStream layout" in printed


def test_the_namespace_defaults_to_the_services_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__NAMESPACE", "stage")
    assert cli_main.main(["bus-credentials", "--out", str(tmp_path)]) == 0
    assert read_env(tmp_path / "tape.env")[USER_ENV] == user_name(Role.TAPE, "stage")


def test_a_bad_namespace_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["bus-credentials", "--out", str(tmp_path), "--namespace", "no spaces"])
    assert exited.value.code == 2
    assert not list(tmp_path.iterdir())


def test_the_env_files_set_the_services_own_settings() -> None:
    names = env_names(ServiceSettings)
    assert {USER_ENV, PASSWORD_ENV} <= set(names)


async def test_dev_credentials_are_what_a_server_and_the_services_start_with(tmp_path: Path) -> None:
    made = dev_credentials(tmp_path, "dev")
    assert made.directory == tmp_path / DEV_CREDENTIALS_DIR
    assert set(made.env) == {str(role) for role in Role}
    assert made.env["dispatch"][USER_ENV] == user_name(Role.DISPATCH, "dev")
    again = dev_credentials(tmp_path, "dev")
    assert again.env["dispatch"][PASSWORD_ENV] != made.env["dispatch"][PASSWORD_ENV]
    server = NatsServer(tmp_path / "nats", extra_args=("-c", str(again.server_config))).start()
    try:
        # The provisioner makes the layout; a service finds what its role uses, with its own login.
        env = again.env["provisioner"]
        async with connect(
            server.url, name="provisioner", namespace="dev", user=env[USER_ENV], password=env[PASSWORD_ENV]
        ) as bus:
            await bus.provision(JetStreamLayout(), by=env[USER_ENV])
        env = again.env["sandbox"]
        async with connect(
            server.url, name="sandbox", namespace="dev", user=env[USER_ENV], password=env[PASSWORD_ENV]
        ) as bus:
            assert await bus.verify(role_layout(Role.SANDBOX, JetStreamLayout()), timeout=5) == "dev.atmo-provisioner"
        # The first set's passwords were replaced.
        with pytest.raises(ConnectError, match="authorization violation"):
            async with connect(
                server.url, name="old", user=made.env["sandbox"][USER_ENV], password=made.env["sandbox"][PASSWORD_ENV]
            ):
                pass
    finally:
        server.stop()
