"""Ingress's timing settings are bounded: a value out of range stops the service, naming the variable."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.ingress.settings import IngressSettings
from atmosphere.service import EXIT_INVALID_SETTINGS, run


async def never_served(_settings: IngressSettings, *, stop: asyncio.Event) -> None:
    raise AssertionError("invalid settings must stop the process before it serves")


def test_the_admin_timeout_defaults_to_five_seconds_and_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert IngressSettings().ingress.admin_timeout == 5.0
    monkeypatch.setenv("ATMOSPHERE_INGRESS__ADMIN_TIMEOUT", "300")
    assert IngressSettings().ingress.admin_timeout == 300.0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "must be greater than 0"),
        ("-1", "must be greater than 0"),
        ("300.5", "must be at most 300"),
        ("1e9", "must be at most 300"),
        ("soon", "must be a number"),
    ],
)
def test_an_admin_timeout_out_of_range_stops_ingress_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, said: str
) -> None:
    monkeypatch.setenv("ATMOSPHERE_INGRESS__ADMIN_TIMEOUT", value)
    assert run(never_served, IngressSettings, service="ingress") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "ingress: invalid settings" in err
    assert f"  ATMOSPHERE_INGRESS__ADMIN_TIMEOUT: {said}\n" in err
