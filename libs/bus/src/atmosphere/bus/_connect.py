"""Connecting to NATS: a bounded first connect, then reconnecting forever with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import nats.errors
from nats.aio.client import Client, Server

from atmosphere.bus._nats import NatsBus
from atmosphere.bus.errors import ConnectError
from atmosphere.bus.subjects import validate_namespace

log = logging.getLogger("atmosphere.bus")


def reconnect_delay(attempt: int, *, base: float = 0.1, cap: float = 5.0) -> float:
    """Exponential backoff with jitter: about `base * 2**attempt`, capped, never below half."""
    ceiling = min(cap, base * 2 ** min(attempt, 16))
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not cryptography


def _pick_server(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
    # Try the server that failed least recently-often first; wait according to its failures.
    server = min(servers, key=lambda s: s.reconnects)
    return server, reconnect_delay(server.reconnects)


class _ConnectionWatch:
    """The client's callbacks: log what happens to the connection and tell the bus.

    One per `connect()`; it knows whether the first connection was made (so pre-connect retries
    stay quiet) and whether we are closing on purpose (so a deliberate close is not a loss).
    """

    def __init__(self, name: str, client: Client) -> None:
        self.name = name
        self.client = client
        self.connected = asyncio.Event()
        self.closing = asyncio.Event()
        self.bus: NatsBus | None = None

    async def on_error(self, exc: Exception) -> None:
        """Log a client error; quietly before the first connection, where failures are retries."""
        level = logging.WARNING if self.connected.is_set() else logging.DEBUG
        log.log(level, "nats error (%s): %s", self.name, exc)

    async def on_disconnect(self) -> None:
        """Tell the bus it is disconnected, and warn unless we are the ones closing."""
        if self.bus is not None:
            self.bus.note_disconnected()
        if self.connected.is_set() and not self.closing.is_set():
            log.warning("disconnected from nats (%s); reconnecting", self.name)

    async def on_reconnect(self) -> None:
        """Log the reconnection."""
        log.info("reconnected to nats (%s)", self.name)

    async def on_closed(self) -> None:
        """Mark the bus lost when the connection closed without our asking."""
        if self.closing.is_set() or self.bus is None:
            log.debug("nats connection closed (%s)", self.name)
            return
        # nats-py closes for good on any -ERR from the server (an oversized message, an
        # authorization change): it never reconnects from CLOSED. Say so, so that the service
        # stops and its supervisor starts it afresh instead of serving errors forever.
        reason = self.client.last_error or "no reason given"
        log.error("nats connection closed for good (%s): %s", self.name, reason)
        self.bus.mark_lost()


async def _first_connect(
    watch: _ConnectionWatch, urls: list[str], *, connect_timeout: float, drain_timeout: float
) -> None:
    """Make the first connection within `connect_timeout`, or close the client and raise."""
    client = watch.client
    try:
        await asyncio.wait_for(
            client.connect(
                servers=urls,
                name=watch.name,
                connect_timeout=2,
                # Only the first connect uses this fixed wait; reconnects use `_pick_server`.
                reconnect_time_wait=0.2,  # type: ignore[arg-type]
                max_reconnect_attempts=-1,
                reconnect_to_server_handler=_pick_server,
                error_cb=watch.on_error,
                disconnected_cb=watch.on_disconnect,
                reconnected_cb=watch.on_reconnect,
                closed_cb=watch.on_closed,
                drain_timeout=int(max(1, drain_timeout)),
                # A dead or frozen server is noticed within ~30 s, not nats-py's default 4 min.
                ping_interval=10,
                max_outstanding_pings=3,
            ),
            timeout=connect_timeout,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        await _close(client)
        msg = f"could not connect to nats at {', '.join(urls)} within {connect_timeout:g}s"
        raise ConnectError(msg) from exc
    watch.connected.set()
    log.info("connected to nats (%s)", watch.name)


@contextlib.asynccontextmanager
async def connect(
    servers: str | Sequence[str],
    *,
    name: str,
    namespace: str = "",
    connect_timeout: float = 10.0,
    drain_timeout: float = 5.0,
) -> AsyncIterator[NatsBus]:
    """Connect to NATS and yield a `Bus`; drain and close it on exit.

    The first connection is retried until `connect_timeout` seconds have passed, then
    `ConnectError` is raised. Once connected, a lost connection is retried forever with
    exponential backoff; disconnects, reconnects and errors are logged.
    """
    validate_namespace(namespace)
    urls = [servers] if isinstance(servers, str) else list(servers)
    watch = _ConnectionWatch(name, Client())
    await _first_connect(watch, urls, connect_timeout=connect_timeout, drain_timeout=drain_timeout)
    watch.bus = NatsBus(watch.client, namespace=namespace)
    try:
        yield watch.bus
    finally:
        watch.closing.set()
        await _close(watch.client)


async def _close(client: Client) -> None:
    if client.is_closed:
        return
    try:
        if client.is_connected:
            await client.drain()
        else:
            await client.close()
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        # Closing while the connection is broken (pending data to a dead socket) is not an error.
        log.debug("closing nats: %s", exc)
        with contextlib.suppress(OSError, nats.errors.Error):
            await client.close()
