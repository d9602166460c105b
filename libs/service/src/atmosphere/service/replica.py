"""One replica's copy of a replicated stream: how N replicas of a stateful service never split state.

A JetStream stream (replicated by the NATS cluster) is the store of record. Every replica reads
the whole stream and applies every message, in stream order, to its own store (SQLite by
default): all replicas hold the same state, each a moment behind the stream at most. A write is
acknowledged once the stream holds it *and* this replica applied it; a read first waits until
this replica applied everything the stream held when the read began, so whichever replica
answers, it answers with every write acknowledged before the read — also after the replica
that took the write died.

A replica reads by direct get (`Bus.read_stream`) and keeps how far it applied beside its data
(`ReplicaPosition`): it holds no consumer on the broker, so its login needs no right to create
one (whoever may create a consumer chooses where it delivers: `atmosphere.bus.permissions`). A
replica that restarts on the same volume goes on where it stopped; a new volume is a new
replica that applies the stream from its start. It hears of new messages by polling the
stream's last sequence and, where the writers are its own service, by a subscription to the
stream's subject that wakes it at once (`doorbell`). How far it is behind is a gauge
(`replica_metrics`), set from the stream's last sequence it reads at every look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

from google.protobuf.empty_pb2 import Empty
from google.protobuf.message import Message

from atmosphere.bus import Bus, BusError, Envelope, Headers, PayloadTooLargeError, PublishAck, Subscription, WorkItem
from atmosphere.bus.errors import ReplicaBehindError
from atmosphere.service import replica_metrics
from atmosphere.service.tasks import stop_tasks

M = TypeVar("M", bound=Message)
R = TypeVar("R")

log = logging.getLogger("atmosphere.service.replica")

KEEP_RESULTS = 4096
"""Results of recent applies kept for the writers waiting on them (a writer asks right after
its write is stored, so only a burst larger than this could miss its own)."""
POLL_INTERVAL = 1.0
"""Seconds between two looks at the stream's newest sequence when nothing woke the replica."""
RETRY_DELAY = 1.0
"""Seconds before reading again after the broker did not answer, or an apply failed."""
EAGER_LOOKS = 5
"""Looks at the stream, 5 ms apart and doubling, after a doorbell that found nothing new yet: a
subscriber may hear of a message a moment before the stream's leader stored it."""


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


SAVE_INTERVAL = 1.0
"""Seconds between two writes of a replica's position while it applies a steady stream: a replica
killed outright applies at most about this much again on restart (applies are at least once)."""


class ReplicaPosition:
    """How far this replica applied its stream (a stream sequence), kept in `<data dir>/<service>.applied`.

    Saved after an applied batch at once when none was for `save_interval` seconds, else by a timer
    at the end of the interval, and on `flush` (a stopping replica): one small file write a second
    under load rather than one per batch (a run's writes are several batches on each replicated
    store). A replica killed before a save applies those batches again on restart: applies are at
    least once, and must tolerate a repeat.
    """

    def __init__(self, data_dir: Path | None, service: str, *, save_interval: float = SAVE_INTERVAL) -> None:
        """The position of `service`'s replica whose data is in `data_dir` (None: kept in memory only).

        In memory, a restart applies the stream again from its start: for a test's replica.
        """
        self._path = None if data_dir is None else data_dir / f"{service}.applied"
        self._interval = save_interval
        self._saved = 0
        """Applied through here."""
        self._written = 0
        """What the file says."""
        self._timer: asyncio.TimerHandle | None = None

    def load(self) -> int:
        """The sequence applied through (0: nothing yet, a new replica)."""
        if self._path is None:
            return self._saved
        try:
            text = self._path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        try:
            self._saved = self._written = int(text)
        except ValueError:
            log.warning("%s does not hold a sequence; applying the stream from its start", self._path)
            return 0
        return self._saved

    def save(self, seq: int) -> None:
        """Record that everything up to `seq` is applied (written now, or within `save_interval`)."""
        if seq == self._saved:
            return
        self._saved = seq
        if self._path is None or self._timer is not None:
            return  # in memory only, or the timer writes it
        self._write()
        with contextlib.suppress(RuntimeError):  # no loop (a tool, a test): every save is written at once
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._due)

    def flush(self) -> None:
        """Write what is applied now if the file says less (a replica that stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._path is not None and self._saved != self._written:
            self._write()

    def _due(self) -> None:
        self._timer = None
        if self._saved != self._written:
            self._write()
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._due)

    def _write(self) -> None:
        """Atomically: a crash leaves the old position or the new."""
        assert self._path is not None
        seq = self._saved
        if not self._written:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        temp = self._path.with_suffix(f".{os.getpid()}.tmp")
        temp.write_text(f"{seq}\n", encoding="ascii")
        os.replace(temp, self._path)
        self._written = seq


class StreamReplica(Generic[M]):
    """Read a stream in order and hand every message of `filter_subject` to `apply_batch`, once each.

    `applied_seq` says how far: every message of the filter up to it is applied (the messages
    the filter leaves out count as passed). A batch that fails is read and applied again after
    `RETRY_DELAY` (a failure of this replica's store); an undecodable message is left out.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        filter_subject: str,
        message_type: type[M],
        apply_batch: Callable[[list[WorkItem[M]]], Awaitable[None]],
        position: ReplicaPosition,
        max_batch: int = 1,
        linger: float = 0.0,
        doorbell: bool = False,
        poll_interval: float = POLL_INTERVAL,
        barrier_timeout: float = 10.0,
    ) -> None:
        """Apply `stream`'s messages on `filter_subject` from where `position` says.

        `max_batch=1` hands each message over the moment it is read (a writer waits for its
        own); a larger batch suits a high-volume stream nobody waits on (recorded events), and
        `linger` then waits after a short batch so that the next one is fuller. With `doorbell`
        the replica subscribes to `filter_subject` and reads as soon as anything is published
        there (its login must be allowed to); else it looks every `poll_interval` seconds.
        """
        self.stream = stream
        self._bus = bus
        self._filter = filter_subject
        self._type = message_type
        self._apply_batch = apply_batch
        self._position = position
        self._max_batch = max(1, max_batch)
        self._linger = linger
        self._doorbell = doorbell
        self._poll = poll_interval
        self._barrier_timeout = barrier_timeout
        self.applied_seq = position.load()
        """Every message of the filter up to this stream sequence is applied here."""
        self._newest = self.applied_seq
        """The stream's last sequence at the last look (what the lag is measured against)."""
        self._lag = replica_metrics.LAG.labels(stream)
        self._applied = replica_metrics.APPLIED.labels(stream)
        self._progress = asyncio.Condition()
        self._wake = asyncio.Event()
        self._eager = 0
        self._known_end = self.applied_seq
        """A sequence the stream's leader said it stored (a write's acknowledgement, a look): read
        through it without asking the stream where it ends."""
        self._own_rings = 0
        """Doorbell rings still to come for this process's own writes, which `reach` reads
        through without a look (a look is a stream info: the broker's dearest read)."""
        self._look = True
        """Whether the next read asks where the stream ends (at start, on a ring of another
        writer, a wake, a poll); else it reads through `_known_end`."""
        self._own: dict[int, Envelope[M]] = {}
        """Messages this process wrote, by the sequence the stream's leader stored each at: a
        run of them right after `applied_seq` is applied as written, not read back."""

    @contextlib.asynccontextmanager
    async def applying(self) -> AsyncIterator[None]:
        """Apply the stream while the context is open."""
        async with contextlib.AsyncExitStack() as stack:
            if self._doorbell:
                bell = await stack.enter_async_context(self._bus.subscribe(self._filter, Empty))
                ringing = asyncio.create_task(self._ring(bell), name=f"{self.stream}-doorbell")
                stack.callback(ringing.cancel)
            # Last out: the position of everything applied is written once the reading stopped.
            stack.callback(self._position.flush)
            reading = asyncio.create_task(self._read_loop(), name=f"{self.stream}-replica")
            # Stopped and waited for: an apply in progress ends before the store closes.
            stack.push_async_callback(stop_tasks, reading)  # cancelled until it ends (see tasks.py)
            yield

    async def _ring(self, bell: Subscription[Empty]) -> None:
        async for _ in bell:
            if self._own_rings > 0:
                # Taken for an own write's ring (its `reach` reads through its sequence). Were it
                # another writer's, the own ring it stands for comes a moment later and looks.
                self._own_rings -= 1
                continue
            self.wake(eager=True)

    def expect_own_ring(self) -> None:
        """This process is about to write to the filter: its doorbell ring needs no look."""
        self._own_rings += 1

    def no_own_ring(self) -> None:
        """The write announced by `expect_own_ring` may not have been stored: its ring is not counted on."""
        self._own_rings = max(0, self._own_rings - 1)

    def stored_own(self, seq: int, envelope: Envelope[M] | None) -> None:
        """This process's message is stored at `seq` (its acknowledgement said so): apply it soon.

        Applied as written when every message before it is applied here: the stream holds at
        `seq` exactly what was written, so reading it back (a direct get, its reply and the
        batch's end: three messages on the bus) would only return the same bytes. None: what
        the stream holds there is not known here (a repeat of an earlier write): it is read.
        """
        if envelope is not None and seq > self.applied_seq:
            self._own[seq] = envelope
        self._known_end = max(self._known_end, seq)
        self._wake.set()  # stored already: no look needed

    def wake(self, *, eager: bool = False) -> None:
        """Look at the stream now (`eager`: and a few times more while it shows nothing new)."""
        if eager:
            self._eager = EAGER_LOOKS
        self._look = True
        self._wake.set()

    async def _read_loop(self) -> None:
        failures = 0
        while True:
            try:
                if self._look:
                    self._look = False
                    newest = await self._stream_end()
                    if newest < self.applied_seq:
                        await self._restart(newest)
                    else:
                        newest = max(newest, self._known_end)  # an acknowledgement that came meanwhile
                else:
                    newest = self._known_end  # the leader's word already: no look needed
                    self._newest = max(self._newest, newest)
                if newest > self.applied_seq:
                    # What woke it is here: no more eager looks. Each look is a request to the
                    # stream's leader, so none follows a read at once either: what came during
                    # the read is read at the next ring, wake or poll, in one batch.
                    self._eager = 0
                    await self._read_through(newest)
                    if self._linger:
                        await asyncio.sleep(self._linger)
                failures = 0
            except BusError as exc:
                self._look = True
                replica_metrics.READ_FAILURES.labels(self.stream, "unreachable").inc()
                failures += 1
                # Once per outage, not every second of it: the broker restarting is no news.
                (log.warning if failures == 1 else log.debug)(
                    "%s: cannot read now (%s); trying again", self.stream, exc
                )
                await asyncio.sleep(RETRY_DELAY)
                continue
            except Exception:
                self._look = True
                replica_metrics.READ_FAILURES.labels(self.stream, "apply").inc()
                log.exception("%s: applying failed; reading it again in %gs", self.stream, RETRY_DELAY)
                await asyncio.sleep(RETRY_DELAY)
                continue
            await self._idle()

    async def _stream_end(self) -> int:
        """The stream's last sequence now; the lag is measured against it until the next look."""
        newest = await self._bus.stream_last_seq(self.stream)
        self._newest = newest
        self._lag.set(max(newest - self.applied_seq, 0))
        return newest

    async def _restart(self, newest: int) -> None:
        # A stream's sequences only grow, so one that ends before what was applied here was
        # made anew (deleted and provisioned again): its messages are all new to this replica.
        log.warning(
            "%s ends at %d but this replica applied through %d: the stream was made anew; applying it from its start",
            self.stream,
            newest,
            self.applied_seq,
        )
        self._position.save(0)
        self._known_end = newest  # an end heard of the old stream means nothing in this one
        self._own.clear()  # nor a sequence a write of the old one was stored at
        async with self._progress:
            self.applied_seq = 0

    async def _idle(self) -> None:
        """Wait for the next read: an eager look's moment, a wake, or the poll's (which looks)."""
        if self._eager > 0:
            self._eager -= 1
            await asyncio.sleep(0.005 * 2 ** (EAGER_LOOKS - 1 - self._eager))
            self._look = True
            return
        try:
            async with asyncio.timeout(self._poll):
                await self._wake.wait()
        except TimeoutError:
            self._look = True
        self._wake.clear()

    async def _read_through(self, newest: int) -> None:
        await self._apply_own(newest)
        if self.applied_seq >= newest:
            return
        batch: list[WorkItem[M]] = []
        read = self._bus.read_stream(self.stream, self._filter, self._type, after=self.applied_seq, through=newest)
        async with contextlib.aclosing(read) as messages:
            async for seq, envelope in messages:
                if envelope is not None:
                    batch.append(WorkItem(envelope=envelope, stream_seq=seq, delivered=1))
                if len(batch) >= self._max_batch:
                    await self._settle(batch, seq)
                    batch = []
        # Everything of the filter up to `newest` is read: what follows the last one is left out.
        await self._settle(batch, newest)
        for seq in [seq for seq in self._own if seq <= newest]:
            del self._own[seq]  # read from the stream instead

    async def _apply_own(self, newest: int) -> None:
        """Apply this process's own messages that follow `applied_seq` without a gap, as written.

        A gap is another writer's message (or one the filter leaves out): from there on the
        stream is read.
        """
        seq = self.applied_seq + 1
        batch: list[WorkItem[M]] = []
        while seq <= newest and seq in self._own:
            batch.append(WorkItem(envelope=self._own.pop(seq), stream_seq=seq, delivered=1))
            if len(batch) >= self._max_batch:
                await self._settle(batch, seq)
                batch = []
            seq += 1
        if batch:
            await self._settle(batch, seq - 1)

    async def _settle(self, batch: list[WorkItem[M]], through: int) -> None:
        if batch:
            await self._apply_batch(batch)
            self._applied.inc(len(batch))
        self._position.save(through)
        async with self._progress:
            self.applied_seq = max(self.applied_seq, through)
            self._progress.notify_all()
        self._lag.set(max(self._newest - self.applied_seq, 0))

    async def reach(self, seq: int, *, timeout: float) -> bool:
        """Wait until this replica applied through `seq`; False when it did not within `timeout`.

        `seq` is stored (the stream's leader said so: an acknowledgement, a look), so the
        replica reads through it without asking where the stream ends.
        """
        if self.applied_seq >= seq:
            return True
        self._known_end = max(self._known_end, seq)
        self._wake.set()  # stored already: read through it, no look needed
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self.applied_seq >= seq)
        except TimeoutError:
            return False
        return True

    async def caught_up(self) -> None:
        """Wait until this replica applied every message the stream held when this was called.

        Raises `ReplicaBehindError` (retryable) after the barrier timeout: the replica is stuck
        or far behind, and answering now could miss acknowledged writes.
        """
        try:
            # Under a steady stream of writes "nothing left" may never be seen: the target is
            # what the stream held at the call.
            target = await self._stream_end()
        except BusError as exc:
            msg = f"this replica cannot tell how far {self.stream} goes now: try again"
            raise ReplicaBehindError(msg) from exc
        if target < self.applied_seq:
            await self._restart(target)
        if not await self.reach(target, timeout=self._barrier_timeout):
            msg = f"this replica is behind {self.stream}: try again"
            raise ReplicaBehindError(msg)


class ReplicaLog(Generic[M, R]):
    """Apply every message of a stream to this replica's store; write through it; read behind it.

    `apply(seq, message)` changes the local store and returns the writer's answer. It must be
    deterministic (the same message gives every replica the same state: times and ids travel
    in the message). An exception of `outcomes` is an answer too (a refused write is refused on
    every replica); any other exception is a failure of this replica's store, retried.
    Applies are at least once: a replica killed between an apply and saving its position
    applies that message again on restart, so an apply should tolerate a repeat.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        filter_subject: str,
        position: ReplicaPosition,
        message_type: type[M],
        apply: Callable[[int, M], Awaitable[R]],
        outcomes: tuple[type[Exception], ...] = (),
        barrier_timeout: float = 10.0,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        """Apply `stream`'s messages on `filter_subject` from `position`, each the moment it is stored.

        The log's writers are the service's own replicas, so this one subscribes to
        `filter_subject` to hear of every write at once (`StreamReplica`'s doorbell), and
        looks at the stream every `poll_interval` seconds besides.
        """
        self._bus = bus
        self._apply = apply
        self._outcomes = outcomes
        self._results: OrderedDict[int, R | BaseException] = OrderedDict()
        self._reader = StreamReplica(
            bus,
            stream=stream,
            filter_subject=filter_subject,
            message_type=message_type,
            apply_batch=self._apply_batch,
            position=position,
            doorbell=True,
            poll_interval=poll_interval,
            barrier_timeout=barrier_timeout,
        )

    @property
    def stream(self) -> str:
        """The stream this replica applies."""
        return self._reader.stream

    @property
    def applied_seq(self) -> int:
        """The stream sequence through which this replica applied (0 before the first)."""
        return self._reader.applied_seq

    def applying(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Apply the stream while the context is open."""
        return self._reader.applying()

    async def _apply_batch(self, items: list[WorkItem[M]]) -> None:
        for item in items:
            result: R | BaseException
            try:
                result = await self._apply(item.stream_seq, item.envelope.message)
            except self._outcomes as refused:
                result = refused
            self._results[item.stream_seq] = result
            while len(self._results) > KEEP_RESULTS:
                self._results.popitem(last=False)

    async def write(self, subject: str, message: M, *, msg_id: str = "", timeout: float = 10.0) -> R:
        """Store `message` on the stream, wait until this replica applied it, and return the apply's answer.

        `msg_id` de-duplicates a retried write (the stream keeps the first; its answer is returned).
        Raises what the apply raised among `outcomes`; `ReplicaBehindError` (retryable) when the
        stream did not take the write, or this replica did not apply it within `timeout` (it is
        stored: every replica applies it); `PayloadTooLargeError` when it cannot be sent at all.
        """
        ack = await self.store(subject, message, msg_id=msg_id)
        if not await self._reader.reach(ack.seq, timeout=timeout):
            msg = f"write {ack.seq} of {self.stream} is stored but this replica has not applied it yet"
            raise ReplicaBehindError(msg)
        if ack.seq not in self._results:
            # Applied by an earlier process on this volume, or pushed out by a larger burst: the
            # write took effect, only its detailed answer is gone.
            msg = f"write {ack.seq} of {self.stream} was applied, but its answer is no longer kept"
            raise ReplicaBehindError(msg)
        result = self._results[ack.seq]
        if isinstance(result, BaseException):
            raise result
        return result

    async def store(self, subject: str, message: M, *, msg_id: str = "") -> PublishAck:
        """Store `message` on the stream; this replica applies it soon after, nobody waits for that.

        Raises as `write` does when the stream did not take it. Applied here as written (not read
        back) unless another writer's message came between; a repeat of an earlier `msg_id` is
        the earlier message, read from the stream.
        """
        headers = Headers(msg_id=msg_id)
        self._reader.expect_own_ring()
        try:
            ack = await self._bus.js_publish(subject, message, headers=headers if msg_id else None)
        except PayloadTooLargeError:
            self._reader.no_own_ring()
            raise
        except BusError as exc:
            self._reader.no_own_ring()
            # The broker is away or the stream is electing a leader: nothing was taken, or a
            # retry with the same `msg_id` is stored once. Either way the caller may try again.
            msg = f"{self.stream} did not take the write ({exc}); try again"
            raise ReplicaBehindError(msg) from exc
        except BaseException:  # cancelled: perhaps sent, perhaps not
            self._reader.no_own_ring()
            raise
        self._reader.stored_own(ack.seq, None if ack.duplicate else Envelope(subject, message, headers))
        return ack

    async def caught_up(self) -> None:
        """Wait until this replica applied every message the stream held when this was called."""
        await self._reader.caught_up()
