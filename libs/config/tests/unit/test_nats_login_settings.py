"""How a service logs in to NATS: user, password (never shown), TLS files."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from atmosphere.config import NatsSettings, ServiceSettings, env_names


def test_the_login_and_tls_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__USER", "atmo-tape")
    monkeypatch.setenv("ATMOSPHERE_NATS__PASSWORD", "s3cret-pass")
    monkeypatch.setenv("ATMOSPHERE_NATS__TLS_CA", "/etc/nats/ca.pem")
    monkeypatch.setenv("ATMOSPHERE_NATS__TLS_CERT", "/etc/nats/tls.crt")
    monkeypatch.setenv("ATMOSPHERE_NATS__TLS_KEY", "/etc/nats/tls.key")
    monkeypatch.setenv("ATMOSPHERE_NATS__TLS_REQUIRED", "true")
    nats = ServiceSettings().nats
    assert nats.user == "atmo-tape"
    assert nats.password.get_secret_value() == "s3cret-pass"
    assert (nats.tls_ca, nats.tls_cert, nats.tls_key) == (
        Path("/etc/nats/ca.pem"),
        Path("/etc/nats/tls.crt"),
        Path("/etc/nats/tls.key"),
    )
    assert nats.tls_required


def test_the_password_is_never_shown() -> None:
    nats = NatsSettings(user="atmo-tape", password="s3cret-pass")  # type: ignore[arg-type]
    for shown in (repr(nats), str(nats), nats.model_dump_json(), str(nats.model_dump())):
        assert "s3cret-pass" not in shown


def test_by_default_there_is_no_login_and_no_tls() -> None:
    nats = NatsSettings()
    assert nats.user == ""
    assert nats.password.get_secret_value() == ""
    assert (nats.tls_ca, nats.tls_cert, nats.tls_key, nats.tls_required) == (None, None, None, False)


def test_an_empty_file_variable_means_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_NATS__TLS_CA", "")
    assert ServiceSettings().nats.tls_ca is None


def test_incomplete_logins_are_refused() -> None:
    with pytest.raises(ValidationError, match="tls_cert and tls_key go together"):
        NatsSettings(tls_cert=Path("tls.crt"))
    with pytest.raises(ValidationError, match="tls_cert and tls_key go together"):
        NatsSettings(tls_key=Path("tls.key"))
    with pytest.raises(ValidationError, match="password without a user"):
        NatsSettings(password="orphan")  # type: ignore[arg-type]


def test_every_login_variable_is_listed() -> None:
    names = env_names(ServiceSettings)
    for name in ("USER", "PASSWORD", "TLS_CA", "TLS_CERT", "TLS_KEY", "TLS_REQUIRED"):
        assert f"ATMOSPHERE_NATS__{name}" in names
