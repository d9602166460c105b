"""The effect journal of a durable run (Atmosphere's `EffectJournal`, on JetStream).

Every effect a run has on the world — its assembled input, each model round, each tool call,
each approval — is written `PENDING` before it happens and `COMMITTED` with its result after
(or `FAILED`). A worker that takes over a run whose worker died reads the journal and replays
every committed effect instead of doing it again: no second model call, no second tool
execution.

Storage: one subject per run (`atmo.journal.<run_id>`, stream `ATMO_JOURNAL`), so the journal
lives on the bus, replicated like the other streams, and outlives the worker that wrote it.
Every append names the sequence of the subject's newest record (JetStream's expected last
subject sequence): a worker that took the run over appends a `Lease` record first, after which
every write of the earlier holder is refused (`RunTakenOverError`) — one writer per run, fenced
by the broker rather than by clocks.

Without durable runs a run's first delivery neither reads nor writes its journal up front
(`unread`): the subject is empty, and the first write (a tool call's start marker) expects it
to be — so a run that calls no tool costs nothing here, and one taken over meanwhile is fenced
all the same.

Keys and digests follow Atmosphere's `EffectKeys`: SHA-256 hex over parts each followed by a
NUL byte; arguments in canonical JSON (keys sorted recursively); digests bound to the
principal, so a key hit whose digest differs (another user) is never replayed.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import Bus, BusError, Headers, PayloadTooLargeError, WrongLastSequenceError, subjects
from atmosphere.bus.errors import EffectLimitError, ReplayDivergedError
from atmosphere.contracts.journal.v1.journal_pb2 import (
    Effect,
    EffectKind,
    EffectStatus,
    JournalRecord,
    Lease,
    Terminal,
)
from atmosphere.dispatch import metrics

log = logging.getLogger("atmosphere.dispatch.journal")

DEFAULT_MAX_EFFECTS = 2000
"""Atmosphere's `maxEffectsPerRun`: beyond it a run fails rather than dropping effects."""


class RunTakenOverError(Exception):
    """Another worker holds the run now: this one must stop writing for it."""


class AtEnd(enum.Enum):
    """What becomes of a run's journal when the run ends."""

    PURGE_ON_SUCCESS = "purge-on-success"
    """A durable run's: removed if it succeeded; a failed run's is its resume anchor."""
    PURGE = "purge"
    """A first delivery's without durable runs: nothing resumes from it, nobody held the run before."""
    KEEP = "keep"
    """A takeover's without durable runs: an earlier holder that never wrote the journal may still
    wake, and must then find it not empty (an empty subject is what its first write expects).
    A terminal record stays; the stream's max age clears it."""


def effect_key(*parts: str | int) -> str:
    """SHA-256 hex over `parts`, each followed by a NUL byte (Atmosphere's `EffectKeys`)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(str(part).encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def canonical_json(value: Any) -> str:
    """JSON with object keys sorted recursively, so equal arguments give equal keys."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Entry:
    """The latest state of one effect."""

    seq: int
    kind: EffectKind.ValueType
    key: str
    status: EffectStatus.ValueType
    digest: str
    payload: str
    reason: str = ""

    @property
    def committed(self) -> bool:
        """Whether it replays (only committed effects do)."""
        return self.status == EffectStatus.EFFECT_STATUS_COMMITTED

    @property
    def pending(self) -> bool:
        """Whether it was started and never settled: its worker died inside it."""
        return self.status == EffectStatus.EFFECT_STATUS_PENDING


class RunJournal:
    """One run's journal, as the worker holding the run reads and writes it."""

    def __init__(self, bus: Bus, run_id: str, *, owner: str, max_effects: int = DEFAULT_MAX_EFFECTS) -> None:
        """An empty view; `open` reads what is stored and takes the run, `unread` takes it as it is."""
        self.bus = bus
        self.run_id = run_id
        self.owner = owner
        self.max_effects = max_effects
        self.subject = subjects.run_journal(run_id)
        self.entries: dict[str, Entry] = {}
        self.lost = False
        """Set once another worker took the run: nothing more is written for it here."""
        self.read_only = False
        self.at_end = AtEnd.PURGE_ON_SUCCESS
        """What becomes of the journal when the run ends (`close`)."""
        self.fruitless_deliveries = 0
        """Deliveries of the run in a row (this one included) that committed no effect: the
        poison-run guard counts these, so a run that keeps progressing is never given up on."""
        self._last = 0
        self._last_record: JournalRecord | None = None
        """The newest record this worker wrote (what the subject's newest must be while it holds the run)."""
        self._occurrences: Counter[tuple[str, ...]] = Counter()
        self._writing = asyncio.Lock()
        """One append at a time: parallel tool calls of one round must not race for the expected
        sequence (the loser would take its own earlier write for another worker's) or a seq."""

    @classmethod
    async def open(
        cls,
        bus: Bus,
        run_id: str,
        *,
        owner: str,
        delivery: int,
        max_effects: int = DEFAULT_MAX_EFFECTS,
        at_end: AtEnd = AtEnd.PURGE_ON_SUCCESS,
    ) -> RunJournal:
        """Read the run's journal and take the run (a `Lease` record fences earlier holders)."""
        journal = cls(bus, run_id, owner=owner, max_effects=max_effects)
        journal.at_end = at_end
        await journal._load()
        await journal._append(JournalRecord(lease=Lease(owner=owner, delivery=delivery)))
        journal.fruitless_deliveries += 1
        return journal

    @classmethod
    def unread(cls, bus: Bus, run_id: str, *, owner: str, max_effects: int = DEFAULT_MAX_EFFECTS) -> RunJournal:
        """A first delivery's journal when only tool calls are journaled: nothing read or written yet.

        A first delivery finds the subject empty, so its first append expects exactly that: a
        worker that took the run over meanwhile (its lease) makes it fail, and `still_held` sees
        the lease too. Nothing is written for a run that calls no tool; what is written is
        removed when the run ends, however it ends (nothing resumes from it).
        """
        journal = cls(bus, run_id, owner=owner, max_effects=max_effects)
        journal.at_end = AtEnd.PURGE
        return journal

    def _fold(self, effect: Effect) -> None:
        if effect.status == EffectStatus.EFFECT_STATUS_COMMITTED:
            self.fruitless_deliveries = 0
        self.entries[effect.idempotency_key] = Entry(
            seq=effect.seq,
            kind=effect.kind,
            key=effect.idempotency_key,
            status=effect.status,
            digest=effect.request_digest,
            payload=effect.result_payload,
            reason=effect.reason,
        )

    @classmethod
    async def read(cls, bus: Bus, run_id: str) -> RunJournal:
        """The run's journal to replay an ended run from: read only, any write is refused.

        A replay that needs a write needs an effect the journal has no committed record of (the
        model, a tool): `ReplayDivergedError` ends it.
        """
        journal = cls(bus, run_id, owner="")
        journal.read_only = True
        await journal._load()
        return journal

    async def _load(self) -> None:
        """Fold every stored record: the effects' latest states, the deliveries since the last commit."""
        async for seq, record in self.bus.replay_sequenced(subjects.JOURNAL_STREAM, self.subject, JournalRecord):
            self._last = max(self._last, seq)
            kind = record.WhichOneof("record")
            if kind == "effect":
                self._fold(record.effect)
            elif kind == "lease":
                self.fruitless_deliveries += 1

    @property
    def resumed(self) -> bool:
        """Whether an earlier worker left effects to replay."""
        return bool(self.entries)

    def occurrence(self, *identity: str) -> int:
        """How many times an effect with this identity came before (0, 1, ...), counted on.

        Advanced once per call on the first drive and on a replay alike, so identical repeated
        calls (the same tool, the same arguments) get their own keys in the same order.
        """
        count = self._occurrences[identity]
        self._occurrences[identity] += 1
        return count

    def replayable(self, key: str, digest: str) -> Entry | None:
        """The committed effect under `key` when its inputs match (`digest`), else None."""
        entry = self.entries.get(key)
        if entry is None or not entry.committed:
            return None
        if entry.digest != digest:
            log.warning("run %s: journal key hit with another digest; running live", self.run_id)
            return None
        return entry

    def interrupted(self, key: str) -> bool:
        """Whether the effect under `key` started and never settled (its worker died in it)."""
        entry = self.entries.get(key)
        return entry is not None and entry.pending

    async def pending(self, kind: EffectKind.ValueType, key: str, digest: str) -> None:
        """Record that the effect is about to happen (before its side effect).

        Raises:
            EffectLimitError: the run already has `max_effects` effects (the run fails).
            RunTakenOverError: another worker holds the run.
        """
        async with self._writing:
            entry = self.entries.get(key)
            seq = entry.seq if entry is not None else len(self.entries) + 1
            if entry is None and len(self.entries) >= self.max_effects:
                msg = f"The run reached its limit of {self.max_effects} journaled effects"
                raise EffectLimitError(msg, details={"limit": str(self.max_effects)})
            await self._write(
                Effect(
                    seq=seq,
                    kind=kind,
                    idempotency_key=key,
                    status=EffectStatus.EFFECT_STATUS_PENDING,
                    request_digest=digest,
                )
            )

    async def commit(self, key: str, payload: str) -> bool:
        """Record the effect's result: from now on it replays instead of running.

        False when the record would not fit in one bus message: the effect then stays pending
        (a resume treats it as interrupted), and the run goes on.
        """
        try:
            await self._settle(key, EffectStatus.EFFECT_STATUS_COMMITTED, payload=payload)
        except PayloadTooLargeError:
            log.warning("run %s: an effect's result is too large to journal (%d chars)", self.run_id, len(payload))
            return False
        return True

    async def fail(self, key: str, reason: str) -> None:
        """Record that the effect failed: a resume runs it again."""
        await self._settle(key, EffectStatus.EFFECT_STATUS_FAILED, reason=reason)

    async def _settle(self, key: str, status: EffectStatus.ValueType, *, payload: str = "", reason: str = "") -> None:
        async with self._writing:
            entry = self.entries[key]
            await self._write(
                Effect(
                    seq=entry.seq,
                    kind=entry.kind,
                    idempotency_key=key,
                    status=status,
                    request_digest=entry.digest,
                    result_payload=payload,
                    reason=reason,
                )
            )

    async def _write(self, effect: Effect) -> None:
        await self._append(JournalRecord(effect=effect))
        self._fold(effect)

    async def still_held(self) -> bool:
        """Whether this worker still holds the run: nobody appended since its own last record.

        A worker that stalled past the ack wait may still be running a run another worker took
        over; it learns so at its next append, or here (dispatch asks about once a second while
        events flow), and writes nothing more. A journal this worker never wrote must still be
        empty (`unread`). When the journal cannot be read, it is assumed held.
        """
        if self.lost or self.read_only:
            return not self.lost
        try:
            newest = await self.bus.last_message(subjects.JOURNAL_STREAM, self.subject, JournalRecord)
        except BusError:
            return True
        # Nobody wrote (both None): held. Our record gone, the subject empty: another worker
        # ended the run and removed the journal.
        if newest != self._last_record:
            self.lost = True
            log.warning("run %s: another worker took the run; this one stops writing", self.run_id)
        return not self.lost

    async def close(self, *, succeeded: bool, retain: bool = False) -> None:
        """The run ended: its journal is removed or closed with a terminal record, as `at_end` says.

        `retain` keeps it in any case. Never raises: the run's outcome is already written.
        """
        if self.lost or self._last == 0:
            return  # taken over, or nothing was ever stored for the run (it called no tool)
        purge = self.at_end is AtEnd.PURGE or (self.at_end is AtEnd.PURGE_ON_SUCCESS and succeeded)
        try:
            if purge and not retain:
                await self.bus.purge(subjects.JOURNAL_STREAM, self.subject)
            else:
                async with self._writing:
                    await self._append(JournalRecord(terminal=Terminal(succeeded=succeeded)))
        except (BusError, RunTakenOverError) as exc:
            log.warning("run %s: the journal was not closed (%s)", self.run_id, exc)

    async def _append(self, record: JournalRecord) -> None:
        if self.read_only:
            msg = "The replay reached a step the journal has no committed record of (a model call or a tool)"
            raise ReplayDivergedError(msg)
        if self.lost:
            raise RunTakenOverError(self.run_id)
        stamp = Timestamp()
        stamp.GetCurrentTime()
        record.recorded_at.CopyFrom(stamp)
        try:
            ack = await self.bus.js_publish(self.subject, record, headers=Headers(expected_last_subject_seq=self._last))
        except WrongLastSequenceError:
            if await self._stored_after_all(record):
                return
            self.lost = True
            log.warning("run %s: another worker took the run; this one stops", self.run_id)
            raise RunTakenOverError(self.run_id) from None
        self._last = ack.seq
        self._last_record = record
        metrics.JOURNAL_APPENDS.labels(record.WhichOneof("record") or "").inc()

    async def _stored_after_all(self, record: JournalRecord) -> bool:
        """Whether the subject moved because of our own earlier write (acknowledged too late).

        A publish that timed out may have been stored all the same; then the newest record is
        ours and the journal goes on. If another worker's lease came after our last record, the
        run was taken over — even when its holder then wrote a record equal to ours (the same
        tool call's start, the same round asked again): records carry no owner, leases do.
        """
        newest: tuple[int, JournalRecord] | None = None
        async for seq, stored in self.bus.replay_sequenced(subjects.JOURNAL_STREAM, self.subject, JournalRecord):
            if stored.WhichOneof("record") == "lease" and stored.lease.owner != self.owner:
                if seq > self._last:
                    return False
                newest = None  # an earlier holder's lease: whatever follows it is not ours to match
                continue
            newest = (seq, stored)
        if newest is None:
            return False
        seq, stored = newest
        kept = JournalRecord()
        kept.CopyFrom(stored)
        stored.ClearField("recorded_at")
        mine = JournalRecord()
        mine.CopyFrom(record)
        mine.ClearField("recorded_at")
        if stored != mine:
            return False
        self._last, self._last_record = seq, kept
        return True


async def discard_journal(bus: Bus, run_id: str) -> None:
    """Remove the journal of a run that already ended (a redelivery found its terminal event)."""
    try:
        await bus.purge(subjects.JOURNAL_STREAM, subjects.run_journal(run_id))
    except BusError as exc:
        log.debug("run %s: journal not purged (%s)", run_id, exc)
