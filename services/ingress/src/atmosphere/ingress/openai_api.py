"""The OpenAI-compatible API at `/atmosphere/v1`: any OpenAI SDK can talk to an agent.

    POST /atmosphere/v1/chat/completions   streaming (SSE chunks, `data: [DONE]`) and not
    GET  /atmosphere/v1/models

A completion is an ordinary run (same queue, governance, budgets, tape). It is off unless
`ATMOSPHERE_AI_OPENAI_ENABLED=true`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from atmosphere.bus import BusError, PayloadTooLargeError
from atmosphere.bus.runs import (
    ANSWER_REWOUND_METADATA_KEY,
    HISTORY_METADATA_KEY,
    StreamGapError,
    cancel_run,
    follow_run,
    new_run,
)
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission
from atmosphere.ingress.auth import AuthError
from atmosphere.ingress.bodies import BodyError, read_body
from atmosphere.ingress.errors import (
    OpenAiError,
    OpenAiInvalidApiKeyError,
    OpenAiModelNotFoundError,
    OpenAiPermissionDeniedError,
    OpenAiTooLargeError,
    OpenAiUnavailableError,
    OpenAiUnsupportedMediaTypeError,
)
from atmosphere.ingress.http import message_limit_of, state_of
from atmosphere.ingress.openai_wire import (
    ChatRequest,
    Completion,
    agent_failed,
    body_error,
    error_for_run,
    model_list,
    parse_chat_request,
    resolve_target,
    sse_data,
)
from atmosphere.ingress.pacing import Drain, PacedResponse
from atmosphere.ingress.state import IngressState
from atmosphere.service import scoped_conversation

log = logging.getLogger("atmosphere.ingress")

router = APIRouter(prefix="/atmosphere/v1")

ERROR_SCHEMA = {
    "content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object"}}}}}
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return dict.fromkeys(statuses, ERROR_SCHEMA)


MISSING_KEY = "Incorrect or missing API key. Send 'Authorization: Bearer <key>'."


def _run_error(event: RunEvent) -> OpenAiError:
    return error_for_run(event.error)


def _authorize(state: IngressState, request: Request) -> None:
    key = state.settings.ai_openai_api_key
    if not key:
        # Without a key of its own the endpoint takes the agent endpoints' token grants, if any.
        _grant_principal(state, request, path=None)
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), key.encode()):
        raise OpenAiInvalidApiKeyError(MISSING_KEY)


def _grant_principal(state: IngressState, request: Request, *, path: str | None) -> Principal | None:
    """The token grant's principal (None with no grants configured), checked against `path` if given.

    With token grants configured, a completion runs for (and is owned by) the grant's user,
    exactly as a WebSocket run would (mode parity).
    """
    if not state.authenticator.enabled:
        return None
    try:
        caller = state.authenticator.identify(request.headers)
    except AuthError:
        raise OpenAiInvalidApiKeyError(MISSING_KEY) from None
    if path is not None and not caller.may_use(path):
        raise OpenAiPermissionDeniedError("This key may not use that model.")
    return caller.principal


@router.get("/models", summary="The agents exposed as models", responses=_errors(401, 503))
async def list_models(request: Request) -> JSONResponse:
    """`{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}`."""
    state = state_of(request)
    _authorize(state, request)
    try:
        agents = await state.directory.all()
    except BusError:
        raise OpenAiUnavailableError("The agent directory is unavailable.") from None
    return JSONResponse(model_list(state.settings.ai_openai_models, [a.name for a in agents]))


class AnswerChangedError(Exception):
    """The run resumed after its worker died and its answer came out differently than what was streamed."""


@dataclass
class _Run:
    """A completion being produced."""

    state: IngressState
    run: RunSubmission
    events: AsyncGenerator[RunEvent, None]
    completion: Completion
    deadline: float
    """`time.monotonic()` by which the answer must be complete."""
    text: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    finished: bool = False
    streaming: bool = False
    """Whether text already went to the client (a streamed completion): it cannot be taken back."""

    async def next(self) -> RunEvent | None:
        """The next event worth answering with, or None at the end of the stream."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                # `asyncio.timeout`, not `wait_for`: on 3.11 `wait_for` can swallow the
                # cancellation of a client that went away.
                async with asyncio.timeout(remaining):
                    event = await anext(self.events)
            except StopAsyncIteration:
                return None
            if event.origin_run_id:
                continue  # a sub-agent's activity has no OpenAI representation; its report does
            # A run whose worker died goes on where it stopped (dispatch sends none of what the
            # stream already has again), so its `ai.run.resumed` marker needs nothing here.
            kind = event.WhichOneof("kind")
            if kind == "metadata" and event.metadata.key == ANSWER_REWOUND_METADATA_KEY:
                self._rewind(event.metadata.value_json)
            elif kind == "usage":
                self.usage["prompt_tokens"] += event.usage.input_tokens
                self.usage["completion_tokens"] += event.usage.output_tokens
                self.usage["total_tokens"] += event.usage.total_tokens or (
                    event.usage.input_tokens + event.usage.output_tokens
                )
            elif kind in {"text_delta", "complete", "error"}:
                if kind != "text_delta":
                    self.finished = True
                return event

    def _rewind(self, value_json: str) -> None:
        """Drop the end of the answer the resumed run replaced; streamed text cannot be, so that is an error."""
        if self.streaming:
            raise AnswerChangedError
        try:
            discard = max(0, int(json.loads(value_json)["discard"]))
        except (ValueError, TypeError, KeyError):
            raise AnswerChangedError from None
        text = "".join(self.text)
        self.text[:] = [text[: max(0, len(text) - discard)]]

    @property
    def counted_usage(self) -> dict[str, int] | None:
        return self.usage if self.usage["total_tokens"] else None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.events.aclose()
        if not self.finished:
            # An OpenAI client that went away (or timed out) does not come back for the rest.
            await cancel_run(
                self.state.bus, self.run.run_id, "the OpenAI client went away", principal=self.run.principal
            )
        self.state.openai_permits.release()


def _run_request(chat: ChatRequest, agent: str, path: str, principal: Principal) -> RunSubmission:
    """The run a completion is: the last user message, earlier turns as its history."""
    key = f"openai:{chat.user}:{uuid.uuid4().hex}" if chat.user else f"openai:{uuid.uuid4().hex}"
    # Unescaped: a history of non-ASCII text must not grow sixfold on its way to the broker.
    metadata = {HISTORY_METADATA_KEY: json.dumps(chat.prior, ensure_ascii=False)} if chat.prior else {}
    return new_run(
        agent=agent,
        message=chat.prompt,
        principal=principal,
        # Scoped like every user's conversation, so it counts against its user's quotas only.
        conversation_id=scoped_conversation(key, principal),
        transport="openai",
        path=path,
        metadata=metadata,
    )


async def _admit(state: IngressState, request: Request) -> tuple[ChatRequest, RunSubmission]:
    """Check and map the request; the run it becomes. `OpenAiError` for anything refused."""
    settings = state.settings
    _authorize(state, request)
    if "application/json" not in request.headers.get("content-type", "").lower():
        raise OpenAiUnsupportedMediaTypeError("Content-Type must be application/json.")
    try:
        # Read as it arrives, within the broker's limit with room for the envelope: 413 early.
        raw = await read_body(request, limit=message_limit_of(state))
    except BodyError as exc:
        raise body_error(exc) from None
    chat = parse_chat_request(raw)
    target, agents = await _resolve(state, chat)
    if state.openai_permits.locked():
        raise OpenAiUnavailableError("Too many completions in flight; try again.")
    granted = None if settings.ai_openai_api_key else _grant_principal(state, request, path=agents[target].path)
    principal = granted or Principal(
        auth_method="api-key" if settings.ai_openai_api_key else "anonymous", name=chat.user or ""
    )
    return chat, _run_request(chat, target, agents[target].path, principal)


async def _resolve(state: IngressState, chat: ChatRequest) -> tuple[str, dict[str, AgentDescriptor]]:
    """The agent serving `chat.model`, and every agent; a miss re-reads the directory once.

    The re-read catches an agent whose dispatch registered it after the directory's last read.
    """
    settings = state.settings
    for after_miss in (False, True):
        try:
            agents = {a.name: a for a in await state.directory.all(after_miss=after_miss)}
        except BusError:
            raise OpenAiUnavailableError("The agent directory is unavailable.") from None
        try:
            target = resolve_target(
                chat.model,
                models=settings.ai_openai_models,
                default_agent=settings.ai_openai_default_agent,
                registered=list(agents),
            )
        except (OpenAiModelNotFoundError, OpenAiUnavailableError):
            if after_miss:
                raise
            continue
        return target, agents
    raise AssertionError("unreachable")  # pragma: no cover


@router.post(
    "/chat/completions",
    response_model=None,
    summary="Create a chat completion with an agent",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["messages"],
                        "properties": {
                            "model": {"type": ["string", "null"]},
                            "stream": {"type": ["boolean", "null"]},
                            "user": {"type": ["string", "null"]},
                            "messages": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["role", "content"],
                                    "properties": {
                                        "role": {"enum": ["system", "developer", "user", "assistant"]},
                                        "content": {"type": "string", "minLength": 1, "pattern": r"\S"},
                                    },
                                },
                            },
                        },
                    }
                }
            },
        }
    },
    responses={
        200: {"content": {"application/json": {}, "text/event-stream": {}}},
        **_errors(400, 401, 403, 404, 413, 415, 429, 500, 502, 503),
    },
)
async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
    """OpenAI's `POST /v1/chat/completions`, served by the agent the model maps to."""
    state = state_of(request)
    chat, run = await _admit(state, request)
    await state.openai_permits.acquire()
    active = _Run(
        state,
        run,
        follow_run(state.bus, run.run_id, submit=run),
        Completion(model=chat.model or run.agent),
        deadline=time.monotonic() + state.settings.ai_openai_timeout,
    )
    handed_over = False
    try:
        response = await _unless_draining(state.drain, _respond(active, chat))
        handed_over = isinstance(response, StreamingResponse)
        return response
    except (DrainingError, TimeoutError, PayloadTooLargeError, BusError, StreamGapError, AnswerChangedError) as exc:
        raise _failure(exc) from None
    finally:
        if not handed_over:
            await active.close()


def _failure(exc: Exception) -> OpenAiError:
    """The OpenAI error for a completion that could not be answered."""
    if isinstance(exc, PayloadTooLargeError):
        return OpenAiTooLargeError("The request is too large to run.")
    if isinstance(exc, DrainingError):
        return OpenAiUnavailableError("The server is restarting; send the request again.")
    if isinstance(exc, TimeoutError):
        return OpenAiUnavailableError("The agent did not answer in time.")
    if isinstance(exc, AnswerChangedError):
        return OpenAiUnavailableError("The agent restarted in the middle of the answer; send the request again.")
    return OpenAiUnavailableError("The agent is unavailable right now; try again.")


class DrainingError(Exception):
    """Ingress began to stop before the answer started."""


async def _unless_draining(
    drain: Drain, answering: Coroutine[Any, Any, JSONResponse | StreamingResponse]
) -> JSONResponse | StreamingResponse:
    """`answering`'s response, unless ingress drains first (a whole answer may take minutes).

    Raises `DrainingError` then, after stopping `answering`.
    """
    answer = asyncio.create_task(answering)
    drained = asyncio.create_task(drain.event.wait())
    try:
        await asyncio.wait({answer, drained}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        drained.cancel()
        if not answer.done():
            answer.cancel()
            await asyncio.gather(answer, return_exceptions=True)
    if answer.cancelled():
        raise DrainingError
    return answer.result()


async def _respond(active: _Run, chat: ChatRequest) -> JSONResponse | StreamingResponse:
    # Wait for the first text (or the end) before answering: a run that fails at once gets a
    # proper HTTP error (the provider's 4xx, a 503 with Retry-After) instead of a 200 with an
    # error inside.
    first = await active.next()
    if first is None:
        raise agent_failed()
    if first.WhichOneof("kind") == "error":
        raise _run_error(first)
    if not chat.stream:
        return await _whole(active, first)
    return _paced(active, first, chat)


async def _whole(active: _Run, event: RunEvent | None) -> JSONResponse:
    summary = ""
    finish_reason = "stop"
    while event is not None:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            active.text.append(event.text_delta.text)
        elif kind == "error":
            raise _run_error(event)
        elif kind == "complete":
            summary = event.complete.summary
            finish_reason = event.complete.finish_reason or "stop"
            break
        event = await active.next()
    content = "".join(active.text) or summary
    return JSONResponse(active.completion.complete(content, active.counted_usage, finish_reason))


def _paced(active: _Run, first: RunEvent, chat: ChatRequest) -> PacedResponse:
    """The completion's chunks, a comment while the agent is quiet (a tool call), an end when ingress drains.

    An OpenAI client cannot resume a completion: a draining ingress ends it with a retryable
    error (the run is cancelled as the stream closes, as for a client that went away), so the
    client sends it again.
    """

    async def last_words() -> bytes:
        failure = OpenAiUnavailableError("The server is restarting; send the request again.")
        return sse_data(failure.body()) + sse_data("[DONE]")

    return PacedResponse(
        _stream(active, first, chat),
        keep_alive=active.state.settings.ingress.sse_keep_alive,
        draining=active.state.drain.event,
        last_words=last_words,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(active: _Run, first: RunEvent, chat: ChatRequest) -> AsyncIterator[bytes]:
    completion = active.completion
    try:
        yield sse_data(completion.chunk({"role": "assistant", "content": ""}))
        event: RunEvent | None = first
        finish_reason = "stop"
        while event is not None:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                active.text.append(event.text_delta.text)
                active.streaming = True
                yield sse_data(completion.chunk({"content": event.text_delta.text}))
            elif kind == "error":
                yield sse_data(_run_error(event).body())
                yield sse_data("[DONE]")
                return
            elif kind == "complete":
                if not active.text and event.complete.summary:
                    yield sse_data(completion.chunk({"content": event.complete.summary}))
                finish_reason = event.complete.finish_reason or "stop"
                break
            event = await active.next()
        yield sse_data(completion.chunk({}, finish_reason))
        usage = active.counted_usage
        if usage and chat.include_usage:
            # Only when asked: a chunk with empty `choices` breaks the common `chunk.choices[0]`
            # loop; and only with counts, since no counts are not zero tokens.
            yield sse_data(completion.usage_chunk(usage))
        yield sse_data("[DONE]")
    except (TimeoutError, BusError, StreamGapError, AnswerChangedError) as exc:
        failure = OpenAiUnavailableError("The agent stopped answering.")
        log.warning("completion %s broke off: %s", completion.id, type(exc).__name__)
        yield sse_data(failure.body())
        yield sse_data("[DONE]")
    finally:
        await active.close()
