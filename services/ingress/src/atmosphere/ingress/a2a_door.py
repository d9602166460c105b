"""The A2A door: each agent an A2A server at `/atmosphere/a2a/<agent>` (JSON-RPC, A2A 1.0 and 0.3 names).

    GET  /atmosphere/a2a/<agent>/.well-known/agent-card.json   its Agent Card
    GET  /.well-known/agent-card.json                          the default agent's (`ATMOSPHERE_A2A__DEFAULT_AGENT`)
    POST /atmosphere/a2a/<agent>                                SendMessage, SendStreamingMessage, GetTask,
                                                               ListTasks, CancelTask, SubscribeToTask (and 0.3's
                                                               message/send, message/stream, tasks/*)

Built on the `a2a-sdk`'s request handler, task store and JSON-RPC dispatcher; a message is a run
(transport "a2a") of the agent, its context id the conversation (scoped to the caller). The
answer streams as chunks of one text artifact (`append`), replaced at the end by the whole text
in one part (so the task holds one answer, not a part per chunk); tool calls as `working` status messages;
an approval puts the task in `input-required`, and the next message on the task answers it
("approve"/"yes", or a data part `{"approve": true, "arguments"?}`; anything else denies), the
same run going on. CancelTask cancels the run. Tasks belong to the caller (another user's are
unknown to them) and are kept in this process, at most `MAX_TASKS` (the oldest go first).
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass

from a2a.auth.user import User
from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from google.protobuf.json_format import MessageToDict
from starlette.requests import Request as StarletteRequest
from starlette.types import Message

from atmosphere.bus.runs import cancel_run
from atmosphere.bus.telemetry import bind_run
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.agent_prompts import find_agent, known_agent
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.door_runs import AnswerText, DoorRun, follow_owned_run, start_run
from atmosphere.ingress.errors import AUTH_REFUSALS, AgentNotFoundError, IngressError, MalformedRequestError
from atmosphere.ingress.http import bounded_body, error_responses, message_limit_of, state_of
from atmosphere.ingress.inbound import ApprovalReply, send_approval
from atmosphere.ingress.protocol_doors import A2A_PATH
from atmosphere.ingress.state import IngressState

log = logging.getLogger("atmosphere.ingress")

TRANSPORT = "a2a"
MAX_TASKS = 10_000
"""Tasks one ingress process keeps (each a few kilobytes); beyond it the oldest are forgotten."""
ANSWER_ARTIFACT = "answer"
ENVELOPE_BYTES = 64 * 1024
"""Room for the JSON-RPC envelope around a message of the largest size ingress admits."""

router = APIRouter()

_call: contextvars.ContextVar[_Call] = contextvars.ContextVar("a2a_call")
"""The caller and agent of the A2A request being served (set before the SDK sees the request)."""


@dataclass(frozen=True)
class _Call:
    state: IngressState
    caller: Caller
    agent: AgentDescriptor
    address: str


class _Principal(User):
    """The caller as the SDK's user: its name keys the caller's own tasks."""

    def __init__(self, caller: Caller) -> None:
        principal = caller.principal
        self._name = f"{principal.auth_method}:{principal.tenant}:{principal.user_id}"

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._name


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's context (the request's headers: its `A2A-Version`, extensions), for our caller."""

    def build(self, request: StarletteRequest) -> ServerCallContext:
        context = super().build(request)
        call = _call.get()
        context.user = _Principal(call.caller)
        context.state["call"] = call
        return context


class BoundedTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store, owner-scoped, holding at most `limit` tasks (the oldest go first)."""

    def __init__(self, limit: int = MAX_TASKS) -> None:
        super().__init__()
        self._limit = limit
        self._order: OrderedDict[str, ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        self._order[task.id] = context
        self._order.move_to_end(task.id)
        while len(self._order) > self._limit:
            oldest, owner = self._order.popitem(last=False)
            await super().delete(oldest, owner)


@dataclass
class _Waiting:
    """A task whose run waits for an approval: what the next message answers."""

    run_id: str
    approval_id: str
    seq: int


class RunExecutor(AgentExecutor):
    """A message to an agent is a run; its events become the task's status and artifact."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, str] = OrderedDict()
        """Task id → the run it is (for CancelTask), the newest `MAX_TASKS`."""
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()
        """Task id → the approval its run waits for, the newest `MAX_TASKS` (an unanswered one expires)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        call: _Call = context.call_context.state["call"]
        task_id, context_id = context.task_id or "", context.context_id or ""
        if context.current_task is None and context.message is not None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, task_id, context_id)
        waiting = self._waiting.pop(task_id, None)
        try:
            if waiting is not None:
                run = await follow_owned_run(
                    call.state, call.caller, waiting.run_id, address=call.address, after_seq=waiting.seq
                )
                await send_approval(
                    call.state.bus,
                    waiting.run_id,
                    _decision(waiting.approval_id, context),
                    principal=call.caller.principal,
                )
            else:
                text = context.get_user_input()
                if not text.strip():
                    msg = "The message has no text (only text parts are read)"
                    raise MalformedRequestError(msg)
                run = await start_run(
                    call.state,
                    call.caller,
                    call.agent,
                    text,
                    transport=TRANSPORT,
                    address=call.address,
                    conversation=f"a2a-{context_id}",
                )
        except IngressError as exc:
            await updater.reject(updater.new_agent_message([new_text_part(f"Error: {exc.message}")]))
            return
        self._remember(task_id, run.run_id)
        # The run behind the task, for its owner's other doors (resume, the tape).
        await updater.update_status(TaskState.TASK_STATE_WORKING, metadata={"atmosphere/runId": run.run_id})
        # Its own task (the A2A server's), not the request's: it binds the run itself.
        with bind_run(run.run_id, run.agent):
            await self._follow(run, updater, task_id)

    async def _follow(self, run: DoorRun, updater: TaskUpdater, task_id: str) -> None:
        answer = AnswerText()
        cancel: str | None = "the A2A task was cancelled"
        chunks = 0
        try:
            async for event in run:
                kind = event.WhichOneof("kind")
                if text := answer.add(event):
                    await updater.add_artifact(
                        [new_text_part(text)], artifact_id=ANSWER_ARTIFACT, name="answer", append=chunks > 0
                    )
                    chunks += 1
                elif kind == "tool_start" and not event.origin_run_id:
                    note = f"Calling {event.tool_start.tool_name}"
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING, message=updater.new_agent_message([new_text_part(note)])
                    )
                elif kind == "approval_required":
                    approval = event.approval_required
                    self._wait(task_id, _Waiting(run.run_id, approval.approval_id, event.seq))
                    cancel = None
                    question = (
                        f"The agent wants to call '{approval.tool_name}' with {approval.arguments_json[:2000]}. "
                        "Reply 'approve' or 'deny'."
                    )
                    await updater.requires_input(updater.new_agent_message([new_text_part(question)]))
                    return
                elif kind == "complete" and not event.origin_run_id:
                    cancel = None
                    # The streamed chunks replaced by the whole answer in one part (`append` false):
                    # the task keeps one text, not a part per chunk.
                    await updater.add_artifact(
                        [new_text_part(answer.text)], artifact_id=ANSWER_ARTIFACT, name="answer", last_chunk=True
                    )
                    await updater.complete()
                    return
                elif kind == "error" and not event.origin_run_id:
                    cancel = None
                    failure = f"Error: {event.error.message}"
                    await updater.failed(updater.new_agent_message([new_text_part(failure)]))
                    return
        finally:
            await run.close(cancel_reason=cancel)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        call: _Call = context.call_context.state["call"]
        task_id = context.task_id or ""
        run_id = self._runs.get(task_id)
        self._waiting.pop(task_id, None)
        if run_id is not None:
            await cancel_run(call.state.bus, run_id, "the A2A task was cancelled", principal=call.caller.principal)
        updater = TaskUpdater(event_queue, task_id, context.context_id or "")
        await updater.cancel()

    def _wait(self, task_id: str, waiting: _Waiting) -> None:
        self._waiting[task_id] = waiting
        self._waiting.move_to_end(task_id)
        while len(self._waiting) > MAX_TASKS:
            self._waiting.popitem(last=False)

    def _remember(self, task_id: str, run_id: str) -> None:
        self._runs[task_id] = run_id
        self._runs.move_to_end(task_id)
        while len(self._runs) > MAX_TASKS:
            self._runs.popitem(last=False)


def _decision(approval_id: str, context: RequestContext) -> ApprovalReply:
    """The answer in the next message: approve only when it clearly says so."""
    message = context.message
    for part in message.parts if message is not None else []:
        if part.HasField("data"):
            data = MessageToDict(part.data)
            if isinstance(data, dict) and data.get("approve") is True:
                edited = data.get("arguments")
                return ApprovalReply(approval_id, "approve", json.dumps(edited) if isinstance(edited, dict) else "")
            return ApprovalReply(approval_id, "deny")
    said = context.get_user_input().strip().lower()
    return ApprovalReply(approval_id, "approve" if said in {"approve", "yes", "approved"} else "deny")


class A2ADoor:
    """The request handler and JSON-RPC dispatcher shared by every agent of this ingress."""

    def __init__(self) -> None:
        # What the handler checks requests against (streaming): every agent's card says the same.
        generic = agent_card(AgentDescriptor(name="agent", description="An Atmosphere agent."), "", secured=False)
        self.handler = DefaultRequestHandler(
            agent_executor=RunExecutor(), task_store=BoundedTaskStore(), agent_card=generic
        )
        self.dispatcher = JsonRpcDispatcher(self.handler, context_builder=_ContextBuilder(), enable_v0_3_compat=True)

    async def aclose(self) -> None:
        await self.handler.aclose()


def agent_card(agent: AgentDescriptor, base_url: str, *, secured: bool) -> AgentCard:
    """The Agent Card of `agent`, served at `base_url`."""
    url = f"{base_url}{A2A_PATH}/{agent.name}"
    card = AgentCard(
        name=agent.name,
        description=agent.description or f"The agent '{agent.name}'.",
        version="0.1.0",
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_CURRENT
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id=agent.name, name=agent.name, description=agent.description or agent.name, tags=["agent"])
        ],
    )
    if secured:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


def _door(request: Request) -> A2ADoor:
    door = getattr(request.app.state, "a2a", None)
    if not isinstance(door, A2ADoor):
        msg = "The A2A door is not running"
        raise AgentNotFoundError(msg)
    return door


def _caller_for(state: IngressState, request: Request, agent: AgentDescriptor) -> Caller:
    try:
        return state.authenticator.caller(agent.path, request.headers, request.query_params)
    except AuthError as exc:
        raise AUTH_REFUSALS[exc.status](exc.message) from None


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def _card_response(request: Request, agent: AgentDescriptor) -> JSONResponse:
    state = state_of(request)
    _caller_for(state, request, agent)
    card = agent_card(agent, _base_url(request), secured=state.authenticator.enabled)
    return JSONResponse(MessageToDict(card))


@router.get(
    A2A_PATH + "/{name}/.well-known/agent-card.json",
    summary="An agent's A2A Agent Card",
    responses=error_responses(401, 403, 404),
)
async def a2a_card(request: Request, name: str) -> JSONResponse:
    """The Agent Card (A2A 1.0): its JSON-RPC interface, streaming, and bearer auth when tokens are required."""
    state = state_of(request)
    return await _card_response(request, known_agent(state, request, await find_agent(state, name=name)))


@router.get(
    "/.well-known/agent-card.json",
    summary="The default agent's A2A Agent Card",
    responses=error_responses(401, 403, 404),
)
async def a2a_default_card(request: Request) -> JSONResponse:
    """The card of `ATMOSPHERE_A2A__DEFAULT_AGENT` (404 when none is set)."""
    state = state_of(request)
    name = state.settings.a2a.default_agent
    agent = await find_agent(state, name=name) if name else None
    return await _card_response(request, known_agent(state, request, agent))


@router.post(
    A2A_PATH + "/{name}",
    summary="An agent's A2A JSON-RPC endpoint (SendMessage, SendStreamingMessage, GetTask, CancelTask, ...)",
    response_model=None,
    responses={200: {"content": {"application/json": {}, "text/event-stream": {}}}, **error_responses(401, 403, 404)},
)
async def a2a_rpc(request: Request, name: str) -> Response:
    """A2A JSON-RPC, answered by the SDK for this agent and caller."""
    state = state_of(request)
    agent = known_agent(state, request, await find_agent(state, name=name))
    caller = _caller_for(state, request, agent)
    door = _door(request)
    # The SDK reads a body whole, however large: it gets one already read within the limit.
    raw = await bounded_body(request, limit=6 * message_limit_of(state) + ENVELOPE_BYTES)
    address = request.client.host if request.client is not None else ""
    token = _call.set(_Call(state, caller, agent, address))
    try:
        return await door.dispatcher.handle_requests(_replaying(request, raw))
    finally:
        _call.reset(token)


def _replaying(request: Request, body: bytes) -> StarletteRequest:
    """`request` with its body already read: `body` once, then the connection's own messages (a disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return StarletteRequest(request.scope, receive)
