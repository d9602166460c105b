"""What ingress's HTTP route modules share: the state, the error bodies, who is calling, bounded bodies.

Routes raise typed errors (`errors.py`); the app answers them in one place per body shape
(`ingress_error_response`, `openai_error_response`), so no route builds an error body itself.
The admin routes (`admin_api.py`, `governance_admin.py`, `workspace_api.py`) ask the owning
service over the bus through `admin_call`, which names the failure precisely; a user's own reads
(`my_runs.py`) through `caller_call`, which names it alike in ingress's own codes.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from atmosphere.bus import Bus, BusError, NoRespondersError, RemoteError, RequestTimeoutError, subjects
from atmosphere.bus.errors import BadRequestError, NotFoundError
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.ingress.auth import AuthError, Caller, presented_token
from atmosphere.ingress.bodies import BodyError, read_body, read_text
from atmosphere.ingress.errors import (
    ADMIN_AUTH_REFUSALS,
    AUTH_REFUSALS,
    AdminBadRequestError,
    AdminForbiddenError,
    AdminSurfaceAbsentError,
    AdminUnauthorizedError,
    AdminUnavailableError,
    IngressError,
    MalformedRequestError,
    OpenAiError,
    SurfaceAbsentError,
    UnavailableError,
)
from atmosphere.ingress.inbound import message_limit
from atmosphere.ingress.state import IngressState

R = TypeVar("R")

OPTIONAL_ID = r"^([A-Za-z0-9_\-:@]{1,128})?$"
"""An optional id filter of an admin read: empty, or what a run, tape or conversation id may look like."""


class ErrorBody(BaseModel):
    """Every non-2xx answer of ingress's own routes."""

    error: str
    code: str


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route that may answer these statuses with an `ErrorBody`."""
    return {s: {"model": ErrorBody} for s in statuses}


ADMIN_ERRORS = error_responses(400, 401, 403, 404, 503)
"""What an admin read may answer besides its data."""


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


def admin_timeout(request: Request | WebSocket) -> float:
    """Seconds an admin call waits for the owning service (`ATMOSPHERE_INGRESS__ADMIN_TIMEOUT`)."""
    return state_of(request).settings.ingress.admin_timeout


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


def valid_id(value: str) -> bool:
    """Whether `value` is usable as an id in a subject (a malformed one is answered 400, never asked)."""
    try:
        subjects.token(value, what="id")
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class FailureAnswers:
    """How a surface answers when the service that owns its data could not serve a read."""

    absent: type[IngressError]
    """Nobody serves the subject, or the service has nothing there (404)."""
    unavailable: type[IngressError]
    """It did not answer in time, or failed (503)."""
    bad_request: type[IngressError]
    """It refused the request as malformed (400)."""


ADMIN_FAILURES = FailureAnswers(AdminSurfaceAbsentError, AdminUnavailableError, AdminBadRequestError)
"""`/api/admin/*`: `admin.absent`, `admin.unavailable`, `admin.bad_request`."""
CALLER_FAILURES = FailureAnswers(SurfaceAbsentError, UnavailableError, MalformedRequestError)
"""A user's own reads: `ingress.absent`, `ingress.unavailable`, `ingress.bad_request`."""


async def admin_call(request: Request, owner: str, ask: Callable[[Bus], Awaitable[R]]) -> R:
    """Gate, then ask the owning service; a bus failure raises the `AdminError` that says which."""
    state = state_of(request)
    require_admin(state, request)
    try:
        return await ask(state.bus)
    except BusError as exc:
        raise _bus_failure(owner, exc) from None


async def caller_call(request: Request, owner: str, ask: Callable[[Bus, Caller], Awaitable[R]]) -> R:
    """Identify the caller (`UnauthorizedError` without valid credentials), then ask the owning service for it.

    The same answers as `admin_call` when the owning service fails (absent 404, unavailable 503,
    refused 400), in ingress's own codes (`CALLER_FAILURES`).
    """
    state = state_of(request)
    caller = identified_caller(state, request)
    try:
        return await ask(state.bus, caller)
    except BusError as exc:
        raise _bus_failure(owner, exc, answers=CALLER_FAILURES) from None


def _bus_failure(owner: str, exc: BusError, *, answers: FailureAnswers = ADMIN_FAILURES) -> IngressError:
    """The answer when the owning service could not serve a read."""
    if isinstance(exc, NoRespondersError):
        return answers.absent(f"The {owner} service is not running, so this surface is absent")
    if isinstance(exc, RequestTimeoutError):
        return answers.unavailable(f"The {owner} service did not answer in time")
    if isinstance(exc, RemoteError):
        if isinstance(exc.error, NotFoundError):
            return answers.absent(exc.message)
        if isinstance(exc.error, BadRequestError):
            return answers.bad_request(exc.message)
        return answers.unavailable(f"The {owner} service failed: {exc.message}")
    return answers.unavailable(f"The {owner} service cannot be reached")


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
