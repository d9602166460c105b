"""Test support for Atmosphere: agents' tests, a real nats-server per session, services in tests.

`run_agent` / `AgentTestEnv` run an app's agent against a `ScriptedModel` on the real services
(`atmosphere.testing.agents`); the same `ScriptedModel` serves on loopback HTTP for services in
processes of their own (`atmosphere.testing.scripted_model`). Installed as a pytest plugin
(entry point `pytest11`), so its fixtures are available in every test of the workspace:
`nats_url`, `fresh_nats`, `bus_namespace`, `nats_bus`, `docker_nats_url`, `fake_provider` (a
served `ScriptedModel`).
"""

from atmosphere.testing.agents import AgentTestEnv, run_agent
from atmosphere.testing.model_turns import ModelRequest, ToolCallScript, Turn
from atmosphere.testing.nats_server import NatsServer, NatsServerError
from atmosphere.testing.otlp import OtlpReceiver, ReceivedSpan
from atmosphere.testing.ports import free_port, free_port_block
from atmosphere.testing.results import RunResult
from atmosphere.testing.scripted_model import ScriptedModel
from atmosphere.testing.services import raw_login, running_service, running_services, wait_until
from atmosphere.testing.stack import Stack, run_stack, settings_for

__all__ = [
    "AgentTestEnv",
    "ModelRequest",
    "NatsServer",
    "NatsServerError",
    "OtlpReceiver",
    "ReceivedSpan",
    "RunResult",
    "ScriptedModel",
    "Stack",
    "ToolCallScript",
    "Turn",
    "free_port",
    "free_port_block",
    "raw_login",
    "run_agent",
    "run_stack",
    "running_service",
    "running_services",
    "settings_for",
    "wait_until",
]
