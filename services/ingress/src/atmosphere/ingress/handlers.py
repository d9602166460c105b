"""Transport-independent logic: parsing prompts, starting runs, streaming their frames."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import Bus, BusError, subjects
from atmosphere.bus.runs import is_terminal, submit_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Cancel, Control, ControlAck, RunEvent, RunRequest
from atmosphere.ingress.frames import Frame, error_frame, to_frame

log = logging.getLogger("atmosphere.ingress")

SendFrame = Callable[[Frame], Awaitable[None]]
Receive = Callable[[], Awaitable[str | None]]


class InboundError(ValueError):
    """An inbound frame that is not a usable prompt."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """A parsed inbound prompt."""

    text: str
    metadata: dict[str, str] = field(default_factory=dict)


def parse_inbound(raw: str) -> Prompt:
    """Parse plain text or `{"prompt": "...", "hints": {...}}`.

    Text that merely starts with `{` but is not JSON is taken as a plain prompt.
    """
    text = raw.strip()
    if not text:
        raise InboundError("Empty prompt")
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
    """Which agents exist, from the `ATMO_AGENTS` bucket that dispatch fills."""

    def __init__(self, bus: Bus, *, ttl: float = 2.0) -> None:
        """Look agents up on `bus`, caching answers for `ttl` seconds."""
        self._bus = bus
        self._ttl = ttl
        self._cache: dict[str, tuple[float, AgentDescriptor | None]] = {}

    async def lookup(self, name: str) -> AgentDescriptor | None:
        """The agent `name`, or None when no dispatch ever served it."""
        try:
            subjects.token(name, what="agent name")
        except ValueError:
            return None
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        descriptor = await self._bus.kv_get(subjects.AGENTS_BUCKET, name, AgentDescriptor)
        self._cache[name] = (now, descriptor)
        return descriptor


async def stream_run(bus: Bus, request: RunRequest, send: SendFrame) -> None:
    """Submit `request` and send each of its frames, in seq order, through its terminal one."""
    async with bus.subscribe(subjects.run_events(request.run_id), RunEvent) as events:
        try:
            await submit_run(bus, request)
        except BusError as exc:
            log.warning("could not submit run %s: %s", request.run_id, exc)
            await send(
                error_frame(
                    "The run could not be submitted; try again",
                    session_id=request.session_id,
                    code="ingress.unavailable",
                )
            )
            return
        last_seq = 0
        async for envelope in events:
            event = envelope.message
            if event.seq <= last_seq:
                continue  # a duplicate delivery
            last_seq = event.seq
            frame = to_frame(event)
            if frame is not None:
                await send(frame)
            if is_terminal(event):
                return


async def cancel_run(bus: Bus, run_id: str, reason: str) -> bool:
    """Ask the worker owning `run_id` to cancel it; False when nobody owns it (or no answer)."""
    control = Control(run_id=run_id, cancel=Cancel(reason=reason))
    try:
        ack = await bus.request(subjects.run_control(run_id), control, ControlAck, timeout=1.0)
    except BusError:
        return False
    return ack.accepted


class ClientGoneError(Exception):
    """The client disconnected while a frame was being sent."""


@dataclass
class Connection:
    """One client connection to an agent: many prompts, one ordered outbound channel."""

    bus: Bus
    agent: str
    conversation_id: str
    principal: Principal
    transport: str
    path: str
    max_prompts: int
    send_queue_frames: int

    async def serve(self, receive: Receive, send: SendFrame) -> None:
        """Read prompts until the client leaves; stream each prompt's run concurrently."""
        outbound: asyncio.Queue[Frame] = asyncio.Queue(self.send_queue_frames)
        runs: dict[asyncio.Task[None], str] = {}
        writer = asyncio.create_task(self._write(outbound, send))
        try:
            while (raw := await receive()) is not None:
                self._start(raw, outbound, runs)
        finally:
            # The client is gone: stop its unfinished runs upstream, then the local streams.
            unfinished = [run_id for task, run_id in runs.items() if not task.done()]
            await asyncio.gather(*(cancel_run(self.bus, r, "the client disconnected") for r in unfinished))
            for task in runs:
                task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    def _start(self, raw: str, outbound: asyncio.Queue[Frame], runs: dict[asyncio.Task[None], str]) -> None:
        try:
            prompt = parse_inbound(raw)
        except InboundError as exc:
            _offer(outbound, error_frame(str(exc)))
            return
        if len(runs) >= self.max_prompts:
            _offer(outbound, error_frame(f"At most {self.max_prompts} prompts may run at once on one connection"))
            return
        request = new_run_request(
            agent=self.agent,
            prompt=prompt,
            conversation_id=self.conversation_id,
            principal=self.principal,
            transport=self.transport,
            path=self.path,
        )
        task = asyncio.create_task(self._run(request, outbound))
        runs[task] = request.run_id
        task.add_done_callback(lambda done: runs.pop(done, None))

    async def _run(self, request: RunRequest, outbound: asyncio.Queue[Frame]) -> None:
        try:
            await stream_run(self.bus, request, outbound.put)
        except Exception:
            log.exception("streaming run %s failed", request.run_id)
            _offer(
                outbound,
                error_frame("Internal error while streaming the run", session_id=request.session_id, code="internal"),
            )

    @staticmethod
    async def _write(outbound: asyncio.Queue[Frame], send: SendFrame) -> None:
        while True:
            frame = await outbound.get()
            try:
                await send(frame)
            except ClientGoneError:
                return


def _offer(outbound: asyncio.Queue[Frame], frame: Frame) -> None:
    """Queue a frame ingress produced itself; dropped if the client is that far behind."""
    try:
        outbound.put_nowait(frame)
    except asyncio.QueueFull:
        log.warning("dropping an ingress error frame for a slow client")
