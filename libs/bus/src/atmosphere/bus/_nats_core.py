"""Core NATS under `NatsBus`: the connection, its namespace on the wire, publish, request, subscribe, serve.

A base class rather than a collaborator: these are the per-message paths, and a delegating call
would add a frame (and an await) to every message. JetStream is `NatsBus`'s, in `_nats`; the
constants here are what the modules of the NATS backend share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import nats.errors
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from atmosphere.bus._api import ConnectionLiveness, Subscription
from atmosphere.bus._codec import Headers, check_size, decode, encode, error_reply_too_large
from atmosphere.bus._observed import observed_request
from atmosphere.bus._router import Route, Router, run_route
from atmosphere.bus._subscription import QueueSubscription
from atmosphere.bus.errors import BusError, NoRespondersError, PayloadTooLargeError, RequestTimeoutError

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")

SUBSCRIPTION_PENDING_LIMIT = 65536
"""Subscriptions buffer at most this many messages before NATS reports a slow consumer."""
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last subject sequence did not match."""
SUBSCRIBE_FLUSH_TIMEOUT = 5
"""Seconds `subscribe` and `serve` wait for the broker to confirm new subscriptions (then go on regardless)."""


class NatsCore(ConnectionLiveness):
    """The core NATS part of `NatsBus`: names on the wire, the size check, and the plain messaging."""

    def __init__(self, client: Client, *, namespace: str = "") -> None:
        """Wrap `client`; every subject is prefixed with `namespace.` on the wire."""
        super().__init__()
        self._nc = client
        self._prefix = f"{namespace}." if namespace else ""
        self._stream_prefix = stream_prefix(namespace)

    @property
    def client(self) -> Client:
        """The underlying nats-py client (for benchmarks and diagnostics)."""
        return self._nc

    @property
    def is_connected(self) -> bool:
        """Whether the client is connected right now."""
        return bool(self._nc.is_connected)

    @property
    def max_payload(self) -> int:
        """The server's `max_payload` from its INFO (payload plus headers, per message)."""
        return int(self._nc.max_payload)

    def _closed(self) -> bool:
        # Also before `connect`'s callback says so, and after we closed it ourselves.
        return self.lost or bool(self._nc.is_closed)

    def _checked(self, subject: str, data: bytes, wire: dict[str, str] | None) -> None:
        self._ensure_open(f"send on {subject!r}")
        check_size(subject, data, wire, self.max_payload)

    def wire_subject(self, subject: str) -> str:
        """The subject as sent to NATS (with the namespace prefix)."""
        return self._prefix + subject

    def stream_name(self, name: str) -> str:
        """The stream or bucket name as known to JetStream (with the namespace prefix)."""
        return self._stream_prefix + name

    def _logical(self, wire_subject: str) -> str:
        return wire_subject.removeprefix(self._prefix)

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        """Publish without waiting (at most once)."""
        data = message.SerializeToString()
        wire = (headers.to_wire() or None) if headers else None
        self._checked(subject, data, wire)
        try:
            await self._nc.publish(self.wire_subject(subject), data, headers=wire)
        except nats.errors.Error as exc:
            msg = f"publish to {subject!r} failed: {exc}"
            raise BusError(msg) from exc

    async def request(
        self,
        subject: str,
        message: Message,
        reply_type: type[M],
        *,
        timeout: float = 5.0,
        headers: Headers | None = None,
    ) -> M:
        """Send a request and wait for its typed reply (with the current run's and span's headers)."""

        async def send(sent: Headers) -> M:
            data, wire = encode(message, sent)
            self._checked(subject, data, wire)
            try:
                reply = await self._nc.request(self.wire_subject(subject), data, timeout=timeout, headers=wire)
            except nats.errors.NoRespondersError as exc:
                raise NoRespondersError(subject) from exc
            except nats.errors.TimeoutError as exc:
                raise RequestTimeoutError(subject, timeout) from exc
            except nats.errors.Error as exc:
                msg = f"request to {subject!r} failed: {exc}"
                raise BusError(msg) from exc
            return decode(reply.data, reply.headers, reply_type)

        return await observed_request(subject, headers, send)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, subject: str, message_type: type[M], *, queue: str | None = None, confirmed: bool = True
    ) -> AsyncIterator[Subscription[M]]:
        """Receive the messages on `subject` while the context is open (`confirmed`: see `Bus.subscribe`)."""
        subscription = QueueSubscription(message_type)

        async def on_message(msg: Msg) -> None:
            subscription.offer(self._logical(msg.subject), msg.data, msg.headers)

        sub = await self._nc.subscribe(
            self.wire_subject(subject),
            queue=queue or "",
            cb=on_message,
            pending_msgs_limit=SUBSCRIPTION_PENDING_LIMIT,
        )
        try:
            if confirmed:
                await self._interest_sent()
            # Else the SUB is in nats-py's write buffer ahead of whatever this client publishes next.
            yield subscription
        finally:
            subscription.close()
            await unsubscribe(sub)

    async def _interest_sent(self) -> None:
        """Return once the broker has this client's new subscriptions.

        Without it a message another client published the moment after `subscribe` (or
        `serve`) was entered could be missed. One `flush()` is not enough: nats-py writes its
        PING straight to the socket while the SUB waits in its write buffer for the flusher
        task, so the PONG can come back before the server has the SUB (a test publishing from a
        second client lost about one message in twenty that way). By the first PONG the flusher
        has written the SUB; the second PING follows it on the wire, so its PONG proves it.
        While reconnecting there is nothing to wait for: the client sends every subscription
        again as it reconnects.
        """
        if not self._nc.is_connected:
            return
        with contextlib.suppress(nats.errors.TimeoutError, nats.errors.ConnectionClosedError):
            for _ in range(2):
                await self._nc.flush(timeout=SUBSCRIBE_FLUSH_TIMEOUT)

    @contextlib.asynccontextmanager
    async def serve(
        self, router: Router, *, queue: str | None = None, max_inflight: int = 256, confirmed: bool = True
    ) -> AsyncIterator[None]:
        """Serve every route of `router`; on exit stop receiving, finish in-flight work (`confirmed`: `Bus.serve`)."""
        # A fixed pool of workers fed by a bounded queue: cheaper per message than a task per
        # request, and when every worker is busy the queue fills, the subscription callback
        # waits, NATS buffers and finally drops (slow consumer) instead of this process growing.
        inbox: asyncio.Queue[tuple[Route[Any], Msg] | None] = asyncio.Queue(max_inflight)
        subs: list[NatsSubscription] = []
        async with asyncio.TaskGroup() as tasks:
            workers = [tasks.create_task(self._serve_worker(inbox)) for _ in range(max_inflight)]
            try:
                for route in router.routes:
                    subs.append(
                        await self._nc.subscribe(
                            self.wire_subject(route.subject),
                            queue=queue or "",
                            cb=_enqueue(route, inbox),
                            pending_msgs_limit=SUBSCRIPTION_PENDING_LIMIT,
                        )
                    )
                if confirmed:
                    await self._interest_sent()
                yield
            finally:
                for sub in subs:
                    await unsubscribe(sub)
                for _ in workers:
                    await inbox.put(None)

    async def _serve_worker(self, inbox: asyncio.Queue[tuple[Route[Any], Msg] | None]) -> None:
        while (item := await inbox.get()) is not None:
            route, msg = item
            try:
                reply = await run_route(route, self._logical(msg.subject), msg.data, msg.headers)
                if reply is not None and msg.reply:
                    reply = self._fitting_reply(msg.subject, reply)
                    await self._nc.publish(msg.reply, reply[0], headers=reply[1])
            except Exception:
                log.exception("answering on %s failed", msg.subject)

    def _fitting_reply(
        self, subject: str, reply: tuple[bytes, dict[str, str] | None]
    ) -> tuple[bytes, dict[str, str] | None]:
        """`reply`, or a typed `Error` in its place when it would exceed the broker's limit.

        Sending it would make the server close this connection; the requester gets a clear
        error instead, and a responder that may answer big (history, files) pages its answers.
        """
        try:
            check_size(subject, reply[0], reply[1], self.max_payload)
        except PayloadTooLargeError as exc:
            log.warning("reply on %s refused: %s", subject, exc)
            return error_reply_too_large(exc)
        return reply


def _enqueue(route: Route[Any], inbox: asyncio.Queue[tuple[Route[Any], Msg] | None]) -> Callable[[Msg], Any]:
    async def on_message(msg: Msg) -> None:
        await inbox.put((route, msg))

    return on_message


async def unsubscribe(sub: NatsSubscription) -> None:
    """Unsubscribe `sub`, ignoring a connection that is closed or closing (nothing is left to stop)."""
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()


def stream_prefix(namespace: str) -> str:
    """What every stream and bucket name starts with in `namespace` (upper case, `.` and `-` as `_`)."""
    if not namespace:
        return ""
    return namespace.upper().replace(".", "_").replace("-", "_") + "_"
