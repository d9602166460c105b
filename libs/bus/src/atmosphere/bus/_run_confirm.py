"""Confirming a run's events in bulk, and sending again the ones a lost session or leader took.

The protocol is `_run_writer`'s (its module docstring says why it holds): this is its
bookkeeping. Each event sent as a plain publish stays listed (`Piece`) with the bus epoch and
the `ATMO_EVENTS` leader it was sent under until an acknowledged publish proves it stored: a
durable event of the run, or a probe (`atmo.run.<id>.probe`). What no acknowledgement proves is
looked up in the stream, and what the stream lacks is stored again under its `Nats-Msg-Id`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus
from atmosphere.bus._codec import Headers
from atmosphere.bus._retry import FINAL_ERRORS
from atmosphere.bus.errors import BusError
from atmosphere.contracts.run.v1.run_pb2 import RunEvent

log = logging.getLogger("atmosphere.bus")


@dataclass(eq=False)
class Piece:
    """An event sent as a plain publish, not yet confirmed stored."""

    event: RunEvent
    epoch: int
    """The bus epoch it was sent in; -1 when it could not be sent at all."""
    leader: str | None
    """The `ATMO_EVENTS` leader (and term) the writer trusted when it sent it; None: none trusted."""
    sent_at: float = field(default_factory=time.monotonic)
    """When it was sent (monotonic): the oldest unconfirmed piece's age drives the watchdog."""


class UnconfirmedEvents:
    """One run's events sent as plain publishes and not yet known stored, and how they get confirmed."""

    def __init__(self, bus: Bus, run_id: str, *, ack_patience: float, store_deadline: float) -> None:
        """Confirm `run_id`'s events on `bus`; see `RunEventWriter` for the two durations."""
        self._bus = bus
        self._run_id = run_id
        self._subject = subjects.run_events(run_id)
        self._patience = ack_patience
        self._deadline = store_deadline
        self.pieces: list[Piece] = []
        """The events sent but not yet confirmed stored, in the order they were sent."""
        self._repair = asyncio.Lock()
        self._leader: str | None = None
        """The `ATMO_EVENTS` leader (and term) trusted for the events sent from now on: read before
        the first one, and again at each confirmation. None when it could not be read, or right
        after it changed (until an acknowledgement through the new one proves the way to it)."""
        self._leader_read = False

    async def send(self, event: RunEvent) -> None:
        """Publish `event` plainly and list it as unconfirmed (also when it could not be sent)."""
        if not self._leader_read:
            # Before the first piece is sent: its confirmation compares the leader with this
            # one. A writer of durable events only (a submitter's run-id event) never asks.
            self._leader_read = True
            self._leader = await self._current_leader()
        epoch = self._bus.epoch
        if not self._bus.is_connected:
            epoch = -1  # not handed to a client that would buffer it: sent once we are back
        else:
            try:
                await self._bus.publish(self._subject, event)
            except FINAL_ERRORS:
                raise
            except BusError:
                epoch = -1
        self.pieces.append(Piece(event, epoch, self._leader))

    async def store_durable(self, event: RunEvent) -> None:
        """Store `event` and return once it and every event sent before it are stored."""
        give_up = time.monotonic() + self._deadline
        trusted = self._leader
        epoch = await self.store(event)
        if not self.pieces:
            return  # acknowledged itself, and nothing unconfirmed before it
        # The durable event's own acknowledgement confirms the events sent before it in its
        # session under the leader it was stored by; only the others need looking up.
        leader = await self._reread_leader(trusted)
        self._confirmed_by(epoch, event.seq, leader)
        if self.pieces:
            await self.confirm(give_up)

    def _confirmed_by(self, epoch: int | None, seq: int, leader: str | None) -> None:
        """Event `seq` was stored in session `epoch` (None: unknown) by `leader` (None: unknown).

        So was every event sent before it in that session while the writer trusted that same
        leader (and term): JetStream stores one leader's messages in the order it received them.
        """
        if epoch is not None and leader is not None:
            self.pieces = [p for p in self.pieces if p.epoch != epoch or p.event.seq > seq or p.leader != leader]

    async def store(self, event: RunEvent) -> int | None:
        """Publish `event` and wait until stored, trying again (same id) until the deadline.

        Returns the epoch of the session that stored it, or None if that session ended
        between the send and the acknowledgement.
        """
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            epoch = self._bus.epoch
            try:
                headers = Headers(msg_id=f"{self._run_id}:{event.seq}")
                await self._bus.js_publish(self._subject, event, headers=headers, timeout=self._patience)
                return epoch if self._bus.epoch == epoch else None
            except FINAL_ERRORS:
                raise
            except BusError as exc:
                if time.monotonic() >= give_up:
                    raise
                log.info("run %s: storing event %d failed (%s); trying again", self._run_id, event.seq, exc)
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1

    async def _current_leader(self) -> str | None:
        try:
            return await self._bus.stream_leader(subjects.EVENTS_STREAM)
        except FINAL_ERRORS:
            raise
        except BusError:
            return None

    async def _reread_leader(self, before: str | None) -> str | None:
        """The leader now, after an acknowledgement that went out while `before` was trusted.

        It becomes the leader trusted for what is sent next only when it is `before` still: the
        acknowledgement then came the way the next events go. After a change, a message sent
        at once may still go the old way (the new leader's interest not yet known on every
        route), so nothing is trusted until the next acknowledgement under the new one.
        """
        now = await self._current_leader()
        self._leader = now if now is not None and now == before else None
        return now

    def _check_deadline(self, give_up: float) -> None:
        if time.monotonic() >= give_up:
            msg = f"run {self._run_id}: {len(self.pieces)} event(s) not stored in {self._deadline:g}s"
            raise BusError(msg)

    async def confirm(self, give_up: float, *, until_none: bool = True) -> None:
        """Make sure the pieces sent so far are stored: probe, then send again what is missing.

        A piece stays listed until it is known stored, so whoever flushes meanwhile waits for
        this repair instead of finding nothing to do. `until_none`: go on while pieces keep
        coming (a flush); else settle what was sent before the call (the watchdog, while the
        run streams on). The probe proves a piece stored only when it went out in the piece's
        session under the leader the piece was sent to: each piece carries the leader trusted
        when it was sent, and the leader is read again after the probe's acknowledgement (two
        confirmations at once each compare with their own pieces, never with each other's).
        """
        async with self._repair:
            while self.pieces:
                self._check_deadline(give_up)
                sent = list(self.pieces)  # pieces sent after the probe are not proven by it
                # The leader before the probe, read afresh when none is trusted: a probe between two
                # equal readings proves the way to that leader, which is then trusted again.
                before = self._leader if self._leader is not None else await self._current_leader()
                epoch = await self._probe(give_up)
                if epoch is None:
                    continue  # the session ended during the probe: it proves nothing
                leader = await self._reread_leader(before)
                proven = {id(p) for p in sent if p.epoch == epoch and p.leader is not None and p.leader == leader}
                self.pieces = [p for p in self.pieces if id(p) not in proven]
                uncertain = [p for p in sent if id(p) not in proven]
                if uncertain:
                    await self._send_missing(uncertain, give_up)
                if not until_none:
                    return

    async def _probe(self, give_up: float) -> int | None:
        """The epoch in which a probe was stored, or None if the session ended meanwhile.

        Everything sent before the probe in that session is stored too; what was sent in an
        earlier session was either stored or lost by then (a client flushes what it buffered
        before anything sent after it).
        """
        epoch = self._bus.epoch
        probe = RunEvent(run_id=self._run_id)
        while True:
            try:
                await self._bus.js_publish(subjects.run_probe(self._run_id), probe, timeout=self._patience)
                break
            except FINAL_ERRORS:
                raise
            except BusError:
                self._check_deadline(give_up)
                await asyncio.sleep(min(1.0, self._patience / 4))
                epoch = self._bus.epoch
        return epoch if self._bus.epoch == epoch else None

    async def _send_missing(self, uncertain: list[Piece], give_up: float) -> None:
        stored = await self._stored_seqs(give_up)
        missing = [p for p in uncertain if p.event.seq not in stored]
        if missing:
            log.info("run %s: sending %d event(s) again after a lost connection", self._run_id, len(missing))
        for piece in missing:
            self._check_deadline(give_up)
            await self.store(piece.event)
            self._forget(piece)
        for piece in uncertain:
            self._forget(piece)

    async def _stored_seqs(self, give_up: float) -> set[int]:
        """The seqs of this run the stream holds, read again while JetStream cannot answer yet.

        Right after a leader change the stream answers "temporarily unavailable" for a moment:
        that is a reason to wait (within the store deadline), not to give the run up.
        """
        attempt = 0
        while True:
            try:
                return await _stored_seqs(self._bus, self._run_id)
            except FINAL_ERRORS:
                raise
            except BusError as exc:
                self._check_deadline(give_up)
                log.info("run %s: cannot read its stored events yet (%s); trying again", self._run_id, exc)
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1

    def _forget(self, piece: Piece) -> None:
        self.pieces = [p for p in self.pieces if p is not piece]


async def _stored_seqs(bus: Bus, run_id: str) -> set[int]:
    return {e.seq async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)}
