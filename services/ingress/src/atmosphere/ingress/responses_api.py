"""The OpenAI Responses API at `/atmosphere/v1/responses`: streamed (`response.*` events) and not.

A response is a run (transport "openai-responses") with the same admission, governance,
budgets, tape and limits as a completion (`openai_api.py`, whose key, grants, permits, timeout
and retry of the head it shares). Its id is `resp_<run id>`; `previous_response_id` continues
that run's conversation (its history is the agent's memory), for the run's owner only and on the
same agent, anyone else's being answered as unknown. What Chat Completions cannot carry, this
cannot either: an approval cancels the run with a 422 that names the doors that can.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from atmosphere.bus import BusError
from atmosphere.bus.runs import HISTORY_METADATA_KEY, StreamGapError, follow_run, last_event, new_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.ingress.errors import (
    OpenAiError,
    OpenAiInvalidRequestError,
    OpenAiNotFoundError,
    OpenAiTooLargeError,
    OpenAiUnavailableError,
    RequestTooLargeError,
)
from atmosphere.ingress.http import state_of
from atmosphere.ingress.inbound import require_fits
from atmosphere.ingress.openai_api import (
    OPENAI_PREFIX,
    AnswerChangedError,
    ApprovalNotCarriedError,
    CompletionRun,
    checked_first,
    first_event,
    paced_answer,
    principal_for,
    read_request,
    resolve_agent,
    run_error_of,
    serve_answer,
)
from atmosphere.ingress.openai_wire import Completion
from atmosphere.ingress.pacing import PacedResponse
from atmosphere.ingress.responses_wire import ResponseShape, ResponsesRequest, parse_responses_request, response_id
from atmosphere.ingress.state import IngressState
from atmosphere.service import scoped_conversation

TRANSPORT = "openai-responses"
DOOR = "the Responses API"

router = APIRouter(prefix=OPENAI_PREFIX)
ERRORS = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object"}}}}}}


async def _run_for(state: IngressState, request: Request) -> tuple[ResponsesRequest, RunSubmission, ResponseShape]:
    """Check and map the request; the run it becomes and the Response that describes it."""
    asked = parse_responses_request(await read_request(state, request))
    target, agents = await resolve_agent(state, asked.model)
    agent = agents[target]
    if state.openai_permits.locked():
        raise OpenAiUnavailableError("Too many responses in flight; try again.")
    principal = principal_for(state, request, agent, asked.user)
    conversation = await _conversation(state, asked, principal, agent.name)
    metadata = {HISTORY_METADATA_KEY: json.dumps(asked.prior, ensure_ascii=False)} if asked.prior else {}
    run = new_run(
        agent=agent.name,
        message=asked.prompt,
        principal=principal,
        conversation_id=conversation,
        transport=TRANSPORT,
        path=agent.path,
        metadata=metadata,
        pool=agent.pool,
    )
    try:
        require_fits(run, state.bus.max_payload)
    except RequestTooLargeError as exc:
        raise OpenAiTooLargeError(exc.message) from None
    previous = response_id(asked.previous_run) if asked.previous_run else None
    shape = ResponseShape(run.run_id, model=asked.model or agent.name, previous_response_id=previous)
    return asked, run, shape


async def _conversation(state: IngressState, asked: ResponsesRequest, principal: Principal, agent: str) -> str:
    """The conversation the response belongs to: the previous response's (its owner's only), else a new one."""
    if asked.previous_run is None:
        return scoped_conversation(f"responses:{uuid.uuid4().hex}", principal)
    try:
        last = await last_event(state.bus, asked.previous_run)
    except BusError:
        raise OpenAiUnavailableError("Responses cannot be looked up right now; try again.") from None
    if last is None or last.owner != principal.user_id:
        # Another user's response is answered exactly like one that does not exist.
        msg = f"Previous response with id '{response_id(asked.previous_run)}' not found."
        raise OpenAiNotFoundError(msg, param="previous_response_id")
    if last.agent != agent:
        msg = f"The previous response is of the agent '{last.agent}', not '{agent}'."
        raise OpenAiInvalidRequestError(msg, param="previous_response_id")
    return last.conversation_id


@router.post(
    "/responses",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["input"],
                        "properties": {
                            "model": {"type": ["string", "null"]},
                            "input": {
                                "type": "string",
                                "minLength": 1,
                                "pattern": r"\S",
                                "description": "The user's input; also accepted: an array of message items "
                                "(`{role, content}`, the last one the user's).",
                            },
                            "instructions": {"type": ["string", "null"]},
                            "previous_response_id": {
                                "type": ["string", "null"],
                                "pattern": r"^resp_[A-Za-z0-9_\-:@]{1,128}$",
                            },
                            "stream": {"type": ["boolean", "null"]},
                            "user": {"type": ["string", "null"], "maxLength": 256},
                        },
                    }
                }
            },
        }
    },
    summary="Create a model response with an agent (the OpenAI Responses API)",
    responses={
        200: {"content": {"application/json": {}, "text/event-stream": {}}},
        **dict.fromkeys((400, 401, 403, 404, 413, 415, 422, 429, 500, 502, 503), ERRORS),
    },
)
async def create_response(request: Request) -> Response:
    """OpenAI's `POST /v1/responses`, served by the agent the model maps to."""
    state = state_of(request)
    asked, run, shape = await _run_for(state, request)
    await state.openai_permits.acquire()
    deadline = time.monotonic() + state.settings.ai_openai_timeout
    active = CompletionRun(
        state, run, follow_run(state.bus, run.run_id, submit=run), Completion(model=shape.model), deadline
    )
    answer = _streamed(active, shape) if asked.stream else _whole(active, shape)
    return await serve_answer(state, request, active, answer, door=DOOR)


async def _whole(active: CompletionRun, shape: ResponseShape) -> JSONResponse:
    event: RunEvent | None = checked_first(await active.next())
    while event is not None:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            active.text.append(event.text_delta.text)
        elif kind == "error":
            raise run_error_of(event)
        elif kind == "complete":
            if not active.text and event.complete.summary:
                active.text.append(event.complete.summary)
            break
        event = await active.next()
    active.head_sent = True
    return JSONResponse(shape.response("completed", text="".join(active.text), usage=active.counted_usage))


async def _streamed(active: CompletionRun, shape: ResponseShape) -> PacedResponse:
    first = await first_event(active)

    async def last_words() -> bytes:
        failure = OpenAiUnavailableError("The server is restarting; send the request again.")
        return _sse(shape.event("error", code=failure.code, message=failure.message, param=None))

    return paced_answer(active, first, _events(active, shape, first), last_words)


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


async def _events(
    active: CompletionRun, shape: ResponseShape, first: Awaitable[RunEvent | None]
) -> AsyncIterator[bytes]:
    yield _sse(shape.event("response.created", response=shape.response("in_progress")))
    yield _sse(shape.event("response.in_progress", response=shape.response("in_progress")))
    yield _sse(shape.event("response.output_item.added", output_index=0, item=shape.message("", status="in_progress")))
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield _sse(shape.text_event("response.content_part.added", part=part))
    try:
        event = await first
        while event is not None:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                active.text.append(event.text_delta.text)
                active.streaming = True
                yield _sse(shape.text_event("response.output_text.delta", delta=event.text_delta.text, logprobs=[]))
            elif kind == "error":
                yield _sse(_failed(shape, active, run_error_of(event)))
                return
            elif kind == "complete":
                if not active.text and event.complete.summary:
                    active.text.append(event.complete.summary)
                    yield _sse(
                        shape.text_event("response.output_text.delta", delta=event.complete.summary, logprobs=[])
                    )
                break
            event = await active.next()
    except ApprovalNotCarriedError as exc:
        await active.close(f"an approval cannot be given over {DOOR}", at_once=True)
        yield _sse(_failed(shape, active, exc.as_openai(DOOR)))
        return
    except (TimeoutError, BusError, StreamGapError, AnswerChangedError):
        yield _sse(_failed(shape, active, OpenAiUnavailableError("The agent stopped answering.")))
        return
    text = "".join(active.text)
    yield _sse(shape.text_event("response.output_text.done", text=text, logprobs=[]))
    yield _sse(shape.text_event("response.content_part.done", part={**part, "text": text}))
    yield _sse(shape.event("response.output_item.done", output_index=0, item=shape.message(text)))
    done = shape.response("completed", text=text, usage=active.counted_usage)
    yield _sse(shape.event("response.completed", response=done))


def _failed(shape: ResponseShape, active: CompletionRun, error: OpenAiError) -> dict[str, Any]:
    text = "".join(active.text)
    return shape.event("response.failed", response=shape.response("failed", text=text or None, error=error))
