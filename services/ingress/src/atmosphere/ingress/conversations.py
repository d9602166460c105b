"""When a conversation ends, announced once however many ingress replicas saw it.

A conversation ends when its last WebSocket leaves, or when nobody spoke in it for
`idle_timeout`; ingress then announces it on `atmo.conv.closed` (dispatch extracts long-term
facts from it). A new prompt in an announced conversation opens it again: a new stretch.

Replicas behind one load balancer share one record per conversation in the JetStream KV
bucket `ATMO_CONVERSATIONS` (replicated like every bucket): the replica that saw its newest
activity (the owner) and when (epoch ms), which replicas hold a WebSocket of it and when each
last said so, the principal, and once it is announced, when (a tombstone). Every change is a
compare-and-set (`Bus.kv_update`), so of two replicas that both decide to end a stretch, only
the one whose write turns the record into a tombstone announces.

What is guaranteed, while the bucket answers:
- One announcement per stretch. Every other replica that saw the stretch finds the tombstone
  and lets its own copy go silently.
- Idle: the owner announces `idle_timeout` after the newest recorded activity, unless some
  replica holds a live WebSocket of the conversation. For prompts a replica writes a record
  at most once per `debounce` seconds; the newest prompt is written when the wait ends, not
  dropped, so the recorded activity lags the real one by seconds, against an idle timeout of
  many minutes.
- Disconnect: the replica whose last socket leaves announces, unless another replica still
  holds one. A replica holding a socket refreshes its mark (and the activity time) every
  `idle_timeout / 4` (at most 5 minutes), so a socket held anywhere keeps the conversation open
  everywhere.
- A dead owner: any other replica that saw the stretch announces it, claiming the record
  first, once the record is `idle_timeout + grace` old (no prompt, no refresh). A conversation
  that only the dead replica saw is not announced (as when the one instance dies).
- Bucket unavailable: prompts never wait for it (writes run in the background); each replica
  decides alone, as one instance did, and logs it once per outage. Announcements may then
  repeat across replicas: at least once, never lost while a replica that saw it lives.
- Memory: at most `max_open` conversations per instance; past it the stalest is let go early
  (announced if this replica owns it, as a single instance announced it).

Replicas compare epoch times: clock skew between them eats into `grace`.

What a record holds, and what it becomes given one replica's news, is `conversation_records.py`
(no I/O); the tracker here reads and writes the records and announces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from google.protobuf.struct_pb2 import Struct

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed
from atmosphere.ingress.conversation_records import Conversation, Key, Outcome, Record, RecordRules, record_key

log = logging.getLogger("atmosphere.ingress")

BUCKET = subjects.CONVERSATIONS_BUCKET
DEBOUNCE = 5.0
"""Seconds between two writes of one conversation's record by one replica, for prompts."""
GRACE = 60.0
"""How much older than `idle_timeout` a record must be before a replica that is not its owner
ends it: the owner's refresh or announcement may be late (a slow write, skewed clocks)."""
MAX_REFRESH = 300.0
"""A replica holding a socket rewrites its mark at least this often."""
EVICTION_BACKLOG = 1024
"""Conversations let go (past `max_open`) waiting for the bucket; past it they are announced at once."""
BATCH = 64
"""Records read or written at once by one sweep."""
SHUTDOWN_FLUSH = 5.0
"""Seconds a stopping sweeper keeps writing what is left (the last sockets' departures)."""


class ConversationTracker:
    """The conversations with recent activity on this ingress replica (bounded), shared through a bucket."""

    def __init__(
        self,
        bus: Bus,
        *,
        idle_timeout: float,
        max_open: int = 100_000,
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
        debounce: float = DEBOUNCE,
        grace: float = GRACE,
    ) -> None:
        """Announce conversations idle for `idle_timeout` seconds; track at most `max_open`.

        `instance` names this replica in the records (default: host, pid and a random part);
        `clock` gives epoch seconds, comparable across replicas.
        """
        self._bus = bus
        self._idle_timeout = idle_timeout
        self._max_open = max_open
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._clock = clock
        self._debounce = debounce
        self._grace = grace
        self._refresh = min(idle_timeout / 4, MAX_REFRESH)
        self._rules = RecordRules(self.instance, idle_timeout, grace, self._refresh)
        self._open: dict[Key, Conversation] = {}
        self._dirty: dict[Key, None] = {}
        """Conversations with something to write (insertion-ordered set)."""
        self._evicted: dict[Key, Conversation] = {}
        self._wake = asyncio.Event()
        self._busy = asyncio.Lock()
        self._bucket = _BucketHealth()
        self._announcer = _Announcer(bus)

    def __len__(self) -> int:
        return len(self._open)

    # -- what the routes report (never waits for the bucket) ---------------------------------

    def touch(self, agent: str, conversation_id: str, principal: Principal) -> None:
        """A prompt arrived in this conversation."""
        self._active((agent, conversation_id), principal)

    def socket_opened(self, agent: str, conversation_id: str, principal: Principal) -> None:
        """A WebSocket now serves this conversation."""
        entry = self._active((agent, conversation_id), principal)
        entry.sockets += 1
        if entry.sockets == 1:
            self._mark(entry, urgent=True)  # the record must say a socket is held here

    def socket_closed(self, agent: str, conversation_id: str) -> None:
        """A WebSocket of this conversation left; the last one to leave anywhere closes the conversation."""
        entry = self._open.get((agent, conversation_id))
        if entry is None or entry.sockets <= 0:
            return
        entry.sockets -= 1
        entry.version += 1
        if entry.sockets == 0:
            entry.left = entry.version
            self._mark(entry, urgent=True)

    def _active(self, key: Key, principal: Principal) -> Conversation:
        entry = self._open.get(key)
        now = self._clock()
        if entry is None:
            # Alive again before its eviction reached the bucket: nothing to announce for it.
            self._evicted.pop(key, None)
            if len(self._open) >= self._max_open:
                self._evict(min(self._open.values(), key=lambda e: e.last_active))
            entry = self._open[key] = Conversation(key, principal, now, due=now + self._idle_timeout)
        entry.principal = principal
        entry.last_active = max(entry.last_active, now)
        entry.version += 1
        self._mark(entry, urgent=entry.recorded == 0)
        return entry

    def _mark(self, entry: Conversation, *, urgent: bool) -> None:
        self._dirty[entry.key] = None
        if urgent:
            self._wake.set()

    def _evict(self, entry: Conversation) -> None:
        """Bounded: the stalest conversation is let go early rather than the table growing forever."""
        del self._open[entry.key]
        self._dirty.pop(entry.key, None)
        if self._bucket.answering and len(self._evicted) < EVICTION_BACKLOG:
            self._evicted[entry.key] = entry
            self._wake.set()
        else:
            self._announcer.announce(entry.key, entry.principal, "idle")

    # -- the background work: writing records, reading them when a stretch may end ------------

    async def flush(self) -> None:
        """Write the records that are due: socket changes and first prompts at once, others debounced."""
        async with self._busy:
            await self._flush()

    async def sweep(self) -> int:
        """Refresh held sockets, end the stretches that are over; how many this replica announced."""
        async with self._busy:
            now = self._clock()
            for entry in self._open.values():
                if entry.sockets and now - entry.refreshed >= self._refresh:
                    self._mark(entry, urgent=False)
            await self._flush()
            due = [
                e
                for e in self._open.values()
                if not e.sockets and not e.left and e.key not in self._dirty and e.due <= now
            ]
            announced = await _gathered(self._check(e) for e in due)
            await self._flush()
            return announced

    async def _flush(self) -> None:
        now = self._clock()
        # Evictions first: a write of the same key after them must find their tombstone.
        evicted, self._evicted = list(self._evicted.values()), {}
        await _gathered(self._let_go(e) for e in evicted)
        writes: list[Conversation] = []
        for key in list(self._dirty):
            entry = self._open.get(key)
            wanted = entry is not None and self._wants_write(entry)
            if entry is None or not wanted:
                del self._dirty[key]
            elif self._write_due(entry, now):
                del self._dirty[key]
                writes.append(entry)
        await _gathered(self._write(e) for e in writes)

    def _wants_write(self, entry: Conversation) -> bool:
        return bool(entry.left) or entry.sockets > 0 or entry.last_active > entry.recorded

    def _write_due(self, entry: Conversation, now: float) -> bool:
        first = entry.attempted is None
        urgent = first or bool(entry.left) or (entry.sockets > 0 and not entry.refreshed)
        return urgent or now - (entry.attempted or 0) >= self._debounce

    async def _write(self, entry: Conversation) -> int:
        """Put this replica's view of the conversation into its record."""
        now = self._clock()
        version, active = entry.version, entry.last_active
        leaving, holding = bool(entry.left) and not entry.sockets, entry.sockets > 0
        entry.attempted = now
        decided: list[tuple[Outcome, Record | None]] = []

        def change(current: Struct | None) -> Struct | None:
            outcome, record = self._rules.written(
                entry, Record.of(current), now, active, leaving=leaving, holding=holding
            )
            decided[:] = [(outcome, record)]
            return current if outcome in ("ended", "wait") or record is None else record.to_struct()

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._bucket.failed(exc)
            outcome, record = ("disconnect", None) if leaving else ("wait", None)  # as one instance decides
        else:
            self._bucket.answered()
            [(outcome, record)] = decided
        if entry.left <= version:
            entry.left = 0  # taken; a socket that left since is news for the next write
        if outcome == "disconnect":
            return self._end(entry, version, entry.principal, "disconnect")
        if outcome == "ended":
            return self._drop(entry, version)
        if record is None:
            return 0  # not written: the sweep reads the record again (and decides alone if it cannot)
        entry.recorded = max(entry.recorded, active)
        entry.reopens = False
        entry.refreshed = now if holding else 0.0
        entry.due = self._rules.due(record)
        return 0

    async def _check(self, entry: Conversation) -> int:
        """Read the record of a stretch that may be over; end it if this replica is the one to."""
        now = self._clock()
        version, active = entry.version, entry.last_active
        decided: list[tuple[Outcome, Record | None]] = []

        def change(current: Struct | None) -> Struct | None:
            outcome, record = self._rules.checked(entry, Record.of(current), now, active)
            decided[:] = [(outcome, record)]
            return record.to_struct() if outcome == "idle" and record is not None else current

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._bucket.failed(exc)
            if now - active >= self._idle_timeout:
                return self._end(entry, version, entry.principal, "idle")
            entry.due = active + self._idle_timeout
            return 0
        self._bucket.answered()
        [(outcome, record)] = decided
        if outcome == "idle":
            assert record is not None
            return self._end(entry, version, record.principal, "idle")
        if outcome == "ended":
            self._drop(entry, version)
        elif outcome == "unrecorded":
            entry.recorded = 0.0
            entry.due = active + self._idle_timeout
            self._mark(entry, urgent=True)
        else:
            assert record is not None
            entry.due = max(self._rules.due(record), now + min(self._refresh, self._grace))
        return 0

    async def _let_go(self, entry: Conversation) -> int:
        """An evicted conversation: announced now if this replica is the one that would have."""
        now = self._clock()
        decided: list[Record | None] = []

        def change(current: Struct | None) -> Struct | None:
            decided[:] = [self._rules.let_go(entry, Record.of(current), now)]
            return decided[0].to_struct() if decided[0] is not None else current

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._bucket.failed(exc)
            self._announcer.announce(entry.key, entry.principal, "idle")
            return 1
        self._bucket.answered()
        if decided and decided[0] is not None:
            self._announcer.announce(entry.key, decided[0].principal, "idle")
            return 1
        return 0

    def _end(self, entry: Conversation, version: int, principal: Principal, reason: str) -> int:
        """This replica announces the stretch."""
        self._announcer.announce(entry.key, principal, reason)
        self._drop(entry, version)
        entry.reopens = True
        return 1

    def _drop(self, entry: Conversation, version: int) -> int:
        """The stretch is over here; what happened meanwhile (a new prompt, a socket) starts the next."""
        if entry.version == version and not entry.sockets:
            if self._open.get(entry.key) is entry:
                del self._open[entry.key]
                self._dirty.pop(entry.key, None)
            return 0
        entry.recorded, entry.refreshed, entry.attempted = 0.0, 0.0, None
        entry.due = entry.last_active + self._idle_timeout
        self._mark(entry, urgent=True)
        return 0

    async def run_sweeper(self, stop: asyncio.Event, *, every: float = 30.0) -> None:
        """Write records and sweep until `stop` is set; then write what is left, briefly."""
        every = min(every, self._refresh)  # held sockets are refreshed by the sweep
        tick = min(self._debounce, every)
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + every
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stopped.done():
                woken = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({stopped, woken}, timeout=tick, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                self._wake.clear()
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + every
                    await self.sweep()
                else:
                    await self.flush()
        finally:
            stopped.cancel()
        # The sockets that closed as the server stopped: their departures are announced now.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SHUTDOWN_FLUSH):
                await self.flush()


class _Announcer:
    """Announces the end of conversations on `atmo.conv.closed`, in the background: nothing waits for it."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._publishing: set[asyncio.Task[None]] = set()
        """Kept until done: the loop holds only weak references to its tasks."""

    def announce(self, key: Key, principal: Principal, reason: str) -> None:
        closed = ConversationClosed(agent=key[0], conversation_id=key[1], principal=principal, reason=reason)
        task = asyncio.get_running_loop().create_task(self._publish(closed))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, closed: ConversationClosed) -> None:
        try:
            await self._bus.publish(subjects.conversation_closed(), closed)
        except BusError as exc:
            log.warning("could not announce the end of conversation %s (%s)", closed.conversation_id, exc)


class _BucketHealth:
    """Whether the bucket answered last time; an outage and the recovery are each logged once."""

    def __init__(self) -> None:
        self.answering = True

    def failed(self, exc: BusError) -> None:
        if self.answering:
            self.answering = False
            log.warning(
                "conversation tracking is per instance while bucket %s does not answer (%s): "
                "another ingress replica may announce the same conversation again",
                BUCKET,
                exc,
            )

    def answered(self) -> None:
        if not self.answering:
            self.answering = True
            log.info("bucket %s answers again: conversations are tracked across replicas", BUCKET)


async def _gathered(jobs: Iterable[Coroutine[Any, Any, int]]) -> int:
    """Run `jobs` (each on a different conversation) `BATCH` at a time; the sum of their counts."""
    total = 0
    batch: list[Coroutine[Any, Any, int]] = []
    for job in jobs:
        batch.append(job)
        if len(batch) == BATCH:
            total += sum(await asyncio.gather(*batch))
            batch = []
    if batch:
        total += sum(await asyncio.gather(*batch))
    return total
