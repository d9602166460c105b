"""The Server-Sent Events door of an agent: one prompt, its frames, resumable by `Last-Event-ID`.

    POST /atmosphere/agent/{name}            SSE: one prompt, its frames (`id:` = seq)
    GET  /atmosphere/runs/{run_id}/events    SSE resume (`Last-Event-ID`)

`@ai_endpoint` paths take prompts the same way at their own path (`start_sse`, wired by `api.py`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from atmosphere.bus import BusError
from atmosphere.bus.frames import Frame, to_frame
from atmosphere.bus.runs import StreamGapError, follow_run
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.agent_prompts import PROMPT_BODY, accept_prompt, find_agent, known_agent, not_submitted
from atmosphere.ingress.errors import EventsUnavailableError, ServerRestartingError, UnavailableError
from atmosphere.ingress.http import error_responses, identified_caller, require_token, state_of
from atmosphere.ingress.run_access import RunId, check_access
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import HeldStreamResponse, address_of, claim_stream
from atmosphere.service import StreamSlot

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

router = APIRouter()
log = logging.getLogger("atmosphere.ingress")


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
    return await start_sse(request, await find_agent(state_of(request), name=name))


async def start_sse(request: Request, descriptor: AgentDescriptor | None) -> StreamingResponse:
    """Start a run from a POSTed prompt and stream its frames as Server-Sent Events."""
    state = state_of(request)
    descriptor = known_agent(state, request, descriptor)
    run = await accept_prompt(request, descriptor, transport="sse")
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
        raise not_submitted(run, exc) from None
    except BaseException:
        slot.release()
        raise
    return _sse_response(state, run.run_id, _starting_with(first, events), slot=slot, headers=headers)


async def _starting_with(first: RunEvent, rest: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
    yield first
    async for event in rest:
        yield event


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
        await check_access(state, caller, run_id)
    except BaseException:
        slot.release()
        raise
    note_run(run_id)
    events = follow_run(state.bus, run_id, after_seq=after)
    return _sse_response(state, run_id, events, slot=slot, after_seq=after, headers=SSE_HEADERS)


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
