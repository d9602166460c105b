"""Test support for Atmosphere: a real nats-server per session, and running services in tests.

Installed as a pytest plugin (entry point `pytest11`), so its fixtures are available in every
test of the workspace: `nats_url`, `fresh_nats`, `bus_namespace`, `nats_bus`,
`docker_nats_url`.
"""

from atmosphere.testing.nats_server import NatsServer, NatsServerError
from atmosphere.testing.ports import free_port, free_port_block
from atmosphere.testing.services import raw_login, running_service, wait_until
from atmosphere.testing.stack import Stack, run_stack, settings_for

__all__ = [
    "NatsServer",
    "NatsServerError",
    "Stack",
    "free_port",
    "free_port_block",
    "raw_login",
    "run_stack",
    "running_service",
    "settings_for",
    "wait_until",
]
