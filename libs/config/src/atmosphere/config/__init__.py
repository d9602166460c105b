"""Settings shared by the Atmosphere services, read once from the environment in `__main__`."""

from atmosphere.config._logging import configure_logging
from atmosphere.config._settings import (
    JetStreamSettings,
    LogSettings,
    NatsSettings,
    ServiceSettings,
    WorkerSettings,
    env_names,
)

__all__ = [
    "JetStreamSettings",
    "LogSettings",
    "NatsSettings",
    "ServiceSettings",
    "WorkerSettings",
    "configure_logging",
    "env_names",
]
