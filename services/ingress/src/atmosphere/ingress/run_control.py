"""What a client may ask of a run it owns besides its frames: cancel it, answer its approvals.

    POST /atmosphere/runs/{run_id}/cancel    cancel a run
    POST /atmosphere/runs/{run_id}/approval  answer an approval (`/__approval/<id>/<action> ...`)

Whichever door started the run (WebSocket, SSE, long-poll), these reach the worker running it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from atmosphere.bus.runs import cancel_run
from atmosphere.ingress.access_log import note_run
from atmosphere.ingress.http import bounded_text, error_responses, message_limit_of, require_token, state_of
from atmosphere.ingress.inbound import parse_approval, send_approval
from atmosphere.ingress.run_access import RunId, authorize_run

APPROVAL_BODY = {
    "requestBody": {
        "required": True,
        "content": {"text/plain": {"schema": {"type": "string", "pattern": r"^/__approval/apr_[0-9a-f]{12}/[a-z]+"}}},
    }
}

router = APIRouter()


class ControlResult(BaseModel):
    """Whether the worker running the run accepted the request."""

    accepted: bool
    detail: str = ""


@router.post(
    "/atmosphere/runs/{run_id}/cancel",
    response_model=ControlResult,
    summary="Cancel a run",
    responses=error_responses(400, 401, 404, 503),
)
async def run_cancel(request: Request, run_id: RunId) -> ControlResult:
    """False when no worker owns the run any more (it already ended)."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id")
    principal = await authorize_run(state, request, run_id)
    note_run(run_id)
    return ControlResult(accepted=await cancel_run(state.bus, run_id, "cancelled by the client", principal=principal))


@router.post(
    "/atmosphere/runs/{run_id}/approval",
    response_model=ControlResult,
    summary="Answer an approval request",
    openapi_extra=APPROVAL_BODY,
    responses=error_responses(400, 401, 404, 413, 503),
)
async def run_approval(request: Request, run_id: RunId) -> ControlResult:
    """The body is `/__approval/<id>/<approve|yes|deny|respond> [payload]`."""
    state = state_of(request)
    require_token(run_id, what="run id", message="Malformed run id")
    # Who asks, and whether the run is theirs, is settled before the body is read at all.
    principal = await authorize_run(state, request, run_id)
    note_run(run_id)
    reply = parse_approval(await bounded_text(request, limit=message_limit_of(state)))
    ack = await send_approval(state.bus, run_id, reply, principal=principal)
    return ControlResult(accepted=ack.accepted, detail=ack.detail)
