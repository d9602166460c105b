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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.memory.v1.memory_pb2 import ConversationClosed

log = logging.getLogger("atmosphere.ingress")

Key = tuple[str, str]
"""(agent, conversation id)."""

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

Outcome = Literal["idle", "disconnect", "ended", "recorded", "unrecorded", "wait"]


def record_key(agent: str, conversation_id: str) -> str:
    """The conversation's key in the bucket (ids hold characters a KV key may not)."""
    return hashlib.sha256(f"{agent}\0{conversation_id}".encode()).hexdigest()[:32]


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass(frozen=True, slots=True)
class _Record:
    """One conversation as every replica sees it (stored as a `Struct`)."""

    agent: str
    conversation_id: str
    principal: Principal
    owner: str
    """The replica that saw the newest activity: it ends the conversation when it goes idle."""
    seen_ms: int
    """That activity (a prompt, a socket, a holder's refresh), epoch ms."""
    holders: dict[str, int] = field(default_factory=dict)
    """Replica → when it last said it holds a WebSocket of the conversation (epoch ms)."""
    closed_ms: int = 0
    """When the stretch was announced (0: open). Activity up to then is covered."""

    def to_struct(self) -> Struct:
        value = Struct()
        value.update(
            {
                "agent": self.agent,
                "conversation_id": self.conversation_id,
                "principal": json_format.MessageToDict(self.principal, preserving_proto_field_name=True),
                "owner": self.owner,
                "seen_ms": self.seen_ms,
                "holders": dict(self.holders),
                "closed_ms": self.closed_ms,
            }
        )
        return value

    @classmethod
    def of(cls, value: Struct | None) -> _Record | None:
        """The record stored, or None when there is none or it cannot be read (then overwritten)."""
        if value is None:
            return None
        try:
            fields = json_format.MessageToDict(value)
            principal = json_format.ParseDict(fields["principal"], Principal(), ignore_unknown_fields=True)
            return cls(
                agent=str(fields["agent"]),
                conversation_id=str(fields["conversation_id"]),
                principal=principal,
                owner=str(fields["owner"]),
                seen_ms=int(fields["seen_ms"]),
                holders={str(k): int(v) for k, v in dict(fields["holders"]).items()},
                closed_ms=int(fields["closed_ms"]),
            )
        except (KeyError, TypeError, ValueError, json_format.ParseError):
            return None


@dataclass(eq=False)
class _Conversation:
    """What this replica knows of one conversation it saw."""

    key: Key
    principal: Principal
    last_active: float
    """The last prompt here, or socket opened here (seconds of the tracker's clock)."""
    version: int = 0
    """Counts local events: a record decision made before the newest event is not final."""
    sockets: int = 0
    left: int = 0
    """The version at which the last socket here left, until the record took it (0: none)."""
    recorded: float = 0.0
    """The newest local activity the record already covers (0: this stretch is not in it)."""
    attempted: float | None = None
    """When this replica last wrote (or tried to write) the record, for the debounce."""
    refreshed: float = 0.0
    """When the record last took this replica's socket mark (0: not marked)."""
    due: float = 0.0
    """When the sweep next reads the record: the earliest this stretch can end."""
    reopens: bool = False
    """This replica announced the stretch before this activity: a tombstone found is older."""


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
        self._open: dict[Key, _Conversation] = {}
        self._dirty: dict[Key, None] = {}
        """Conversations with something to write (insertion-ordered set)."""
        self._evicted: dict[Key, _Conversation] = {}
        self._wake = asyncio.Event()
        self._busy = asyncio.Lock()
        self._shared = True
        """Whether the bucket answered last time (its outages are logged once)."""
        self._publishing: set[asyncio.Task[None]] = set()

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

    def _active(self, key: Key, principal: Principal) -> _Conversation:
        entry = self._open.get(key)
        now = self._clock()
        if entry is None:
            # Alive again before its eviction reached the bucket: nothing to announce for it.
            self._evicted.pop(key, None)
            if len(self._open) >= self._max_open:
                self._evict(min(self._open.values(), key=lambda e: e.last_active))
            entry = self._open[key] = _Conversation(key, principal, now, due=now + self._idle_timeout)
        entry.principal = principal
        entry.last_active = max(entry.last_active, now)
        entry.version += 1
        self._mark(entry, urgent=entry.recorded == 0)
        return entry

    def _mark(self, entry: _Conversation, *, urgent: bool) -> None:
        self._dirty[entry.key] = None
        if urgent:
            self._wake.set()

    def _evict(self, entry: _Conversation) -> None:
        """Bounded: the stalest conversation is let go early rather than the table growing forever."""
        del self._open[entry.key]
        self._dirty.pop(entry.key, None)
        if self._shared and len(self._evicted) < EVICTION_BACKLOG:
            self._evicted[entry.key] = entry
            self._wake.set()
        else:
            self._announce(entry.key, entry.principal, "idle")

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
        writes: list[_Conversation] = []
        for key in list(self._dirty):
            entry = self._open.get(key)
            wanted = entry is not None and self._wants_write(entry)
            if entry is None or not wanted:
                del self._dirty[key]
            elif self._write_due(entry, now):
                del self._dirty[key]
                writes.append(entry)
        await _gathered(self._write(e) for e in writes)

    def _wants_write(self, entry: _Conversation) -> bool:
        return bool(entry.left) or entry.sockets > 0 or entry.last_active > entry.recorded

    def _write_due(self, entry: _Conversation, now: float) -> bool:
        first = entry.attempted is None
        urgent = first or bool(entry.left) or (entry.sockets > 0 and not entry.refreshed)
        return urgent or now - (entry.attempted or 0) >= self._debounce

    async def _write(self, entry: _Conversation) -> int:
        """Put this replica's view of the conversation into its record."""
        now = self._clock()
        version, active = entry.version, entry.last_active
        leaving, holding = bool(entry.left) and not entry.sockets, entry.sockets > 0
        entry.attempted = now
        decided: list[tuple[Outcome, _Record | None]] = []

        def change(current: Struct | None) -> Struct | None:
            outcome, record = self._written(entry, _Record.of(current), now, active, leaving=leaving, holding=holding)
            decided[:] = [(outcome, record)]
            return current if outcome in ("ended", "wait") or record is None else record.to_struct()

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._unshared(exc)
            outcome, record = ("disconnect", None) if leaving else ("wait", None)  # as one instance decides
        else:
            self._shared_again()
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
        entry.due = self._due(record)
        return 0

    def _written(
        self, entry: _Conversation, record: _Record | None, now: float, active: float, *, leaving: bool, holding: bool
    ) -> tuple[Outcome, _Record | None]:
        """What the record becomes with this replica's news (`ended`: someone announced it already)."""
        me, now_ms, active_ms = self.instance, _ms(now), _ms(active)
        current = record if record is not None and not record.closed_ms else None
        if leaving and not self._other_holders(current, now_ms):
            seen = max(current.seen_ms if current else 0, active_ms)
            closed = self._tombstone(entry, current, seen, now_ms)
            return "disconnect", closed
        # In a tie the stretch stays open: one announcement too many beats one lost.
        covered = record is not None and active_ms < record.closed_ms and not entry.reopens
        if covered and not holding:
            return "ended", record  # announced (by any replica) after everything seen here
        holders = self._live_holders(current, now_ms)
        holders.pop(me, None)
        if holding:
            holders[me] = now_ms
        seen = max(current.seen_ms if current else 0, active_ms, now_ms if holding else 0)
        owner = me if current is None or seen > current.seen_ms else current.owner
        new = _Record(entry.key[0], entry.key[1], entry.principal, owner, seen, holders)
        if current is not None and (current.owner, current.seen_ms, current.holders) == (owner, seen, holders):
            return "wait", current  # the record already says all this
        return "recorded", new

    async def _check(self, entry: _Conversation) -> int:
        """Read the record of a stretch that may be over; end it if this replica is the one to."""
        now = self._clock()
        version, active = entry.version, entry.last_active
        decided: list[tuple[Outcome, _Record | None]] = []

        def change(current: Struct | None) -> Struct | None:
            outcome, record = self._checked(entry, _Record.of(current), now, active)
            decided[:] = [(outcome, record)]
            return record.to_struct() if outcome == "idle" and record is not None else current

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._unshared(exc)
            if now - active >= self._idle_timeout:
                return self._end(entry, version, entry.principal, "idle")
            entry.due = active + self._idle_timeout
            return 0
        self._shared_again()
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
            entry.due = max(self._due(record), now + min(self._refresh, self._grace))
        return 0

    def _checked(
        self, entry: _Conversation, record: _Record | None, now: float, active: float
    ) -> tuple[Outcome, _Record | None]:
        """Whether the stretch is over and this replica ends it (`idle`, with the tombstone)."""
        now_ms, active_ms = _ms(now), _ms(active)
        if record is None or record.closed_ms:
            return self._checked_closed(entry, record, now, active)
        # A socket held anywhere keeps `seen_ms` fresh (its holder refreshes it): no idle while it lives.
        if active_ms > record.seen_ms:
            return "unrecorded", None  # a prompt here the record does not have yet
        age = now_ms - record.seen_ms
        ends_it = record.owner == self.instance or age >= _ms(self._idle_timeout + self._grace)
        if age >= _ms(self._idle_timeout) and ends_it:
            return "idle", self._tombstone(entry, record, record.seen_ms, now_ms)
        return "wait", record

    def _checked_closed(
        self, entry: _Conversation, record: _Record | None, now: float, active: float
    ) -> tuple[Outcome, _Record | None]:
        """`_checked` when the record is a tombstone, or missing."""
        if record is not None:
            newer = _ms(active) >= record.closed_ms or entry.reopens
            return ("unrecorded", None) if newer else ("ended", record)
        # Never recorded (the bucket was away) or expired: this replica's own view decides.
        if now - active >= self._idle_timeout:
            return "idle", self._tombstone(entry, None, _ms(active), _ms(now))
        return "unrecorded", None

    async def _let_go(self, entry: _Conversation) -> int:
        """An evicted conversation: announced now if this replica is the one that would have."""
        now = self._clock()
        decided: list[_Record | None] = []

        def change(current: Struct | None) -> Struct | None:
            record = _Record.of(current)
            active_ms, now_ms = _ms(entry.last_active), _ms(now)
            if record is not None and record.closed_ms:
                ends_it = active_ms >= record.closed_ms
            elif record is not None:
                owns = record.owner == self.instance or active_ms > record.seen_ms
                ends_it = owns and not self._other_holders(record, now_ms)
            else:
                ends_it = True
            decided[:] = [self._tombstone(entry, record, active_ms, now_ms) if ends_it else None]
            return decided[0].to_struct() if decided[0] is not None else current

        try:
            await self._bus.kv_update(BUCKET, record_key(*entry.key), Struct, change)
        except BusError as exc:
            self._unshared(exc)
            self._announce(entry.key, entry.principal, "idle")
            return 1
        self._shared_again()
        if decided and decided[0] is not None:
            self._announce(entry.key, decided[0].principal, "idle")
            return 1
        return 0

    # -- decisions shared by the three -----------------------------------------------------------

    def _live_holders(self, record: _Record | None, now_ms: int) -> dict[str, int]:
        """The replicas whose socket mark is recent enough to believe (a dead one stops refreshing)."""
        if record is None:
            return {}
        window = _ms(self._refresh + self._grace)
        return {who: at for who, at in record.holders.items() if now_ms - at < window}

    def _other_holders(self, record: _Record | None, now_ms: int) -> bool:
        return any(who != self.instance for who in self._live_holders(record, now_ms))

    def _tombstone(self, entry: _Conversation, record: _Record | None, seen_ms: int, now_ms: int) -> _Record:
        principal = record.principal if record is not None else entry.principal
        return _Record(entry.key[0], entry.key[1], principal, self.instance, seen_ms, {}, closed_ms=now_ms)

    def _due(self, record: _Record) -> float:
        """When the stretch can end at the earliest: this replica ends it later if it is not the owner."""
        late = 0.0 if record.owner == self.instance else self._grace
        return record.seen_ms / 1000 + self._idle_timeout + late

    def _end(self, entry: _Conversation, version: int, principal: Principal, reason: str) -> int:
        """This replica announces the stretch."""
        self._announce(entry.key, principal, reason)
        self._drop(entry, version)
        entry.reopens = True
        return 1

    def _drop(self, entry: _Conversation, version: int) -> int:
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

    def _announce(self, key: Key, principal: Principal, reason: str) -> None:
        closed = ConversationClosed(agent=key[0], conversation_id=key[1], principal=principal, reason=reason)
        task = asyncio.get_running_loop().create_task(self._publish(closed))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, closed: ConversationClosed) -> None:
        try:
            await self._bus.publish(subjects.conversation_closed(), closed)
        except BusError as exc:
            log.warning("could not announce the end of conversation %s (%s)", closed.conversation_id, exc)

    def _unshared(self, exc: BusError) -> None:
        if self._shared:
            self._shared = False
            log.warning(
                "conversation tracking is per instance while bucket %s does not answer (%s): "
                "another ingress replica may announce the same conversation again",
                BUCKET,
                exc,
            )

    def _shared_again(self) -> None:
        if not self._shared:
            self._shared = True
            log.info("bucket %s answers again: conversations are tracked across replicas", BUCKET)

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
