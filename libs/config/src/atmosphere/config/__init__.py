"""Settings shared by the Atmosphere services, read once from the environment in `__main__`."""

from atmosphere.config._auth import AuthOptions, TokenGrant
from atmosphere.config._errors import SETTINGS_ERRORS, InvalidSettingsError, invalid_settings
from atmosphere.config._logging import LogContext, configure_logging, log_handler, secret_values
from atmosphere.config._settings import (
    JetStreamSettings,
    LogSettings,
    NatsSettings,
    ServiceSettings,
    WorkerSettings,
    env_names,
)

__all__ = [
    "SETTINGS_ERRORS",
    "AuthOptions",
    "InvalidSettingsError",
    "JetStreamSettings",
    "LogContext",
    "LogSettings",
    "NatsSettings",
    "ServiceSettings",
    "TokenGrant",
    "WorkerSettings",
    "configure_logging",
    "env_names",
    "invalid_settings",
    "log_handler",
    "secret_values",
]
