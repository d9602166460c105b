"""`python -m atmosphere.dispatch.provision` (`atmosphere provision`): make the JetStream layout, then exit.

Every stream and bucket, and the run queue's consumers: what no service's own login may make
(`atmosphere.bus.permissions`). It runs with the provisioner's login (`provisioner.env` of
`atmosphere bus-credentials`) before the services, or beside them (they wait for it): a
Kubernetes Job, compose's `provision` service, `atmosphere dev`. It lives beside dispatch
because the run queue's consumers take dispatch's settings (`ATMOSPHERE_DISPATCH__RUN_ACK_WAIT`,
`__MAX_RUN_DELIVERIES`, `__MAX_CONCURRENT_RUNS`) and dispatch refuses consumers made with others;
so give it dispatch's environment, with the provisioner's login instead of dispatch's.

Exit codes: 0 provisioned, 1 JetStream refused it (a wrong login, a server without JetStream),
2 NATS cannot be reached, 78 invalid settings.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from atmosphere.bus import BusError, ConnectError, JetStreamLayout, connect
from atmosphere.dispatch.app import provisioned_queues
from atmosphere.dispatch.settings import DispatchSettings
from atmosphere.service import layout_from, run

log = logging.getLogger("atmosphere.provision")

EXIT_REFUSED = 1
"""JetStream refused the layout, or did not answer in time."""


def full_layout(settings: DispatchSettings) -> JetStreamLayout:
    """The whole layout these settings ask for: streams, buckets, every pool's run queue consumers."""
    return layout_from(settings, consumers=tuple(provisioned_queues(settings.dispatch)))


def provisioner_name(settings: DispatchSettings) -> str:
    """What the layout is stamped as provisioned by: the login, or that there was none."""
    return settings.nats.user or "provisioner (no login)"


async def provision(settings: DispatchSettings) -> JetStreamLayout:
    """Connect with `settings.nats` and make the layout; the layout made.

    Raises:
        ConnectError: NATS cannot be reached, or refused the login.
        BusError: JetStream refused the layout, or gave no answer for a minute.
    """
    layout = full_layout(settings)
    async with connect(
        settings.nats.servers,
        name="atmosphere-provision",
        namespace=settings.nats.namespace,
        connect_timeout=settings.nats.connect_timeout,
        user=settings.nats.user,
        password=settings.nats.password.get_secret_value(),
        tls_ca=settings.nats.tls_ca,
        tls_cert=settings.nats.tls_cert,
        tls_key=settings.nats.tls_key,
        tls_required=settings.nats.tls_required,
    ) as bus:
        await bus.provision(layout, by=provisioner_name(settings))
    return layout


def summary(layout: JetStreamLayout, *, by: str) -> str:
    """One line of what was provisioned, for the log."""
    consumers = ", ".join(f"{c.stream}/{c.durable}" for c in layout.consumers)
    return (
        f"provisioned by {by}: streams {', '.join(s.name for s in layout.streams())}; "
        f"buckets {', '.join(b.name for b in layout.buckets())}; "
        f"object buckets {', '.join(b.name for b in layout.object_buckets())}; consumers {consumers}; "
        f"{layout.replication.replicas} replica(s)"
    )


async def _provision_and_exit(settings: DispatchSettings, *, stop: asyncio.Event) -> None:
    """`provision` as a service's `serve`: it ends once the layout is made (`stop` is not awaited)."""
    del stop  # one step, not a loop: a signal cancels it outright
    try:
        layout = await provision(settings)
    except ConnectError:
        raise  # exit 2, as a service's: NATS cannot be reached (a restart may cure it)
    except BusError as exc:
        # A login that may not make the layout gets no answer at all (the server drops what it
        # refuses), so the error is a timeout: say which login it was.
        who = f"as {settings.nats.user}" if settings.nats.user else "without a login"
        log.error("provisioning failed %s: %s (the provisioner's login is in provisioner.env)", who, exc)
        raise SystemExit(EXIT_REFUSED) from exc
    log.info("%s", summary(layout, by=provisioner_name(settings)))


def main() -> int:
    """Entry point of `python -m atmosphere.dispatch.provision` and `atmosphere provision`."""
    try:
        return run(_provision_and_exit, DispatchSettings, service="provision")
    except SystemExit as exit_:
        return int(exit_.code or 0)


if __name__ == "__main__":
    sys.exit(main())
