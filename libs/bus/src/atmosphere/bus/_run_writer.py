"""Writing one run's events to `ATMO_EVENTS`: each stored exactly once, at no round trip per event.

Every event but a durable one is a plain publish, with no headers and no reply, as cheap for
every subscriber as a publish can be. Events are confirmed in bulk instead: JetStream stores a
stream's messages in the order the server received them, so an acknowledged publish proves
that every event sent before it *on the same connection session* was stored (the bus's
`epoch` tells sessions apart). A durable event (a terminal above all) is such a publish; so is
a probe (`atmo.run.<id>.probe`, kept in `ATMO_EVENTS` but no event) that a watchdog sends while
the run is quiet or after a disconnect. On a cluster that proof needs one more condition: the stream's leader
did not change meanwhile (a plain publish in flight to a leader that died is lost while this
connection, to another server, lives on), so each confirmation also compares the stream's
leader and its term with the one seen before the events were sent; after a change every event
of the window is uncertain. Events sent in a session that ended before they were
confirmed are uncertain: once a later confirmation holds, the writer looks up which of them
the stream has and sends the missing ones again, with `Nats-Msg-Id` = `<run_id>:<seq>` (a retry
is stored once). Before a durable event everything before it is confirmed, so a run's record is
complete before its work item is acked. A resent event is stored behind later ones: readers
order by `seq` (`follow_run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus
from atmosphere.bus._codec import Headers, wire_size
from atmosphere.bus._retry import FINAL_ERRORS
from atmosphere.bus.errors import BusError, PayloadTooLargeError
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission

log = logging.getLogger("atmosphere.bus")

WORKER_FIRST_SEQ = 2
"""The first seq the owning worker writes; seq 1 belongs to the submitter."""

TERMINAL_KINDS = frozenset({"complete", "error"})

ACK_PATIENCE = 2.0
"""Seconds an acknowledgement may be late before its event is sent again."""

STORE_DEADLINE = 60.0
"""Seconds a writer keeps trying to store its events (a broker restart) before giving up."""

MAX_IN_FLIGHT = 1024
"""Events a run may have sent but not yet confirmed; at this many, it waits for the broker."""

CONFIRM_EVERY = 256
"""Unconfirmed events after which the watchdog confirms them, even while the run goes on."""

CONFIRM_AFTER = 5.0
"""Seconds after which the watchdog confirms what is unconfirmed, even while the run goes on: a
stream leader that died with events in flight leaves no other trace on this connection, and a
reader resuming from the stream must not wait for the run's end to find them."""

STREAM_PIECES = {"text_delta": "text", "reasoning_delta": "text", "tool_call_delta": "arguments_fragment"}
"""Event kinds that are a piece of a stream, and the field that holds the piece."""

_SPLIT_SLACK = 64
"""Bytes left spare per split piece for its length prefix and the stamped fields."""


def is_terminal(event: RunEvent) -> bool:
    """Whether `event` ends its run."""
    return event.WhichOneof("kind") in TERMINAL_KINDS


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


@dataclass(eq=False)
class _Piece:
    """An event sent as a plain publish, not yet confirmed stored."""

    event: RunEvent
    epoch: int
    """The bus epoch it was sent in; -1 when it could not be sent at all."""
    leader: str | None
    """The `ATMO_EVENTS` leader (and term) the writer trusted when it sent it; None: none trusted."""
    sent_at: float = field(default_factory=time.monotonic)
    """When it was sent (monotonic): the oldest unconfirmed piece's age drives the watchdog."""


class RunEventWriter:
    """Numbers, stamps and stores one run's events in `ATMO_EVENTS`, each exactly once (see the module)."""

    def __init__(
        self,
        bus: Bus,
        request: RunSubmission,
        *,
        first_seq: int = WORKER_FIRST_SEQ,
        ack_patience: float = ACK_PATIENCE,
        store_deadline: float = STORE_DEADLINE,
    ) -> None:
        """Write `request`'s events starting at `first_seq`.

        `ack_patience`: how long an acknowledgement may be late before the event is sent
        again. `store_deadline`: how long the writer keeps trying to store an event before
        `BusError` ends its attempt (the broker is gone for longer than a restart).
        """
        self._bus = bus
        self._request = request
        self._subject = subjects.run_events(request.run_id)
        self._owner = request.principal.user_id if request.HasField("principal") else ""
        self._next_seq = first_seq
        self._patience = ack_patience
        self._deadline = store_deadline
        self._pieces: list[_Piece] = []
        self._watchdog: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._repair = asyncio.Lock()
        self._leader: str | None = None
        """The `ATMO_EVENTS` leader (and term) trusted for the events sent from now on: read before
        the first one, and again at each confirmation. None when it could not be read, or right
        after it changed (until an acknowledgement through the new one proves the way to it)."""
        self._leader_read = False
        # The most an event's headers can add (a message id with the longest seq), measured once.
        self._header_room = wire_size(b"", Headers(msg_id=f"{request.run_id}:{'9' * 20}").to_wire())

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    @property
    def unacknowledged(self) -> int:
        """How many events were sent but not yet confirmed stored."""
        return len(self._pieces)

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Stamp `event` (ids, owner, seq, timestamp) and publish it; return the stamped event.

        A durable publish returns once JetStream stored the event and every event before it.
        Terminal events are always durable: once the work item is acked, its outcome must
        already be on record. A stream piece too large for one message goes as several.

        Raises:
            PayloadTooLargeError: the event does not fit in one message (its seq is not used).
            BusError: the events could not be stored within the store deadline.
        """
        self._stamp(event)
        # Checked before the seq is taken (synchronously: concurrent emits of one run, such as
        # a sub-run's forwarded events, must not see a seq that is then given back).
        size = event.ByteSize() + self._header_room
        if size > self._bus.max_payload:
            pieces = _split_stream_piece(event, size - self._bus.max_payload)
            if not pieces:
                raise PayloadTooLargeError(self._subject, size, self._bus.max_payload)
            for piece in pieces:
                stamped = await self.emit(piece, durable=durable)
            return stamped
        self._next_seq += 1
        if durable or (durable is None and is_terminal(event)):
            give_up = time.monotonic() + self._deadline
            trusted = self._leader
            epoch = await self._store(event)
            if not self._pieces:
                return event  # acknowledged itself, and nothing unconfirmed before it
            # The durable event's own acknowledgement confirms the events sent before it in its
            # session under the leader it was stored by; only the others need looking up.
            leader = await self._reread_leader(trusted)
            self._confirmed_by(epoch, event.seq, leader)
            if self._pieces:
                await self._confirm_pieces(give_up)
            return event
        if not self._leader_read:
            # Before the first piece is sent: its confirmation compares the leader with this
            # one. A writer of durable events only (a submitter's run-id event) never asks.
            self._leader_read = True
            self._leader = await self._current_leader()
        await self._send_piece(event)
        if self.unacknowledged >= MAX_IN_FLIGHT:
            await self.flush()  # the broker is not keeping up: hold the run back, never drop
        self._watch()
        return event

    async def flush(self) -> None:
        """Return once every event sent so far is stored.

        Raises:
            BusError: some could not be stored within the store deadline.
        """
        if self._pieces:
            await self._confirm_pieces(time.monotonic() + self._deadline)

    async def close(self) -> None:
        """Stop the watchdog (the run is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

    # -- sending -------------------------------------------------------------------------------

    def _stamp(self, event: RunEvent) -> None:
        request = self._request
        event.run_id = request.run_id
        event.session_id = request.session_id
        event.conversation_id = request.conversation_id
        event.agent = request.agent
        event.parent_run_id = request.parent_run_id
        event.owner = self._owner
        event.seq = self._next_seq
        event.timestamp.CopyFrom(_now())

    def _headers(self, seq: int) -> Headers:
        return Headers(msg_id=f"{self._request.run_id}:{seq}")

    async def _send_piece(self, event: RunEvent) -> None:
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
        self._pieces.append(_Piece(event, epoch, self._leader))

    def _confirmed_by(self, epoch: int | None, seq: int, leader: str | None) -> None:
        """Event `seq` was stored in session `epoch` (None: unknown) by `leader` (None: unknown).

        So was every event sent before it in that session while the writer trusted that same
        leader (and term): JetStream stores one leader's messages in the order it received them.
        """
        if epoch is not None and leader is not None:
            self._pieces = [p for p in self._pieces if p.epoch != epoch or p.event.seq > seq or p.leader != leader]

    async def _store(self, event: RunEvent) -> int | None:
        """Publish `event` and wait until stored, trying again (same id) until the deadline.

        Returns the epoch of the session that stored it, or None if that session ended
        between the send and the acknowledgement.
        """
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            epoch = self._bus.epoch
            try:
                await self._bus.js_publish(
                    self._subject, event, headers=self._headers(event.seq), timeout=self._patience
                )
                return epoch if self._bus.epoch == epoch else None
            except FINAL_ERRORS:
                raise
            except BusError as exc:
                if time.monotonic() >= give_up:
                    raise
                log.info("run %s: storing event %d failed (%s); trying again", self._request.run_id, event.seq, exc)
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
            msg = f"run {self._request.run_id}: {self.unacknowledged} event(s) not stored in {self._deadline:g}s"
            raise BusError(msg)

    # -- confirming stream pieces --------------------------------------------------------------

    async def _confirm_pieces(self, give_up: float, *, until_none: bool = True) -> None:
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
            while self._pieces:
                self._check_deadline(give_up)
                sent = list(self._pieces)  # pieces sent after the probe are not proven by it
                # The leader before the probe, read afresh when none is trusted: a probe between two
                # equal readings proves the way to that leader, which is then trusted again.
                before = self._leader if self._leader is not None else await self._current_leader()
                epoch = await self._probe(give_up)
                if epoch is None:
                    continue  # the session ended during the probe: it proves nothing
                leader = await self._reread_leader(before)
                proven = {id(p) for p in sent if p.epoch == epoch and p.leader is not None and p.leader == leader}
                self._pieces = [p for p in self._pieces if id(p) not in proven]
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
        probe = RunEvent(run_id=self._request.run_id)
        while True:
            try:
                await self._bus.js_publish(subjects.run_probe(self._request.run_id), probe, timeout=self._patience)
                break
            except FINAL_ERRORS:
                raise
            except BusError:
                self._check_deadline(give_up)
                await asyncio.sleep(min(1.0, self._patience / 4))
                epoch = self._bus.epoch
        return epoch if self._bus.epoch == epoch else None

    async def _send_missing(self, uncertain: list[_Piece], give_up: float) -> None:
        stored = await self._stored_seqs(give_up)
        missing = [p for p in uncertain if p.event.seq not in stored]
        if missing:
            log.info("run %s: sending %d event(s) again after a lost connection", self._request.run_id, len(missing))
        for piece in missing:
            self._check_deadline(give_up)
            await self._store(piece.event)
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
                return await _stored_seqs(self._bus, self._request.run_id)
            except FINAL_ERRORS:
                raise
            except BusError as exc:
                self._check_deadline(give_up)
                log.info("run %s: cannot read its stored events yet (%s); trying again", self._request.run_id, exc)
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1

    def _forget(self, piece: _Piece) -> None:
        self._pieces = [p for p in self._pieces if p is not piece]

    # -- the watchdog --------------------------------------------------------------------------

    def _watch(self) -> None:
        # A timer first, a task only when it finds work: most runs end (and flush) before it fires.
        if self._timer is None and (self._watchdog is None or self._watchdog.done()):
            self._timer = asyncio.get_running_loop().call_later(self._patience, self._wake)

    def _wake(self) -> None:
        self._timer = None
        if self.unacknowledged and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = asyncio.create_task(self._keep_watch(), name=f"events-{self._request.run_id}")

    async def _keep_watch(self) -> None:
        """While anything is unconfirmed: confirm the events that may be lost (or are many)."""
        while self.unacknowledged:
            try:
                if self._needs_confirmation():
                    await self._confirm_pieces(time.monotonic() + self._deadline, until_none=False)
            except BusError as exc:
                # Nothing is dropped: the run's next durable event flushes (and fails) for real.
                log.warning("run %s: confirming events failed: %s", self._request.run_id, exc)
                return
            await asyncio.sleep(self._patience)

    def _needs_confirmation(self) -> bool:
        epoch = self._bus.epoch
        if len(self._pieces) >= CONFIRM_EVERY or any(p.epoch != epoch for p in self._pieces):
            return True
        return bool(self._pieces) and time.monotonic() - self._pieces[0].sent_at >= CONFIRM_AFTER


async def _stored_seqs(bus: Bus, run_id: str) -> set[int]:
    return {e.seq async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)}


def _split_stream_piece(event: RunEvent, excess: int) -> list[RunEvent]:
    """`event` cut into pieces that each fit, when it is a stream piece (else none).

    A provider may send one huge chunk of text or tool arguments; the client sees it as
    several consecutive deltas, which concatenate to the same thing.
    """
    kind = event.WhichOneof("kind")
    text_field = STREAM_PIECES.get(kind or "")
    if kind is None or text_field is None:
        return []
    body = getattr(event, kind)
    data = getattr(body, text_field).encode()
    room = len(data) - excess - _SPLIT_SLACK
    if room < 1024:
        return []
    pieces: list[RunEvent] = []
    start = 0
    while start < len(data):
        end = min(len(data), start + room)
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1  # never cut inside a UTF-8 character
        piece = RunEvent()
        piece.CopyFrom(event)
        setattr(getattr(piece, kind), text_field, data[start:end].decode())
        pieces.append(piece)
        start = end
    return pieces


__all__ = [
    "ACK_PATIENCE",
    "MAX_IN_FLIGHT",
    "STORE_DEADLINE",
    "TERMINAL_KINDS",
    "WORKER_FIRST_SEQ",
    "RunEventWriter",
    "is_terminal",
]
