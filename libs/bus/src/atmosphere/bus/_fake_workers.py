"""The workers of `atmosphere.bus.testing.FakeBus`'s durable consumers: pulling, handing over, settling.

A handler always settles its message here (ack, nak with its delay, or term), so no ack-wait
timer is modelled; a nak'ed message waits its delay, then goes to whichever worker asks next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from atmosphere.bus._api import BatchHandler, Consumer, Envelope, WorkHandler, WorkItem
from atmosphere.bus._codec import Headers, decode
from atmosphere.bus._fake_streams import Durable, Stored, Stream
from atmosphere.bus._jetstream import Retention
from atmosphere.bus.errors import BusError, DecodeError, Nak, Term
from atmosphere.bus.subjects import matches

M = TypeVar("M", bound=Message)

log = logging.getLogger("atmosphere.bus")


class FakeWorker(Consumer):
    """`consume`: one handler call per message, at most `max_inflight` at once, settled as a server would."""

    def __init__(
        self,
        stream: Stream,
        durable: Durable,
        message_type: type[M],
        handler: WorkHandler[M],
        max_inflight: int,
    ) -> None:
        self._stream = stream
        self._durable = durable
        self._type: type[Message] = message_type
        self._handler: Callable[[WorkItem[Any]], Awaitable[None]] = handler
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False

    @property
    def active(self) -> bool:
        return not self.stopping

    def _next(self) -> Stored | None:
        durable, stream = self._durable, self._stream
        while durable.redeliver:
            seq = durable.redeliver.pop(0)
            if seq in stream.messages:
                return stream.messages[seq]
        for seq in sorted(s for s in stream.messages if s > durable.cursor):
            durable.cursor = seq
            stored = stream.messages[seq]
            if matches(durable.spec.filter_subject, stored.subject):
                return stored
        return None

    def stop(self) -> None:
        self.stopping = True
        self._stream.wake()

    async def run(self, tasks: asyncio.TaskGroup) -> None:
        while not self.stopping:
            await self._slots.acquire()
            stored = self._next()
            while stored is None:
                # Clear before waiting: a message stored after `_next` sets it again.
                self._stream.changed.clear()
                await self._stream.changed.wait()
                if not self.active:  # stopped while waiting
                    self._slots.release()
                    return
                stored = self._next()
            self._durable.delivered[stored.seq] = self._durable.delivered.get(stored.seq, 0) + 1
            task = tasks.create_task(self._work(stored))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()

    async def _work(self, stored: Stored) -> None:
        try:
            item = self._item(stored)
            if item is not None:
                await self._run(self._handler(item), [stored], stored.subject)
        finally:
            self._slots.release()

    def _item(self, stored: Stored) -> WorkItem[Any] | None:
        """The work item of `stored`; None (and the message terminated) when it does not decode."""
        try:
            message = decode(stored.data, stored.headers, self._type)
        except (DecodeError, BusError):
            self._settle(stored, ("term", 0.0))
            return None
        envelope = Envelope(stored.subject, message, Headers.from_wire(stored.headers))
        return WorkItem(envelope, stream_seq=stored.seq, delivered=self._durable.delivered[stored.seq])

    async def _run(self, call: Awaitable[None], stored: list[Stored], what: str) -> None:
        """Await a handler `call`, then settle `stored` by how it ended, as the server would."""
        try:
            await call
        except Nak as nak:
            outcome = ("nak", nak.delay)
        except Term:
            outcome = ("term", 0.0)
        except asyncio.CancelledError:
            for each in stored:
                self._settle(each, ("nak", 0.0))
            raise
        except Exception:
            log.exception("work handler for %s failed; redelivering", what)
            outcome = ("nak", 0.0)
        else:
            outcome = ("ack", 0.0)
        for each in stored:
            self._settle(each, outcome)

    def _settle(self, stored: Stored, outcome: tuple[str, float]) -> None:
        verb, delay = outcome
        if verb == "nak":
            asyncio.get_running_loop().call_later(delay, self._redeliver, stored.seq)
            return
        self._durable.delivered.pop(stored.seq, None)
        if self._stream.spec.retention is Retention.WORK_QUEUE:
            self._stream.messages.pop(stored.seq, None)

    def _redeliver(self, seq: int) -> None:
        self._durable.redeliver.append(seq)
        self._stream.wake()


class FakeBatchWorker(FakeWorker):
    """`consume_batches`: everything available (up to `max_batch`) handed over and settled at once."""

    def __init__(
        self,
        stream: Stream,
        durable: Durable,
        message_type: type[M],
        handler: BatchHandler[M],
        *,
        max_batch: int,
        linger: float,
    ) -> None:
        super().__init__(stream, durable, message_type, _never, 1)
        self._batch_handler: BatchHandler[Any] = handler
        self._max_batch = max_batch
        self._linger = linger
        self.handling = False

    async def run_batches(self) -> None:
        while not self.stopping:
            batch = self._take()
            while not batch:
                self._stream.changed.clear()
                await self._stream.changed.wait()
                if not self.active:  # stopped while waiting
                    return
                batch = self._take()
            self.handling = True
            try:
                await self._handle(batch)
            finally:
                self.handling = False
            if len(batch) < self._max_batch and self._linger:
                await asyncio.sleep(self._linger)

    def _take(self) -> list[Stored]:
        batch: list[Stored] = []
        while len(batch) < self._max_batch and (stored := self._next()) is not None:
            self._durable.delivered[stored.seq] = self._durable.delivered.get(stored.seq, 0) + 1
            batch.append(stored)
        return batch

    async def _handle(self, batch: list[Stored]) -> None:
        items = {stored.seq: item for stored in batch if (item := self._item(stored)) is not None}
        if items:
            kept = [stored for stored in batch if stored.seq in items]
            await self._run(self._batch_handler(list(items.values())), kept, self._durable.spec.durable)


async def _never(item: WorkItem[Any]) -> None:
    raise AssertionError("a batch worker hands out batches only")  # pragma: no cover
