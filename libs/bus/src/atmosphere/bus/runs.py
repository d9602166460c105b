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
import time

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects
from atmosphere.bus._api import Bus, PublishAck
from atmosphere.bus._codec import Headers
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunRequest

RUN_ID_METADATA_KEY = "X-Atmosphere-Run-Id"
"""The metadata key of the run-id event (seq 1), as Atmosphere clients expect it."""

WORKER_FIRST_SEQ = 2
"""The first seq the owning worker writes; seq 1 belongs to the submitter."""

TERMINAL_KINDS = frozenset({"complete", "error"})


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


async def submit_run(bus: Bus, request: RunRequest) -> PublishAck:
    """Accept a run: write its run-id event (seq 1), then queue it on `ATMO_RUNS`.

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
        bus.js_publish(subjects.run_submit(request.agent), request, headers=headers),
    )
    return ack
