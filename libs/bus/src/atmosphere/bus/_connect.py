"""Connecting to NATS: a bounded first connect, then reconnecting forever with backoff.

With a user, the connection logs in and keeps its replies under an inbox of that user's own
(`permissions.inbox_prefix`), the only inbox its permissions let it read. A login the server
refuses, or a server that will not speak TLS when TLS is required, ends the first connect at
once with a `ConnectError` saying so: retrying cannot fix credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client, Server

from atmosphere.bus._nats import NatsBus
from atmosphere.bus.errors import ConnectError
from atmosphere.bus.permissions import inbox_prefix
from atmosphere.bus.subjects import validate_namespace

log = logging.getLogger("atmosphere.bus")


_LOGIN = re.compile(r"(^|//)[^/@\s]*@")


def without_login(url: str) -> str:
    """`url` without the user and password it may carry (`nats://user:pass@host` → `nats://host`): fit for a message."""
    return _LOGIN.sub(r"\1", url)


def reconnect_delay(attempt: int, *, base: float = 0.1, cap: float = 5.0) -> float:
    """Exponential backoff with jitter: about `base * 2**attempt`, capped, never below half."""
    ceiling = min(cap, base * 2 ** min(attempt, 16))
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not cryptography


def _pick_server(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
    # Try the server that failed least recently-often first; wait according to its failures.
    server = min(servers, key=lambda s: s.reconnects)
    return server, reconnect_delay(server.reconnects)


class _TlsOnlyClient(Client):
    """A client that drops a server whose INFO does not require TLS, before sending CONNECT.

    nats-py upgrades to TLS only when the server asks for it, and would otherwise send the
    credentials in the clear; this check runs on every (re)connect, between INFO and CONNECT.
    """

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and not info.get("tls_required"):
            raise nats.errors.SecureConnWantedError
        await super()._process_info(info, initial_connection=initial_connection)


def _tls_context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """A context that verifies the server with `ca` (else the system's CAs) and shows `cert` if given."""
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert is not None:
            context.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as exc:
        msg = f"cannot use the TLS files (ca={ca}, cert={cert}, key={key}): {exc}"
        raise ConnectError(msg) from exc
    return context


def _refusal(exc: BaseException) -> str:
    """Why the server refused us for good, or "" for a failure that a retry may cure."""
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower():
        return "authorization violation"
    if isinstance(exc, nats.errors.SecureConnWantedError):
        return "the server does not require TLS, and TLS is required"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its TLS certificate was not accepted ({exc.verify_message or exc})"
    return ""


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
        self.refused = asyncio.Event()
        self.refusal = ""
        """Why the server refused the first connection for good (set with `refused`)."""
        self.bus: NatsBus | None = None

    async def on_error(self, exc: Exception) -> None:
        """Log a client error; quietly before the first connection, where failures are retries.

        A refusal before the first connection (bad credentials, no TLS) sets `refused`, which
        ends the first connect with a `ConnectError` saying why.
        """
        if not self.connected.is_set():
            reason = _refusal(exc)
            if reason:
                self.refusal = reason
                self.refused.set()
                return
        # Once connected, a refusal (credentials revoked while reconnecting) or a permissions
        # violation is a warning: reconnecting goes on, as the server may be reloaded again.
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
    watch: _ConnectionWatch,
    urls: list[str],
    *,
    login: dict[str, Any],
    connect_timeout: float,
    drain_timeout: float,
) -> None:
    """Make the first connection within `connect_timeout`, or close the client and raise.

    `login` holds the client's credential and TLS options. A refusal ends the wait at once.
    """
    client = watch.client
    connecting = asyncio.ensure_future(
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
            **login,
        )
    )
    refused = asyncio.ensure_future(watch.refused.wait())
    try:
        await asyncio.wait({connecting, refused}, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        refused.cancel()
    where = ", ".join(map(without_login, urls))
    if not connecting.done() or watch.refused.is_set():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, OSError, nats.errors.Error):
            await connecting
        await _close(client)
        if watch.refused.is_set():
            user = login.get("user")
            who = f"user {user!r}" if user else "a client without credentials"
            msg = f"nats at {where} refused {who}: {watch.refusal}"
            raise ConnectError(msg)
        msg = f"could not connect to nats at {where} within {connect_timeout:g}s"
        raise ConnectError(msg)
    try:
        connecting.result()
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        await _close(client)
        msg = f"could not connect to nats at {where}: {exc}"
        raise ConnectError(msg) from exc
    watch.connected.set()
    log.info("connected to nats (%s)", watch.name)


def _login(
    *,
    user: str,
    password: str,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_required: bool,
) -> tuple[Client, dict[str, Any]]:
    """The client to use and its credential and TLS options for `Client.connect`."""
    if password and not user:
        msg = "a nats password was given without a user"
        raise ConnectError(msg)
    if tls_key is not None and tls_cert is None:
        msg = "a TLS key was given without its certificate"
        raise ConnectError(msg)
    options: dict[str, Any] = {}
    if user:
        options |= {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}
    if tls_required or tls_ca or tls_cert:
        options["tls"] = _tls_context(tls_ca, tls_cert, tls_key)
    return (_TlsOnlyClient() if tls_required else Client()), options


@contextlib.asynccontextmanager
async def connect(
    servers: str | Sequence[str],
    *,
    name: str,
    namespace: str = "",
    connect_timeout: float = 10.0,
    drain_timeout: float = 5.0,
    user: str = "",
    password: str = "",
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_required: bool = False,
) -> AsyncIterator[NatsBus]:
    """Connect to NATS and yield a `Bus`; drain and close it on exit.

    The first connection is retried until `connect_timeout` seconds have passed, then
    `ConnectError` is raised; at once when the server refuses the login (`user`, `password`)
    or TLS. Once connected, a lost connection is retried forever with exponential backoff;
    disconnects, reconnects and errors (a permissions violation among them) are logged.

    TLS is used when the server asks for it, verified with `tls_ca` (else the system's CAs);
    `tls_cert` and `tls_key` are the client's certificate for a server that verifies clients;
    `tls_required` refuses a server that does not ask for TLS.
    """
    validate_namespace(namespace)
    urls = [servers] if isinstance(servers, str) else list(servers)
    client, login = _login(
        user=user, password=password, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, tls_required=tls_required
    )
    watch = _ConnectionWatch(name, client)
    await _first_connect(watch, urls, login=login, connect_timeout=connect_timeout, drain_timeout=drain_timeout)
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
