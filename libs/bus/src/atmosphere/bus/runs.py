"""The run protocol on the bus: submitting a run and writing its numbered event stream.

A run's events form one ordered stream on `atmo.run.<run_id>.evt` with `seq` from 1 and a
single writer at a time. The submitter (ingress, or dispatch for gRPC) writes seq 1, the
`X-Atmosphere-Run-Id` metadata event, before it queues the `RunSubmission`, so a client learns
the run id (and can resume by it) even before a worker picks the run up. The worker that
owns the run writes from seq 2 on, each event stored exactly once even across a broker
restart (`RunEventWriter`, in `_run_writer`); the stream pieces that make up nearly every
event carry no headers, because every subscriber would pay to parse them on every token. A
run re-driven after a worker died continues after the last seq `ATMO_EVENTS` holds.
Followers (`follow_run`) put events back in seq order, whatever order they were stored in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import subjects, telemetry
from atmosphere.bus._api import Bus, PublishAck
from atmosphere.bus._codec import Headers, wire_size
from atmosphere.bus._retry import FINAL_ERRORS
from atmosphere.bus._run_writer import (
    ACK_PATIENCE,
    MAX_IN_FLIGHT,
    STORE_DEADLINE,
    TERMINAL_KINDS,
    WORKER_FIRST_SEQ,
    RunEventWriter,
    is_terminal,
)
from atmosphere.bus.errors import BusError, DecodeError, PayloadTooLargeError, RunNotQueuedError, plain_reason
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import Cancel, Control, ControlAck, Metadata, RunEvent, RunSubmission

RUN_ID_METADATA_KEY = "X-Atmosphere-Run-Id"
"""The metadata key of the run-id event (seq 1), as Atmosphere clients expect it."""

RESUMED_METADATA_KEY = "ai.run.resumed"
"""The metadata event a re-driven run starts with (its worker died): the run goes on from there,
without sending again what its stream already has."""

EVENT_LOST_METADATA_KEY = "ai.run.event_lost"
"""Marks a seq whose event was lost with the worker that wrote it."""

ANSWER_REWOUND_METADATA_KEY = "ai.run.answer_rewound"
"""A resumed run's answer came out differently than what was already sent (a model asked again
does not always say the same): the value `{"discard": N}` says to drop the last N characters of
the answer received so far; the new text follows. Sent at most once per resume."""

SERVER_SIDE_KINDS = frozenset({"input"})
"""Event kinds no client is sent: `input` holds the model's whole input, system prompt included
(the tape and the journal keep it); a client's frame seqs skip them."""

SUBMIT_DEADLINE = 20.0
"""Seconds a submission keeps trying (a frozen or restarting broker) before it is refused."""

NESTING_METADATA_KEY = "atmosphere.run.nesting"
"""A sub-run's nesting level in `RunSubmission.metadata`: 1 below a top-level run, 2 below that."""

MAX_NESTING = 3
"""The deepest level with a queue of its own; deeper sub-runs share it (a coordinator's fleet
member running `task`, which runs `task` again, is level 3)."""

HISTORY_METADATA_KEY = "ai.request.history"
"""Request metadata of a conversation the client keeps (the Chat Completions door): its earlier
turns, as a JSON list of `{role, content}` (an assistant turn's `tool_calls` and a `tool` turn's
`tool_call_id` too), `[]` for a first message. Present, it is the whole history: conversation
memory neither loads nor records the run's conversation."""

CONTEXT_METADATA_KEY = "ai.request.context"
"""Request metadata with turns this request puts before its prompt, on top of the conversation
memory keeps (the Responses API's `instructions` and earlier input items): the same JSON shape as
the history, used for this response only."""

GATEWAY_METADATA_KEY = "ai.request.gateway"
"""Request metadata of an OpenAI door acting as a model gateway (JSON object): the caller's own
functions (`tools`: `{name, description, parameters}`), its `tool_choice`, its `response_format`,
and the exchange after the user message (`continuation`: turns as in the history)."""

TOOL_CALL_METADATA_KEY = "atmosphere.run.tool_call"
"""Request metadata asking for a run of exactly one tool call and no model (JSON `{"name": <tool>,
"arguments": {...}}`): what the MCP door starts for an app's `@tool` it exposes. Dispatch runs the
call through the tool choke point, as any tool call of the agent, and ends the run with its
result. Reserved (`atmosphere.`): a gRPC client cannot set it."""

log = logging.getLogger("atmosphere.bus")


def new_run(
    *,
    agent: str,
    message: str,
    principal: Principal,
    conversation_id: str,
    transport: str,
    path: str = "",
    metadata: Mapping[str, str] | None = None,
    parent: RunSubmission | None = None,
    subagent: bool = False,
    run_id: str = "",
    pool: str = "",
) -> RunSubmission:
    """A submitted run: fresh run and session ids, the submission time, and its nesting.

    The one place a `RunSubmission` is made. A sub-run (`parent` given) runs as its parent's
    principal, one nesting level below it (so it is queued where its parent cannot starve it),
    and one `task` depth below it when it is a `subagent` (else at its parent's depth).
    `run_id` fixes the id (a durable parent's resumed delegation finds its sub-run again).
    `pool` is the dispatch pool of `agent` (its descriptor's): the queue it waits in.
    """
    submitted = Timestamp()
    submitted.FromNanoseconds(time.time_ns())
    metadata = dict(metadata or {})
    if parent is not None:
        metadata[NESTING_METADATA_KEY] = str(nesting_of(parent) + 1)
        metadata[SUBAGENT_DEPTH_METADATA_KEY] = str(subagent_depth_of(parent) + (1 if subagent else 0))
        principal = parent.principal
    return RunSubmission(
        run_id=run_id or uuid.uuid4().hex,
        session_id=str(uuid.uuid4()),
        conversation_id=conversation_id,
        agent=agent,
        message=message,
        principal=principal,
        parent_run_id=parent.run_id if parent is not None else "",
        metadata=metadata,
        submitted_at=submitted,
        transport=transport,
        path=path,
        pool=pool,
    )


SUBAGENT_DEPTH_METADATA_KEY = "ai.subagent.depth"
"""How many `task` sub-agents deep a run is (Atmosphere's key; only `task` spawns count, not
`delegate_task`): what the harness's subagent nesting bound reads."""


def _level(request: RunSubmission, key: str) -> int:
    """A non-negative level from `request.metadata[key]` (absent or malformed reads as 0)."""
    try:
        return max(0, int(request.metadata.get(key, "0")))
    except ValueError:
        return 0


def nesting_of(request: RunSubmission) -> int:
    """How many runs `request` is nested below (0 for a top-level run)."""
    return _level(request, NESTING_METADATA_KEY)


def subagent_depth_of(request: RunSubmission) -> int:
    """How many `task` sub-agents deep `request` runs (0 outside any)."""
    return _level(request, SUBAGENT_DEPTH_METADATA_KEY)


def submission_subject(request: RunSubmission) -> str:
    """Where `request` is queued: its pool's queue at its nesting level."""
    return subjects.run_submit(request.agent, level=queue_level(request), pool=request.pool)


def queue_level(request: RunSubmission) -> int:
    """The `ATMO_RUNS` level `request` is queued on: its nesting, capped at `MAX_NESTING`."""
    return min(nesting_of(request), MAX_NESTING)


class SubmitError(BusError):
    """A run could not be queued (the broker is unreachable): nothing runs it; try again."""


async def submit_run(bus: Bus, request: RunSubmission, *, deadline: float = SUBMIT_DEADLINE) -> PublishAck:
    """Accept a run: store its run-id event (seq 1), then queue it on `ATMO_RUNS` at its level.

    Subscribe to `subjects.run_events(request.run_id)` before calling this to see every event.
    Submitting the same run id twice queues it once (`Nats-Msg-Id` = run id), so a frozen or
    restarting broker is retried for up to `deadline` seconds without queueing the run twice.

    The run-id event is stored *before* the run is queued: no worker can write seq 2 before
    seq 1 is in `ATMO_EVENTS`, so the stream holds every run's events in seq order and a plain
    subscriber of the stream reads them in order (one writer per run at a time). That costs
    one round trip of latency before the run is queued, and no more messages.

    Raises:
        SubmitError: the run was not queued (no connection, or no acknowledgement in time).
        PayloadTooLargeError: the request does not fit in one message.
    """
    if not bus.is_connected:
        # Refused at once rather than buffered by the client library: a buffered submission
        # could still run after its caller was told it failed.
        msg = f"run {request.run_id} was not submitted: the broker is unreachable"
        raise SubmitError(msg)
    tracer = telemetry.tracer()
    if tracer is not None and not request.traceparent:
        request.traceparent = tracer.traceparent()  # the run's spans join the submitter's trace
    headers = Headers(msg_id=request.run_id)
    # Refused before anything is written: a run-id event must not be left for a run that
    # could never be queued.
    size = request.ByteSize() + wire_size(b"", headers.to_wire())
    if size > bus.max_payload:
        raise PayloadTooLargeError(submission_subject(request), size, bus.max_payload)
    give_up = time.monotonic() + deadline
    writer = RunEventWriter(bus, request, first_seq=1, store_deadline=deadline)
    run_id_event = RunEvent(metadata=Metadata(key=RUN_ID_METADATA_KEY, value_json=json.dumps(request.run_id)))
    try:
        await writer.emit(run_id_event, durable=True)
    except BusError as exc:
        if isinstance(exc, FINAL_ERRORS):
            raise
        msg = f"run {request.run_id} was not submitted: its first event was not stored ({exc})"
        raise SubmitError(msg) from exc
    subject = submission_subject(request)
    try:
        return await _publish_until(bus, subject, request, headers, max(0.0, give_up - time.monotonic()))
    except BusError as exc:
        if isinstance(exc, PayloadTooLargeError):
            raise
        await _end_unqueued(bus, request, writer.next_seq, exc)
        msg = f"run {request.run_id} was not submitted: {exc}"
        raise SubmitError(msg) from exc


NOT_QUEUED_PATIENCE = 2.0
"""Seconds spent telling a run's readers that it was never queued, before giving up on that."""


async def _end_unqueued(bus: Bus, request: RunSubmission, seq: int, reason: BusError) -> None:
    """Give a run whose seq 1 is stored but which could not be queued a terminal event.

    A client that learnt the run id from seq 1 and resumes by it then sees the run end (with a
    retryable error: nothing ran) instead of waiting for events that will never come. The
    broker is likely unreachable, so this is a short attempt; it fails quietly.
    """
    writer = RunEventWriter(bus, request, first_seq=seq, store_deadline=NOT_QUEUED_PATIENCE)
    ended = RunEvent(error=RunNotQueuedError("the run was not queued; send it again").to_proto())
    try:
        await writer.emit(ended)
    except BusError as exc:
        log.warning("run %s: not queued (%s); its end could not be recorded either (%s)", request.run_id, reason, exc)


async def _publish_until(
    bus: Bus, subject: str, message: RunSubmission, headers: Headers, deadline: float
) -> PublishAck:
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


class UnknownRunError(BusError, LookupError):
    """No events are stored for that run id (never existed, or expired)."""


class StreamGapError(BusError, RuntimeError):
    """Events of a run are missing from both the live subscription and the stream, for good.

    Their writer gave up storing them: a reader cannot go on past them, and a resume would stop
    at the same place.
    """

    def __init__(self, run_id: str, missing: list[int]) -> None:
        self.run_id = run_id
        self.missing = missing
        super().__init__(f"run {run_id}: events {missing} are missing from the stream")

    @property
    def plainly(self) -> str:
        """What a client is told: the run, and which events it will never get."""
        shown = ", ".join(str(seq) for seq in self.missing[:10]) + (", ..." if len(self.missing) > 10 else "")
        return f"Run {self.run_id} lost events {shown} from its stream; it cannot be followed past them"


IDLE_CHECK = 2.0
"""Seconds without a live event after which a follower looks at the stream (it may have missed
events while its own connection was down)."""

FULL_REPLAY_INTERVAL = 30.0
"""A quiet follower replays the whole stored run at most this often (see `_Follower.catch_up`)."""

GAP_PATIENCE = STORE_DEADLINE + 30.0
"""Seconds a follower waits for a missing event (resent after a broker restart) before giving up."""


async def last_event(bus: Bus, run_id: str) -> RunEvent | None:
    """The newest stored event of `run_id` (any one names its agent and owner), or None.

    An undecodable newest message (garbage on the subject) is passed over for the newest
    event that decodes, so one bad message cannot make a run unreadable.
    """
    try:
        return await bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
    except DecodeError:
        events = await stored_events(bus, run_id)
        return events[max(events)] if events else None


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
        if event.seq == self.next_seq and not self.held and not self.finished:
            # The hot path: the next event, in order, nothing held back.
            self.next_seq += 1
            self.finished = is_terminal(event)
            return [event]
        if is_terminal(event) and event.seq < self.next_seq:
            # The run ended before the seq the reader resumes after: nothing more will come.
            self.finished = True
            return []
        if event.seq >= self.next_seq and not self.finished:
            self.held.setdefault(event.seq, event)
        ready: list[RunEvent] = []
        while not self.finished and self.next_seq in self.held:
            ready.append(self.held.pop(self.next_seq))
            self.next_seq += 1
            self.finished = is_terminal(ready[-1])
        if not self.held or self.finished:
            self._gap_since = None
        elif self._gap_since is None:  # `is None`, not falsiness: a monotonic clock may read 0.0
            self._gap_since = time.monotonic()
        return ready

    @property
    def gap_open(self) -> bool:
        """Whether events after a missing seq are being held back."""
        return self._gap_since is not None

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
            last = await last_event(self.bus, self.run_id)
            if last is None or last.seq < self.next_seq:
                return
        async with contextlib.aclosing(self.from_stream()) as stored:
            async for event in stored:
                yield event

    def _check_gap(self) -> None:
        if self._gap_since is not None and time.monotonic() - self._gap_since >= self._patience:
            missing = [s for s in range(self.next_seq, min(self.held)) if s not in self.held]
            raise StreamGapError(self.run_id, missing)

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
    submit: RunSubmission | None = None,
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
    # Not confirmed: what matters follows this client's next publish (the submission, or the
    # stream read of a resume), which the broker takes after the subscription.
    async with bus.subscribe(subjects.run_events(run_id), RunEvent, confirmed=False) as live:
        if submit is not None:
            await submit_run(bus, submit)
        else:
            last = await last_event(bus, run_id)
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
            if envelope is None or follower.gap_open:  # else nothing to catch up: the hot path
                async with contextlib.aclosing(follower.catch_up(quiet=envelope is None)) as caught_up:
                    async for event in caught_up:
                        yield event


class TerminalGate:
    """A run's first terminal event is its last: what comes after it is dropped, counted, logged once."""

    def __init__(self, run_id: str) -> None:
        """Guard the events of run `run_id`."""
        self.run_id = run_id
        self.closed = False
        """Whether the terminal event went through."""
        self.dropped = 0
        """How many events arrived after it."""

    def admit(self, event: RunEvent) -> bool:
        """Whether `event` may go out (a terminal one closes the gate behind it)."""
        if self.closed:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("run %s: dropped %s sent after the terminal event", self.run_id, event.WhichOneof("kind"))
            return False
        if is_terminal(event):
            self.closed = True
        return True


class SinkHost:
    """The host of a `StreamingSession` outside dispatch: its events go to `sink`.

    For a runtime's tests and a summarizer's one-off model call. The first terminal event is
    the last one sent (`TerminalGate`). It has no model, so `stream` is refused.
    """

    def __init__(self, sink: Callable[[RunEvent], Awaitable[None]], *, run_id: str = "") -> None:
        """Send the events of run `run_id` to `sink`."""
        self._sink = sink
        self._gate = TerminalGate(run_id)

    @property
    def closed(self) -> bool:
        """Whether a terminal event was sent."""
        return self._gate.closed

    @property
    def dropped(self) -> int:
        """How many sends arrived after the terminal event and were dropped."""
        return self._gate.dropped

    async def emit(self, event: RunEvent) -> None:
        """Send `event`, unless the terminal one was already sent."""
        if self._gate.admit(event):
            await self._sink(event)

    async def stream(self, message: str) -> None:
        """Refused: only a host with a model (dispatch) can stream."""
        msg = "this session has no model: only runs hosted by dispatch can stream"
        raise RuntimeError(msg)


async def send_control(bus: Bus, control: Control, *, timeout: float = 2.0) -> ControlAck:
    """Send `control` to the worker owning the run; a not-accepted ack if nobody does."""
    try:
        return await bus.request(subjects.run_control(control.run_id), control, ControlAck, timeout=timeout)
    except BusError as exc:
        return ControlAck(accepted=False, detail=f"no worker owns this run ({plain_reason(exc)})")


async def cancel_run(bus: Bus, run_id: str, reason: str, *, principal: Principal | None = None) -> bool:
    """Ask the worker owning `run_id` to cancel it; False when nobody owns it (or no answer)."""
    control = Control(run_id=run_id, cancel=Cancel(reason=reason), principal=principal)
    return (await send_control(bus, control, timeout=1.0)).accepted


__all__ = [
    "ACK_PATIENCE",
    "ANSWER_REWOUND_METADATA_KEY",
    "CONTEXT_METADATA_KEY",
    "EVENT_LOST_METADATA_KEY",
    "GAP_PATIENCE",
    "GATEWAY_METADATA_KEY",
    "HISTORY_METADATA_KEY",
    "IDLE_CHECK",
    "MAX_IN_FLIGHT",
    "MAX_NESTING",
    "NESTING_METADATA_KEY",
    "RESUMED_METADATA_KEY",
    "RUN_ID_METADATA_KEY",
    "SERVER_SIDE_KINDS",
    "STORE_DEADLINE",
    "SUBAGENT_DEPTH_METADATA_KEY",
    "SUBMIT_DEADLINE",
    "TERMINAL_KINDS",
    "TOOL_CALL_METADATA_KEY",
    "WORKER_FIRST_SEQ",
    "RunEventWriter",
    "SinkHost",
    "StreamGapError",
    "SubmitError",
    "TerminalGate",
    "UnknownRunError",
    "cancel_run",
    "follow_run",
    "is_terminal",
    "last_event",
    "nesting_of",
    "new_run",
    "queue_level",
    "send_control",
    "stored_events",
    "subagent_depth_of",
    "submit_run",
]
