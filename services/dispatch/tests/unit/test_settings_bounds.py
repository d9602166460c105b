"""Dispatch's memory model timeout is bounded: a value out of range stops the service, naming the variable."""

from __future__ import annotations

import asyncio

import pytest

from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.service import EXIT_INVALID_SETTINGS, run


async def never_served(_settings: DispatchSettings, *, stop: asyncio.Event) -> None:
    raise AssertionError("invalid settings must stop the process before it serves")


def test_the_memory_model_timeout_defaults_to_thirty_seconds_and_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert DispatchSettings().dispatch.memory_model_timeout == 30.0
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__MEMORY_MODEL_TIMEOUT", "600")
    assert DispatchSettings().dispatch.memory_model_timeout == 600.0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "must be greater than 0"),
        ("-0.5", "must be greater than 0"),
        ("600.1", "must be at most 600"),
        ("inf", "must be at most 600"),
        ("half a minute", "must be a number"),
    ],
)
def test_a_memory_model_timeout_out_of_range_stops_dispatch_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str, said: str
) -> None:
    monkeypatch.setenv("ATMOSPHERE_DISPATCH__MEMORY_MODEL_TIMEOUT", value)
    assert run(never_served, DispatchSettings, service="dispatch") == EXIT_INVALID_SETTINGS
    err = capsys.readouterr().err
    assert "dispatch: invalid settings" in err
    assert f"  ATMOSPHERE_DISPATCH__MEMORY_MODEL_TIMEOUT: {said}\n" in err
