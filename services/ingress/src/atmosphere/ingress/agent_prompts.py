"""A prompt POSTed to an agent, checked and turned into a run (the SSE and long-poll doors share it).

The order of the checks is the point: the agent's credentials and the conversation id are
settled from the headers before a byte of the body is read, and an unknown agent is a 404
only after the credentials passed, so agent names cannot be probed without a token.
"""

from __future__ import annotations

import logging
import uuid

from fastapi import Request

from atmosphere.bus import BusError, PayloadTooLargeError, subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunSubmission
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.errors import AgentNotFoundError, MalformedRequestError, RequestTooLargeError, UnavailableError
from atmosphere.ingress.http import agent_principal, bounded_body, identified_caller, message_limit_of, state_of
from atmosphere.ingress.inbound import (
    MAX_HINT_NAME,
    MAX_HINTS,
    ApprovalReply,
    Prompt,
    new_run_request,
    parse_inbound,
    require_fits,
)
from atmosphere.ingress.state import IngressState
from atmosphere.service import scoped_conversation

log = logging.getLogger("atmosphere.ingress")

CONVERSATION_HEADER = "x-atmosphere-conversation-id"
RETRY_AFTER = 2
"""Seconds a client is asked to wait before it tries a run the broker could not take."""
PROMPT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "text/plain": {"schema": {"type": "string", "minLength": 1, "pattern": r"\S"}},
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["prompt"],
                    "properties": {
                        "prompt": {"type": "string", "pattern": r"\S"},
                        # As `inbound._hint_metadata` takes them: null is no hints.
                        "hints": {
                            "type": ["object", "null"],
                            "maxProperties": MAX_HINTS,
                            "propertyNames": {"minLength": 1, "maxLength": MAX_HINT_NAME},
                        },
                    },
                },
            },
        },
    }
}
"""The OpenAPI body of every route that takes a prompt."""


def conversation_of(given: str | None, principal: Principal) -> str:
    """The conversation a request belongs to: the client's id (validated), else a fresh one.

    An authenticated user's conversations are keyed under their user id (`scoped_conversation`,
    shared with gRPC), so knowing someone else's conversation id never reaches their history or
    files; a fresh id is scoped too, so it counts against its own user's quotas.
    """
    if given:
        try:
            subjects.token(given, what="conversation id")
        except ValueError as exc:
            msg = "Malformed conversation id (1-128 letters, digits, '_', '-', ':', '@')"
            raise MalformedRequestError(msg) from exc
    return scoped_conversation(given or uuid.uuid4().hex, principal)


async def find_agent(
    state: IngressState, *, name: str | None = None, path: str | None = None
) -> AgentDescriptor | None:
    """The agent served under `name` (None for a name no subject could hold), else at `path`."""
    if name is not None:
        try:
            subjects.token(name, what="agent name")
        except ValueError:
            return None
        return await state.directory.lookup(name)
    return await state.directory.by_path(path or "")


def known_agent(state: IngressState, request: Request, descriptor: AgentDescriptor | None) -> AgentDescriptor:
    """The agent a prompt is for; 404 when there is none, but only after the credentials passed.

    Checked in that order so that agent names cannot be probed without a token (a 401 either way).
    """
    if descriptor is None:
        identified_caller(state, request)
        raise AgentNotFoundError(f"Unknown agent at {request.url.path}")
    return descriptor


async def accept_prompt(request: Request, descriptor: AgentDescriptor, *, transport: str) -> RunSubmission:
    """Authenticate a POSTed prompt and build its run; a typed `IngressError` says why it was refused.

    Everything the headers decide (credentials, the conversation id) is checked before a byte
    of the body is read, and the body is read within the message limit as it arrives.
    """
    state = state_of(request)
    principal = agent_principal(state, request, descriptor.path)
    conversation_id = conversation_of(request.headers.get(CONVERSATION_HEADER), principal)
    # A body declared JSON must be a prompt object: broken JSON is a 400, never a prompt.
    declared_json = "json" in request.headers.get("content-type", "").lower()
    prompt = _prompt_of(await bounded_body(request, limit=message_limit_of(state)), declared_json=declared_json)
    run = new_run_request(
        agent=descriptor.name,
        prompt=prompt,
        conversation_id=conversation_id,
        principal=principal,
        transport=transport,
        path=descriptor.path,
        pool=descriptor.pool,
    )
    require_fits(run, state.bus.max_payload)
    state.conversations.touch(descriptor.name, conversation_id, principal)
    note_run(run.run_id, run.agent)
    return run


def _prompt_of(raw: bytes, *, declared_json: bool = False) -> Prompt:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        msg = "The prompt must be UTF-8 text"
        raise MalformedRequestError(msg) from None
    parsed = parse_inbound(text, declared_json=declared_json)
    if isinstance(parsed, ApprovalReply):
        msg = "Send approvals to /atmosphere/runs/{run_id}/approval"
        raise MalformedRequestError(msg)
    return parsed


def not_submitted(run: RunSubmission, exc: BusError) -> RequestTooLargeError | UnavailableError:
    """Why a run was not queued: too large for the broker, or the broker is unreachable (try again)."""
    if isinstance(exc, PayloadTooLargeError):
        return RequestTooLargeError(f"The prompt is too large: {exc}")
    log.warning("run %s (%s) not submitted: %s", run.run_id, run.transport, exc)
    return UnavailableError(
        "The run could not be submitted (the message broker is unavailable); try again", retry_after=RETRY_AFTER
    )
