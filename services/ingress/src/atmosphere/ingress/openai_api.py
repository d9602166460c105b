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
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from google.protobuf.timestamp_pb2 import Timestamp

from atmosphere.bus import BusError
from atmosphere.bus.runs import cancel_run, follow_run
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunRequest
from atmosphere.ingress.agents_api import state_of
from atmosphere.ingress.handlers import HISTORY_METADATA_KEY
from atmosphere.ingress.openai_wire import (
    ChatRequest,
    Completion,
    OpenAiError,
    error_for_run,
    model_list,
    parse_chat_request,
    resolve_target,
    sse_data,
)
from atmosphere.ingress.state import IngressState

log = logging.getLogger("atmosphere.ingress")

router = APIRouter(prefix="/atmosphere/v1")

ERROR_SCHEMA = {
    "content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object"}}}}}
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return dict.fromkeys(statuses, ERROR_SCHEMA)


def _answer(exc: OpenAiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _authorize(state: IngressState, request: Request) -> None:
    key = state.settings.ai_openai_api_key
    if not key:
        return
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), key.encode()):
        raise OpenAiError(
            401, "Incorrect or missing API key. Send 'Authorization: Bearer <key>'.", code="invalid_api_key"
        )


@router.get("/models", summary="The agents exposed as models", responses=_errors(401, 503))
async def list_models(request: Request) -> JSONResponse:
    """`{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}`."""
    state = state_of(request)
    try:
        _authorize(state, request)
        agents = await state.directory.all()
    except OpenAiError as exc:
        return _answer(exc)
    except BusError:
        return _answer(
            OpenAiError(503, "The agent directory is unavailable.", type_="server_error", code="service_unavailable")
        )
    return JSONResponse(model_list(state.settings.ai_openai_models, [a.name for a in agents]))


@dataclass
class _Run:
    """A completion being produced."""

    state: IngressState
    run: RunRequest
    events: AsyncGenerator[RunEvent, None]
    completion: Completion
    text: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    deadline: float = 0.0
    finished: bool = False

    async def next(self) -> RunEvent | None:
        """The next event worth answering with, or None at the end of the stream."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                event = await asyncio.wait_for(anext(self.events), remaining)
            except StopAsyncIteration:
                return None
            if event.origin_run_id:
                continue  # a sub-agent's activity has no OpenAI representation; its report does
            kind = event.WhichOneof("kind")
            if kind == "usage":
                self.usage["prompt_tokens"] += event.usage.input_tokens
                self.usage["completion_tokens"] += event.usage.output_tokens
                self.usage["total_tokens"] += event.usage.total_tokens or (
                    event.usage.input_tokens + event.usage.output_tokens
                )
            elif kind in {"text_delta", "complete", "error"}:
                if kind != "text_delta":
                    self.finished = True
                return event

    @property
    def counted_usage(self) -> dict[str, int] | None:
        return self.usage if self.usage["total_tokens"] else None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.events.aclose()
        if not self.finished:
            # An OpenAI client that went away (or timed out) does not come back for the rest.
            await cancel_run(self.state.bus, self.run.run_id, "the OpenAI client went away")
        self.state.openai_permits.release()


def _run_request(chat: ChatRequest, agent: str, path: str, principal: Principal) -> RunRequest:
    submitted = Timestamp()
    submitted.FromNanoseconds(time.time_ns())
    key = f"openai:{chat.user}:{uuid.uuid4().hex}" if chat.user else f"openai:{uuid.uuid4().hex}"
    metadata = {HISTORY_METADATA_KEY: json.dumps(chat.prior)} if chat.prior else {}
    return RunRequest(
        run_id=uuid.uuid4().hex,
        session_id=str(uuid.uuid4()),
        conversation_id=key,
        agent=agent,
        message=chat.prompt,
        principal=principal,
        metadata=metadata,
        submitted_at=submitted,
        transport="openai",
        path=path,
    )


async def _admit(state: IngressState, request: Request) -> tuple[ChatRequest, RunRequest]:
    """Check and map the request; the run it becomes. `OpenAiError` for anything refused."""
    settings = state.settings
    _authorize(state, request)
    if "application/json" not in request.headers.get("content-type", "").lower():
        raise OpenAiError(415, "Content-Type must be application/json.", code="unsupported_media_type")
    chat = parse_chat_request(await request.body())
    target, agents = await _resolve(state, chat)
    if state.openai_permits.locked():
        raise _unavailable("Too many completions in flight; try again.")
    principal = Principal(auth_method="api-key" if settings.ai_openai_api_key else "anonymous", name=chat.user or "")
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
            raise _unavailable("The agent directory is unavailable.") from None
        try:
            target = resolve_target(
                chat.model,
                models=settings.ai_openai_models,
                default_agent=settings.ai_openai_default_agent,
                registered=list(agents),
            )
        except OpenAiError as exc:
            if after_miss or exc.status not in {404, 503}:
                raise
            continue
        return target, agents
    raise AssertionError("unreachable")  # pragma: no cover


def _unavailable(message: str) -> OpenAiError:
    return OpenAiError(503, message, type_="server_error", code="service_unavailable")


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
        **_errors(400, 401, 403, 404, 413, 415, 429, 500, 503),
    },
)
async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
    """OpenAI's `POST /v1/chat/completions`, served by the agent the model maps to."""
    state = state_of(request)
    try:
        chat, run = await _admit(state, request)
    except OpenAiError as exc:
        return _answer(exc)
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
        # Wait for the first text (or the end) before answering: a run that fails at once gets a
        # proper HTTP error instead of a 200 with an error inside.
        first = await active.next()
        if first is None or first.WhichOneof("kind") == "error":
            code, message = (first.error.code, first.error.message) if first else ("internal", "no answer")
            return _answer(error_for_run(code, message))
        if not chat.stream:
            return await _whole(active, first)
        handed_over = True
        return StreamingResponse(
            _stream(active, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    except TimeoutError:
        return _answer(_unavailable("The agent did not answer in time."))
    except BusError:
        return _answer(_unavailable("The agent is unavailable right now; try again."))
    finally:
        if not handed_over:
            await active.close()


async def _whole(active: _Run, event: RunEvent | None) -> JSONResponse:
    summary = ""
    while event is not None:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            active.text.append(event.text_delta.text)
        elif kind == "error":
            return _answer(error_for_run(event.error.code, event.error.message))
        elif kind == "complete":
            summary = event.complete.summary
            break
        event = await active.next()
    content = "".join(active.text) or summary
    return JSONResponse(active.completion.complete(content, active.counted_usage))


async def _stream(active: _Run, first: RunEvent) -> AsyncIterator[bytes]:
    completion = active.completion
    try:
        yield sse_data(completion.chunk({"role": "assistant", "content": ""}))
        event: RunEvent | None = first
        while event is not None:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                active.text.append(event.text_delta.text)
                yield sse_data(completion.chunk({"content": event.text_delta.text}))
            elif kind == "error":
                yield sse_data(error_for_run(event.error.code, event.error.message).body())
                yield sse_data("[DONE]")
                return
            elif kind == "complete":
                if not active.text and event.complete.summary:
                    yield sse_data(completion.chunk({"content": event.complete.summary}))
                break
            event = await active.next()
        yield sse_data(completion.chunk({}, "stop"))
        usage = active.counted_usage
        if usage:
            yield sse_data(completion.usage_chunk(usage))
        yield sse_data("[DONE]")
    except (TimeoutError, BusError) as exc:
        failure = OpenAiError(503, "The agent stopped answering.", type_="server_error", code="service_unavailable")
        log.warning("completion %s broke off: %s", completion.id, type(exc).__name__)
        yield sse_data(failure.body())
        yield sse_data("[DONE]")
    finally:
        await active.close()
