"""Pulling work from durable JetStream consumers: binding or creating them, and the per-item loop.

`consume` hands each message to its own handler call (`WorkPuller`, here); `consume_batches`
hands over whole fetches (`_batches.BatchPuller`). Both bind to a consumer the provisioner made,
or create (or update) one whose spec is not provisioned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import nats.errors
from google.protobuf.message import Message
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from atmosphere.bus._api import BatchHandler, Consumer, ConsumerState, Envelope, WorkHandler, WorkItem
from atmosphere.bus._batches import FAILED_HANDLER_REDELIVERY_DELAY, BatchPuller, fetch, settle
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus._jetstream import ConsumerSpec, RequiredLayout
from atmosphere.bus._provisioning import LayoutProvisioner, WireNames, consumer_config, patiently
from atmosphere.bus.errors import BusError, DecodeError, Nak, Term

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")

# Seconds `consume` waits for a provisioned consumer to be readable as it must be, before it fails.
_BIND_PATIENCE = 5.0


class PullConsumers:
    """`NatsBus`'s durable pull consumers: `consume`, `consume_batches` and `consumer_state`."""

    def __init__(
        self,
        js: JetStreamContext,
        names: WireNames,
        logical: Callable[[str], str],
        provisioner: LayoutProvisioner,
    ) -> None:
        """Pull through `js`; `logical` turns a wire subject back into the bus's own."""
        self._js = js
        self._names = names
        self._logical = logical
        self._provisioner = provisioner
        self.replicas: int | None = None
        """The replica count of the provisioned layout, for durable consumers (None: the stream's)."""

    @contextlib.asynccontextmanager
    async def consume(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        *,
        max_inflight: int,
        drain_timeout: float,
    ) -> AsyncIterator[Consumer]:
        """Pull work from a durable consumer while the context is open (`Bus.consume`)."""
        psub = await self._pull_subscribe(consumer, max_ack_pending=max(1000, max_inflight * 4))
        puller = WorkPuller(consumer, message_type, handler, max_inflight, logical=self._logical)
        try:
            async with asyncio.TaskGroup() as tasks:
                pull = tasks.create_task(puller.run(psub, tasks))
                heartbeat = tasks.create_task(puller.heartbeat())
                try:
                    yield puller
                finally:
                    puller.stop()
                    await pull
                    await puller.drain(drain_timeout)
                    heartbeat.cancel()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()

    @contextlib.asynccontextmanager
    async def consume_batches(
        self,
        consumer: ConsumerSpec,
        message_type: type[M],
        handler: BatchHandler[M],
        *,
        max_batch: int,
        linger: float,
        drain_timeout: float,
    ) -> AsyncIterator[Consumer]:
        """Pull work a batch at a time while the context is open (`Bus.consume_batches`)."""
        psub = await self._pull_subscribe(consumer, max_ack_pending=max(1000, max_batch * 4))
        puller = BatchPuller(consumer, message_type, handler, max_batch=max_batch, logical=self._logical, linger=linger)
        try:
            # In a task group, like `consume`: a loop that dies takes its service down (and the
            # supervisor or Kubernetes restarts it) rather than silently stopping the recording.
            async with asyncio.TaskGroup() as tasks:
                loop = tasks.create_task(puller.run(psub))
                try:
                    yield puller
                finally:
                    puller.stop()
                    # The fetch in progress ends within its 1 s expiry; the batch in hand may finish.
                    _, pending = await asyncio.wait({loop}, timeout=drain_timeout + 1.0)
                    for task in pending:
                        task.cancel()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()

    async def _pull_subscribe(
        self, consumer: ConsumerSpec, *, max_ack_pending: int
    ) -> JetStreamContext.PullSubscription:
        stream = self._names.stream(consumer.stream)
        if consumer.provisioned:
            # The provisioner made it; this login may only bind to it (`bus.permissions`). Checked
            # first, as it is, waiting out a leader election (the service's start checked it too).
            await self._provisioner.verify(RequiredLayout(consumers=(consumer,)), timeout=_BIND_PATIENCE)
            return await self._js.pull_subscribe_bind(durable=consumer.durable, stream=stream)
        config = consumer_config(
            consumer,
            self._names,
            max_ack_pending=consumer.max_ack_pending or max_ack_pending,
            replicas=self.replicas,
        )
        # Create or update: a durable left by an earlier version takes the current settings (its
        # filter above all: consumers of a work-queue stream must not overlap, so a stale filter
        # would keep a new consumer from being created at all).
        what = f"creating or updating consumer {consumer.durable!r} on {consumer.stream!r}"
        try:
            # Patiently, like provisioning: on a cluster that lost a node the meta leader that
            # creates consumers may still be being elected when the stream already takes messages.
            await patiently(lambda: self._js.add_consumer(stream, config), what)
        except nats.errors.Error as exc:
            msg = f"cannot create or update consumer {consumer.durable!r} on {consumer.stream!r}: {exc}"
            raise BusError(msg) from exc
        return await self._js.pull_subscribe_bind(durable=consumer.durable, stream=stream)

    async def consumer_state(self, stream: str, durable: str) -> ConsumerState:
        """How far the durable has got: its unacknowledged messages and its ack floor."""
        try:
            info = await self._js.consumer_info(self._names.stream(stream), durable)
        except nats.errors.Error as exc:
            msg = f"reading consumer {durable!r} of {stream!r} failed: {exc}"
            raise BusError(msg) from exc
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        return ConsumerState(pending=(info.num_pending or 0) + (info.num_ack_pending or 0), ack_floor=floor or 0)


class WorkPuller(Consumer):
    """The fetch loop of one durable pull consumer and the lifecycle of each work item."""

    def __init__(
        self,
        spec: ConsumerSpec,
        message_type: type[M],
        handler: WorkHandler[M],
        max_inflight: int,
        *,
        logical: Callable[[str], str],
    ) -> None:
        self._logical = logical
        self._spec = spec
        self._type: type[Message] = message_type
        self._handler: WorkHandler[Any] = handler
        self._slots = asyncio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._inflight = 0
        self._stopping = asyncio.Event()
        self._active = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._started: dict[int, tuple[Msg, float]] = {}
        """In-flight messages and when their handler started (for the heartbeat)."""

    @property
    def active(self) -> bool:
        return self._active and not self._stopping.is_set()

    async def heartbeat(self) -> None:
        """Keep long-running items alive: one loop for all of them, not a task per message."""
        interval = self._spec.heartbeat_seconds or max(0.5, self._spec.ack_wait_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            due = time.monotonic() - interval
            for msg, started in list(self._started.values()):
                if started <= due:
                    with contextlib.suppress(nats.errors.Error):
                        await msg.in_progress()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, psub: JetStreamContext.PullSubscription, tasks: asyncio.TaskGroup) -> None:
        self._active = True
        failures = 0
        while not self._stopping.is_set():
            # Wait for at least one free slot, then ask for as many messages as there are.
            await self._slots.acquire()
            self._slots.release()
            free = self._max_inflight - self._inflight if self._spec.batch_fetch else 1
            msgs, failures = await fetch(
                psub, free, durable=self._spec.durable, stopping=self._stopping, failures=failures
            )
            for msg in msgs:
                await self._slots.acquire()
                self._inflight += 1
                work = tasks.create_task(self._work(msg))
                self._tasks.add(work)
                work.add_done_callback(self._tasks.discard)
        self._active = False

    async def drain(self, timeout: float) -> None:
        """Let in-flight handlers finish for `timeout` seconds, then cancel them.

        A cancelled handler's message is nak'ed, so another worker takes it over at once.
        """
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()

    async def _work(self, msg: Msg) -> None:
        self._started[id(msg)] = (msg, time.monotonic())
        try:
            await self._run_handler(msg)
        finally:
            self._started.pop(id(msg), None)
            self._inflight -= 1
            self._slots.release()

    async def _run_handler(self, msg: Msg) -> None:
        meta = msg.metadata
        try:
            message = decode(msg.data, msg.headers, self._type)
        except (DecodeError, BusError) as exc:
            log.error("terminating undecodable work item on %s: %s", msg.subject, exc)
            await settle(msg.term())
            return
        envelope = Envelope(self._logical(msg.subject), message, Headers.from_wire(msg.headers))
        item = WorkItem(envelope, stream_seq=meta.sequence.stream, delivered=meta.num_delivered)
        try:
            await self._handler(item)
        except Nak as nak:
            await settle(msg.nak(delay=nak.delay))
        except Term as term:
            log.warning("terminating work item on %s: %s", msg.subject, term.reason)
            await settle(msg.term())
        except asyncio.CancelledError:
            await settle(msg.nak())
            raise
        except Exception:
            log.exception("work handler for %s failed; redelivering", msg.subject)
            await settle(msg.nak(delay=FAILED_HANDLER_REDELIVERY_DELAY))
        else:
            await settle(msg.ack_sync(timeout=5.0) if self._spec.confirm_ack else msg.ack())
