"""The long-poll door of an agent: start a run, then ask for its frames after a seq until it is done.

    POST /atmosphere/agent/{name}/poll       long-poll: start a run, then poll it
    GET  /atmosphere/runs/{run_id}/poll      long-poll: frames after `after`

For clients that can hold neither a WebSocket nor an event stream: each answer is plain JSON.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from atmosphere.bus import BusError
from atmosphere.bus.frames import Frame, to_frame
from atmosphere.bus.runs import (
    StreamGapError,
    UnknownRunError,
    follow_run,
    is_terminal,
    last_event,
    stored_events,
    submit_run,
)
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.agent_prompts import PROMPT_BODY, accept_prompt, find_agent, known_agent, not_submitted
from atmosphere.ingress.errors import RunNotFoundError
from atmosphere.ingress.http import error_responses, identified_caller, require_token, state_of
from atmosphere.ingress.pacing import Pause, paced
from atmosphere.ingress.run_access import RunId, check_access
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import address_of, claim_stream

POLL_QUIET = 0.05
"""A long-poll answer goes out once no further frame arrived for this long."""

router = APIRouter()


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
    descriptor = known_agent(state, request, await find_agent(state, name=name))
    run = await accept_prompt(request, descriptor, transport="long-poll")
    try:
        await submit_run(state.bus, run)
    except BusError as exc:
        raise not_submitted(run, exc) from None
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
        await check_access(state, caller, run_id)
        note_run(run_id)
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
