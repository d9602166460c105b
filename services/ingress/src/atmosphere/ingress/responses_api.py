"""The OpenAI Responses API at `/atmosphere/v1/responses`: streamed (`response.*` events) and not.

A response is a run (transport "openai-responses") with the same admission, governance,
budgets, tape and limits as a completion (`openai_api.py`, whose key, grants, permits, timeout
and retry of the head it shares). Its id is `resp_<run id>`; `previous_response_id` continues
that run's conversation (its history is the agent's memory), for the run's owner only and on the
same agent, anyone else's being answered as unknown. What Chat Completions cannot carry, this
cannot either: an approval cancels the run with a 422 that names the doors that can.

Function tools make it a model gateway (`client_functions`): the model's calls come back as
`function_call` items, and the client continues with `function_call_output` items — in a whole
input, or after `previous_response_id`, whose run's recorded input (`RunInput`) and calls say
what the model was asked and what it called.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from atmosphere.bus import BusError
from atmosphere.bus.runs import (
    CONTEXT_METADATA_KEY,
    GATEWAY_METADATA_KEY,
    StreamGapError,
    follow_run,
    last_event,
    new_run,
)
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.run.v1.run_pb2 import InputMessage, RunEvent, RunInput, RunSubmission, ToolStart
from atmosphere.ingress.client_functions import Gateway, check_served
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
from atmosphere.ingress.responses_wire import (
    ResponseShape,
    ResponsesRequest,
    check_outputs,
    function_call,
    parse_responses_request,
    response_id,
)
from atmosphere.ingress.state import IngressState
from atmosphere.service import scoped_conversation

LOOKUP_PATIENCE = 10.0
"""Seconds reading a previous response's recorded input may take (a finished run's stored events)."""
TRANSPORT = "openai-responses"
DOOR = "the Responses API"

router = APIRouter(prefix=OPENAI_PREFIX)
ERRORS = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object"}}}}}}


async def _run_for(state: IngressState, request: Request) -> tuple[ResponsesRequest, RunSubmission, ResponseShape]:
    """Check and map the request; the run it becomes and the Response that describes it."""
    asked = parse_responses_request(await read_request(state, request))
    target, agents = await resolve_agent(state, asked.model)
    agent = agents[target]
    check_served(asked.gateway, agent)
    if state.openai_permits.locked():
        raise OpenAiUnavailableError("Too many responses in flight; try again.")
    principal = principal_for(state, request, agent, asked.user)
    conversation, continued = await _conversation(state, asked, principal, agent.name)
    prompt, gateway = asked.prompt, asked.gateway
    if prompt is None:
        prompt, gateway = await _continued(state, asked, continued)
    else:
        check_outputs(asked, set())
    # The conversation is memory's (`previous_response_id`); these turns are this response's only.
    metadata = {CONTEXT_METADATA_KEY: json.dumps(asked.prior, ensure_ascii=False)} if asked.prior else {}
    if gateway.used:
        metadata[GATEWAY_METADATA_KEY] = json.dumps(gateway.metadata(), ensure_ascii=False)
    run = new_run(
        agent=agent.name,
        message=prompt,
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


async def _conversation(
    state: IngressState, asked: ResponsesRequest, principal: Principal, agent: str
) -> tuple[str, RunEvent | None]:
    """The conversation the response belongs to: the previous response's (its owner's only), else a new one.

    Also the previous response's terminal event, when there is one.
    """
    if asked.previous_run is None:
        return scoped_conversation(f"responses:{uuid.uuid4().hex}", principal), None
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
    return last.conversation_id, last


async def _continued(state: IngressState, asked: ResponsesRequest, last: RunEvent | None) -> tuple[str, Gateway]:
    """The question and exchange that `asked`'s function outputs continue: the previous response's.

    Its run's `input` event holds what the model was asked (the user's message, and the exchange
    that followed it); its terminal event the calls it handed back; its text what the model said
    beside them.
    """
    assert asked.previous_run is not None
    calls = last.complete.client_tool_calls if last is not None and last.WhichOneof("kind") == "complete" else ()
    if not calls:
        raise OpenAiInvalidRequestError(
            "The previous response made no function calls for these outputs to answer.", param="input"
        )
    try:
        asked_before, said = await _recorded_exchange(state, asked.previous_run)
    except (BusError, StreamGapError, TimeoutError):
        raise OpenAiUnavailableError("Responses cannot be looked up right now; try again.") from None
    if asked_before is None or asked_before.clipped or asked_before.omitted_messages:
        raise OpenAiInvalidRequestError(
            "The previous response's input was too large to keep whole; send the whole exchange as 'input'.",
            param="previous_response_id",
        )
    messages = list(asked_before.messages)
    question = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if question is None:
        raise OpenAiInvalidRequestError("The previous response has no question to continue.", param="input")
    before = [_turn(m) for m in messages[question + 1 :]]
    made = {"role": "assistant", "content": said, "tool_calls": [_call(c) for c in calls]}
    check_outputs(asked, {c.call_id for c in calls} | {c["id"] for t in before for c in t.get("tool_calls", ())})
    continuation = (*before, made, *asked.gateway.continuation)
    return messages[question].content, replace(asked.gateway, continuation=continuation, tool_turns=True)


async def _recorded_exchange(state: IngressState, run_id: str) -> tuple[RunInput | None, str]:
    """A finished run's last recorded model input, and the text its model answered after it."""
    recorded: RunInput | None = None
    text: list[str] = []
    async with asyncio.timeout(LOOKUP_PATIENCE):
        async for event in follow_run(state.bus, run_id):
            if event.origin_run_id:
                continue
            kind = event.WhichOneof("kind")
            if kind == "input":
                recorded, text = event.input, []
            elif kind == "text_delta":
                text.append(event.text_delta.text)
    return recorded, "".join(text)


def _turn(message: InputMessage) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [_call(c) for c in message.tool_calls]
    if message.tool_call_id:
        turn["tool_call_id"] = message.tool_call_id
    return turn


def _call(call: ToolStart) -> dict[str, str]:
    return {"id": call.call_id, "name": call.tool_name, "arguments": call.arguments_json}


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
    calls: Sequence[ToolStart] = ()
    while event is not None:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            active.text.append(event.text_delta.text)
        elif kind == "error":
            raise run_error_of(event)
        elif kind == "complete":
            if not active.text and event.complete.summary:
                active.text.append(event.complete.summary)
            calls = event.complete.client_tool_calls
            break
        event = await active.next()
    active.head_sent = True
    text = "".join(active.text)
    return JSONResponse(shape.response("completed", text=text, usage=active.counted_usage, calls=calls))


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
    calls: Sequence[ToolStart] = ()
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
                calls = event.complete.client_tool_calls
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
    for index, call in enumerate(calls, start=1):
        for line in _function_call_events(shape, index, call):
            yield line
    done = shape.response("completed", text=text, usage=active.counted_usage, calls=calls)
    yield _sse(shape.event("response.completed", response=done))


def _function_call_events(shape: ResponseShape, index: int, call: ToolStart) -> list[bytes]:
    """A handed-back call as the Responses stream announces one: added, its arguments, done."""
    item_id = "fc_" + call.call_id
    return [
        _sse(
            shape.event(
                "response.output_item.added", output_index=index, item=function_call(call, status="in_progress")
            )
        ),
        _sse(
            shape.event(
                "response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=call.arguments_json
            )
        ),
        _sse(
            shape.event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=call.tool_name,
                arguments=call.arguments_json,
            )
        ),
        _sse(shape.event("response.output_item.done", output_index=index, item=function_call(call))),
    ]


def _failed(shape: ResponseShape, active: CompletionRun, error: OpenAiError) -> dict[str, Any]:
    text = "".join(active.text)
    return shape.event("response.failed", response=shape.response("failed", text=text or None, error=error))
