"""Readiness as the service itself knows it, answered over NATS and HTTP."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from atmosphere.bus import Bus, MessageContext, Router, subjects
from atmosphere.contracts.common.v1.service_pb2 import (
    HealthCheckRequest,
    HealthCheckResponse,
    ServiceInfoRequest,
    ServiceInfoResponse,
)

InfoFragment = Callable[[], dict[str, Any]]


def _version(service: str) -> str:
    try:
        return metadata.version(f"atmosphere-ai-{service}")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def process_instance() -> str:
    """`host:pid`: which process this is (in Kubernetes the host is the pod's name).

    `/readyz` and the health answer report it as `instance`, and every log line as `replica`,
    so an operator finds the process a line or an answer came from.
    """
    return f"{socket.gethostname()}:{os.getpid()}"


class Health:
    """Liveness and readiness of one service instance.

    Ready means: connected to NATS, and `mark_ready()` was called once every subscription and
    consumer was active. A lost connection makes it not ready until NATS is back.
    """

    def __init__(self, service: str, bus: Bus) -> None:
        """Track `service`'s readiness over `bus`."""
        self.service = service
        self.instance = process_instance()
        """`host:pid`: which process answers (`/readyz` reports it, so that a supervisor counts its own)."""
        self.version = _version(service)
        self._bus = bus
        self._wired = False
        self._started = time.monotonic()

    def mark_ready(self) -> None:
        """Every subscription and consumer is active."""
        self._wired = True

    def mark_not_ready(self) -> None:
        """Shutting down or lost a dependency."""
        self._wired = False

    @property
    def ready(self) -> bool:
        """Whether the instance can take work now."""
        return self._wired and self._bus.is_connected

    @property
    def live(self) -> bool:
        """Whether the process can still recover on its own (liveness).

        False once the NATS connection closed for good: a disconnected client reconnects by
        itself, a closed one never does, so only a restart helps.
        """
        return not self._bus.lost

    @property
    def uptime(self) -> float:
        """Seconds since the instance started."""
        return time.monotonic() - self._started

    def snapshot(self) -> HealthCheckResponse:
        """The health as a message."""
        return HealthCheckResponse(
            service=self.service,
            ready=self.ready,
            instance=self.instance,
            uptime_seconds=self.uptime,
            version=self.version,
        )


def health_router(health: Health, info: InfoFragment | None = None) -> Router:
    """Responders for `atmo.svc.<service>.health` and `atmo.svc.<service>.info`."""
    router = Router()

    async def on_health(_request: HealthCheckRequest, _ctx: MessageContext) -> HealthCheckResponse:
        return health.snapshot()

    async def on_info(_request: ServiceInfoRequest, _ctx: MessageContext) -> ServiceInfoResponse:
        fragment = info() if info is not None else {}
        return ServiceInfoResponse(service=health.service, info_json=json.dumps(fragment, sort_keys=True))

    router.add(subjects.service_health(health.service), HealthCheckRequest, on_health)
    router.add(subjects.service_info(health.service), ServiceInfoRequest, on_info)
    return router
