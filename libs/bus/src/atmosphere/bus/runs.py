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
import json
import logging
import time
from collections.abc import AsyncGenerator

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus, PublishAck
from atmosphere.bus._codec import Headers
from atmosphere.bus.errors import BusError
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import Cancel, Control, ControlAck, Metadata, RunEvent, RunRequest

RUN_ID_METADATA_KEY = "X-Atmosphere-Run-Id"
"""The metadata key of the run-id event (seq 1), as Atmosphere clients expect it."""

WORKER_FIRST_SEQ = 2
"""The first seq the owning worker writes; seq 1 belongs to the submitter."""

TERMINAL_KINDS = frozenset({"complete", "error"})

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


class RunEventWriter:
    """Numbers, stamps and publishes one run's events."""

    def __init__(self, bus: Bus, request: RunRequest, *, first_seq: int = WORKER_FIRST_SEQ) -> None:
        """Write `request`'s events starting at `first_seq`."""
        self._bus = bus
        self._request = request
        self._subject = subjects.run_events(request.run_id)
        self._next_seq = first_seq

    @property
    def next_seq(self) -> int:
        """The seq the next event will get."""
        return self._next_seq

    async def emit(self, event: RunEvent, *, durable: bool | None = None) -> RunEvent:
        """Stamp `event` (ids, seq, timestamp) and publish it; return the stamped event.

        A durable publish waits until JetStream stored the event. Terminal events are always
        durable: once the work item is acked, its outcome must already be on record.
        """
        request = self._request
        event.run_id = request.run_id
        event.session_id = request.session_id
        event.conversation_id = request.conversation_id
        event.agent = request.agent
        event.parent_run_id = request.parent_run_id
        event.seq = self._next_seq
        event.timestamp.CopyFrom(_now())
        self._next_seq += 1
        if durable or (durable is None and is_terminal(event)):
            await self._bus.js_publish(self._subject, event)
        else:
            await self._bus.publish(self._subject, event)
        return event


def nesting_of(request: RunRequest) -> int:
    """How many runs `request` is nested below (0 for a top-level run; malformed reads as 0)."""
    try:
        return max(0, int(request.metadata.get(NESTING_METADATA_KEY, "0")))
    except ValueError:
        return 0


def queue_level(request: RunRequest) -> int:
    """The `ATMO_RUNS` level `request` is queued on: its nesting, capped at `MAX_NESTING`."""
    return min(nesting_of(request), MAX_NESTING)


async def submit_run(bus: Bus, request: RunRequest) -> PublishAck:
    """Accept a run: write its run-id event (seq 1), then queue it on `ATMO_RUNS` at its level.

    Subscribe to `subjects.run_events(request.run_id)` before calling this to see every event.
    Submitting the same run id twice queues it once (`Nats-Msg-Id` = run id).
    """
    writer = RunEventWriter(bus, request, first_seq=1)
    headers = Headers(
        run_id=request.run_id,
        principal=request.principal if request.HasField("principal") else None,
        msg_id=request.run_id,
    )
    # Both publishes leave on this one connection in this order, so the run-id event is stored
    # before any worker can pull the request; waiting for the two acks together saves a round trip.
    run_id_event = RunEvent(metadata=Metadata(key=RUN_ID_METADATA_KEY, value_json=json.dumps(request.run_id)))
    _, ack = await asyncio.gather(
        writer.emit(run_id_event, durable=True),
        bus.js_publish(subjects.run_submit(request.agent, level=queue_level(request)), request, headers=headers),
    )
    return ack


class UnknownRunError(LookupError):
    """No events are stored for that run id (never existed, or expired)."""


class StreamGapError(RuntimeError):
    """Events of a run are missing from both the live subscription and the stream."""


async def _backfill(bus: Bus, run_id: str, first: int, last: int, *, patience: float) -> list[RunEvent]:
    """Stored events with `first <= seq <= last`; waits up to `patience` for stragglers."""
    deadline = time.monotonic() + patience
    while True:
        found = {
            e.seq: e
            async for e in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
            if first <= e.seq <= last
        }
        if len(found) == last - first + 1:
            return [found[s] for s in range(first, last + 1)]
        if time.monotonic() >= deadline:
            missing = [s for s in range(first, last + 1) if s not in found]
            msg = f"run {run_id}: events {missing} are missing from the stream"
            raise StreamGapError(msg)
        await asyncio.sleep(0.05)


async def _stored_from(bus: Bus, run_id: str, first: int) -> AsyncGenerator[RunEvent, None]:
    """The stored events of `run_id` with seq >= `first`, in order; a hole is a `StreamGapError`."""
    expected = first
    async for event in bus.replay(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent):
        if event.seq < expected:
            continue
        if event.seq > expected:
            msg = f"run {run_id}: events {expected}..{event.seq - 1} are no longer stored"
            raise StreamGapError(msg)
        yield event
        expected += 1


async def follow_run(
    bus: Bus,
    run_id: str,
    *,
    after_seq: int = 0,
    submit: RunRequest | None = None,
    gap_patience: float = 2.0,
) -> AsyncGenerator[RunEvent, None]:
    """Yield the events of `run_id` with seq > `after_seq`, in order, once each, through the terminal one.

    With `submit`, the run is submitted after the live subscription is in place (a new run).
    Otherwise the stored events come first (a resume), then the live tail; a finished run
    ends at its stored terminal event.

    Raises:
        UnknownRunError: resuming a run of which nothing is stored.
        StreamGapError: events missing from both the live tail and the stream.
    """
    next_seq = after_seq + 1
    async with bus.subscribe(subjects.run_events(run_id), RunEvent) as live:
        if submit is not None:
            await submit_run(bus, submit)
        else:
            last = await bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
            if last is None:
                raise UnknownRunError(run_id)
            if is_terminal(last) and last.seq < next_seq:
                return  # the client already saw the end
            async for event in _stored_from(bus, run_id, next_seq):
                yield event
                next_seq = event.seq + 1
                if is_terminal(event):
                    return
        async for envelope in live:
            event = envelope.message
            if event.seq < next_seq:
                continue  # already delivered (replayed, or a duplicate)
            if event.seq > next_seq:
                log.info("run %s: live gap %d..%d; back-filling from the stream", run_id, next_seq, event.seq - 1)
                for missing in await _backfill(bus, run_id, next_seq, event.seq - 1, patience=gap_patience):
                    yield missing
                    if is_terminal(missing):
                        return
            yield event
            next_seq = event.seq + 1
            if is_terminal(event):
                return


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
