"""Transport-independent logic: what a client sends, and following a run's event stream.

`follow_run` is the heart of resumable streams: it yields a run's events after a given seq, in
order and each exactly once — first what `ATMO_EVENTS` already holds, then the live tail — and
back-fills from the stream whatever the live subscription missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.runs import is_terminal, submit_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import (
    ApprovalDecision,
    Cancel,
    Control,
    ControlAck,
    RunEvent,
    RunRequest,
)

log = logging.getLogger("atmosphere.ingress")

APPROVAL_PREFIX = "/__approval/"
HISTORY_METADATA_KEY = "ai.request.history"
"""Request metadata carrying prior turns (JSON list of `{role, content}`) when memory is absent."""


class InboundError(ValueError):
    """An inbound frame that is not a usable prompt or command."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """A parsed inbound prompt."""

    text: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApprovalReply:
    """A human-in-the-loop answer: `/__approval/<id>/<action> [payload]`."""

    approval_id: str
    action: str
    """"approve", "deny" or "respond" (anything unusable has become "deny")."""
    payload_json: str = ""


def parse_approval(raw: str) -> ApprovalReply:
    """Parse an approval reply with Atmosphere's rules: when in doubt, deny.

    `approve` / `yes` may carry edited arguments (`{"arguments": {...}}` or a bare object);
    unparseable arguments deny. `respond` needs a payload (JSON or text) or it denies. Any other
    action denies.
    """
    head, _, payload = raw.strip()[len(APPROVAL_PREFIX) :].partition(" ")
    approval_id, _, action = head.partition("/")
    if not approval_id.startswith("apr_") or not action:
        msg = "An approval reply looks like /__approval/<apr_id>/<approve|deny|respond> [payload]"
        raise InboundError(msg)
    payload = payload.strip()
    deny = ApprovalReply(approval_id, "deny")
    if action in {"approve", "yes"}:
        if not payload:
            return ApprovalReply(approval_id, "approve")
        try:
            edited = json.loads(payload)
        except json.JSONDecodeError:
            return deny
        return ApprovalReply(approval_id, "approve", json.dumps(edited)) if isinstance(edited, dict) else deny
    if action == "respond" and payload:
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            payload = json.dumps(payload)
        return ApprovalReply(approval_id, "respond", payload)
    return deny


def parse_inbound(raw: str) -> Prompt | ApprovalReply:
    """Parse plain text, `{"prompt": "...", "hints": {...}}` or an approval reply.

    Text that merely starts with `{` but is not JSON is taken as a plain prompt.
    """
    text = raw.strip()
    if not text:
        raise InboundError("Empty prompt")
    if text.startswith(APPROVAL_PREFIX):
        return parse_approval(text)
    if not text.startswith("{"):
        return Prompt(text=raw)
    try:
        envelope = json.loads(text)
    except json.JSONDecodeError:
        return Prompt(text=raw)
    if not isinstance(envelope, dict):
        return Prompt(text=raw)
    prompt = envelope.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InboundError('A JSON frame needs a non-empty "prompt" string')
    hints = envelope.get("hints")
    if hints is None:
        hints = {}
    if not isinstance(hints, dict):
        raise InboundError('"hints" must be an object')
    metadata = {f"hints.{k}": json.dumps(v) for k, v in hints.items() if isinstance(k, str)}
    return Prompt(text=prompt, metadata=metadata)


def new_run_request(
    *,
    agent: str,
    prompt: Prompt,
    conversation_id: str,
    principal: Principal,
    transport: str,
    path: str,
) -> RunRequest:
    """A fresh `RunRequest` with new run and session ids."""
    submitted = Timestamp()
    submitted.FromNanoseconds(time.time_ns())
    return RunRequest(
        run_id=uuid.uuid4().hex,
        session_id=str(uuid.uuid4()),
        conversation_id=conversation_id,
        agent=agent,
        message=prompt.text,
        principal=principal,
        metadata=prompt.metadata,
        submitted_at=submitted,
        transport=transport,
        path=path,
    )


class AgentDirectory:
    """Which agents exist and where, from the `ATMO_AGENTS` bucket that dispatch fills."""

    def __init__(self, bus: Bus, *, ttl: float = 2.0) -> None:
        """Read from `bus`, caching the bucket for `ttl` seconds."""
        self._bus = bus
        self._ttl = ttl
        self._loaded = 0.0
        self._by_name: dict[str, AgentDescriptor] = {}
        self._lock = asyncio.Lock()

    async def _refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._loaded < self._ttl:
                return
            self._by_name = await self._bus.kv_items(subjects.AGENTS_BUCKET, AgentDescriptor)
            self._loaded = time.monotonic()

    async def all(self) -> list[AgentDescriptor]:
        """Every agent, by name."""
        await self._refresh()
        return [self._by_name[name] for name in sorted(self._by_name)]

    async def lookup(self, name: str) -> AgentDescriptor | None:
        """The agent `name`, or None when no dispatch ever served it."""
        await self._refresh()
        return self._by_name.get(name)

    async def by_path(self, path: str) -> AgentDescriptor | None:
        """The agent served at `path` (an `@ai_endpoint` path or `/atmosphere/agent/<name>`)."""
        await self._refresh()
        return next((d for d in self._by_name.values() if d.path == path), None)


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


async def send_approval(
    bus: Bus, run_id: str, reply: ApprovalReply, *, principal: Principal | None = None
) -> ControlAck:
    """Route an approval reply to the worker running `run_id`."""
    control = Control(
        run_id=run_id,
        principal=principal,
        approval=ApprovalDecision(approval_id=reply.approval_id, action=reply.action, payload_json=reply.payload_json),
    )
    return await send_control(bus, control)
