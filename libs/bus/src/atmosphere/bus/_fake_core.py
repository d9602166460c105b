"""Core NATS in memory, under `atmosphere.bus.testing.FakeBus`: subjects, queue groups, requests, responders.

A message on a subject that a stream captures is stored before it is delivered, as on NATS:
`_capture` is the step that stores it, which `FakeBus` (it has the streams) fills in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import ConnectionLiveness, Subscription
from atmosphere.bus._codec import DEFAULT_MAX_PAYLOAD, Headers, check_size, decode, encode, error_reply_too_large
from atmosphere.bus._observed import observed_request
from atmosphere.bus._router import Route, Router, run_route
from atmosphere.bus._subscription import QueueSubscription
from atmosphere.bus.errors import NoRespondersError, PayloadTooLargeError, RequestTimeoutError
from atmosphere.bus.subjects import matches

M = TypeVar("M", bound=Message)

_Deliver = Callable[[str, bytes, Mapping[str, str] | None, str | None], None]


@dataclass(eq=False)
class _Sub:
    pattern: str
    queue: str | None
    deliver: _Deliver


class FakeCore(ConnectionLiveness):
    """The core NATS part of `FakeBus`: its connection state, the size check and the plain messaging."""

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        """Start empty and connected, with the broker limit `max_payload` (nats-server's default)."""
        super().__init__()
        self._max_payload = max_payload
        self._subs: list[_Sub] = []
        self._rr = itertools.count()
        self._inbox = itertools.count(1)
        self.connected = True
        """Set to False to make readiness checks see a disconnected bus."""
        self.published: list[tuple[str, Message]] = []
        """Every message published or requested, decoded as sent (for assertions)."""

    @property
    def is_connected(self) -> bool:
        """Whether the fake is marked connected."""
        return self.connected and not self._lost.is_set()

    @property
    def max_payload(self) -> int:
        """The broker limit this fake enforces."""
        return self._max_payload

    def disconnect(self) -> None:
        """Count a disconnect (what a broker restart does to the connection's epoch)."""
        self.note_disconnected()

    def close_for_good(self) -> None:
        """Behave like a nats-py client that reached CLOSED: nothing can be sent any more."""
        self.mark_lost()

    def _check(self, subject: str, data: bytes, wire: Mapping[str, str] | None) -> None:
        self._ensure_open(f"send on {subject!r}")
        check_size(subject, data, wire, self._max_payload)

    def _route(self, subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> int:
        """Capture into a matching stream, then deliver as core NATS does; return deliveries."""
        self._capture(subject, data, headers)
        return self._deliver(subject, data, headers, reply)

    def _capture(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> None:
        """Store the message in the stream that captures `subject`, if any (streams are `FakeBus`'s)."""

    def _deliver(self, subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> int:
        delivered = 0
        groups: dict[str, list[_Sub]] = {}
        for sub in [s for s in self._subs if matches(s.pattern, subject)]:
            if sub.queue is None:
                sub.deliver(subject, data, headers, reply)
                delivered += 1
            else:
                groups.setdefault(sub.queue, []).append(sub)
        for members in groups.values():
            members[next(self._rr) % len(members)].deliver(subject, data, headers, reply)
            delivered += 1
        return delivered

    async def publish(self, subject: str, message: Message, *, headers: Headers | None = None) -> None:
        """Deliver to every matching subscriber (and capture into matching streams)."""
        wire = (headers.to_wire() or None) if headers else None
        data = message.SerializeToString()
        self._check(subject, data, wire)
        self.published.append((subject, message))
        self._route(subject, data, wire, None)
        await asyncio.sleep(0)

    async def request(
        self,
        subject: str,
        message: Message,
        reply_type: type[M],
        *,
        timeout: float = 5.0,
        headers: Headers | None = None,
    ) -> M:
        """Send a request to one responder and wait for its typed reply (as `NatsBus.request`)."""

        async def send(sent: Headers) -> M:
            data, wire = encode(message, sent)
            self._check(subject, data, wire)
            self.published.append((subject, message))
            inbox = f"_INBOX.fake.{next(self._inbox)}"
            answer: asyncio.Future[tuple[bytes, Mapping[str, str] | None]] = asyncio.get_running_loop().create_future()

            def on_reply(_s: str, payload: bytes, reply_headers: Mapping[str, str] | None, _r: str | None) -> None:
                if not answer.done():
                    answer.set_result((payload, reply_headers))

            reply_sub = _Sub(inbox, None, on_reply)
            self._subs.append(reply_sub)
            try:
                if self._route(subject, data, wire, inbox) == 0:
                    raise NoRespondersError(subject)
                try:
                    payload, reply_headers = await asyncio.wait_for(answer, timeout)
                except TimeoutError as exc:
                    raise RequestTimeoutError(subject, timeout) from exc
            finally:
                self._subs.remove(reply_sub)
            return decode(payload, reply_headers, reply_type)

        return await observed_request(subject, headers, send)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, subject: str, message_type: type[M], *, queue: str | None = None, confirmed: bool = True
    ) -> AsyncIterator[Subscription[M]]:
        """Receive the messages on `subject` while the context is open (known at once: `confirmed` changes nothing)."""
        subscription = QueueSubscription(message_type)
        sub = _Sub(subject, queue, lambda s, d, h, _r: subscription.offer(s, d, h))
        self._subs.append(sub)
        try:
            yield subscription
        finally:
            self._subs.remove(sub)
            subscription.close()

    @contextlib.asynccontextmanager
    async def serve(
        self, router: Router, *, queue: str | None = None, max_inflight: int = 256, confirmed: bool = True
    ) -> AsyncIterator[None]:
        """Serve every route while the context is open; finish in-flight work on exit (`confirmed` changes nothing)."""
        slots = asyncio.Semaphore(max_inflight)
        subs: list[_Sub] = []
        async with asyncio.TaskGroup() as tasks:
            try:
                for route in router.routes:
                    sub = _Sub(route.subject, queue, self._responder(route, slots, tasks))
                    subs.append(sub)
                    self._subs.append(sub)
                yield
            finally:
                for sub in subs:
                    self._subs.remove(sub)

    def _responder(self, route: Route[Any], slots: asyncio.Semaphore, tasks: asyncio.TaskGroup) -> _Deliver:
        async def answer(subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> None:
            async with slots:
                result = await run_route(route, subject, data, headers)
            if result is not None and reply is not None:
                try:
                    check_size(subject, result[0], result[1], self._max_payload)
                except PayloadTooLargeError as exc:
                    result = error_reply_too_large(exc)
                self._route(reply, result[0], result[1], None)

        def deliver(subject: str, data: bytes, headers: Mapping[str, str] | None, reply: str | None) -> None:
            tasks.create_task(answer(subject, data, headers, reply))

        return deliver
