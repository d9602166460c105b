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
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from atmosphere.bus import BusError, subjects
from atmosphere.bus.runs import StreamGapError, UnknownRunError, cancel_run, follow_run, is_terminal, submit_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunRequest
from atmosphere.ingress.auth import AuthError
from atmosphere.ingress.connection import ClientGoneError, Closed, Connection
from atmosphere.ingress.frames import Frame, to_frame
from atmosphere.ingress.handlers import (
    ApprovalReply,
    InboundError,
    Prompt,
    new_run_request,
    parse_approval,
    parse_inbound,
    send_approval,
)
from atmosphere.ingress.state import IngressState

RUN_ID_HEADER = "x-atmosphere-run-id"
LAST_SEQ_HEADER = "x-atmosphere-last-seq"
CONVERSATION_HEADER = "x-atmosphere-conversation-id"
CLOSE_AUTH = {401: 4401, 403: 4403}
CLOSE_UNKNOWN = 4404
CLOSE_UNAVAILABLE = 4503
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
POLL_QUIET = 0.05
"""A long-poll answer goes out once no further frame arrived for this long."""

router = APIRouter()

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


class ErrorBody(BaseModel):
    """Every non-2xx answer of ingress's own routes."""

    error: str
    code: str


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

    An authenticated user's conversations are keyed under their user id, so knowing someone
    else's conversation id never reaches their history or files.
    """
    if not given:
        return uuid.uuid4().hex
    try:
        subjects.token(given, what="conversation id")
    except ValueError as exc:
        msg = "Malformed conversation id (1-128 letters, digits, '_', '-', ':', '@')"
        raise InboundError(msg) from exc
    user = principal.user_id.strip()
    if user.lower() in {"", "anonymous"}:
        return given
    # A fixed-length digest of the user id: any user id is safe in a path, and keys never collide.
    return f"{hashlib.sha256(user.encode()).hexdigest()[:16]}--{given}"


def error(status: int, message: str, code: str) -> JSONResponse:
    """A JSON error answer."""
    return JSONResponse({"error": message, "code": code}, status_code=status)


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorBody} for s in statuses}


def state_of(request: Request | WebSocket) -> IngressState:
    """The app's shared state."""
    state: IngressState = request.app.state.ingress
    return state


def sse(frame: Frame) -> bytes:
    """One SSE event: `id:` is the seq, so `Last-Event-ID` resumes after it."""
    return f"id: {frame['seq']}\ndata: {json.dumps(frame, separators=(',', ':'))}\n\n".encode()


async def _sse_frames(events: AsyncIterator[RunEvent]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            frame = to_frame(event)
            if frame is not None:
                yield sse(frame)
    except (StreamGapError, BusError) as exc:
        body = {
            "type": "error",
            "data": "The stream broke; resume with Last-Event-ID",
            "code": "ingress.unavailable",
            "detail": type(exc).__name__,
        }
        yield f"data: {json.dumps(body)}\n\n".encode()


def _prompt_of(raw: bytes, limit: int) -> Prompt:
    if len(raw) > limit:
        msg = f"The prompt exceeds {limit} bytes"
        raise ValueError(msg)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        msg = "The prompt must be UTF-8 text"
        raise InboundError(msg) from None
    parsed = parse_inbound(text)
    if isinstance(parsed, ApprovalReply):
        msg = "Send approvals to /atmosphere/runs/{run_id}/approval"
        raise InboundError(msg)
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


async def _run_agent(state: IngressState, run_id: str) -> AgentDescriptor | None:
    """The agent a stored run belongs to (None for an unknown run)."""
    last = await state.bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(run_id), RunEvent)
    if last is None:
        return None
    return await state.directory.lookup(last.agent)


# -- WebSocket ---------------------------------------------------------------------------------


async def serve_socket(websocket: WebSocket, descriptor: AgentDescriptor | None) -> None:
    """One WebSocket client of an agent (shared by agent names and `@ai_endpoint` paths)."""
    state = state_of(websocket)
    await websocket.accept()
    if descriptor is None:
        await websocket.close(CLOSE_UNKNOWN, f"Unknown agent '{websocket.url.path.rsplit('/', 1)[-1]}'")
        return
    try:
        principal = state.authenticator.principal(descriptor.path, websocket.headers, websocket.query_params)
    except AuthError as exc:
        await websocket.close(CLOSE_AUTH[exc.status], exc.message)
        return
    headers, query = websocket.headers, websocket.query_params
    resume_id = headers.get(RUN_ID_HEADER) or query.get("X-Atmosphere-Run-Id") or query.get("runId")
    resume: tuple[str, int] | None = None
    if resume_id:
        try:
            subjects.token(resume_id, what="run id")
            resume = (resume_id, max(0, int(headers.get(LAST_SEQ_HEADER) or query.get("lastSeq") or 0)))
        except ValueError:
            await websocket.close(1008, "Malformed run id or last seq")
            return
    try:
        conversation_id = conversation_of(headers.get(CONVERSATION_HEADER) or query.get("conversationId"), principal)
    except InboundError as exc:
        await websocket.close(1008, str(exc))
        return
    connection = Connection(
        bus=state.bus,
        agent=descriptor,
        conversation_id=conversation_id,
        conversations=state.conversations,
        principal=principal,
        transport="websocket",
        max_prompts=state.settings.ingress.max_prompts_per_connection,
        send_queue_frames=state.settings.ingress.send_queue_frames,
    )

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
                    return " "  # becomes an "Empty prompt" error frame; the connection stays usable

    async def send(frame: Frame) -> None:
        try:
            await websocket.send_text(json.dumps(frame, separators=(",", ":")))
        except (RuntimeError, OSError) as exc:
            raise ClientGoneError from exc

    async def close(code: int, reason: str) -> None:
        with contextlib.suppress(RuntimeError):
            await websocket.close(code, reason)

    await connection.serve(receive, send, close, resume=resume)


@router.websocket("/atmosphere/agent/{name}")
async def agent_socket(websocket: WebSocket, name: str) -> None:
    """Prompts in (text or JSON, or approval replies), Atmosphere frames out."""
    await serve_socket(websocket, await _descriptor(state_of(websocket), name=name))


# -- SSE -----------------------------------------------------------------------------------------


async def _accept_prompt(request: Request, descriptor: AgentDescriptor, *, transport: str) -> RunRequest | JSONResponse:
    """Authenticate a POSTed prompt and build its run, or say in JSON why it was refused."""
    state = state_of(request)
    try:
        principal = state.authenticator.principal(descriptor.path, request.headers, request.query_params)
        prompt = _prompt_of(await request.body(), state.settings.ingress.max_message_bytes)
        conversation_id = conversation_of(request.headers.get(CONVERSATION_HEADER), principal)
    except AuthError as exc:
        return error(exc.status, exc.message, "ingress.unauthorized" if exc.status == 401 else "ingress.forbidden")
    except InboundError as exc:
        return error(400, str(exc), "ingress.bad_request")
    except ValueError as exc:
        return error(413, str(exc), "ingress.too_large")
    state.conversations.touch(descriptor.name, conversation_id, principal)
    return new_run_request(
        agent=descriptor.name,
        prompt=prompt,
        conversation_id=conversation_id,
        principal=principal,
        transport=transport,
        path=descriptor.path,
    )


async def start_sse(request: Request, descriptor: AgentDescriptor | None) -> StreamingResponse | JSONResponse:
    """Start a run from a POSTed prompt and stream its frames as Server-Sent Events."""
    state = state_of(request)
    if descriptor is None:
        return error(404, f"Unknown agent at {request.url.path}", "ingress.unknown_agent")
    run = await _accept_prompt(request, descriptor, transport="sse")
    if isinstance(run, JSONResponse):
        return run
    headers = {**SSE_HEADERS, "X-Atmosphere-Run-Id": run.run_id}
    return StreamingResponse(
        _sse_frames(follow_run(state.bus, run.run_id, submit=run)), media_type="text/event-stream", headers=headers
    )


@router.post(
    "/atmosphere/agent/{name}",
    summary="Run a prompt and stream its frames (Server-Sent Events)",
    openapi_extra=PROMPT_BODY,
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {}}}, **_errors(400, 401, 403, 404, 413)},
)
async def agent_sse(request: Request, name: str) -> StreamingResponse | JSONResponse:
    """The body is the prompt: plain text or `{"prompt": "...", "hints": {...}}`."""
    return await start_sse(request, await _descriptor(state_of(request), name=name))


@router.get(
    "/atmosphere/runs/{run_id}/events",
    summary="Resume a run's frames after Last-Event-ID (Server-Sent Events)",
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {}}}, **_errors(400, 401, 403, 404)},
)
async def run_events(
    request: Request,
    run_id: RunId,
    last_event_id: Annotated[str, Header(pattern=r"^[0-9]{0,15}$")] = "",
    lastEventId: Annotated[int | None, Query(ge=0, le=2**53)] = None,  # noqa: N803 - EventSource's name
) -> StreamingResponse | JSONResponse:
    """Every frame after the client's last seq, then the live tail; a finished run ends at its terminal frame."""
    state = state_of(request)
    try:
        subjects.token(run_id, what="run id")
        after = int(last_event_id) if last_event_id else (lastEventId or 0)
        if after < 0:
            raise ValueError
    except ValueError:
        return error(400, "Malformed run id or Last-Event-ID", "ingress.bad_request")
    principal = await _authorize_run(state, request, run_id)
    if isinstance(principal, JSONResponse):
        return principal
    return StreamingResponse(
        _sse_frames(follow_run(state.bus, run_id, after_seq=after)), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _authorize_run(state: IngressState, request: Request, run_id: str) -> Principal | JSONResponse:
    """The caller's principal for a stored run's agent, or the error to answer."""
    descriptor = await _run_agent(state, run_id)
    if descriptor is None:
        return error(404, f"Unknown run {run_id}", "ingress.unknown_run")
    try:
        return state.authenticator.principal(descriptor.path, request.headers, request.query_params)
    except AuthError as exc:
        return error(exc.status, exc.message, "ingress.unauthorized" if exc.status == 401 else "ingress.forbidden")


# -- long-poll -----------------------------------------------------------------------------------


@router.post(
    "/atmosphere/agent/{name}/poll",
    status_code=202,
    response_model=RunStarted,
    summary="Start a run for long-polling",
    openapi_extra=PROMPT_BODY,
    responses=_errors(400, 401, 403, 404, 413, 503),
)
async def agent_poll_start(request: Request, name: str) -> RunStarted | JSONResponse:
    """Queue the prompt; then `GET` the returned `next` URL until `done`."""
    state = state_of(request)
    descriptor = await _descriptor(state, name=name)
    if descriptor is None:
        return error(404, f"Unknown agent '{name}'", "ingress.unknown_agent")
    run = await _accept_prompt(request, descriptor, transport="long-poll")
    if isinstance(run, JSONResponse):
        return run
    try:
        await submit_run(state.bus, run)
    except BusError:
        return error(503, "The run could not be submitted; try again", "ingress.unavailable")
    return RunStarted(runId=run.run_id, sessionId=run.session_id, next=f"/atmosphere/runs/{run.run_id}/poll?after=0")


@router.get(
    "/atmosphere/runs/{run_id}/poll",
    response_model=PollResult,
    summary="Frames of a run after a seq (long-poll)",
    responses=_errors(400, 401, 403, 404),
)
async def run_poll(
    request: Request,
    run_id: RunId,
    after: Annotated[int, Query(ge=0, le=2**53)] = 0,
    wait: Annotated[float, Query(ge=0, le=120)] = 25.0,
) -> PollResult | JSONResponse:
    """Waits up to `wait` seconds (capped by the server) for frames after `after`."""
    state = state_of(request)
    try:
        subjects.token(run_id, what="run id")
    except ValueError:
        return error(400, "Malformed run id", "ingress.bad_request")
    principal = await _authorize_run(state, request, run_id)
    if isinstance(principal, JSONResponse):
        return principal
    deadline = time.monotonic() + min(wait, state.settings.ingress.long_poll_max_wait)
    frames: list[Frame] = []
    done = False
    events = follow_run(state.bus, run_id, after_seq=after)
    try:
        while not done:
            budget = deadline - time.monotonic() if not frames else POLL_QUIET
            if budget <= 0:
                break
            try:
                event = await asyncio.wait_for(anext(events), budget)
            except (TimeoutError, StopAsyncIteration):
                break
            frame = to_frame(event)
            if frame is not None:
                frames.append(frame)
            done = is_terminal(event)
    except (UnknownRunError, StreamGapError, BusError):
        return error(404, f"Run {run_id} cannot be read", "ingress.unknown_run")
    finally:
        await events.aclose()
    return PollResult(frames=frames, done=done, after=int(frames[-1]["seq"]) if frames else after)


# -- control -------------------------------------------------------------------------------------


@router.post(
    "/atmosphere/runs/{run_id}/cancel",
    response_model=ControlResult,
    summary="Cancel a run",
    responses=_errors(400, 401, 403, 404),
)
async def run_cancel(request: Request, run_id: RunId) -> ControlResult | JSONResponse:
    """False when no worker owns the run any more (it already ended)."""
    state = state_of(request)
    try:
        subjects.token(run_id, what="run id")
    except ValueError:
        return error(400, "Malformed run id", "ingress.bad_request")
    principal = await _authorize_run(state, request, run_id)
    if isinstance(principal, JSONResponse):
        return principal
    return ControlResult(accepted=await cancel_run(state.bus, run_id, "cancelled by the client", principal=principal))


@router.post(
    "/atmosphere/runs/{run_id}/approval",
    response_model=ControlResult,
    summary="Answer an approval request",
    openapi_extra=APPROVAL_BODY,
    responses=_errors(400, 401, 403, 404),
)
async def run_approval(request: Request, run_id: RunId) -> ControlResult | JSONResponse:
    """The body is `/__approval/<id>/<approve|yes|deny|respond> [payload]`."""
    state = state_of(request)
    try:
        subjects.token(run_id, what="run id")
        reply = parse_approval((await request.body()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return error(400, str(exc) or "Malformed approval", "ingress.bad_request")
    principal = await _authorize_run(state, request, run_id)
    if isinstance(principal, JSONResponse):
        return principal
    ack = await send_approval(state.bus, run_id, reply, principal=principal)
    return ControlResult(accepted=ack.accepted, detail=ack.detail)
