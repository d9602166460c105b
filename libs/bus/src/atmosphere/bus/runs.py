"""The run protocol on the bus: submitting a run and writing its numbered event stream.

A run's events form one ordered stream on `atmo.run.<run_id>.evt` with `seq` from 1 and a
single writer at a time. The submitter (ingress, or dispatch for gRPC) writes seq 1, the
`X-Atmosphere-Run-Id` metadata event, before it queues the `RunRequest`, so a client learns
the run id (and can resume by it) even before a worker picks the run up. The worker that
owns the run writes from seq 2 on. Events carry no headers — the subject names the run and
the payload its seq — because every subscriber would pay to parse them on every token; a run
re-driven after a worker died continues after the last seq `ATMO_EVENTS` holds instead of
relying on de-duplication.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus, PublishAck
from atmosphere.bus._codec import Headers, wire_size
from atmosphere.bus._retry import FINAL_ERRORS
from atmosphere.bus.errors import BusError, PayloadTooLargeError
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import Cancel, Control, ControlAck, Metadata, RunEvent, RunRequest

RUN_ID_METADATA_KEY = "X-Atmosphere-Run-Id"
"""The metadata key of the run-id event (seq 1), as Atmosphere clients expect it."""

WORKER_FIRST_SEQ = 2
"""The first seq the owning worker writes; seq 1 belongs to the submitter."""

TERMINAL_KINDS = frozenset({"complete", "error"})

ACK_PATIENCE = 2.0
"""Seconds an event's acknowledgement may be late before the event is sent again."""

STORE_DEADLINE = 60.0
"""Seconds a writer keeps trying to store its events (a broker restart) before giving up."""

MAX_IN_FLIGHT = 1024
"""Events a run may have sent but not yet confirmed; at this many, it waits for the broker."""

SUBMIT_DEADLINE = 20.0
"""Seconds a submission keeps trying (a frozen or restarting broker) before it is refused."""

NESTING_METADATA_KEY = "atmosphere.run.nesting"
"""A sub-run's nesting level in `RunRequest.metadata`: 1 below a top-level run, 2 below that."""

MAX_NESTING = 3
"""The deepest level with a queue of its own; deeper sub-runs share it (a coordinator's fleet
member running `task`, which runs `task` again, is level 3)."""

log = logging.getLogger("atmosphere.bus")


def is_terminal(event: RunEvent) -> bool:
    """Whether `event` ends its run."""
    return event.WhichOneof("kind") in TERMINAL_KINDS


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return ts


@dataclass(eq=False)
class _InFlight:
    """An event handed to JetStream whose acknowledgement has not arrived yet."""

    event: RunEvent
    ack: asyncio.Future[PublishAck] | None
    """None when the publish itself failed (the broker was unreachable): send again."""
    sent_at: float


class RunEventWriter:
    """Numbers, stamps and stores one run's events in `ATMO_EVENTS`, each exactly once.

    Every event goes to JetStream with `Nats-Msg-Id` = `<run_id>:<seq>` and its acknowledgement
    is tracked without waiting for it, so a token costs no round trip. An event whose
    acknowledgement is late (the broker restarted or froze with it in flight) is sent again
    with the same id: JetStream stores it once whether or not the first copy arrived. Before
    a durable event (a terminal above all) every earlier event must be acknowledged, so a
    run's record is complete before its work item is acked.

    A resent event may be stored after a later one; readers order by `seq` (`follow_run`).
    """

    def __init__(
        self,
        bus: Bus,
        request: RunRequest,
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
        self._in_flight: dict[int, _InFlight] = {}

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    @property
    def unacknowledged(self) -> int:
        """How many events were sent but not yet confirmed stored."""
        return len(self._in_flight)

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Stamp `event` (ids, owner, seq, timestamp) and publish it; return the stamped event.

        A durable publish returns once JetStream stored the event and every event before it.
        Terminal events are always durable: once the work item is acked, its outcome must
        already be on record.

        Raises:
            PayloadTooLargeError: the event does not fit in one message (its seq is not used).
            BusError: the events could not be stored within the store deadline.
        """
        self._stamp(event)
        # Checked before the seq is taken (synchronously: concurrent emits of one run, such as
        # a sub-run's forwarded events, must not see a seq that is then given back).
        size = event.ByteSize() + wire_size(b"", self._headers(event.seq).to_wire())
        if size > self._bus.max_payload:
            pieces = _split_stream_piece(event, size - self._bus.max_payload)
            if not pieces:
                raise PayloadTooLargeError(self._subject, size, self._bus.max_payload)
            for piece in pieces:  # a streamed piece too big for one message is several
                stamped = await self.emit(piece, durable=durable)
            return stamped
        self._next_seq += 1
        if durable or (durable is None and is_terminal(event)):
            await self.flush()
            await self._store(event)
        else:
            await self._send(event)
            if len(self._in_flight) >= MAX_IN_FLIGHT:
                await self.flush()  # the broker is not keeping up: hold the run back, never drop
            else:
                await self._resend_late()
        return event

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

    async def _send(self, event: RunEvent) -> None:
        ack: asyncio.Future[PublishAck] | None
        try:
            ack = await self._bus.js_publish_nowait(self._subject, event, headers=self._headers(event.seq))
        except FINAL_ERRORS:
            raise
        except BusError as exc:
            log.info("run %s: event %d not sent (%s); will send again", self._request.run_id, event.seq, exc)
            ack = None
        entry = _InFlight(event, ack, time.monotonic())
        self._in_flight[event.seq] = entry
        if ack is not None:
            ack.add_done_callback(lambda done: self._settled(entry, done))

    def _settled(self, entry: _InFlight, done: asyncio.Future[PublishAck]) -> None:
        if done.cancelled() or done.exception() is not None:
            if self._in_flight.get(entry.event.seq) is entry:
                entry.ack = None  # refused (e.g. JetStream not ready after a restart): send again
            return
        if self._in_flight.get(entry.event.seq) is entry:
            del self._in_flight[entry.event.seq]

    async def _resend_late(self) -> None:
        """Send again every event whose acknowledgement is overdue (oldest first)."""
        if not self._in_flight or not self._bus.is_connected:
            return  # while disconnected nats-py buffers what was published; resend once back
        overdue = time.monotonic() - self._patience
        late = [e for e in self._in_flight.values() if e.ack is None or e.sent_at <= overdue]
        for entry in sorted(late, key=lambda e: e.event.seq):
            if entry.ack is not None:
                entry.ack.cancel()
            del self._in_flight[entry.event.seq]
            await self._send(entry.event)

    async def flush(self) -> None:
        """Return once every event sent so far is stored.

        Raises:
            BusError: some could not be stored within the store deadline.
        """
        give_up = time.monotonic() + self._deadline
        while self._in_flight:
            pending = [e.ack for e in self._in_flight.values() if e.ack is not None and not e.ack.done()]
            if pending:
                await asyncio.wait(pending, timeout=self._patience)
            else:
                # Only refused or unsent events are left (or acks whose callbacks have not run
                # yet): give the callbacks a turn and the broker a moment.
                await asyncio.sleep(0 if not self._unsent() else min(0.25, self._patience))
            if not self._in_flight:
                return
            if time.monotonic() >= give_up:
                msg = f"run {self._request.run_id}: {len(self._in_flight)} event(s) not stored in {self._deadline:g}s"
                raise BusError(msg)
            await self._resend_late()

    def _unsent(self) -> bool:
        return any(e.ack is None for e in self._in_flight.values())

    async def _store(self, event: RunEvent) -> None:
        """Publish `event` and wait until stored, trying again (same id) until the deadline."""
        give_up = time.monotonic() + self._deadline
        attempt = 0
        while True:
            try:
                await self._bus.js_publish(
                    self._subject, event, headers=self._headers(event.seq), timeout=self._patience
                )
                return
            except FINAL_ERRORS:
                raise
            except BusError as exc:
                if time.monotonic() >= give_up:
                    raise
                log.info("run %s: storing event %d failed (%s); trying again", self._request.run_id, event.seq, exc)
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            attempt += 1


_STREAMED_TEXT = {"text_delta": "text", "reasoning_delta": "text", "tool_call_delta": "arguments_fragment"}
"""Event kinds that are a piece of a stream, and the field that holds the piece."""

_SPLIT_SLACK = 64
"""Bytes left spare per split piece for its length prefix and the stamped fields."""


def _split_stream_piece(event: RunEvent, excess: int) -> list[RunEvent]:
    """`event` cut into pieces that each fit, when it is a streamed piece (else none).

    A provider may send one huge chunk of text or tool arguments; the client sees it as
    several consecutive deltas, which concatenate to the same thing.
    """
    kind = event.WhichOneof("kind")
    field = _STREAMED_TEXT.get(kind or "")
    if kind is None or field is None:
        return []
    body = getattr(event, kind)
    data = getattr(body, field).encode()
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
        setattr(getattr(piece, kind), field, data[start:end].decode())
        pieces.append(piece)
        start = end
    return pieces


def nesting_of(request: RunRequest) -> int:
    """How many runs `request` is nested below (0 for a top-level run; malformed reads as 0)."""
    try:
        return max(0, int(request.metadata.get(NESTING_METADATA_KEY, "0")))
    except ValueError:
        return 0


def queue_level(request: RunRequest) -> int:
    """The `ATMO_RUNS` level `request` is queued on: its nesting, capped at `MAX_NESTING`."""
    return min(nesting_of(request), MAX_NESTING)


class SubmitError(BusError):
    """A run could not be queued (the broker is unreachable): nothing runs it; try again."""


async def submit_run(bus: Bus, request: RunRequest, *, deadline: float = SUBMIT_DEADLINE) -> PublishAck:
    """Accept a run: write its run-id event (seq 1), then queue it on `ATMO_RUNS` at its level.

    Subscribe to `subjects.run_events(request.run_id)` before calling this to see every event.
    Submitting the same run id twice queues it once (`Nats-Msg-Id` = run id), so a frozen or
    restarting broker is retried for up to `deadline` seconds without queueing the run twice.

    Raises:
        SubmitError: the run was not queued (no connection, or no acknowledgement in time).
        PayloadTooLargeError: the request does not fit in one message.
    """
    if not bus.is_connected:
        # Refused at once rather than buffered by the client library: a buffered submission
        # could still run after its caller was told it failed.
        msg = f"run {request.run_id} was not submitted: the broker is unreachable"
        raise SubmitError(msg)
    writer = RunEventWriter(bus, request, first_seq=1, store_deadline=deadline)
    headers = Headers(
        run_id=request.run_id,
        principal=request.principal if request.HasField("principal") else None,
        msg_id=request.run_id,
    )
    # Refused before anything is written: a run-id event must not be left for a run that
    # could never be queued.
    size = request.ByteSize() + wire_size(b"", headers.to_wire())
    if size > bus.max_payload:
        raise PayloadTooLargeError(subjects.run_submit(request.agent), size, bus.max_payload)
    # Both publishes leave on this one connection in this order, so the run-id event is stored
    # before any worker can pull the request; waiting for the two acks together saves a round trip.
    run_id_event = RunEvent(metadata=Metadata(key=RUN_ID_METADATA_KEY, value_json=json.dumps(request.run_id)))
    subject = subjects.run_submit(request.agent, level=queue_level(request))
    try:
        async with asyncio.TaskGroup() as both:
            both.create_task(writer.emit(run_id_event, durable=True))
            queued = both.create_task(_publish_until(bus, subject, request, headers, deadline))
    except* PayloadTooLargeError as group:
        raise group.exceptions[0] from None
    except* BusError as group:
        msg = f"run {request.run_id} was not submitted: {group.exceptions[0]}"
        raise SubmitError(msg) from group.exceptions[0]
    return queued.result()


async def _publish_until(bus: Bus, subject: str, message: RunRequest, headers: Headers, deadline: float) -> PublishAck:
    """`js_publish` with the same message id until acknowledged or `deadline` seconds passed."""
    give_up = time.monotonic() + deadline
    attempt = 0
    while True:
        try:
            return await bus.js_publish(subject, message, headers=headers, timeout=ACK_PATIENCE)
        except FINAL_ERRORS:
            raise
        except BusError:
            if time.monotonic() >= give_up:
                raise
        await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        attempt += 1


class UnknownRunError(LookupError):
    """No events are stored for that run id (never existed, or expired)."""


class StreamGapError(RuntimeError):
    """Events of a run are missing from both the live subscription and the stream."""


IDLE_CHECK = 2.0
"""Seconds without a live event after which a follower looks at the stream (it may have missed
events while its own connection was down)."""

FULL_REPLAY_INTERVAL = 30.0
"""A quiet follower replays the whole stored run at most this often (see `_Follower.catch_up`)."""

GAP_PATIENCE = 30.0
"""Seconds a follower waits for a missing event (resent after a broker restart) before giving up."""


async def stored_events(bus: Bus, run_id: str) -> dict[int, RunEvent]:
    """Every stored event of `run_id` by seq (a resent event may be stored out of order)."""
    return {e.seq: e async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)}


class _Follower:
    """Puts one run's events in seq order, once each, from any mix of live and stored copies."""

    def __init__(self, bus: Bus, run_id: str, after_seq: int, gap_patience: float) -> None:
        self.bus = bus
        self.run_id = run_id
        self.next_seq = after_seq + 1
        self.held: dict[int, RunEvent] = {}
        self.finished = False
        self._patience = gap_patience
        self._gap_since: float | None = None
        self._replayed_at = time.monotonic()

    def offer(self, event: RunEvent) -> list[RunEvent]:
        """The events that are now next in order (possibly none); later ones wait for the gap."""
        if event.seq >= self.next_seq and not self.finished:
            self.held.setdefault(event.seq, event)
        ready: list[RunEvent] = []
        while not self.finished and self.next_seq in self.held:
            ready.append(self.held.pop(self.next_seq))
            self.next_seq += 1
            self.finished = is_terminal(ready[-1])
        self._gap_since = (self._gap_since or time.monotonic()) if self.held and not self.finished else None
        return ready

    async def from_stream(self) -> AsyncGenerator[RunEvent, None]:
        """Whatever the stream holds beyond what was delivered, in order, as it is read.

        Yielded one by one while the replay goes on (not gathered first), so a long resumed
        run reaches a slow reader at the pace it reads.
        """
        self._replayed_at = time.monotonic()
        replay = self.bus.replay(subjects.EVENTS_STREAM, subjects.run_events(self.run_id), RunEvent)
        async with contextlib.aclosing(replay) as stored:
            async for event in stored:
                for ready in self.offer(event):
                    yield ready
                if self.finished:
                    return
        self._check_gap()

    async def catch_up(self, *, quiet: bool) -> AsyncGenerator[RunEvent, None]:
        """After a quiet spell, or while a gap lasts: complete the live tail from the stream.

        A quiet spell costs one look at the newest stored event; the whole run is replayed only
        when that shows something undelivered (or, rarely, to catch an event stored out of
        order behind it).
        """
        now = time.monotonic()
        if self._gap_since is not None:
            if now - self._replayed_at < self.wait_time():
                return
        elif not quiet:
            return
        elif now - self._replayed_at < FULL_REPLAY_INTERVAL:
            last = await self.bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(self.run_id), RunEvent)
            if last is None or last.seq < self.next_seq:
                return
        async with contextlib.aclosing(self.from_stream()) as stored:
            async for event in stored:
                yield event

    def _check_gap(self) -> None:
        if self._gap_since is not None and time.monotonic() - self._gap_since >= self._patience:
            missing = [s for s in range(self.next_seq, min(self.held)) if s not in self.held]
            msg = f"run {self.run_id}: events {missing} are missing from the stream"
            raise StreamGapError(msg)

    def wait_time(self) -> float:
        """How long to wait for the live tail before looking at the stream again."""
        if self._gap_since is None:
            return IDLE_CHECK
        # A gap is usually an event resent a moment later: look soon, then less often.
        waited = time.monotonic() - self._gap_since
        return max(0.05, min(1.0, waited / 2, self._patience - waited))


async def follow_run(
    bus: Bus,
    run_id: str,
    *,
    after_seq: int = 0,
    submit: RunRequest | None = None,
    gap_patience: float = GAP_PATIENCE,
) -> AsyncGenerator[RunEvent, None]:
    """Yield the events of `run_id` with seq > `after_seq`, in order, once each, through the terminal one.

    With `submit`, the run is submitted after the live subscription is in place (a new run).
    Otherwise the stored events come first (a resume), then the live tail; a finished run
    ends at its stored terminal event. A live tail that goes quiet, or that skips a seq, is
    completed from the stream: events published while this process's connection was down,
    or resent by their writer after a broker restart, still arrive in order.

    Raises:
        SubmitError: `submit` could not be queued.
        UnknownRunError: resuming a run of which nothing is stored.
        StreamGapError: an event stayed missing from both the live tail and the stream for
            `gap_patience` seconds.
    """
    follower = _Follower(bus, run_id, after_seq, gap_patience)
    async with bus.subscribe(subjects.run_events(run_id), RunEvent) as live:
        if submit is not None:
            await submit_run(bus, submit)
        else:
            last = await bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
            if last is None:
                raise UnknownRunError(run_id)
            if is_terminal(last) and last.seq < follower.next_seq:
                return  # the client already saw the end
            async with contextlib.aclosing(follower.from_stream()) as stored:
                async for event in stored:
                    yield event
        while not follower.finished:
            try:
                envelope = await live.receive(follower.wait_time())
            except StopAsyncIteration:
                return
            for event in follower.offer(envelope.message) if envelope is not None else []:
                yield event
            async with contextlib.aclosing(follower.catch_up(quiet=envelope is None)) as caught_up:
                async for event in caught_up:
                    yield event


async def send_control(bus: Bus, control: Control, *, timeout: float = 2.0) -> ControlAck:
    """Send `control` to the worker owning the run; a not-accepted ack if nobody does."""
    try:
        return await bus.request(subjects.run_control(control.run_id), control, ControlAck, timeout=timeout)
    except BusError as exc:
        return ControlAck(accepted=False, detail=f"no worker owns this run ({type(exc).__name__})")


async def cancel_run(bus: Bus, run_id: str, reason: str, *, principal: Principal | None = None) -> bool:
    """Ask the worker owning `run_id` to cancel it; False when nobody owns it (or no answer)."""
    control = Control(run_id=run_id, cancel=Cancel(reason=reason), principal=principal)
    return (await send_control(bus, control, timeout=1.0)).accepted
