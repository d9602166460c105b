"""Agent endpoints: WebSocket, SSE and long-poll, and the run resources they resume from.

    WS   /atmosphere/agent/{name}            prompts in, frames out; resume with X-Atmosphere-Run-Id
    POST /atmosphere/agent/{name}            SSE: one prompt, its frames (`id:` = seq)
    POST /atmosphere/agent/{name}/poll       long-poll: start a run, then poll it
    GET  /atmosphere/runs/{run_id}/events    SSE resume (`Last-Event-ID`)
    GET  /atmosphere/runs/{run_id}/poll      long-poll: frames after `after`
    POST /atmosphere/runs/{run_id}/cancel    cancel a run
    POST /atmosphere/runs/{run_id}/approval  answer an approval (`/__approval/<id>/<action> ...`)

`@ai_endpoint` paths are served the same way (WebSocket and SSE) at their own path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, WebSocket
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from atmosphere.bus import BusError, PayloadTooLargeError, subjects
from atmosphere.bus.frames import Frame, to_frame
from atmosphere.bus.runs import (
    StreamGapError,
    UnknownRunError,
    cancel_run,
    follow_run,
    is_terminal,
    last_event,
    stored_events,
    submit_run,
)
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.connection import ClientGoneError, Closed, Connection
from atmosphere.ingress.errors import (
    AgentNotFoundError,
    EventsUnavailableError,
    MalformedRequestError,
    RequestTooLargeError,
    RunNotFoundError,
    ServerRestartingError,
    UnavailableError,
)
from atmosphere.ingress.http import (
    agent_principal,
    bounded_body,
    bounded_text,
    error_responses,
    identified_caller,
    message_limit_of,
    require_token,
    state_of,
)
from atmosphere.ingress.inbound import (
    ApprovalReply,
    Prompt,
    close_reason,
    new_run_request,
    parse_approval,
    parse_inbound,
    require_fits,
    send_approval,
)
from atmosphere.ingress.pacing import Pause, paced
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import HeldStreamResponse, address_of, claim_stream
from atmosphere.service import StreamSlot, client_key, scoped_conversation

RESUME_RUN_HEADER = "x-atmosphere-run-id"
"""The HTTP/WebSocket header naming a run to resume (not the bus's own run-id header)."""
LAST_SEQ_HEADER = "x-atmosphere-last-seq"
CONVERSATION_HEADER = "x-atmosphere-conversation-id"
CLOSE_AUTH = {401: 4401, 403: 4403}
CLOSE_UNKNOWN = 4404
CLOSE_UNAVAILABLE = 4503
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
POLL_QUIET = 0.05
"""A long-poll answer goes out once no further frame arrived for this long."""

router = APIRouter()
log = logging.getLogger("atmosphere.ingress")

RUN_ID_PATTERN = r"^[A-Za-z0-9_\-:@]{1,128}$"
RunId = Annotated[str, Path(json_schema_extra={"pattern": RUN_ID_PATTERN})]
PROMPT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "text/plain": {"schema": {"type": "string", "minLength": 1, "pattern": r"\S"}},
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["prompt"],
                    "properties": {"prompt": {"type": "string", "pattern": r"\S"}, "hints": {"type": "object"}},
                },
            },
        },
    }
}
APPROVAL_BODY = {
    "requestBody": {
        "required": True,
        "content": {"text/plain": {"schema": {"type": "string", "pattern": r"^/__approval/apr_[0-9a-f]{12}/[a-z]+"}}},
    }
}
"""A run id; anything not matching the pattern is answered with 400 (never used in a subject)."""
RETRY_AFTER = 2
"""Seconds a client is asked to wait before it tries a run the broker could not take."""


class RunStarted(BaseModel):
    """A long-poll run was started."""

    runId: str  # noqa: N815 - the wire's camelCase
    sessionId: str  # noqa: N815
    next: str


class PollResult(BaseModel):
    """Frames after the `after` seq; `done` once the terminal frame is among them."""

    frames: list[dict[str, Any]]
    done: bool
    after: int


class ControlResult(BaseModel):
    """Whether the worker running the run accepted the request."""

    accepted: bool
    detail: str = ""


def conversation_of(given: str | None, principal: Principal) -> str:
    """The conversation a request belongs to: the client's id (validated), else a fresh one.

    An authenticated user's conversations are keyed under their user id (`scoped_conversation`,
    shared with gRPC), so knowing someone else's conversation id never reaches their history or
    files; a fresh id is scoped too, so it counts against its own user's quotas.
    """
    if given:
        try:
            subjects.token(given, what="conversation id")
        except ValueError as exc:
            msg = "Malformed conversation id (1-128 letters, digits, '_', '-', ':', '@')"
            raise MalformedRequestError(msg) from exc
    return scoped_conversation(given or uuid.uuid4().hex, principal)


def sse(frame: Frame) -> bytes:
    """One SSE event: `id:` is the seq, so `Last-Event-ID` resumes after it."""
    return f"id: {frame['seq']}\ndata: {json.dumps(frame, separators=(',', ':'))}\n\n".encode()


@dataclass
class _Sent:
    """The seq of the last frame an SSE stream sent: where its client resumes."""

    seq: int


def _sse_response(
    state: IngressState,
    run_id: str,
    events: AsyncIterator[RunEvent],
    *,
    slot: StreamSlot,
    after_seq: int = 0,
    headers: dict[str, str],
) -> HeldStreamResponse:
    """The run's frames as SSE; a comment while it is quiet; a last word when ingress drains.

    The stream's `slot` is given back when the response is over, however it ended.
    """
    sent = _Sent(after_seq)

    async def last_words() -> bytes:
        return _drained(run_id, sent.seq)

    return HeldStreamResponse(
        _sse_frames(events, sent),
        slot=slot,
        keep_alive=state.settings.ingress.sse_keep_alive,
        draining=state.drain.event,
        last_words=last_words,
        headers=headers,
    )


async def _sse_frames(events: AsyncIterator[RunEvent], sent: _Sent) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            if (frame := to_frame(event)) is not None:
                sent.seq = event.seq
                yield sse(frame)
    except StreamGapError as exc:
        # Lost for good: a resume would stop at the same place, so it is not offered.
        log.warning("an SSE stream stopped at a gap after seq %d: %s", sent.seq, exc)
        lost = EventsUnavailableError(exc.plainly)
        body = {"type": "error", "data": lost.message, "code": lost.code, "recoverable": False}
        yield f"data: {json.dumps(body)}\n\n".encode()
    except BusError as exc:
        # Logged here, told plainly there: no exception name or broker text reaches the client.
        log.warning("an SSE stream broke after seq %d: %s", sent.seq, exc)
        broke = UnavailableError("The stream broke; resume with Last-Event-ID")
        body = {"type": "error", "data": broke.message, "code": broke.code, "recoverable": True}
        yield f"data: {json.dumps(body)}\n\n".encode()


def _drained(run_id: str, last_seq: int) -> bytes:
    """The last event of an SSE stream cut by a stopping ingress: the run goes on; resume it by id.

    No `id:` line, so the client's Last-Event-ID stays the last frame it really got.
    """
    resume = f"/atmosphere/runs/{run_id}/events"
    restarting = ServerRestartingError(
        f"The server is restarting; the run goes on: resume at {resume} with Last-Event-ID: {last_seq}"
    )
    body = {
        "type": "error",
        "data": restarting.message,
        "code": restarting.code,
        "recoverable": True,
        "runId": run_id,
        "lastSeq": last_seq,
        "resume": resume,
    }
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def _prompt_of(raw: bytes, *, declared_json: bool = False) -> Prompt:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        msg = "The prompt must be UTF-8 text"
        raise MalformedRequestError(msg) from None
    parsed = parse_inbound(text, declared_json=declared_json)
    if isinstance(parsed, ApprovalReply):
        msg = "Send approvals to /atmosphere/runs/{run_id}/approval"
        raise MalformedRequestError(msg)
    return parsed


async def _descriptor(
    state: IngressState, *, name: str | None = None, path: str | None = None
) -> AgentDescriptor | None:
    if name is not None:
        try:
            subjects.token(name, what="agent name")
        except ValueError:
            return None
        return await state.directory.lookup(name)
    return await state.directory.by_path(path or "")


@dataclass(frozen=True, slots=True)
class StoredRun:
    """What a run's last stored event says about it: who owns it and which agent runs it."""

    owner: str
    agent: AgentDescriptor


async def _run_agent(state: IngressState, run_id: str) -> StoredRun | None:
    """The owner and agent of a stored run (None for an unknown run, or an agent no longer served).

    Every event carries the owner, so the last one stored is enough.
    """
    last = await last_event(state.bus, run_id)
    if last is None:
        return None
    descriptor = await state.directory.lookup(last.agent)
    return None if descriptor is None else StoredRun(owner=last.owner, agent=descriptor)


def _resume_guard(state: IngressState, caller: Caller, agent: AgentDescriptor) -> Callable[[str], Awaitable[bool]]:
    """Whether a WebSocket of `caller` at `agent`'s route may resume a run: its owner, same agent.

    Another agent's run is refused even when the grant covers that agent too: a route reads only
    its own agent's runs.
    """

    async def may_resume(run_id: str) -> bool:
        stored = await _run_agent(state, run_id)
        return stored is not None and stored.agent.name == agent.name and caller.owns(stored.owner)

    return may_resume


# -- WebSocket ---------------------------------------------------------------------------------


class _SocketRefusedError(Exception):
    """A WebSocket refused before it serves anything: closed with `code` and `reason`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


async def serve_socket(websocket: WebSocket, descriptor: AgentDescriptor | None) -> None:
    """One WebSocket client of an agent (shared by agent names and `@ai_endpoint` paths)."""
    state = state_of(websocket)
    await websocket.accept()
    try:
        connection, resume = _open_connection(state, websocket, descriptor)
    except _SocketRefusedError as refused:
        await websocket.close(refused.code, close_reason(refused.reason))
        return
    close = functools.partial(_close_socket, websocket)
    try:
        with state.drain.tracking(connection):
            await connection.serve(
                _receiver(websocket, connection), functools.partial(_send_frame, websocket), close, resume=resume
            )
    except Exception:
        # Never drop the socket without a close frame: its client learns the connection ended.
        log.exception("a WebSocket connection failed")
        await close(1011, "Internal error; reconnect with X-Atmosphere-Run-Id to resume")


def _open_connection(
    state: IngressState, websocket: WebSocket, descriptor: AgentDescriptor | None
) -> tuple[Connection, tuple[str, int] | None]:
    """The connection of an accepted socket and the run it resumes; `_SocketRefusedError` when refused."""
    try:
        if descriptor is None:
            # Credentials first: without them, which agents exist is nobody's business.
            state.authenticator.identify(websocket.headers, websocket.query_params)
            raise _SocketRefusedError(CLOSE_UNKNOWN, f"Unknown agent '{websocket.url.path.rsplit('/', 1)[-1]}'")
        caller = state.authenticator.caller(descriptor.path, websocket.headers, websocket.query_params)
    except AuthError as exc:
        raise _SocketRefusedError(CLOSE_AUTH[exc.status], exc.message) from None
    headers, query = websocket.headers, websocket.query_params
    resume = _resume_point(headers, query)
    try:
        conversation_id = conversation_of(
            headers.get(CONVERSATION_HEADER) or query.get("conversationId"), caller.principal
        )
    except MalformedRequestError as exc:
        raise _SocketRefusedError(1008, exc.message) from None
    connection = Connection(
        bus=state.bus,
        agent=descriptor,
        conversation_id=conversation_id,
        conversations=state.conversations,
        principal=caller.principal,
        transport="websocket",
        may_resume=_resume_guard(state, caller, descriptor) if state.authenticator.enabled else None,
        max_prompts=state.settings.ingress.max_prompts_per_connection,
        send_queue_frames=state.settings.ingress.send_queue_frames,
        max_message_bytes=message_limit_of(state),
        streams=state.streams,
        client=client_key(caller.principal, address_of(websocket)),
        idle_timeout=state.settings.ingress.ws_idle_timeout,
    )
    return connection, resume


def _resume_point(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, int] | None:
    """The run a connecting client resumes and the last seq it saw (None: it resumes nothing)."""
    resume_id = headers.get(RESUME_RUN_HEADER) or query.get("X-Atmosphere-Run-Id") or query.get("runId")
    if not resume_id:
        return None
    try:
        subjects.token(resume_id, what="run id")
        return resume_id, max(0, int(headers.get(LAST_SEQ_HEADER) or query.get("lastSeq") or 0))
    except ValueError:
        raise _SocketRefusedError(1008, "Malformed run id or last seq") from None


def _receiver(websocket: WebSocket, connection: Connection) -> Callable[[], Awaitable[str | Closed]]:
    """The next text message of `websocket`; a binary one must be UTF-8 or it is answered with an error frame."""

    async def receive() -> str | Closed:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return Closed(int(message.get("code") or 1006))
            if message.get("text") is not None:
                return str(message["text"])
            if message.get("bytes") is not None:
                try:
                    return bytes(message["bytes"]).decode("utf-8")
                except UnicodeDecodeError:
                    connection.reject(MalformedRequestError("A binary frame must hold UTF-8 text"))

    return receive


async def _send_frame(websocket: WebSocket, frame: Frame) -> None:
    try:
        await websocket.send_text(json.dumps(frame, separators=(",", ":")))
    except (RuntimeError, OSError) as exc:
        raise ClientGoneError from exc


async def _close_socket(websocket: WebSocket, code: int, reason: str) -> None:
    # A reason over the protocol's 123 bytes would make the close itself fail.
    with contextlib.suppress(RuntimeError, OSError):
        await websocket.close(code, close_reason(reason))


@router.websocket("/atmosphere/agent/{name}")
async def agent_socket(websocket: WebSocket, name: str) -> None:
    """Prompts in (text or JSON, or approval replies), Atmosphere frames out."""
    await serve_socket_at(websocket, _descriptor(state_of(websocket), name=name))


async def serve_socket_at(websocket: WebSocket, lookup: Awaitable[AgentDescriptor | None]) -> None:
    """Serve the agent `lookup` finds; if the directory cannot be read, refuse with a close code.

    Unhandled, the lookup's `BusError` would make the server reject the handshake with a bare
    500; a client should learn that it may try again.
    """
    try:
        descriptor = await lookup
    except BusError as exc:
        log.warning("agent directory unavailable for %s: %s", websocket.url.path, exc)
        await websocket.accept()
        await websocket.close(CLOSE_UNAVAILABLE, "The agent directory is unavailable; try again")
        return
    await serve_socket(websocket, descriptor)


# -- SSE -----------------------------------------------------------------------------------------


async def _accept_prompt(request: Request, descriptor: AgentDescriptor, *, transport: str) -> RunSubmission:
    """Authenticate a POSTed prompt and build its run; a typed `IngressError` says why it was refused.

    Everything the headers decide (credentials, the conversation id) is checked before a byte
    of the body is read, and the body is read within the message limit as it arrives.
    """
    state = state_of(request)
    principal = agent_principal(state, request, descriptor.path)
    conversation_id = conversation_of(request.headers.get(CONVERSATION_HEADER), principal)
    # A body declared JSON must be a prompt object: broken JSON is a 400, never a prompt.
    declared_json = "json" in request.headers.get("content-type", "").lower()
    prompt = _prompt_of(await bounded_body(request, limit=message_limit_of(state)), declared_json=declared_json)
    run = new_run_request(
        agent=descriptor.name,
        prompt=prompt,
        conversation_id=conversation_id,
        principal=principal,
        transport=transport,
        path=descriptor.path,
    )
    require_fits(run, state.bus.max_payload)
    state.conversations.touch(descriptor.name, conversation_id, principal)
    return run


async def start_sse(request: Request, descriptor: AgentDescriptor | None) -> StreamingResponse:
    """Start a run from a POSTed prompt and stream its frames as Server-Sent Events."""
    state = state_of(request)
    descriptor = _known(state, request, descriptor)
    run = await _accept_prompt(request, descriptor, transport="sse")
    headers = {**SSE_HEADERS, "X-Atmosphere-Run-Id": run.run_id}
    # Claimed before the run is submitted: a refused client starts nothing.
    slot = claim_stream(state.streams, run.principal, address_of(request))
    events = follow_run(state.bus, run.run_id, submit=run)
    # The first event (the run id, seq 1) is read before answering, so a run that could not be
    # queued is a 413 or 503 the client can act on, not a 200 stream with an error in it.
    try:
        first = await anext(events)
    except BusError as exc:
        slot.release()
        raise _not_submitted(run, exc) from None
    except BaseException:
        slot.release()
        raise
    return _sse_response(state, run.run_id, _starting_with(first, events), slot=slot, headers=headers)


def _known(state: IngressState, request: Request, descriptor: AgentDescriptor | None) -> AgentDescriptor:
    """The agent a prompt is for; 404 when there is none, but only after the credentials passed.

    Checked in that order so that agent names cannot be probed without a token (a 401 either way).
    """
    if descriptor is None:
        identified_caller(state, request)
        raise AgentNotFoundError(f"Unknown agent at {request.url.path}")
    return descriptor


async def _starting_with(first: RunEvent, rest: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
    yield first
    async for event in rest:
        yield event


def _not_submitted(run: RunSubmission, exc: BusError) -> RequestTooLargeError | UnavailableError:
    """Why a run was not queued: too large for the broker, or the broker is unreachable (try again)."""
    if isinstance(exc, PayloadTooLargeError):
        return RequestTooLargeError(f"The prompt is too large: {exc}")
    log.warning("run %s (%s) not submitted: %s", run.run_id, run.transport, exc)
    return UnavailableError(
        "The run could not be submitted (the message broker is unavailable); try again", retry_after=RETRY_AFTER
    )


@router.post(
    "/atmosphere/agent/{name}",
    summary="Run a prompt and stream its frames (Server-Sent Events)",
    openapi_extra=PROMPT_BODY,
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {}}}, **error_responses(400, 401, 403, 404, 413, 429)},
)
async def agent_sse(request: Request, name: str) -> StreamingResponse:
    """The body is the prompt: plain text or `{"prompt": "...", "hints": {...}}`."""
    return await start_sse(request, await _descriptor(state_of(request), name=name))


@router.get(
    "/atmosphere/runs/{run_id}/events",
    summary="Resume a run's frames after Last-Event-ID (Server-Sent Events)",
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {}}}, **error_responses(400, 401, 404, 429, 503)},
)
async def run_events(
    request: Request,
    run_id: RunId,
    last_event_id: Annotated[str, Header(pattern=r"^[0-9]{0,15}$")] = "",
    lastEventId: Annotated[int | None, Query(ge=0, le=2**53)] = None,  # noqa: N803 - EventSource's name
) -> StreamingResponse:
    """Every frame after the client's last seq, then the live tail; a finished run ends at its terminal frame."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id or Last-Event-ID")
    after = int(last_event_id) if last_event_id else (lastEventId or 0)
    caller = identified_caller(state, request)
    # Claimed before the run is looked up: a client past its share costs the broker nothing.
    slot = claim_stream(state.streams, caller.principal, address_of(request))
    try:
        await _check_access(state, caller, run_id)
    except BaseException:
        slot.release()
        raise
    events = follow_run(state.bus, run_id, after_seq=after)
    return _sse_response(state, run_id, events, slot=slot, after_seq=after, headers=SSE_HEADERS)


async def _authorize_run(state: IngressState, request: Request, run_id: str) -> Principal:
    """The caller's principal when it may read, cancel or answer this stored run, else a typed refusal.

    Authentication comes first, so a 401 says nothing about the run. A run the caller does not
    own, or whose agent its grant does not cover, is answered exactly like one that does not
    exist (404), so run ids cannot be probed. No-auth mode: every caller may use every run.
    """
    caller = identified_caller(state, request)
    await _check_access(state, caller, run_id)
    return caller.principal


async def _check_access(state: IngressState, caller: Caller, run_id: str) -> None:
    """Pass when `caller` may use the stored run `run_id` (see `_authorize_run`), else a typed refusal."""
    try:
        stored = await _run_agent(state, run_id)
    except BusError:
        raise UnavailableError("Runs cannot be looked up right now; try again") from None
    if stored is None or not caller.may_access(owner=stored.owner, path=stored.agent.path):
        raise RunNotFoundError(f"Unknown run {run_id}")


# -- long-poll -----------------------------------------------------------------------------------


@router.post(
    "/atmosphere/agent/{name}/poll",
    status_code=202,
    response_model=RunStarted,
    summary="Start a run for long-polling",
    openapi_extra=PROMPT_BODY,
    responses=error_responses(400, 401, 403, 404, 413, 503),
)
async def agent_poll_start(request: Request, name: str) -> RunStarted:
    """Queue the prompt; then `GET` the returned `next` URL until `done`."""
    state = state_of(request)
    descriptor = _known(state, request, await _descriptor(state, name=name))
    run = await _accept_prompt(request, descriptor, transport="long-poll")
    try:
        await submit_run(state.bus, run)
    except BusError as exc:
        raise _not_submitted(run, exc) from None
    return RunStarted(runId=run.run_id, sessionId=run.session_id, next=f"/atmosphere/runs/{run.run_id}/poll?after=0")


@router.get(
    "/atmosphere/runs/{run_id}/poll",
    response_model=PollResult,
    summary="Frames of a run after a seq (long-poll)",
    responses=error_responses(400, 401, 404, 429, 503),
)
async def run_poll(
    request: Request,
    run_id: RunId,
    after: Annotated[int, Query(ge=0, le=2**53)] = 0,
    wait: Annotated[float, Query(ge=0, le=120)] = 25.0,
) -> PollResult:
    """Waits up to `wait` seconds (capped by the server) for frames after `after`."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id")
    caller = identified_caller(state, request)
    wait = min(wait, state.settings.ingress.long_poll_max_wait)
    # A poll holds a stream like any follower (briefly, when answered from the store); claimed
    # before the run is looked up, so a client past its share costs the broker nothing.
    with claim_stream(state.streams, caller.principal, address_of(request)):
        await _check_access(state, caller, run_id)
        try:
            frames, done = await _poll_frames(state, run_id, after, wait)
        except (UnknownRunError, StreamGapError, BusError):
            raise RunNotFoundError(f"Run {run_id} cannot be read") from None
    return PollResult(frames=frames, done=done, after=int(frames[-1]["seq"]) if frames else after)


async def _poll_frames(state: IngressState, run_id: str, after: int, wait: float) -> tuple[list[Frame], bool]:
    """The frames after `after`, and whether the run is over.

    What is stored already is answered whatever `wait` is (0 included): the frames after
    `after` up to the terminal one (`done`), or up to the newest stored and whatever follows
    within `POLL_QUIET`. Only when nothing newer is stored does the poll wait, up to `wait`
    seconds, for the next frames of a live run. A run that ended at or before `after` is over
    at once (`done`); a stopping ingress answers at once with what it has.
    """
    frames, done, through = await _stored_frames(state, run_id, after)
    if done:
        return frames, True
    return await _next_frames(state, run_id, through, 0.0 if frames else wait, frames)


async def _stored_frames(state: IngressState, run_id: str, after: int) -> tuple[list[Frame], bool, int]:
    """The stored frames after `after` up to the first missing seq, whether the run ended, and that seq - 1."""
    stored = await stored_events(state.bus, run_id)
    if any(is_terminal(event) and seq <= after for seq, event in stored.items()):
        return [], True, after  # the client already saw the end
    frames: list[Frame] = []
    seq = after + 1
    while (event := stored.get(seq)) is not None:
        if (frame := to_frame(event)) is not None:
            frames.append(frame)
        if is_terminal(event):
            return frames, True, seq
        seq += 1
    return frames, False, seq - 1


async def _next_frames(
    state: IngressState, run_id: str, after: int, wait: float, frames: list[Frame]
) -> tuple[list[Frame], bool]:
    """`frames` and those a live run sends after `after`, and whether the run ended.

    The first new frame is waited for up to `wait` seconds; after one, until `POLL_QUIET`
    passes without another.
    """
    deadline = time.monotonic() + wait
    events = paced(follow_run(state.bus, run_id, after_seq=after), draining=state.drain.event)
    try:
        while True:
            budget = deadline - time.monotonic() if not frames else POLL_QUIET
            if budget <= 0:
                return frames, False
            try:
                async with asyncio.timeout(budget):
                    item = await anext(events)
            except TimeoutError:
                return frames, False
            except StopAsyncIteration:
                # The follower ended without a terminal event after `after`: the run ended before.
                return frames, await _ended(state, run_id)
            if isinstance(item, Pause):
                return frames, False
            if (frame := to_frame(item)) is not None:
                frames.append(frame)
            if is_terminal(item):
                return frames, True
    finally:
        await events.aclose()


async def _ended(state: IngressState, run_id: str) -> bool:
    last = await last_event(state.bus, run_id)
    return last is not None and is_terminal(last)


# -- control -------------------------------------------------------------------------------------


@router.post(
    "/atmosphere/runs/{run_id}/cancel",
    response_model=ControlResult,
    summary="Cancel a run",
    responses=error_responses(400, 401, 404, 503),
)
async def run_cancel(request: Request, run_id: RunId) -> ControlResult:
    """False when no worker owns the run any more (it already ended)."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id")
    principal = await _authorize_run(state, request, run_id)
    return ControlResult(accepted=await cancel_run(state.bus, run_id, "cancelled by the client", principal=principal))


@router.post(
    "/atmosphere/runs/{run_id}/approval",
    response_model=ControlResult,
    summary="Answer an approval request",
    openapi_extra=APPROVAL_BODY,
    responses=error_responses(400, 401, 404, 413, 503),
)
async def run_approval(request: Request, run_id: RunId) -> ControlResult:
    """The body is `/__approval/<id>/<approve|yes|deny|respond> [payload]`."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id")
    # Who asks, and whether the run is theirs, is settled before the body is read at all.
    principal = await _authorize_run(state, request, run_id)
    reply = parse_approval(await bounded_text(request, limit=message_limit_of(state)))
    ack = await send_approval(state.bus, run_id, reply, principal=principal)
    return ControlResult(accepted=ack.accepted, detail=ack.detail)
