"""One replica's copy of a replicated stream: how N replicas of a stateful service never split state.

A JetStream stream (replicated by the NATS cluster) is the store of record. Every replica has a
durable consumer of its own, named after the replica, and applies every message of the stream,
in stream order, to its own store (SQLite by default): all replicas hold the same state, each
a moment behind the stream at most. A write is acknowledged once the stream holds it *and*
this replica applied it; a read first waits until this replica applied everything the stream
held when the read began, so whichever replica answers, it answers with every write
acknowledged before the read — also after the replica that took the write died.

The replica's name is made once and kept beside its data: a replica that restarts on the same
volume resumes its consumer where it stopped; a new volume is a new replica that applies the
stream from its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

from google.protobuf.message import Message

from atmosphere.bus import Bus, BusError, ConsumerSpec, Headers, PayloadTooLargeError, WorkItem
from atmosphere.bus.errors import ReplicaBehindError

M = TypeVar("M", bound=Message)
R = TypeVar("R")

KEEP_RESULTS = 4096
"""Results of recent applies kept for the writers waiting on them (a writer asks right after
its write is stored, so only a burst larger than this could miss its own)."""
GONE_REPLICA_SECONDS = 7 * 24 * 3600.0
"""A replica's consumer outlives a week without pulls; a replica gone for longer starts over."""
BARRIER_POLL = 0.01


def replica_name(data_dir: Path, service: str) -> str:
    """This replica's name (`<service>-<12 hex>`), made on first use and kept in `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"{service}.replica"
    try:
        name = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        name = ""
    if name:
        return name
    name = f"{service}-{secrets.token_hex(6)}"
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    temp.write_text(name + "\n", encoding="ascii")
    os.replace(temp, path)  # atomic: two processes on one volume agree on one name
    return path.read_text(encoding="ascii").strip()


class ReplicaLog(Generic[M, R]):
    """Apply every message of a stream to this replica's store; write through it; read behind it.

    `apply(seq, message)` changes the local store and returns the writer's answer. It must be
    deterministic (the same message gives every replica the same state: times and ids travel
    in the message). An exception of `outcomes` is an answer too (a refused write is refused on
    every replica); any other exception is a failure of this replica's store, retried.
    Applies are at least once: a replica killed between an apply and its acknowledgement
    applies that one message again on restart, so an apply should tolerate a repeat.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        filter_subject: str,
        replica: str,
        message_type: type[M],
        apply: Callable[[int, M], Awaitable[R]],
        outcomes: tuple[type[Exception], ...] = (),
        max_batch: int = 1,
        linger: float = 0.0,
        barrier_timeout: float = 10.0,
    ) -> None:
        """Apply `stream`'s messages on `filter_subject` as replica `replica`.

        `max_batch=1` hands each message over the moment it is stored (a writer waits for its
        own); a larger batch suits a high-volume log nobody waits on (recorded events).
        """
        self._bus = bus
        self._type = message_type
        self._apply = apply
        self._outcomes = outcomes
        self._max_batch = max_batch
        self._linger = linger
        self._barrier_timeout = barrier_timeout
        self.consumer = replica_consumer(stream, filter_subject, replica, batch_fetch=max_batch > 1)
        self.applied_seq = 0
        """The stream sequence of the last message applied here (0 before the first)."""
        self._results: OrderedDict[int, R | BaseException] = OrderedDict()
        self._progress = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def applying(self) -> AsyncIterator[None]:
        """Apply the stream while the context is open."""
        async with self._bus.consume_batches(
            self.consumer, self._type, self._apply_batch, max_batch=self._max_batch, linger=self._linger
        ):
            yield

    async def _apply_batch(self, items: list[WorkItem[M]]) -> None:
        for item in items:
            if item.stream_seq <= self.applied_seq:
                continue  # a redelivery of what this process applied already
            result: R | BaseException
            try:
                result = await self._apply(item.stream_seq, item.envelope.message)
            except self._outcomes as refused:
                result = refused
            await self._advance(item.stream_seq, result)

    async def _advance(self, seq: int, result: R | BaseException) -> None:
        async with self._progress:
            self.applied_seq = seq
            self._results[seq] = result
            while len(self._results) > KEEP_RESULTS:
                self._results.popitem(last=False)
            self._progress.notify_all()

    async def write(self, subject: str, message: Message, *, msg_id: str = "", timeout: float = 10.0) -> R:
        """Store `message` on the stream, wait until this replica applied it, and return the apply's answer.

        `msg_id` de-duplicates a retried write (the stream keeps the first; its answer is returned).
        Raises what the apply raised among `outcomes`; `ReplicaBehindError` (retryable) when the
        stream did not take the write, or this replica did not apply it within `timeout` (it is
        stored: every replica applies it); `PayloadTooLargeError` when it cannot be sent at all.
        """
        try:
            ack = await self._bus.js_publish(subject, message, headers=Headers(msg_id=msg_id) if msg_id else None)
        except PayloadTooLargeError:
            raise
        except BusError as exc:
            # The broker is away or the stream is electing a leader: nothing was taken, or a
            # retry with the same `msg_id` is stored once. Either way the caller may try again.
            msg = f"{self.consumer.stream} did not take the write ({exc}); try again"
            raise ReplicaBehindError(msg) from exc
        result = await self._result_of(ack.seq, timeout)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _result_of(self, seq: int, timeout: float) -> R | BaseException:
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self.applied_seq >= seq)
        except TimeoutError as exc:
            msg = f"write {seq} of {self.consumer.stream} is stored but this replica has not applied it yet"
            raise ReplicaBehindError(msg) from exc
        if seq not in self._results:
            # Applied by an earlier process on this volume, or pushed out by a larger burst: the
            # write took effect, only its detailed answer is gone.
            msg = f"write {seq} of {self.consumer.stream} was applied, but its answer is no longer kept"
            raise ReplicaBehindError(msg)
        return self._results[seq]

    async def caught_up(self) -> None:
        """Wait until this replica applied every message the stream held when this was called."""
        await wait_caught_up(self._bus, self.consumer, timeout=self._barrier_timeout)


def replica_consumer(stream: str, filter_subject: str, replica: str, *, batch_fetch: bool) -> ConsumerSpec:
    """The durable consumer through which replica `replica` applies the whole of `stream`."""
    return ConsumerSpec(
        stream=stream,
        durable=replica,
        filter_subject=filter_subject,
        batch_fetch=batch_fetch,
        inactive_threshold_seconds=GONE_REPLICA_SECONDS,
    )


async def wait_caught_up(bus: Bus, consumer: ConsumerSpec, *, timeout: float) -> None:
    """Wait until `consumer` has handled every message its stream held when this was called.

    Raises `ReplicaBehindError` after `timeout` seconds (the replica is stuck or far behind:
    answering now could miss acknowledged writes).
    """
    try:
        async with asyncio.timeout(timeout):
            # Under a steady stream of writes "nothing pending" may never be seen: the target is
            # what the stream held at the call, and the ack floor passing it is enough.
            target = await bus.stream_last_seq(consumer.stream)
            # The state is the server's: there is no local event to wait on, only the answer to poll.
            while not (await bus.consumer_state(consumer.stream, consumer.durable)).handled_through(target):  # noqa: ASYNC110
                await asyncio.sleep(BARRIER_POLL)
    except TimeoutError as exc:
        msg = f"this replica is behind {consumer.stream}: try again"
        raise ReplicaBehindError(msg) from exc
