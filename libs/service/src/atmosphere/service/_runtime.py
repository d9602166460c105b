"""The part of `serve()` every service repeats: connect, answer health and info, probes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from atmosphere.bus import Bus, ConnectionLostError, JetStreamLayout, Replication, Storage, connect
from atmosphere.config import ServiceSettings, WorkerSettings
from atmosphere.service._health import Health, InfoFragment, health_router
from atmosphere.service._probes import serve_probes

log = logging.getLogger("atmosphere.service")


@dataclass(frozen=True, slots=True)
class ServiceRuntime:
    """What a service's wiring gets from `open_service`."""

    bus: Bus
    health: Health
    probe_port: int
    """The bound probe port (0 when the service serves probes itself, like ingress)."""


def layout_from(settings: ServiceSettings) -> JetStreamLayout:
    """The JetStream layout with the configured limits and replication."""
    js = settings.jetstream
    return JetStreamLayout(
        replication=Replication(
            replicas=js.replicas,
            storage=Storage(js.storage),
            placement_cluster=js.placement_cluster,
            placement_tags=js.placement_tags,
        ),
        events_max_age_seconds=js.events_max_age,
        events_max_bytes=js.events_max_bytes,
        runs_max_age_seconds=js.runs_max_age,
        journal_max_age_seconds=js.journal_max_age,
        agents_max_age_seconds=js.agents_max_age,
    )


@contextlib.asynccontextmanager
async def open_service(
    name: str,
    settings: ServiceSettings,
    *,
    info: InfoFragment | None = None,
    stop: asyncio.Event | None = None,
    bus: Bus | None = None,
) -> AsyncIterator[ServiceRuntime]:
    """Connect to NATS, provision JetStream, answer health/info, serve HTTP probes.

    If the connection closes for good (nats-py never reconnects from CLOSED), `stop` is set so
    the service shuts down, and leaving the context raises `ConnectionLostError`: the process
    exits non-zero and its supervisor (`atmosphere dev`, Kubernetes) starts a fresh one.

    Every service provisions the layout (idempotently) so that any of them may start first.
    Workers (`WorkerSettings`) get a probe listener here; a service with its own HTTP server
    (ingress) answers `/healthz` and `/readyz` there. The caller marks `health` ready once its
    own subscriptions are active.

    `bus` replaces the connection to `settings.nats` (a test's `FakeBus`, or a connection the
    caller shares): the composition root runs the same either way, and the caller closes it.
    """
    async with contextlib.AsyncExitStack() as stack:
        if bus is None:
            bus = await stack.enter_async_context(
                connect(
                    settings.nats.servers,
                    name=f"atmosphere-{name}",
                    namespace=settings.nats.namespace,
                    connect_timeout=settings.nats.connect_timeout,
                    # The service's own login, whose permissions are its role's (`bus.permissions`).
                    user=settings.nats.user,
                    password=settings.nats.password.get_secret_value(),
                    tls_ca=settings.nats.tls_ca,
                    tls_cert=settings.nats.tls_cert,
                    tls_key=settings.nats.tls_key,
                    tls_required=settings.nats.tls_required,
                )
            )
        await bus.provision(layout_from(settings))
        health = Health(name, bus)
        probe_port = 0
        if isinstance(settings, WorkerSettings):
            probe_port = await stack.enter_async_context(
                serve_probes(health, host=settings.probe_host, port=settings.probe_port)
            )
            log.info("%s probes on http://%s:%d/readyz", name, settings.probe_host, probe_port)
        await stack.enter_async_context(bus.serve(health_router(health, info), queue=f"{name}-health"))
        watcher = asyncio.create_task(_stop_when_lost(name, bus, health, stop))
        stack.callback(watcher.cancel)
        try:
            yield ServiceRuntime(bus=bus, health=health, probe_port=probe_port)
        finally:
            health.mark_not_ready()
    # Raised once everything above is closed, so that it reaches the caller as itself (not
    # wrapped in the exception group of a task group that was still open).
    if bus.lost:
        msg = f"{name}: the NATS connection closed for good; exiting so that a fresh process takes over"
        raise ConnectionLostError(msg)


async def _stop_when_lost(name: str, bus: Bus, health: Health, stop: asyncio.Event | None) -> None:
    await bus.wait_lost()
    health.mark_not_ready()
    log.error("%s: the NATS connection closed for good; stopping", name)
    if stop is not None:
        stop.set()
