"""The settings every service shares; each service subclasses `ServiceSettings`.

Environment variables use the `ATMOSPHERE_` prefix and `__` for nesting, e.g.
`ATMOSPHERE_NATS__URL`, `ATMOSPHERE_LOG__LEVEL`, `ATMOSPHERE_DISPATCH__HEALTH_PORT`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseModel):
    """How a service reaches NATS."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    url: str = "nats://127.0.0.1:4222"
    """One URL, or several separated by commas (a cluster)."""
    namespace: str = ""
    """Prefix of every subject and stream; lets several systems (or tests) share one NATS."""
    connect_timeout: float = Field(default=30.0, gt=0)
    """Seconds to keep retrying the first connection before the service gives up."""

    @property
    def servers(self) -> list[str]:
        """The URLs as a list."""
        return [u.strip() for u in self.url.split(",") if u.strip()]


class JetStreamSettings(BaseModel):
    """Limits of the streams the system provisions."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    events_max_age: float = Field(default=24 * 3600, ge=0)
    """Seconds a run's events stay replayable in `ATMO_EVENTS` (0 = no age limit)."""
    events_max_bytes: int = Field(default=1 << 30, ge=-1)
    """Size limit of `ATMO_EVENTS` in bytes (-1 = none); the oldest events go first."""
    journal_max_age: float = Field(default=7 * 24 * 3600, ge=0)
    """Seconds the effect journal of a failed or unfinished durable run is kept in `ATMO_JOURNAL` as
    its resume anchor (a run that succeeds removes its journal at once; 0 = no age limit)."""
    runs_max_age: float = Field(default=24 * 3600, ge=0)
    """Seconds an unclaimed run waits in `ATMO_RUNS` before it expires."""
    agents_max_age: float = Field(default=30.0, ge=0)
    """Seconds an agent stays listed in `ATMO_AGENTS` after the last dispatch serving it stopped
    (dispatch rewrites its descriptors every third of this; 0 = never expire). Set the same on every service."""


class LogSettings(BaseModel):
    """Logging."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    level: str = "INFO"
    """DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    json_format: bool = Field(default=False, alias="json")
    """One JSON object per line instead of text (for log collectors)."""

    @field_validator("level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            msg = f"unknown log level {value!r}"
            raise ValueError(msg)
        return level


class ServiceSettings(BaseSettings):
    """What every service reads: NATS, JetStream limits, logging, data directory."""

    model_config = SettingsConfigDict(
        env_prefix="ATMOSPHERE_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    nats: NatsSettings = NatsSettings()
    jetstream: JetStreamSettings = JetStreamSettings()
    log: LogSettings = LogSettings()
    data_dir: Path = Path(".atmosphere/data")
    """Where services keep their SQLite files."""


class WorkerSettings(ServiceSettings):
    """A service without an HTTP surface of its own: it serves `/healthz` + `/readyz` apart."""

    probe_host: str = "0.0.0.0"
    """Interface of the `/healthz` + `/readyz` listener (the kubelet must reach it)."""
    probe_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the probe listener; 0 picks a free one."""


def env_names(settings: type[BaseSettings]) -> dict[str, str]:
    """Every environment variable `settings` reads, with the field's description.

    Used to check that manifests only set variables that exist and that the README documents
    every one of them.
    """
    config = settings.model_config
    prefix = str(config.get("env_prefix", ""))
    delimiter = str(config.get("env_nested_delimiter", "__"))
    names: dict[str, str] = {}

    def walk(model: type[BaseModel], stem: str, depth: int) -> None:
        for name, field in model.model_fields.items():
            env = f"{stem}{(field.alias or name).upper()}"
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
                # A nested settings class reads its own variables (e.g. `LLM_*`).
                walk(annotation, str(annotation.model_config.get("env_prefix", "")), depth + 1)
            elif isinstance(annotation, type) and issubclass(annotation, BaseModel) and depth < 3:
                walk(annotation, env + delimiter, depth + 1)
            else:
                names[env] = field.description or ""

    walk(settings, prefix, 0)
    return names
