"""`invalid_settings`: the variable and what it must be, from any settings class, never the value."""

from typing import Literal

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from atmosphere.config import AuthOptions, ServiceSettings, invalid_settings


class ProviderSettings(BaseSettings):
    """A nested class with a prefix of its own, as dispatch's `LLM_*`."""

    model_config = SettingsConfigDict(env_prefix="LLM_", extra="ignore")

    timeout: float = Field(default=5.0, gt=0)


class CodeLike(BaseSettings):
    """A nested class read by camelCase aliases, as sandbox's `ATMOSPHERE_AI_CODE_*`."""

    model_config = SettingsConfigDict(env_prefix="ATMOSPHERE_AI_CODE_", env_prefix_target="all", extra="ignore")

    pids_limit: int = Field(default=256, validation_alias="pidsLimit")


class Options(BaseModel):
    storage: Literal["file", "memory"] = "file"
    workers: int = Field(default=2, ge=1, le=64)
    permissions: dict[str, str] = Field(default_factory=dict)

    @field_validator("permissions")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        for key, permission in value.items():
            if permission not in {"deny", "confirm"}:
                msg = f"the permission of {key!r} must be 'deny' or 'confirm', got {permission!r}"
                raise ValueError(msg)
        return value


class Settings(ServiceSettings):
    ingress: AuthOptions = AuthOptions()
    options: Options = Options()
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    code: CodeLike = Field(default_factory=CodeLike)


def lines(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises((ValidationError, SettingsError)) as caught:
        Settings()
    assert isinstance(caught.value, ValidationError | SettingsError)
    return invalid_settings(caught.value, Settings)


def test_constraints_say_what_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    found = lines(
        monkeypatch,
        ATMOSPHERE_OPTIONS__STORAGE="tape-drive",
        ATMOSPHERE_OPTIONS__WORKERS="65",
        ATMOSPHERE_NATS__CONNECT_TIMEOUT="0",
        ATMOSPHERE_LOG__JSON="maybe",
    )
    assert found == [
        "ATMOSPHERE_NATS__CONNECT_TIMEOUT: must be greater than 0",
        "ATMOSPHERE_LOG__JSON: must be true or false",
        "ATMOSPHERE_OPTIONS__STORAGE: must be 'file' or 'memory'",
        "ATMOSPHERE_OPTIONS__WORKERS: must be at most 64",
    ]


def test_a_grant_names_its_entry_and_field(monkeypatch: pytest.MonkeyPatch) -> None:
    grants = '[{"token": "long-enough-token", "user_id": "a"}, {"token": "short", "user_id": "anonymous"}]'
    assert lines(monkeypatch, ATMOSPHERE_INGRESS__AUTH_TOKENS=grants) == [
        "ATMOSPHERE_INGRESS__AUTH_TOKENS[1].token: must be at least 8 characters",
        "ATMOSPHERE_INGRESS__AUTH_TOKENS[1].user_id: must name a user (not blank, not anonymous)",
    ]


def test_a_validator_quoting_the_value_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    found = lines(monkeypatch, ATMOSPHERE_OPTIONS__PERMISSIONS='{"send_email": "always-allow-please"}')
    assert found == ["ATMOSPHERE_OPTIONS__PERMISSIONS: the permission of '…' must be 'deny' or 'confirm', got '…'"]


def test_a_log_level_is_listed_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lines(monkeypatch, ATMOSPHERE_LOG__LEVEL="whisper") == [
        "ATMOSPHERE_LOG__LEVEL: must be DEBUG, INFO, WARNING, ERROR or CRITICAL"
    ]


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        ("LLM_TIMEOUT", "-1", "LLM_TIMEOUT: must be greater than 0"),
        ("ATMOSPHERE_AI_CODE_PIDSLIMIT", "lots", "ATMOSPHERE_AI_CODE_PIDSLIMIT: must be a whole number"),
    ],
)
def test_nested_settings_classes_name_their_own_variables(
    variable: str, value: str, line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lines(monkeypatch, **{variable: value}) == [line]


def test_a_model_wide_check_names_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    found = lines(monkeypatch, ATMOSPHERE_NATS__PASSWORD="correct-horse-battery")
    assert found == ["ATMOSPHERE_NATS__*: a password without a user: set the user as well"]


def test_json_that_does_not_parse_names_the_group_and_where_it_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    found = lines(monkeypatch, ATMOSPHERE_INGRESS__AUTH_TOKENS='[{"token": "hunter2hunter2",')
    assert len(found) == 1
    assert found[0].startswith("ATMOSPHERE_INGRESS__*: cannot be read; JSON values must be valid JSON: ")
    assert "line 1 column" in found[0]
    assert "hunter2" not in found[0]


def test_without_the_settings_class_the_model_path_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATMOSPHERE_OPTIONS__WORKERS", "0")
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert invalid_settings(caught.value) == ["options.workers: must be at least 1"]
