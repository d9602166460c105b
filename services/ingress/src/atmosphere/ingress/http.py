"""What ingress's HTTP route modules share: the state, the error bodies, who is calling, bounded bodies.

Routes raise typed errors (`errors.py`); the app answers them in one place per body shape
(`ingress_error_response`, `openai_error_response`), so no route builds an error body itself.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from atmosphere.bus import subjects
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.ingress.auth import AuthError, Caller, presented_token
from atmosphere.ingress.bodies import BodyError, read_body, read_text
from atmosphere.ingress.errors import (
    ADMIN_AUTH_REFUSALS,
    AUTH_REFUSALS,
    AdminForbiddenError,
    AdminUnauthorizedError,
    IngressError,
    MalformedRequestError,
    OpenAiError,
)
from atmosphere.ingress.inbound import message_limit
from atmosphere.ingress.state import IngressState


class ErrorBody(BaseModel):
    """Every non-2xx answer of ingress's own routes."""

    error: str
    code: str


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that may answer these statuses with an `ErrorBody`."""
    return {s: {"model": ErrorBody} for s in statuses}


def ingress_error_response(error: IngressError, *, status: int | None = None) -> JSONResponse:
    """`{"error", "code"}` with the class's status (or `status`, Starlette's own) and the error's headers."""
    return JSONResponse(error.body(), status_code=status or error.status, headers=error.headers)


def openai_error_response(error: OpenAiError, *, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """`{"error": {message, type, param, code}}` with the error's status and retry advice."""
    return JSONResponse(error.body(), status_code=error.status, headers={**error.headers(), **(headers or {})})


def state_of(request: Request | WebSocket) -> IngressState:
    """The app's shared state."""
    state: IngressState = request.app.state.ingress
    return state


def message_limit_of(state: IngressState) -> int:
    """The largest prompt ingress admits: the setting, within the broker's limit with room for the envelope."""
    return message_limit(state.settings.ingress.max_message_bytes, state.bus.max_payload)


def require_token(value: str, *, what: str, message: str) -> None:
    """Raise `MalformedRequestError(message)` unless `value` is usable in a subject (an id, a name)."""
    try:
        subjects.token(value, what=what)
    except ValueError:
        raise MalformedRequestError(message) from None


def agent_principal(state: IngressState, request: Request, path: str) -> Principal:
    """The caller's principal for the agent at `path` (`UnauthorizedError` / `ForbiddenError` otherwise)."""
    try:
        return state.authenticator.principal(path, request.headers, request.query_params)
    except AuthError as exc:
        raise AUTH_REFUSALS[exc.status](exc.message) from None


def identified_caller(state: IngressState, request: Request) -> Caller:
    """Who is calling, whatever the agent (`UnauthorizedError` without valid credentials)."""
    try:
        return state.authenticator.identify(request.headers, request.query_params)
    except AuthError as exc:
        raise AUTH_REFUSALS[401](exc.message) from None


def require_admin(state: IngressState, request: Request) -> None:
    """Pass the admin gate, or raise `AdminUnauthorizedError` / `AdminForbiddenError`."""
    try:
        state.admin_gate.check(request.headers)
    except AuthError as exc:
        raise ADMIN_AUTH_REFUSALS[exc.status](exc.message) from None


def require_admin_write(state: IngressState, request: Request) -> None:
    """Pass the gate of admin routes that change something (governance's reload, the kill switch).

    Unlike reads, these always need `Authorization: Bearer <admin token>`, even when admin reads
    are open (`ATMOSPHERE_ADMIN_HTTP_READ_AUTH_REQUIRED=false`): opening reads must not open a
    way to switch policies off. No admin token configured: `AdminForbiddenError` (fail-closed).
    """
    token = state.admin_gate.token
    if not token:
        msg = "Admin changes are disabled: set ATMOSPHERE_ADMIN_TOKEN"
        raise AdminForbiddenError(msg)
    presented, _ = presented_token(request.headers, {})
    if not presented or not hmac.compare_digest(presented.encode(), token.encode()):
        msg = "Admin changes need 'Authorization: Bearer <admin token>'"
        raise AdminUnauthorizedError(msg)


async def bounded_body(request: Request, *, limit: int) -> bytes:
    """The body within `limit` bytes, or the refusal its `BodyError` names (400 or 413)."""
    try:
        return await read_body(request, limit=limit)
    except BodyError as exc:
        raise exc.as_ingress_error() from None


async def bounded_text(request: Request, *, limit: int) -> str:
    """`bounded_body` as UTF-8 text."""
    try:
        return await read_text(request, limit=limit)
    except BodyError as exc:
        raise exc.as_ingress_error() from None
