"""Invalid settings stop a service once, with a message naming the variable and never its value."""

import asyncio
import os
import subprocess
import sys

import pytest
from pydantic import field_validator

from atmosphere.config import AuthOptions, ServiceSettings
from atmosphere.service import EXIT_APP_UNLOADABLE, EXIT_INVALID_SETTINGS, run

SECRET_TOKEN = "s3cr7x!"  # seven characters: one short of a grant's minimum


class GrantSettings(ServiceSettings):
    """The part of dispatch's settings that holds the grants."""

    ingress: AuthOptions = AuthOptions()


class EchoingSettings(ServiceSettings):
    """A setting whose own validator puts the rejected value into its message."""

    api_key: str = ""

    @field_validator("api_key")
    @classmethod
    def _checked(cls, value: str) -> str:
        msg = f"the key {value!r} is not a key"
        raise ValueError(msg)


async def never_served(_settings: ServiceSettings, *, stop: asyncio.Event) -> None:
    raise AssertionError("invalid settings must stop the process before it serves")


def test_the_invalid_settings_code_is_distinct_from_every_other_exit() -> None:
    assert EXIT_INVALID_SETTINGS == 78  # EX_CONFIG from sysexits.h
    assert EXIT_INVALID_SETTINGS not in {0, 1, 2, 3, EXIT_APP_UNLOADABLE, 130}


def test_a_short_grant_token_names_the_variable_and_the_minimum_but_not_the_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATMOSPHERE_INGRESS__AUTH_TOKENS", f'[{{"token": "{SECRET_TOKEN}", "user_id": "alice"}}]')
    assert run(never_served, GrantSettings, service="dispatch") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "dispatch: invalid settings" in err
    assert "ATMOSPHERE_INGRESS__AUTH_TOKENS[0].token: must be at least 8 characters" in err
    assert SECRET_TOKEN not in err
    assert "input_value" not in err


def test_a_password_without_a_user_is_refused_without_showing_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__PASSWORD", "hunter2-hunter2")
    assert run(never_served, ServiceSettings, service="tape") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "ATMOSPHERE_NATS__*: a password without a user" in err
    assert "hunter2" not in err


def test_a_validator_that_echoes_the_value_is_redacted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATMOSPHERE_API_KEY", "sk-live-0123456789")
    assert run(never_served, EchoingSettings, service="ingress") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "ATMOSPHERE_API_KEY: the key" in err
    assert "0123456789" not in err


def test_a_variable_that_is_not_json_is_an_invalid_setting_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATMOSPHERE_INGRESS__AUTH_TOKENS", f'[{{"token": "{SECRET_TOKEN}longer", oops')
    assert run(never_served, GrantSettings, service="dispatch") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "ATMOSPHERE_INGRESS__*" in err
    assert "JSON" in err
    assert SECRET_TOKEN not in err


@pytest.mark.timeout(60)
def test_the_dispatch_process_prints_no_secret_and_exits_78() -> None:
    env = {
        **os.environ,
        "ATMOSPHERE_INGRESS__AUTH_TOKENS": f'[{{"token": "{SECRET_TOKEN}", "user_id": "alice"}}]',
        "ATMOSPHERE_LOG__LEVEL": "chatty-not-a-level",
    }
    done = subprocess.run(
        [sys.executable, "-m", "atmosphere.dispatch"], env=env, capture_output=True, text=True, timeout=50, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_INVALID_SETTINGS, output
    assert "ATMOSPHERE_INGRESS__AUTH_TOKENS[0].token: must be at least 8 characters" in output
    assert "ATMOSPHERE_LOG__LEVEL: must be DEBUG, INFO, WARNING, ERROR or CRITICAL" in output
    assert SECRET_TOKEN not in output
    assert "chatty" not in output
    assert "Traceback" not in output
