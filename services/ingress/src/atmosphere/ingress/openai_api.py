"""The OpenAI-compatible API at `/atmosphere/v1`: any OpenAI SDK can talk to an agent.

    POST /atmosphere/v1/chat/completions   streaming (SSE chunks, `data: [DONE]`) and not
    GET  /atmosphere/v1/models

A completion is an ordinary run (same queue, governance, budgets, tape). It is off unless
`ATMOSPHERE_AI_OPENAI_ENABLED=true`.

What Chat Completions cannot carry is said at once, never waited out: a tool call that needs a
human's approval cancels the run and answers 422 `approval_required`, naming the tool and the
doors that can carry approvals. A client that leaves, before the first byte or mid-stream,
cancels its run; a streamed answer sends its head within `FIRST_EVENT_PATIENCE` and SSE
comments while the run is quiet. A retried request attaches to its first attempt's run
(`openai_retries`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from atmosphere.bus import BusError, PayloadTooLargeError
from atmosphere.bus.errors import RunCancelledError
from atmosphere.bus.runs import (
    ANSWER_REWOUND_METADATA_KEY,
    GATEWAY_METADATA_KEY,
    HISTORY_METADATA_KEY,
    StreamGapError,
    cancel_run,
    follow_run,
    last_event,
    new_run,
)
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunSubmission, ToolStart
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.bodies import BodyError, read_body
from atmosphere.ingress.client_functions import check_served
from atmosphere.ingress.errors import (
    RUN_ID_HEADER,
    OpenAiApprovalRequiredError,
    OpenAiError,
    OpenAiInvalidApiKeyError,
    OpenAiModelNotFoundError,
    OpenAiPermissionDeniedError,
    OpenAiTooLargeError,
    OpenAiUnavailableError,
    OpenAiUnsupportedMediaTypeError,
)
from atmosphere.ingress.http import message_limit_of, state_of
from atmosphere.ingress.openai_retries import Claim, RetryKey
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
    tool_call,
)
from atmosphere.ingress.pacing import Drain, PacedResponse
from atmosphere.ingress.state import IngressState
from atmosphere.service import scoped_conversation

log = logging.getLogger("atmosphere.ingress")

OPENAI_PREFIX = "/atmosphere/v1"
router = APIRouter(prefix=OPENAI_PREFIX)

ERROR_SCHEMA = {
    "content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object"}}}}}
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return dict.fromkeys(statuses, ERROR_SCHEMA)


MISSING_KEY = "Incorrect or missing API key. Send 'Authorization: Bearer <key>'."


def run_error_of(event: RunEvent) -> OpenAiError:
    return error_for_run(event.error)


OPENAI_FINISH_REASONS = frozenset({"stop", "length", "content_filter", "tool_calls"})


def _finish_reason(event: RunEvent) -> str | None:
    """The terminal's `finish_reason` as OpenAI spells it: null when the model never said (`unknown`).

    OpenAI's schema allows null there; a reason its clients do not know would not be truthful either.
    """
    reason = event.complete.finish_reason or "stop"  # empty: a runtime that finished without naming why
    return reason if reason in OPENAI_FINISH_REASONS else None


FIRST_EVENT_PATIENCE = 2.0
"""Seconds a streamed completion waits for its first event before it sends its head anyway.

Within it, a run that fails at once (a governance denial, a provider's 4xx) still gets a proper
HTTP error; after it, the client sees the stream open and SSE comments while the run is quiet,
and an error (if any) as a last chunk."""

APPROVAL_DOORS = (
    "the WebSocket at /atmosphere/agent/{agent} (answer with /__approval/<approvalId>/approve), "
    "or SSE (POST /atmosphere/agent/{agent}) with approvals POSTed to /atmosphere/runs/<run>/approval"
)


def authorize_openai(state: IngressState, request: Request) -> Caller | None:
    """Check the caller's key; its token grant's caller when grants stand in for a key (else None)."""
    key = state.settings.ai_openai_api_key
    if not key:
        # Without a key of its own the endpoint takes the agent endpoints' token grants, if any.
        return _grant_caller(state, request)
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), key.encode()):
        raise OpenAiInvalidApiKeyError(MISSING_KEY)
    return None


def _grant_caller(state: IngressState, request: Request) -> Caller | None:
    """The token grant's caller (None with no grants configured); 401 without a valid token."""
    if not state.authenticator.enabled:
        return None
    try:
        return state.authenticator.identify(request.headers)
    except AuthError:
        raise OpenAiInvalidApiKeyError(MISSING_KEY) from None


def grant_principal(state: IngressState, request: Request, *, path: str | None) -> Principal | None:
    """The token grant's principal (None with no grants configured), checked against `path` if given.

    With token grants configured, a completion runs for (and is owned by) the grant's user,
    exactly as a WebSocket run would (mode parity).
    """
    caller = _grant_caller(state, request)
    if caller is None:
        return None
    if path is not None and not caller.may_use(path):
        raise OpenAiPermissionDeniedError("This key may not use that model.")
    return caller.principal


@router.get("/models", summary="The agents exposed as models", responses=_errors(401, 503))
async def list_models(request: Request) -> JSONResponse:
    """`{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}`.

    With token grants, only the models whose agent the key may use are listed.
    """
    state = state_of(request)
    caller = authorize_openai(state, request)
    try:
        agents = {a.name: a for a in await state.directory.all()}
    except BusError:
        raise OpenAiUnavailableError("The agent directory is unavailable.") from None
    usable = [name for name, agent in agents.items() if caller is None or caller.may_use(agent.path)]
    return JSONResponse(model_list(state.settings.ai_openai_models, usable))


class AnswerChangedError(Exception):
    """The run resumed after its worker died and its answer came out differently than what was streamed."""


class ApprovalNotCarriedError(Exception):
    """The run asked for a human's approval, which Chat Completions has no way to carry."""

    def __init__(self, agent: str, tool: str) -> None:
        self.agent = agent
        self.tool = tool
        super().__init__(f"{agent}: {tool} needs approval")

    def as_openai(self, door: str = "Chat Completions") -> OpenAiError:
        doors = APPROVAL_DOORS.format(agent=self.agent)
        return OpenAiApprovalRequiredError(
            f"The agent '{self.agent}' called the tool '{self.tool}', which needs a human's approval; "
            f"{door} cannot carry one, so the run was cancelled and the tool did not run. "
            f"Use a door that carries approvals: {doors}."
        )


@dataclass
class _Retry:
    """How this completion may be found again by a retry, and what it claimed."""

    key: RetryKey
    claim: Claim


@dataclass
class CompletionRun:
    """A completion being produced."""

    state: IngressState
    run: RunSubmission
    """The run followed: this request's own, or the one a retry attached to."""
    events: AsyncGenerator[RunEvent, None]
    completion: Completion
    deadline: float
    """`time.monotonic()` by which the answer must be complete."""
    retry: _Retry | None = None
    text: list[str] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    finished: bool = False
    streaming: bool = False
    """Whether text already went to the client (a streamed completion): it cannot be taken back."""
    head_sent: bool = False
    """Whether the response's head went out (a Stainless SDK never retries after that)."""
    closed: bool = False

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
            kind = event.WhichOneof("kind")
            if kind == "approval_required":
                # A sub-agent's too: nobody here can answer it, and the run would wait for it.
                raise ApprovalNotCarriedError(event.origin_agent or event.agent, event.approval_required.tool_name)
            if event.origin_run_id:
                continue  # a sub-agent's activity has no OpenAI representation; its report does
            # A run whose worker died goes on where it stopped (dispatch sends none of what the
            # stream already has again), so its `ai.run.resumed` marker needs nothing here.
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

    async def close(self, reason: str = "the OpenAI client went away", *, at_once: bool = False) -> None:
        """Stop following the run, and cancel it unless it finished (once, whoever calls first).

        A run a retry may still attach to (an `Idempotency-Key`; an SDK's request whose head
        was not sent yet) is cancelled after the retry grace, unless a retry attached.
        """
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            await self.events.aclose()
        try:
            if self.finished:
                return
            retry = self.retry
            if retry is not None and not at_once and (retry.key.explicit or not self.head_sent):
                self.state.completions.cancel_unless_retried(retry.key, retry.claim, self.run, reason)
            else:
                # An OpenAI client that went away (or timed out) does not come back for the rest.
                await cancel_run(self.state.bus, self.run.run_id, reason, principal=self.run.principal)
        finally:
            self.state.openai_permits.release()


def _run_request(chat: ChatRequest, agent: AgentDescriptor, principal: Principal) -> RunSubmission:
    """The run a completion is: the last user message, earlier turns as its history."""
    key = f"openai:{chat.user}:{uuid.uuid4().hex}" if chat.user else f"openai:{uuid.uuid4().hex}"
    # Unescaped: a history of non-ASCII text must not grow sixfold on its way to the broker.
    # Always sent (`[]` for a first message): the client keeps the conversation, so memory takes no part.
    metadata = {HISTORY_METADATA_KEY: json.dumps(chat.prior, ensure_ascii=False)}
    if chat.gateway.used:
        metadata[GATEWAY_METADATA_KEY] = json.dumps(chat.gateway.metadata(), ensure_ascii=False)
    return new_run(
        agent=agent.name,
        message=chat.prompt,
        principal=principal,
        # Scoped like every user's conversation, so it counts against its user's quotas only.
        conversation_id=scoped_conversation(key, principal),
        transport="openai",
        path=agent.path,
        metadata=metadata,
        pool=agent.pool,
    )


@dataclass(frozen=True)
class _Admitted:
    chat: ChatRequest
    run: RunSubmission
    retry_key: RetryKey | None


async def read_request(state: IngressState, request: Request) -> bytes:
    """The caller checked and the JSON body read within the limit; `OpenAiError` for anything refused."""
    authorize_openai(state, request)
    if "application/json" not in request.headers.get("content-type", "").lower():
        raise OpenAiUnsupportedMediaTypeError("Content-Type must be application/json.")
    try:
        # Read as it arrives, within the broker's limit with room for the envelope: 413 early.
        return await read_body(request, limit=message_limit_of(state))
    except BodyError as exc:
        raise body_error(exc) from None


def principal_for(state: IngressState, request: Request, agent: AgentDescriptor, user: str | None) -> Principal:
    """Who the run is for: the token grant's user, else the API key's (or anonymous) caller named `user`."""
    settings = state.settings
    granted = None if settings.ai_openai_api_key else grant_principal(state, request, path=agent.path)
    return granted or Principal(auth_method="api-key" if settings.ai_openai_api_key else "anonymous", name=user or "")


async def _admit(state: IngressState, request: Request) -> _Admitted:
    """Check and map the request; the run it becomes. `OpenAiError` for anything refused."""
    raw = await read_request(state, request)
    chat = parse_chat_request(raw)
    target, agents = await resolve_agent(state, chat.model)
    if state.openai_permits.locked():
        raise OpenAiUnavailableError("Too many completions in flight; try again.")
    check_served(chat.gateway, agents[target])
    principal = principal_for(state, request, agents[target], chat.user)
    # A retry is recognised only as the same caller's: never another user's completion.
    caller = f"{principal.auth_method}:{principal.tenant}:{principal.user_id}"
    retry_key = RetryKey.of(request.headers, caller, raw)
    return _Admitted(chat, _run_request(chat, agents[target], principal), retry_key)


async def resolve_agent(state: IngressState, model: str | None) -> tuple[str, dict[str, AgentDescriptor]]:
    """The agent serving `model`, and every agent; a miss re-reads the directory once.

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
                model,
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
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "Requests with the same key (and caller) are one completion: a retry "
                "attaches to the first one's run instead of starting another.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        ],
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
                                    "required": ["role"],
                                    "properties": {
                                        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                                        "content": {"type": ["string", "array", "null"]},
                                        "tool_calls": {"type": "array", "items": {"type": "object"}},
                                        "tool_call_id": {"type": "string"},
                                    },
                                },
                            },
                            "tools": {
                                "type": "array",
                                "maxItems": 128,
                                "description": "The client's own functions: the model's calls of them come back "
                                "as `tool_calls` (finish_reason `tool_calls`), never run here.",
                                "items": {"type": "object"},
                            },
                            "tool_choice": {"type": ["string", "object", "null"]},
                            "parallel_tool_calls": {"type": ["boolean", "null"]},
                            "response_format": {"type": ["object", "null"]},
                        },
                    }
                }
            },
        },
    },
    responses={
        200: {"content": {"application/json": {}, "text/event-stream": {}}},
        **_errors(400, 401, 403, 404, 413, 415, 422, 429, 500, 502, 503),
    },
)
async def chat_completions(request: Request) -> Response:
    """OpenAI's `POST /v1/chat/completions`, served by the agent the model maps to."""
    state = state_of(request)
    admitted = await _admit(state, request)
    await state.openai_permits.acquire()
    try:
        active = await _start(state, admitted)
    except BaseException:
        state.openai_permits.release()
        raise
    return await serve_answer(state, request, active, _respond(active, admitted.chat), door="Chat Completions")


async def serve_answer(
    state: IngressState,
    request: Request,
    active: CompletionRun,
    answering: Coroutine[Any, Any, Response],
    *,
    door: str,
) -> Response:
    """`answering`'s response, naming its run; every way it can fail as the OpenAI error it is.

    A response that streams takes `active` over (it closes it when the stream ends); any other
    outcome closes it here, cancelling the run unless it finished.
    """
    note_run(active.run.run_id, active.run.agent)
    handed_over = False
    try:
        response = await answer_unless_gone(state.drain, request, answering)
        handed_over = isinstance(response, StreamingResponse)
        response.headers[RUN_ID_HEADER] = active.run.run_id
        return response
    except ClientGoneError:
        await active.close()
        return Response(status_code=499)  # nobody reads it: the connection is gone
    except ApprovalNotCarriedError as exc:
        await active.close(f"an approval cannot be given over {door}", at_once=True)
        raise naming_run(exc.as_openai(door), active) from None
    except OpenAiError as exc:
        raise naming_run(exc, active) from None
    except (DrainingError, TimeoutError, PayloadTooLargeError, BusError, StreamGapError, AnswerChangedError) as exc:
        raise naming_run(failure_of(exc), active) from None
    finally:
        if not handed_over:
            await active.close()


def naming_run(error: OpenAiError, active: CompletionRun) -> OpenAiError:
    """`error`, naming the run the completion started (`X-Atmosphere-Run-Id`)."""
    error.run_id = active.run.run_id
    return error


async def _start(state: IngressState, admitted: _Admitted) -> CompletionRun:
    """Submit the run, or attach to the run of the request this one repeats."""
    run, completion = admitted.run, Completion(model=admitted.chat.model or admitted.run.agent)
    deadline = time.monotonic() + state.settings.ai_openai_timeout
    key = admitted.retry_key
    if key is None:
        return CompletionRun(state, run, follow_run(state.bus, run.run_id, submit=run), completion, deadline)
    try:
        claim = await state.completions.claim(key, run, completion.id, completion.created)
        if not claim.ours and not _worth_attaching(await last_event(state.bus, claim.run_id)):
            claim = await state.completions.claim(key, run, completion.id, completion.created, replacing=claim.run_id)
    except BusError:
        raise OpenAiUnavailableError("The agent is unavailable right now; try again.") from None
    retry = _Retry(key, claim)
    if claim.ours:
        return CompletionRun(state, run, follow_run(state.bus, run.run_id, submit=run), completion, deadline, retry)
    log.info("completion retried: attaching to run %s", claim.run_id)
    followed = RunSubmission()
    followed.CopyFrom(run)
    followed.run_id = claim.run_id
    same = Completion(model=completion.model, id=claim.completion_id, created=claim.created)
    return CompletionRun(state, followed, follow_run(state.bus, claim.run_id), same, deadline, retry)


def _worth_attaching(last: RunEvent | None) -> bool:
    """Whether a retry should follow the run whose newest stored event is `last`, or start afresh.

    A retry follows a run still going, or one that ended in a way another try would not change
    (its answer, or an error a retry cannot cure). It starts a new run when the first one is gone
    (its events expired), was cancelled (its client left and no retry came in time), or failed
    with an error worth retrying (a provider's 503, a rate limit): the client was told to try
    again, and replaying that error would answer the retry with the same refusal.
    """
    if last is None:
        return False
    if last.WhichOneof("kind") != "error":
        return True
    return not (last.error.retryable or last.error.code == RunCancelledError.code)


def failure_of(exc: Exception) -> OpenAiError:
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


class ClientGoneError(Exception):
    """The client hung up before the answer started."""


async def _disconnected(request: Request) -> None:
    """Return once the client hangs up (its body was read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def answer_unless_gone(drain: Drain, request: Request, answering: Coroutine[Any, Any, Response]) -> Response:
    """`answering`'s response, unless ingress drains or the client leaves first (an answer may take minutes).

    Raises `DrainingError` or `ClientGoneError` then, after stopping `answering`.
    """
    answer = asyncio.create_task(answering)
    drained = asyncio.create_task(drain.event.wait())
    gone = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({answer, drained, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left = gone.done() and not gone.cancelled() and gone.exception() is None
        for watcher in (drained, gone):
            watcher.cancel()
        if not answer.done():
            answer.cancel()
        # Awaited, so that nothing of ours still reads the connection when a stream takes it over.
        await asyncio.gather(answer, drained, gone, return_exceptions=True)
    if answer.cancelled():
        raise ClientGoneError if left else DrainingError
    return answer.result()


async def _respond(active: CompletionRun, chat: ChatRequest) -> Response:
    if not chat.stream:
        # Wait for the first text (or the end) before answering: a run that fails at once gets a
        # proper HTTP error (the provider's 4xx, a 503 with Retry-After) instead of a 200 with
        # an error inside.
        return await _whole(active, checked_first(await active.next()))
    first = await first_event(active)

    async def last_words() -> bytes:
        failure = OpenAiUnavailableError("The server is restarting; send the request again.")
        return sse_data(failure.body()) + sse_data("[DONE]")

    return paced_answer(active, first, _stream(active, first, chat), last_words)


async def first_event(active: CompletionRun) -> Awaitable[RunEvent | None]:
    """The run's first event, when it comes within the patience (an error then raises), else the wait for it.

    A stream waits for its first event only so long: then its head goes out, and SSE comments
    while the run is quiet (a client or proxy must not take the silence for a hang). Within it, a
    run that fails at once is a proper HTTP error.
    """
    pending = asyncio.ensure_future(active.next())
    try:
        done, _ = await asyncio.wait({pending}, timeout=first_event_patience(active))
    except asyncio.CancelledError:
        pending.cancel()
        raise
    return ready_event(checked_first(pending.result())) if done else pending


def first_event_patience(active: CompletionRun) -> float:
    return min(FIRST_EVENT_PATIENCE, active.state.settings.ingress.sse_keep_alive)


def checked_first(first: RunEvent | None) -> RunEvent:
    if first is None:
        raise agent_failed()
    if first.WhichOneof("kind") == "error":
        raise run_error_of(first)
    return first


async def ready_event(event: RunEvent) -> RunEvent | None:
    return event


async def _whole(active: CompletionRun, event: RunEvent | None) -> JSONResponse:
    summary = ""
    finish_reason: str | None = "stop"
    handed_back: Sequence[ToolStart] = ()
    while event is not None:
        kind = event.WhichOneof("kind")
        if kind == "text_delta":
            active.text.append(event.text_delta.text)
        elif kind == "error":
            raise run_error_of(event)
        elif kind == "complete":
            summary = event.complete.summary
            finish_reason = _finish_reason(event)
            handed_back = event.complete.client_tool_calls
            break
        event = await active.next()
    content = "".join(active.text) or summary
    active.head_sent = True
    return JSONResponse(active.completion.complete(content, active.counted_usage, finish_reason, handed_back))


def paced_answer(
    active: CompletionRun,
    first: Awaitable[RunEvent | None],
    body: AsyncIterator[bytes],
    last_words: Callable[[], Awaitable[bytes]],
) -> PacedResponse:
    """The answer's SSE `body`, a comment while the agent is quiet (a tool call), `last_words` when ingress drains.

    An OpenAI client cannot resume an answer: a draining ingress ends it with a retryable error
    (the run is cancelled as the stream closes, as for a client that went away), so the client
    sends it again.
    """

    async def closed() -> None:
        if isinstance(first, asyncio.Future) and not first.done():
            first.cancel()  # the stream ended before its first event arrived
        await active.close()

    active.head_sent = True
    return PacedResponse(
        body,
        keep_alive=active.state.settings.ingress.sse_keep_alive,
        draining=active.state.drain.event,
        last_words=last_words,
        on_close=closed,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(active: CompletionRun, first: Awaitable[RunEvent | None], chat: ChatRequest) -> AsyncIterator[bytes]:
    completion = active.completion
    try:
        yield sse_data(completion.chunk({"role": "assistant", "content": ""}))
        event = await first
        finish_reason: str | None = "stop"
        while event is not None:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                active.text.append(event.text_delta.text)
                active.streaming = True
                yield sse_data(completion.chunk({"content": event.text_delta.text}))
            elif kind == "error":
                yield sse_data(run_error_of(event).body())
                yield sse_data("[DONE]")
                return
            elif kind == "complete":
                if not active.text and event.complete.summary:
                    yield sse_data(completion.chunk({"content": event.complete.summary}))
                for index, call in enumerate(event.complete.client_tool_calls):
                    yield sse_data(completion.chunk({"tool_calls": [tool_call(call, index)]}))
                finish_reason = _finish_reason(event)
                break
            event = await active.next()
        yield sse_data(completion.chunk({}, finish_reason))
        usage = active.counted_usage
        if usage and chat.include_usage:
            # Only when asked: a chunk with empty `choices` breaks the common `chunk.choices[0]`
            # loop; and only with counts, since no counts are not zero tokens.
            yield sse_data(completion.usage_chunk(usage))
        yield sse_data("[DONE]")
    except ApprovalNotCarriedError as exc:
        await active.close("an approval cannot be given over Chat Completions", at_once=True)
        yield sse_data(exc.as_openai().body())
        yield sse_data("[DONE]")
    except (TimeoutError, BusError, StreamGapError, AnswerChangedError) as exc:
        failure = OpenAiUnavailableError("The agent stopped answering.")
        log.warning("completion %s broke off: %s", completion.id, type(exc).__name__)
        yield sse_data(failure.body())
        yield sse_data("[DONE]")
