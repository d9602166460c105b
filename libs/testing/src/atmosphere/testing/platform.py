"""The services an agent's run needs, each through its own `serve()`, on one in-memory bus.

Governance (the app's policy files and Python policies), memory (its store and replica log),
sandbox (the app's tools in its worker processes) and dispatch (the built-in runtime, whose
HTTP client reaches the scripted model through an in-memory transport) start as on a served
stack, configured as the environment would configure them, with their data in one directory.
This module imports nothing of a service but its `app.serve` and its settings class
(`tests/test_seams.py` holds every library to that).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from atmosphere.bus import Bus
from atmosphere.dispatch.app import serve as serve_dispatch
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.governance.app import serve as serve_governance
from atmosphere.governance.settings import GovernanceSettings
from atmosphere.memory.app import serve as serve_memory
from atmosphere.memory.settings import MemorySettings
from atmosphere.sandbox.app import serve as serve_sandbox
from atmosphere.sandbox.settings import SandboxSettings
from atmosphere.sdk.runtime import RuntimeConfig
from atmosphere.testing.app_reference import AppReference
from atmosphere.testing.services import Serve, running_services

SCRIPTED_BASE_URL = "http://scripted-model.invalid/v1"
"""Where the scripted model "lives": a name that resolves nowhere, so nothing can leak out."""
SCRIPTED = RuntimeConfig(base_url=SCRIPTED_BASE_URL, model="scripted", stall_timeout=30.0)


@dataclass(frozen=True)
class Platform:
    """How the services are configured for one environment."""

    app: AppReference
    data_dir: Path
    """Every service's data: memory's store, governance's decision log, the replicas' positions."""
    tool_workers: int
    """The sandbox's worker processes (0: the tools run in this process)."""
    model: RuntimeConfig = SCRIPTED
    """The provider dispatch's runtime is configured with (`LLM_*`)."""

    def services(self, *, bus: Bus, transport: httpx.AsyncBaseTransport | None) -> dict[str, tuple[Serve, Any]]:
        """Each service's `serve()` (on `bus`; dispatch's model behind `transport`) and settings."""
        # What every service gets: the data directory, probes on a free loopback port.
        common: dict[str, Any] = {"data_dir": self.data_dir, "probe_host": "127.0.0.1", "probe_port": 0}
        app: dict[str, Any] = {**common, "app": self.app.app, "app_dir": self.app.app_dir}
        memory: dict[str, Any] = {**common, "workspace_root": self.data_dir / "workspace"}
        sandbox: dict[str, Any] = {**app, "sandbox": {"tool_workers": self.tool_workers}}
        dispatch: dict[str, Any] = {
            **app,
            # The scripted model answers the built-in runtime (through `transport`): an adapter
            # installed beside it must not take the app's agents to a provider of its own.
            "dispatch": {"grpc_host": "127.0.0.1", "grpc_port": 0, "runtime": "built-in"},
            "llm": _llm_settings(self.model),
        }
        return {
            "governance": (functools.partial(serve_governance, bus=bus), GovernanceSettings(**app)),
            "memory": (functools.partial(serve_memory, bus=bus), MemorySettings(**memory)),
            "sandbox": (functools.partial(serve_sandbox, bus=bus), SandboxSettings(**sandbox)),
            "dispatch": (
                functools.partial(serve_dispatch, bus=bus, transport=transport),
                DispatchSettings(**dispatch),
            ),
        }


def _llm_settings(config: RuntimeConfig) -> dict[str, Any]:
    """`config` as dispatch's `LLM_*` settings (the inverse of the mapping dispatch makes)."""
    options = config.generation
    return {
        "base_url": config.base_url or "",
        "api_key": config.api_key or "",
        "model": config.model,
        "temperature": options.temperature,
        "max_tokens": options.max_tokens,
        "top_p": options.top_p,
        "stop": options.stop,
        "connect_timeout": config.connect_timeout,
        "first_byte_timeout": config.first_byte_timeout,
        "stall_timeout": config.stall_timeout,
        "call_timeout": config.call_timeout,
        "retry_window": config.retry_window,
        "prompt_cache_key": config.prompt_cache_key,
    }


@contextlib.asynccontextmanager
async def running(platform: Platform, *, bus: Bus, transport: httpx.AsyncBaseTransport | None) -> AsyncIterator[None]:
    """The four services serving `platform` on `bus` until the context exits."""
    async with running_services(platform.services(bus=bus, transport=transport), bus=bus):
        yield
