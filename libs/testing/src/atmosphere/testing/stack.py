"""The whole system in one test process: every service's real `serve()` on one nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atmosphere.bus import Bus, subjects
from atmosphere.config import NatsSettings, ServiceSettings, WorkerSettings
from atmosphere.contracts.common.v1.service_pb2 import ServiceInfoRequest, ServiceInfoResponse
from atmosphere.testing.services import START_TIMEOUT, running_service

Serve = Callable[..., Coroutine[Any, Any, None]]
LISTEN_PATIENCE = 20.0
"""Seconds `Stack.ingress_url` waits for an ingress that answers but does not listen yet."""


def settings_for(cls: type[ServiceSettings], *, nats_url: str, namespace: str, data_dir: Path, **overrides: Any) -> Any:
    """Settings of a service for a test: its own namespace and data, ephemeral ports."""
    if issubclass(cls, WorkerSettings):
        overrides = {"probe_host": "127.0.0.1", "probe_port": 0, **overrides}
    return cls(nats=NatsSettings(url=nats_url, namespace=namespace, connect_timeout=10), data_dir=data_dir, **overrides)


@dataclass
class Stack:
    """Running services by name, and how to reach ingress."""

    bus: Bus
    running: dict[str, Any] = field(default_factory=dict)

    async def ingress_url(self) -> str:
        """The HTTP base URL ingress reports in its info, once it listens (`TimeoutError` if it does not soon)."""
        async with asyncio.timeout(LISTEN_PATIENCE):
            while True:
                reply = await self.bus.request(
                    subjects.service_info("ingress"), ServiceInfoRequest(), ServiceInfoResponse
                )
                url = str(json.loads(reply.info_json)["ingress"]["http"])
                if url:
                    return url
                await asyncio.sleep(0.05)  # its info answers before its ephemeral port is bound


@contextlib.asynccontextmanager
async def run_stack(
    services: Mapping[str, tuple[Serve, Any]], *, bus: Bus, timeout: float = 15.0
) -> AsyncIterator[Stack]:
    """Start `services` (name → (serve, settings)) in order; stop them in reverse.

    `timeout` bounds each service's stop, and its start when longer than `START_TIMEOUT` (an app
    that imports heavy frameworks, in each of the sandbox's worker processes, takes longer to start).
    """
    async with contextlib.AsyncExitStack() as stack:
        result = Stack(bus=bus)
        for name, (serve, settings) in services.items():
            running = running_service(
                name, serve, settings, bus=bus, timeout=timeout, start_timeout=max(timeout, START_TIMEOUT)
            )
            result.running[name] = await stack.enter_async_context(running)
        yield result
