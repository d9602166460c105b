"""The settings every service shares; each service subclasses `ServiceSettings`.

All but ingress do so through `WorkerSettings`, which adds the probe listener.

Environment variables use the `ATMOSPHERE_` prefix and `__` for nesting, e.g.
`ATMOSPHERE_NATS__URL`, `ATMOSPHERE_LOG__LEVEL`, `ATMOSPHERE_DISPATCH__GRPC_PORT`; a field of the
top level is a flat variable (`ATMOSPHERE_DATA_DIR`, `ATMOSPHERE_PROBE_PORT`, and Atmosphere's own
keys such as `ATMOSPHERE_AI_HARNESS_ENABLED`). A nested settings class with a prefix of its own
reads its own variables (`LLM_*`, `ATMOSPHERE_AI_CODE_*`). docs/settings.md lists every one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels `ATMOSPHERE_LOG__LEVEL` accepts, in any case."""


class NatsSettings(BaseModel):
    """How a service reaches NATS."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    url: str = "nats://127.0.0.1:4222"
    """One URL, or several separated by commas (a cluster)."""
    namespace: str = ""
    """Prefix of every subject and stream; lets several systems (or tests) share one NATS."""
    connect_timeout: float = Field(default=30.0, gt=0)
    """Seconds to keep retrying the first connection before the service gives up."""
    user: str = ""
    """User to log in as (each service has its own, with its subject permissions: `atmosphere
    bus-credentials`); empty: no login, for a server that lets anyone in."""
    password: SecretStr = SecretStr("")
    """Password of `user` (never logged, never in a service's info)."""
    tls_ca: Path | None = None
    """CA bundle (PEM) that verifies the server's certificate; unset: the system's CAs."""
    tls_cert: Path | None = None
    """Client certificate (PEM), for a server that verifies its clients; needs `tls_key`."""
    tls_key: Path | None = None
    """Private key (PEM) of `tls_cert`."""
    tls_required: bool = False
    """Refuse a server that does not require TLS, so that credentials never cross the network in the clear."""

    @field_validator("tls_ca", "tls_cert", "tls_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # An empty variable (a manifest that always sets it) means "no file", not the current directory.
        return None if value == "" else value

    @model_validator(mode="after")
    def _complete(self) -> NatsSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            msg = "tls_cert and tls_key go together: set both or neither"
            raise ValueError(msg)
        if self.password.get_secret_value() and not self.user:
            msg = "a password without a user: set the user as well"
            raise ValueError(msg)
        return self

    @property
    def servers(self) -> list[str]:
        """The URLs as a list."""
        return [u.strip() for u in self.url.split(",") if u.strip()]


class JetStreamSettings(BaseModel):
    """Limits and replication of the streams and buckets the system provisions."""

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
    replicas: int = Field(default=1, ge=1, le=5)
    """Servers keeping a copy of every stream, bucket and durable consumer: 1 on one server, 3 on a
    3-node cluster (a node may then die without taking a stream offline). Existing streams are
    raised or lowered to it in place when a service starts. Set the same on every service."""
    storage: Literal["file", "memory"] = "file"
    """Where new streams keep their messages; an existing stream keeps the storage it was made with."""
    placement_cluster: str = ""
    """Keep every stream's replicas in this NATS cluster (empty: the server chooses)."""
    placement_tags: Annotated[tuple[str, ...], NoDecode] = ()
    """Keep every stream's replicas on servers with all these tags (comma-separated; empty: any)."""

    @field_validator("placement_tags", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(tag.strip() for tag in value.split(",") if tag.strip())
        return value


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
        if level not in LOG_LEVELS:
            # Says what is accepted, not what was given: a message never repeats a setting's value.
            msg = f"must be {', '.join(LOG_LEVELS[:-1])} or {LOG_LEVELS[-1]}"
            raise ValueError(msg)
        return level


class ServiceSettings(BaseSettings):
    """What every service reads: NATS, the JetStream limits and replication, logging, the data directory."""

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
    """A service without an HTTP server (all but ingress): it serves `/healthz` + `/readyz` apart."""

    probe_host: str = "0.0.0.0"
    """Interface of the `/healthz` + `/readyz` listener (the kubelet must reach it)."""
    probe_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the probe listener; 0 picks a free one."""


def env_names(settings: type[BaseSettings]) -> dict[str, str]:
    """Every environment variable `settings` reads, with the field's description.

    Used to check that the deploy manifests only set variables that exist and that
    docs/settings.md documents every one of them (tests/test_deploy.py, tests/test_docs.py).
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
