"""Pulling from JetStream: the shared fetch and settle steps, and the batch consumer's loop.

The batch consumer makes one fetch, one handler call and one settlement per batch. Consuming
message by message costs a task, a semaphore slot and a handler call for every message; for a
stream of many tiny messages (every token of every run) that overhead is most of the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
from google.protobuf.message import Message
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from atmosphere.bus._api import BatchHandler, Consumer, Envelope, WorkItem
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus._jetstream import ConsumerSpec
from atmosphere.bus.errors import BusError, DecodeError, Nak, Term

log = logging.getLogger("atmosphere.bus")

FAILED_HANDLER_REDELIVERY_DELAY = 2.0
"""How long a message whose handler raised waits before it is redelivered."""


async def settle(operation: Any) -> None:
    """Ack/nak/term, tolerating a lost connection (the broker redelivers on its own)."""
    try:
        await operation
    except (TimeoutError, nats.errors.Error) as exc:
        log.warning("could not settle a work item: %s", exc)


async def sleep_or_stop(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less when `stopping` is set."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)


async def fetch(
    psub: JetStreamContext.PullSubscription, batch: int, *, durable: str, stopping: asyncio.Event, failures: int
) -> tuple[list[Msg], int]:
    """One pull of up to `batch` messages, and the count of consecutive failed pulls.

    An expired pull returns nothing. A broker error (disconnected, restarting) is logged and
    waited out with a capped backoff, so a fetch loop keeps trying without spinning.
    """
    try:
        return await psub.fetch(batch=batch, timeout=1.0), 0
    except (TimeoutError, nats.errors.TimeoutError):
        return [], failures
    except nats.errors.Error as exc:
        log.warning("fetch from %s failed: %s", durable, exc)
        await sleep_or_stop(stopping, min(5.0, 0.1 * 2 ** (failures + 1)))
        return [], failures + 1


class BatchPuller(Consumer):
    """Fetches up to `max_batch` messages, hands them over together, settles them together."""

    def __init__(
        self,
        spec: ConsumerSpec,
        message_type: type[Message],
        handler: BatchHandler[Any],
        *,
        max_batch: int,
        logical: Callable[[str], str],
        linger: float,
    ) -> None:
        self._spec = spec
        self._type = message_type
        self._handler = handler
        self._max_batch = max_batch
        self._logical = logical
        self._linger = linger
        self._stopping = asyncio.Event()
        self._active = False

    @property
    def active(self) -> bool:
        return self._active and not self._stopping.is_set()

    def stop(self) -> None:
        """Finish the batch in hand, then stop fetching."""
        self._stopping.set()

    async def run(self, psub: JetStreamContext.PullSubscription) -> None:
        """Fetch and handle batches until stopped."""
        self._active = True
        failures = 0
        try:
            while not self._stopping.is_set():
                msgs, failures = await fetch(
                    psub, self._max_batch, durable=self._spec.durable, stopping=self._stopping, failures=failures
                )
                if not msgs:
                    continue
                await self._handle(msgs)
                if len(msgs) < self._max_batch and self._linger:
                    # Let the next batch gather on the server: under load that is one handler
                    # call (one commit) per `linger` instead of one per handful of messages.
                    await sleep_or_stop(self._stopping, self._linger)
        finally:
            self._active = False

    async def _handle(self, msgs: list[Msg]) -> None:
        items: list[WorkItem[Any]] = []
        kept: list[Msg] = []
        for msg in msgs:
            try:
                message = decode(msg.data, msg.headers, self._type)
            except (DecodeError, BusError) as exc:
                log.error("terminating undecodable work item on %s: %s", msg.subject, exc)
                await settle(msg.term())
                continue
            meta = msg.metadata
            envelope = Envelope(self._logical(msg.subject), message, Headers.from_wire(msg.headers))
            items.append(WorkItem(envelope, stream_seq=meta.sequence.stream, delivered=meta.num_delivered))
            kept.append(msg)
        if not items:
            return
        keep_alive = asyncio.get_running_loop().create_task(self._keep_alive(kept))
        try:
            await self._handler(items)
        except Nak as nak:
            delay = nak.delay
            await self._settle_all(kept, lambda m: m.nak(delay=delay))
        except Term as term:
            log.warning("terminating %d work items on %s: %s", len(kept), self._spec.durable, term.reason)
            await self._settle_all(kept, lambda m: m.term())
        except asyncio.CancelledError:
            await self._settle_all(kept, lambda m: m.nak())
            raise
        except Exception:
            log.exception("batch handler for %s failed; redelivering %d items", self._spec.durable, len(kept))
            await self._settle_all(kept, lambda m: m.nak(delay=FAILED_HANDLER_REDELIVERY_DELAY))
        else:
            if self._spec.confirm_ack:
                await self._settle_all(kept, lambda m: m.ack_sync(timeout=5.0))
            else:
                await self._settle_all(kept, lambda m: m.ack())
        finally:
            keep_alive.cancel()

    async def _keep_alive(self, msgs: list[Msg]) -> None:
        interval = max(0.5, self._spec.ack_wait_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            await self._settle_all(msgs, lambda m: m.in_progress())

    @staticmethod
    async def _settle_all(msgs: list[Msg], operation: Callable[[Msg], Any]) -> None:
        for msg in msgs:
            await settle(operation(msg))
