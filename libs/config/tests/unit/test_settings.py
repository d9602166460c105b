from pathlib import Path

import pytest
from pydantic import ValidationError

from atmosphere.config import ServiceSettings, WorkerSettings, env_names


def test_environment_variables_with_prefix_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__URL", "nats://a:4222, nats://b:4222")
    monkeypatch.setenv("ATMOSPHERE_NATS__NAMESPACE", "dev")
    monkeypatch.setenv("ATMOSPHERE_LOG__LEVEL", "debug")
    monkeypatch.setenv("ATMOSPHERE_DATA_DIR", "/var/lib/atmo")
    monkeypatch.setenv("ATMOSPHERE_JETSTREAM__EVENTS_MAX_AGE", "60")
    settings = ServiceSettings()
    assert settings.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert settings.nats.namespace == "dev"
    assert settings.log.level == "DEBUG"
    assert settings.data_dir == Path("/var/lib/atmo")
    assert settings.jetstream.events_max_age == 60


def test_bad_values_are_rejected_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_LOG__LEVEL", "chatty")
    with pytest.raises(ValidationError, match="level"):
        ServiceSettings()
    monkeypatch.delenv("ATMOSPHERE_LOG__LEVEL")
    monkeypatch.setenv("ATMOSPHERE_PROBE_PORT", "70000")
    with pytest.raises(ValidationError, match="probe_port"):
        WorkerSettings()


def test_settings_are_frozen() -> None:
    settings = ServiceSettings()
    with pytest.raises(ValidationError):
        settings.data_dir = Path("x")  # type: ignore[misc]


def test_env_names_lists_every_variable_with_its_description() -> None:
    names = env_names(WorkerSettings)
    assert names["ATMOSPHERE_NATS__URL"].startswith("One URL")
    assert "ATMOSPHERE_PROBE_PORT" in names
    assert "ATMOSPHERE_LOG__JSON" in names
    assert "ATMOSPHERE_PROBE_PORT" not in env_names(ServiceSettings)
    assert all(description for description in names.values())
