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

The writer numbers, stamps and sends the events and keeps the watchdog; the bookkeeping of what
is not yet confirmed, the probes and the resends are `_run_confirm`'s (`UnconfirmedEvents`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus
from atmosphere.bus._codec import Headers, wire_size
from atmosphere.bus._run_confirm import UnconfirmedEvents
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
        self._unconfirmed = UnconfirmedEvents(
            bus, request.run_id, ack_patience=ack_patience, store_deadline=store_deadline
        )
        self._watchdog: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # The most an event's headers can add (a message id with the longest seq), measured once.
        self._header_room = wire_size(b"", Headers(msg_id=f"{request.run_id}:{'9' * 20}").to_wire())

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    @property
    def unacknowledged(self) -> int:
        """How many events were sent but not yet confirmed stored."""
        return len(self._unconfirmed.pieces)

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
        unconfirmed = self._unconfirmed
        if durable or (durable is None and is_terminal(event)):
            await unconfirmed.store_durable(event)
            return event
        await unconfirmed.send(event)
        if len(unconfirmed.pieces) >= MAX_IN_FLIGHT:
            await self.flush()  # the broker is not keeping up: hold the run back, never drop
        self._watch()
        return event

    async def flush(self) -> None:
        """Return once every event sent so far is stored.

        Raises:
            BusError: some could not be stored within the store deadline.
        """
        if self._unconfirmed.pieces:
            await self._unconfirmed.confirm(time.monotonic() + self._deadline)

    async def close(self) -> None:
        """Stop the watchdog (the run is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog

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
                    await self._unconfirmed.confirm(time.monotonic() + self._deadline, until_none=False)
            except BusError as exc:
                # Nothing is dropped: the run's next durable event flushes (and fails) for real.
                log.warning("run %s: confirming events failed: %s", self._request.run_id, exc)
                return
            await asyncio.sleep(self._patience)

    def _needs_confirmation(self) -> bool:
        pieces = self._unconfirmed.pieces
        epoch = self._bus.epoch
        if len(pieces) >= CONFIRM_EVERY or any(p.epoch != epoch for p in pieces):
            return True
        return bool(pieces) and time.monotonic() - pieces[0].sent_at >= CONFIRM_AFTER


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
