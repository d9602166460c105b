"""The part of `serve()` every service repeats: connect, check the layout, answer health and info, probes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import (
    Bus,
    ConnectionLostError,
    ConsumerSpec,
    JetStreamLayout,
    Replication,
    Storage,
    connect,
)
from atmosphere.bus.permissions import Role, role_layout
from atmosphere.config import ServiceSettings, WorkerSettings
from atmosphere.service._health import Health, InfoFragment, health_router
from atmosphere.service._probes import serve_probes
from atmosphere.service.telemetry import install_bus_metrics

log = logging.getLogger("atmosphere.service")

LAYOUT_WAIT = 60.0
"""Seconds a service with a login waits at start for the provisioner's layout before it exits
(its supervisor starts it again): long enough for a provisioning Job started beside it."""


@dataclass(frozen=True, slots=True)
class ServiceRuntime:
    """What a service's wiring gets from `open_service`."""

    bus: Bus
    health: Health
    probe_port: int
    """The bound probe port (0 when the service serves probes itself, like ingress)."""
    provisioned_by: str = ""
    """Who provisioned the JetStream layout, as stamped on it ("" when nothing says)."""


def layout_from(settings: ServiceSettings, *, consumers: tuple[ConsumerSpec, ...] = ()) -> JetStreamLayout:
    """The JetStream layout with the configured limits and replication, and `consumers` to provision."""
    js = settings.jetstream
    return JetStreamLayout(
        consumers=consumers,
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
    consumers: tuple[ConsumerSpec, ...] = (),
) -> AsyncIterator[ServiceRuntime]:
    """Connect to NATS, check (or make) the JetStream layout, answer health/info, serve HTTP probes.

    If the connection closes for good (nats-py never reconnects from CLOSED), `stop` is set so
    the service shuts down, and leaving the context raises `ConnectionLostError`: the process
    exits non-zero and its supervisor (`atmosphere dev`, Kubernetes) starts a fresh one.

    A service with a login (`ATMOSPHERE_NATS__USER`) never makes the layout: its role may not
    (`atmosphere.bus.permissions`), the provisioner does (`atmosphere provision`, a Kubernetes
    Job). It waits up to `LAYOUT_WAIT` seconds for what its role uses, `consumers` (the
    provisioned ones it binds to) included, and fails naming what is missing. Without a login
    the server lets anyone do anything, and the service provisions the layout itself
    (idempotently, so that any may start first). Either way its info says who provisioned.
    Workers (`WorkerSettings`) get a probe listener here; a service with its own HTTP server
    (ingress) answers `/healthz` and `/readyz` there. The caller marks `health` ready once its
    own subscriptions are active.

    `bus` replaces the connection to `settings.nats` (a test's `FakeBus`, or a connection the
    caller shares): the composition root runs the same either way, and the caller closes it.
    """
    install_bus_metrics()
    async with contextlib.AsyncExitStack() as stack:
        if bus is None:
            bus = await stack.enter_async_context(_connected(name, settings))
        provisioning = await _provisioned(name, settings, bus, layout_from(settings, consumers=consumers))
        health = Health(name, bus)
        probe_port = 0
        if isinstance(settings, WorkerSettings):
            probe_port = await stack.enter_async_context(
                serve_probes(health, host=settings.probe_host, port=settings.probe_port)
            )
            log.info("%s probes on http://%s:%d/readyz", name, settings.probe_host, probe_port)
        truth = _with_layout(info, provisioning)
        await stack.enter_async_context(bus.serve(health_router(health, truth), queue=f"{name}-health"))
        watcher = asyncio.create_task(_stop_when_lost(name, bus, health, stop))
        stack.callback(watcher.cancel)
        try:
            yield ServiceRuntime(bus=bus, health=health, probe_port=probe_port, provisioned_by=provisioning.by)
        finally:
            health.mark_not_ready()
    # Raised once everything above is closed, so that it reaches the caller as itself (not
    # wrapped in the exception group of a task group that was still open).
    if bus.lost:
        msg = f"{name}: the NATS connection closed for good; exiting so that a fresh process takes over"
        raise ConnectionLostError(msg)


def _connected(name: str, settings: ServiceSettings) -> contextlib.AbstractAsyncContextManager[Bus]:
    """The connection to `settings.nats`, logged in as the service's own user (its role's permissions)."""
    nats = settings.nats
    return connect(
        nats.servers,
        name=f"atmosphere-{name}",
        namespace=nats.namespace,
        connect_timeout=nats.connect_timeout,
        user=nats.user,
        password=nats.password.get_secret_value(),
        tls_ca=nats.tls_ca,
        tls_cert=nats.tls_cert,
        tls_key=nats.tls_key,
        tls_required=nats.tls_required,
    )


async def _stop_when_lost(name: str, bus: Bus, health: Health, stop: asyncio.Event | None) -> None:
    await bus.wait_lost()
    health.mark_not_ready()
    log.error("%s: the NATS connection closed for good; stopping", name)
    if stop is not None:
        stop.set()


@dataclass(frozen=True, slots=True)
class _Provisioning:
    by: str
    here: bool
    """This service made the layout (it has no login)."""


async def _provisioned(name: str, settings: ServiceSettings, bus: Bus, layout: JetStreamLayout) -> _Provisioning:
    """Make the layout (no login) or wait until the provisioner made what `name`'s role uses."""
    if not settings.nats.user:
        by = f"{name} (no login)"
        await bus.provision(layout, by=by)
        return _Provisioning(by=by, here=True)
    by = await bus.verify(role_layout(Role(name), layout), timeout=LAYOUT_WAIT)
    log.info("%s: the JetStream layout is there (provisioned by %s)", name, by or "an unnamed provisioner")
    return _Provisioning(by=by, here=False)


def _with_layout(info: InfoFragment | None, provisioning: _Provisioning) -> InfoFragment:
    """The service's info, with who provisioned the layout it runs on (runtime truth)."""

    def truth() -> dict[str, Any]:
        fragment = info() if info is not None else {}
        layout = {"provisionedBy": provisioning.by or None, "provisionedHere": provisioning.here}
        return {**fragment, "jetstream": layout}

    return truth
