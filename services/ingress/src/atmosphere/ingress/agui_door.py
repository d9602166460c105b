"""The AG-UI door of an agent: POST a `RunAgentInput`, read the run as AG-UI events (SSE).

    POST /atmosphere/ag-ui/{agent}     body: AG-UI's RunAgentInput; answer: text/event-stream

The thread is the conversation (scoped to the caller, like every door's): memory keeps its
history, so of `messages` only the last user message is the prompt. A tool call that needs a
human's approval ends the stream with an `interrupt` outcome (and a CUSTOM `approval-required`
event) while the run waits; the client answers with a new RunAgentInput on the same thread whose
`resume` holds `{interruptId, status: "resolved", payload: {approve, arguments?}}` (anything else
denies), and that stream goes on with the same run where it stopped. A client that leaves
mid-stream cancels its run (AG-UI has no resume of a stream); an interrupted run is left waiting
for its answer until the approval expires. Everything is refused before the stream starts where
it can be (401, 403, 404, 400, 413, 429 in ingress's JSON), later as RUN_ERROR.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ag_ui.core import BaseEvent, RunAgentInput, RunErrorEvent, RunStartedEvent, UserMessage
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from atmosphere.bus import BusError
from atmosphere.bus.runs import StreamGapError
from atmosphere.ingress.agent_prompts import find_agent, known_agent
from atmosphere.ingress.agui_events import AgUiTranslation, InterruptRef
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.door_runs import DoorRun, follow_owned_run, start_run
from atmosphere.ingress.errors import (
    AUTH_REFUSALS,
    MalformedRequestError,
    ServerRestartingError,
    UnavailableError,
)
from atmosphere.ingress.http import bounded_body, error_responses, message_limit_of, state_of
from atmosphere.ingress.inbound import ApprovalReply, send_approval
from atmosphere.ingress.pacing import PacedResponse
from atmosphere.ingress.protocol_doors import AGUI_PATH
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import address_of

log = logging.getLogger("atmosphere.ingress")

TRANSPORT = "ag-ui"
ENVELOPE_BYTES = 64 * 1024
"""Room for the rest of a RunAgentInput around a message of the largest size ingress admits."""
MAX_RESUME = 16
"""Interrupts one resume may answer (a run asks one approval at a time)."""

RUN_AGENT_INPUT = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["threadId", "runId", "messages"],
                    "properties": {
                        "threadId": {"type": "string"},
                        "runId": {"type": "string"},
                        "messages": {"type": "array", "items": {"type": "object"}},
                        "resume": {"type": "array", "items": {"type": "object"}},
                    },
                }
            }
        },
    }
}

router = APIRouter()


@router.post(
    AGUI_PATH + "/{name}",
    summary="Run an agent for an AG-UI client (Server-Sent Events of AG-UI events)",
    openapi_extra=RUN_AGENT_INPUT,
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {"text/event-stream": {}}}, **error_responses(400, 401, 403, 404, 413, 429, 503)},
)
async def agui_run(request: Request, name: str) -> PacedResponse:
    """AG-UI's `RunAgentInput` in, the run's AG-UI events out."""
    state = state_of(request)
    agent = known_agent(state, request, await find_agent(state, name=name))
    try:
        caller = state.authenticator.caller(agent.path, request.headers, request.query_params)
    except AuthError as exc:
        raise AUTH_REFUSALS[exc.status](exc.message) from None
    limit = message_limit_of(state)
    raw = await bounded_body(request, limit=6 * limit + ENVELOPE_BYTES)
    run_input = _parse(raw)
    address = address_of(request)
    if run_input.resume:
        run = await _resumed(state, caller, run_input, address)
    else:
        run = await start_run(
            state,
            caller,
            agent,
            _prompt(run_input),
            transport=TRANSPORT,
            address=address,
            conversation=_thread_key(run_input.thread_id),
        )
    return _respond(state, run, run_input)


def _parse(raw: bytes) -> RunAgentInput:
    try:
        return RunAgentInput.model_validate_json(raw)
    except ValidationError as exc:
        where = "; ".join(".".join(str(p) for p in e["loc"])[:80] + ": " + e["msg"][:120] for e in exc.errors()[:5])
        msg = f"Not an AG-UI RunAgentInput: {where}"
        raise MalformedRequestError(msg) from None


def _prompt(run_input: RunAgentInput) -> str:
    """The last user message's text: the prompt (earlier turns are the thread's history in memory)."""
    users = [m for m in run_input.messages if isinstance(m, UserMessage)]
    if not users:
        msg = "A RunAgentInput needs a user message (or `resume` answering an interrupt)"
        raise MalformedRequestError(msg)
    content = users[-1].content
    if isinstance(content, str):
        text = content
    else:
        parts = [getattr(part, "text", None) for part in content]
        if any(part is None for part in parts):
            msg = "Only text content is accepted in a user message"
            raise MalformedRequestError(msg)
        text = "".join(p for p in parts if p)
    if not text.strip():
        msg = "The last user message is empty"
        raise MalformedRequestError(msg)
    return text


def _thread_key(thread_id: str) -> str:
    """The conversation a thread is: its id when usable as one, else a stable digest of it."""
    if thread_id and len(thread_id) <= 100 and all(c.isalnum() or c in "_-:@" for c in thread_id):
        return f"agui-{thread_id}"
    return "agui-" + uuid.uuid5(uuid.NAMESPACE_URL, thread_id).hex


async def _resumed(state: IngressState, caller: Caller, run_input: RunAgentInput, address: str) -> DoorRun:
    """Answer the interrupts `resume` names and follow their run on after the seq that asked."""
    entries = run_input.resume or []
    if len(entries) > MAX_RESUME:
        msg = f"At most {MAX_RESUME} resume entries are accepted"
        raise MalformedRequestError(msg)
    refs = [(InterruptRef.decode(entry.interrupt_id), entry) for entry in entries]
    if any(ref is None for ref, _ in refs) or len({ref.run_id for ref, _ in refs if ref}) != 1:
        msg = "Unknown interruptId: answer the interrupts of one run, by the ids its RUN_FINISHED gave"
        raise MalformedRequestError(msg)
    first = min((ref for ref, _ in refs if ref), key=lambda ref: ref.seq)
    run = await follow_owned_run(state, caller, first.run_id, address=address, after_seq=first.seq)
    try:
        for ref, entry in refs:
            assert ref is not None
            await send_approval(state.bus, ref.run_id, _decision(ref.approval_id, entry), principal=caller.principal)
    except BaseException:
        await run.close()
        raise
    return run


def _decision(approval_id: str, entry: Any) -> ApprovalReply:
    """A resume entry as an approval reply: `resolved` with `approve: true` approves; anything else denies."""
    payload = entry.payload if entry.status == "resolved" else None
    if not isinstance(payload, dict) or payload.get("approve") is not True:
        return ApprovalReply(approval_id, "deny")
    edited = payload.get("arguments")
    if isinstance(edited, dict):
        return ApprovalReply(approval_id, "approve", json.dumps(edited))
    return ApprovalReply(approval_id, "approve")


def _respond(state: IngressState, run: DoorRun, run_input: RunAgentInput) -> PacedResponse:
    encoder = EventEncoder()
    translation = AgUiTranslation(thread_id=run_input.thread_id, run_id=run_input.run_id)

    async def last_words() -> bytes:
        await run.close(cancel_reason="the server is restarting and an AG-UI stream cannot be resumed")
        restarting = ServerRestartingError("The server is restarting; run the agent again")
        return encoder.encode(RunErrorEvent(message=restarting.message, code=restarting.code)).encode()

    async def closed() -> None:
        # A client that left before the end: nobody can pick the stream up again.
        ended = translation.finished
        await run.close(cancel_reason=None if ended else "the AG-UI client went away")

    return PacedResponse(
        _stream(run, translation, encoder),
        keep_alive=state.settings.ingress.sse_keep_alive,
        draining=state.drain.event,
        last_words=last_words,
        on_close=closed,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Atmosphere-Run-Id": run.run_id},
    )


async def _stream(run: DoorRun, translation: AgUiTranslation, encoder: EventEncoder) -> AsyncIterator[bytes]:
    def frame(event: BaseEvent) -> bytes:
        return encoder.encode(event).encode()

    yield frame(RunStartedEvent(thread_id=translation.thread_id, run_id=translation.run_id))
    try:
        async for event in run:
            if event.WhichOneof("kind") == "metadata" and event.seq == 1:
                continue
            for out in translation.events(event):
                yield frame(out)
            if translation.finished:
                return
        failure = UnavailableError("The run's events ended early; run the agent again")
        yield frame(RunErrorEvent(message=failure.message, code=failure.code))
    except (BusError, StreamGapError) as exc:
        log.warning("an AG-UI stream of run %s broke: %s", run.run_id, exc)
        failure = UnavailableError("The stream broke; run the agent again")
        yield frame(RunErrorEvent(message=failure.message, code=failure.code))
