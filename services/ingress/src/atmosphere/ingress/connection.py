"""One client connection to an agent (WebSocket): many prompts, one ordered outbound channel.

A connection may resume a run on connect (its id and the last seq the client saw), start new
runs, and answer approvals. Closing cleanly (close codes 1000/1001) cancels the connection's
unfinished runs; a dropped connection leaves them running so the client can resume them.
A client too slow for its frames is closed with code 4008 and can resume by run id; a stopping
ingress closes every connection with 1012, naming the runs to resume elsewhere. Each run the
connection streams holds one of its client's stream slots (`stream_limits.py`): a prompt or
resume beyond the client's share is refused with an `ingress.too_many_streams` frame. A socket
with no run streaming that hears nothing from its client for `idle_timeout` seconds is closed
(1001), so idle sockets do not pile up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from atmosphere.bus import Bus, BusError, PayloadTooLargeError
from atmosphere.bus.frames import Frame, to_frame
from atmosphere.bus.runs import (
    StreamGapError,
    SubmitError,
    UnknownRunError,
    cancel_run,
    follow_run,
    is_terminal,
    last_event,
)
from atmosphere.bus.telemetry import bind_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.conversations import ConversationTracker
from atmosphere.ingress.errors import (
    ApprovalRejectedError,
    EventsUnavailableError,
    IngressError,
    InternalError,
    MalformedRequestError,
    RequestTooLargeError,
    RunNotFoundError,
    UnavailableError,
    UnknownApprovalError,
)
from atmosphere.ingress.frames import error_frame
from atmosphere.ingress.inbound import (
    ApprovalReply,
    Prompt,
    close_reason,
    new_run_request,
    parse_inbound,
    require_fits,
    require_message_size,
    send_approval,
)
from atmosphere.ingress.mailbox import Mailbox
from atmosphere.ingress.stream_limits import refusal
from atmosphere.service import StreamLimitError, StreamSlot, StreamSlots

log = logging.getLogger("atmosphere.ingress")

SLOW_CLIENT_CODE = 4008
SERVICE_RESTART_CODE = 1012
"""RFC 6455 "service restart": ingress is stopping; reconnect (to another replica) and resume."""
CLEAN_CLOSE_CODES = frozenset({1000, 1001})
IDLE_CLOSE_CODE = 1001
"""RFC 6455 "going away": the server lets an idle socket go; reconnect when there is something to send."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The client went away with this WebSocket close code."""

    code: int

    @property
    def clean(self) -> bool:
        """Whether the client closed on purpose (then its unfinished runs are cancelled)."""
        return self.code in CLEAN_CLOSE_CODES


Receive = Callable[[], Awaitable["str | Closed"]]
SendFrame = Callable[[Frame], Awaitable[None]]
CloseSocket = Callable[[int, str], Awaitable[None]]


class ClientGoneError(Exception):
    """The client disconnected while a frame was being sent."""


@dataclass
class _Close:
    code: int
    reason: str


@dataclass
class Connection:
    """The state of one connection: its runs, the approvals it saw, its outbound queue."""

    bus: Bus
    agent: AgentDescriptor
    conversation_id: str
    principal: Principal
    transport: str
    max_prompts: int
    send_queue_frames: int
    conversations: ConversationTracker | None = None
    max_message_bytes: int = 1 << 20
    """Largest inbound message; a larger one is answered with an `ingress.too_large` error frame."""
    may_resume: Callable[[str], Awaitable[bool]] | None = None
    """Whether this connection's principal may resume a run by id (None: anyone may, no-auth mode)."""
    streams: StreamSlots | None = None
    """Where each run this connection streams takes a slot (None: unbounded, for tests)."""
    client: str = ""
    """Whose share of `streams` its runs count against (`atmosphere.service.client_key`)."""
    idle_timeout: float | None = None
    """Seconds without a client message, while no run streams, after which the socket is closed."""
    runs: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    approvals: dict[str, str] = field(default_factory=dict)
    """approval id → run id, for routing the client's answers."""

    def __post_init__(self) -> None:
        # Bounded by `_enqueue` (a client too slow for its frames is closed), not by the queue.
        self._outbound: Mailbox[Frame | _Close] = Mailbox()
        self._closing = False
        self._last_active = time.monotonic()
        self._idle_timer: asyncio.TimerHandle | None = None

    async def serve(
        self, receive: Receive, send: SendFrame, close: CloseSocket, *, resume: tuple[str, int] | None = None
    ) -> None:
        """Handle the connection until the client leaves."""
        writer = asyncio.create_task(self._write(send, close))
        self._watch_idle()
        closed: Closed | None = None
        if self.conversations is not None:
            self.conversations.socket_opened(self.agent.name, self.conversation_id, self.principal)
        try:
            if resume is not None:
                await self._resume(*resume)
            while not isinstance(received := await receive(), Closed):
                self._last_active = time.monotonic()
                await self._handle(received)
            closed = received
        finally:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            unfinished = [run_id for run_id, task in self.runs.items() if not task.done()]
            if closed is not None and closed.clean and not self._closing:
                await asyncio.gather(
                    *(cancel_run(self.bus, r, "the client disconnected", principal=self.principal) for r in unfinished)
                )
            elif unfinished:
                log.info("connection dropped with %d run(s) still going; they stay resumable", len(unfinished))
            for task in list(self.runs.values()):
                task.cancel()
            await asyncio.gather(*self.runs.values(), return_exceptions=True)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if self.conversations is not None:
                self.conversations.socket_closed(self.agent.name, self.conversation_id)

    async def _resume(self, run_id: str, after_seq: int) -> None:
        """Follow a run the client asked to resume, if it is theirs.

        Someone else's run is answered exactly like a run that does not exist, so run ids
        cannot be probed; the socket stays open for new prompts either way.
        """
        try:
            allowed = self.may_resume is None or await self.may_resume(run_id)
        except BusError as exc:
            log.warning("resuming run %s: the owner check failed: %s", run_id, exc)
            # The run id is the client's own (it asked for it): named, so it resumes that run
            # rather than taking the notice for a prompt that was never started.
            unchecked = UnavailableError(
                f"The run could not be followed now; reconnect with X-Atmosphere-Run-Id {run_id} to resume"
            )
            self._enqueue(_resumable(unchecked, run_id))
            return
        if not allowed:
            self._enqueue(error_frame(RunNotFoundError(f"Unknown run {run_id}")))
            return
        self._follow(run_id, after_seq=after_seq)

    def drain(self) -> None:
        """Ingress is stopping: close with 1012, naming the runs to resume on another replica.

        Unfinished runs are left running (a 1012 is not a clean close), so the client resumes
        them by id; frames already queued are dropped, the stream still holds them.
        """
        if self._closing:
            return
        self._closing = True
        unfinished = [r for r, t in self.runs.items() if not t.done()]
        reason = (
            f"Server restarting; resume with X-Atmosphere-Run-Id: {', '.join(unfinished)}"
            if unfinished
            else "Server restarting; reconnect"
        )
        self._outbound.clear()
        self._outbound.put_nowait(_Close(SERVICE_RESTART_CODE, close_reason(reason)))

    def reject(self, error: IngressError) -> None:
        """Answer an unusable inbound message with an error frame; the socket stays open."""
        self._enqueue(error_frame(error))

    async def _handle(self, raw: str) -> None:
        # The last resort: whatever one message does, the socket and its other runs carry on.
        try:
            await self._handle_inbound(raw)
        except Exception:
            log.exception("an inbound message could not be handled")
            self.reject(InternalError("The message could not be handled"))

    async def _handle_inbound(self, raw: str) -> None:
        try:
            require_message_size(raw, self.max_message_bytes)
            inbound = parse_inbound(raw)
            if isinstance(inbound, ApprovalReply):
                await self._approve(inbound)
            else:
                self._start(inbound)
        except MalformedRequestError as exc:
            self.reject(exc)

    async def _approve(self, reply: ApprovalReply) -> None:
        run_id = self.approvals.get(reply.approval_id)
        if run_id is None:
            self._enqueue(error_frame(UnknownApprovalError(f"Unknown approval {reply.approval_id}")))
            return
        ack = await send_approval(self.bus, run_id, reply, principal=self.principal)
        if not ack.accepted:
            rejected = ApprovalRejectedError(f"Approval {reply.approval_id} was not accepted: {ack.detail}")
            self._enqueue(error_frame(rejected))

    def _start(self, prompt: Prompt) -> None:
        active = sum(not task.done() for task in self.runs.values())
        if active >= self.max_prompts:
            too_many = MalformedRequestError(f"At most {self.max_prompts} prompts may run at once on one connection")
            self._enqueue(error_frame(too_many))
            return
        request = new_run_request(
            agent=self.agent.name,
            prompt=prompt,
            conversation_id=self.conversation_id,
            principal=self.principal,
            transport=self.transport,
            path=self.agent.path,
            pool=self.agent.pool,
        )
        require_fits(request, self.bus.max_payload)
        if self.conversations is not None:
            self.conversations.touch(self.agent.name, self.conversation_id, self.principal)
        self._follow(request.run_id, submit=request)

    def _follow(self, run_id: str, *, after_seq: int = 0, submit: RunSubmission | None = None) -> None:
        """Stream `run_id` (submitting `submit` first) in a task of its own, holding a stream slot."""
        try:
            slot = self.streams.claim(self.client) if self.streams is not None else None
        except StreamLimitError as exc:
            self._enqueue(_refused(exc, run_id, submit))
            return
        # Named in the socket's access line; bound in its own task (a socket streams several runs).
        note_run(run_id, bind=False)
        task = asyncio.create_task(self._pump(run_id, after_seq, submit))
        # Given back when the task ends, even one cancelled before it ran (its `finally` never runs).
        task.add_done_callback(lambda _: self._ended(slot))
        self.runs[run_id] = task

    def _ended(self, slot: StreamSlot | None) -> None:
        if slot is not None:
            slot.release()
        self._last_active = time.monotonic()

    def _watch_idle(self) -> None:
        """Close the socket once it has been idle for `idle_timeout` seconds (no run, no message).

        A timer, not a task: thousands of quiet sockets each cost a timer entry, not a coroutine.
        """
        if self.idle_timeout is None or self._closing:
            return
        if any(not task.done() for task in self.runs.values()):
            self._last_active = time.monotonic()
        idle_for = time.monotonic() - self._last_active
        if idle_for < self.idle_timeout:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(self.idle_timeout - idle_for, self._watch_idle)
            return
        self._closing = True
        reason = f"Idle for {self.idle_timeout:g} s; reconnect to go on"
        self._outbound.put_nowait(_Close(IDLE_CLOSE_CODE, close_reason(reason)))

    async def _pump(self, run_id: str, after_seq: int, submit: RunSubmission | None) -> None:
        with bind_run(run_id, self.agent.name):  # every line logged for this run names it
            await self._stream(run_id, after_seq, submit)

    async def _stream(self, run_id: str, after_seq: int, submit: RunSubmission | None) -> None:
        session_id = submit.session_id if submit is not None else ""
        followed = False
        try:
            async for event in follow_run(self.bus, run_id, after_seq=after_seq, submit=submit):
                followed = True
                if event.WhichOneof("kind") == "approval_required":
                    # A sub-agent's approval is answered to the sub-run that waits for it.
                    self.approvals[event.approval_required.approval_id] = event.origin_run_id or run_id
                frame = to_frame(event)
                if frame is not None:
                    self._enqueue(frame)
            if submit is None and not followed:
                await self._answer_resume_past_end(run_id)
        except (UnknownRunError, StreamGapError, BusError) as exc:
            self._enqueue(_follow_failure(exc, run_id, session_id))

    async def _answer_resume_past_end(self, run_id: str) -> None:
        """Answer a resume at (or past) the end of a finished run with its terminal frame again.

        The client learns that the run is over instead of waiting on a silent socket.
        """
        last = await last_event(self.bus, run_id)
        frame = to_frame(last) if last is not None and is_terminal(last) else None
        if frame is None:
            # Nothing came and the run has not ended: the live subscription itself closed.
            frame = error_frame(_stream_broke(run_id))
        self._enqueue({**frame, "runId": run_id})

    def _enqueue(self, frame: Frame) -> None:
        if self._closing:
            return
        if self._outbound.qsize() >= self.send_queue_frames:
            # The client reads slower than its runs produce: close it rather than buffer without
            # bound; every frame stays in ATMO_EVENTS for it to resume from.
            self._closing = True
            resumable = ", ".join(r for r, t in self.runs.items() if not t.done())
            reason = f"Client too slow; reconnect with X-Atmosphere-Run-Id to resume ({resumable})"[:120]
            self._outbound.put_nowait(_Close(SLOW_CLIENT_CODE, reason))
            return
        self._outbound.put_nowait(frame)

    async def _write(self, send: SendFrame, close: CloseSocket) -> None:
        while True:
            item = await self._outbound.get()
            if isinstance(item, _Close):
                await close(item.code, item.reason)
                return
            try:
                await send(item)
            except ClientGoneError:
                return


def _refused(exc: StreamLimitError, run_id: str, submit: RunSubmission | None) -> Frame:
    """The frame of a run not streamed for want of a slot: a prompt not started, or a run to resume later."""
    error = refusal(exc)
    if submit is not None:
        return error_frame(error)  # nothing was submitted: the client may send the prompt again
    return {**error_frame(error), "runId": run_id}


def _stream_broke(run_id: str) -> UnavailableError:
    return UnavailableError(f"The run's stream broke; reconnect with X-Atmosphere-Run-Id {run_id} to resume")


def _follow_failure(exc: Exception, run_id: str, session_id: str) -> Frame:
    """The error frame of a run that could not be followed (or submitted), by what went wrong.

    `UnknownRunError` and `StreamGapError` are `BusError`s too: they are told apart first.
    """
    if isinstance(exc, UnknownRunError):
        return error_frame(RunNotFoundError(f"Unknown run {run_id}"))
    if isinstance(exc, StreamGapError):
        log.warning("%s", exc)
        return error_frame(EventsUnavailableError(exc.plainly), session_id=session_id)
    if isinstance(exc, PayloadTooLargeError):
        return error_frame(RequestTooLargeError(f"The prompt is too large: {exc}"), session_id=session_id)
    if isinstance(exc, SubmitError):
        # Nothing was queued: the client may simply send the prompt again.
        log.warning("%s", exc)
        message = "The run was not started (the message broker is unavailable); send the prompt again"
        return error_frame(UnavailableError(message), session_id=session_id)
    log.warning("following run %s failed: %s", run_id, exc)
    return _resumable(_stream_broke(run_id), run_id, session_id=session_id)


def _resumable(error: UnavailableError, run_id: str, *, session_id: str = "") -> Frame:
    """An error frame naming the run the client should resume (`runId`), not send again."""
    return {**error_frame(error, session_id=session_id), "runId": run_id}
