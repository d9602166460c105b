"""Settings shared by the Atmosphere services, read once from the environment in `__main__`."""

from atmosphere.config._logging import configure_logging
from atmosphere.config._settings import (
    JetStreamSettings,
    LogSettings,
    NatsSettings,
    ServiceSettings,
)

__all__ = [
    "JetStreamSettings",
    "LogSettings",
    "NatsSettings",
    "ServiceSettings",
    "configure_logging",
]
