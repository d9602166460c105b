"""Every error ingress answers itself, as a class: its code, its HTTP status, its body shape.

    IngressError                    `{"error", "code"}` JSON (and WebSocket error frames)
     ├── MalformedRequestError      ingress.bad_request       400
     │    ├── RequestTooLargeError  ingress.too_large         413
     │    └── MalformedJsonRequestError  ingress.malformed_json  400
     ├── UnauthorizedError / ForbiddenError                  401 / 403
     ├── AgentNotFoundError, RunNotFoundError, PathNotFoundError, SurfaceAbsentError   404
     ├── MethodNotAllowedError                                405
     ├── UnavailableError, BusyError, ServerRestartingError   503
 ├── TooManyStreamsError        ingress.too_many_streams  429
     ├── InternalError                                        500
     ├── UnknownApprovalError, ApprovalRejectedError, EventsUnavailableError   (WebSocket frames only)
     ├── ApprovalNotCarriedError    ingress.approval_required (a protocol door's client cannot approve)
     ├── UriTooLongError, HeadersTooLargeError, SlowRequestError   414 / 431 / 408 (`limits.py`)
     └── AdminError                 `/api/admin/*`: admin.bad_request, .unauthorized, .forbidden,
                                    .absent, .unknown_run, .not_found, .unavailable

    OpenAiError                     `{"error": {message, type, param, code}}` under `/atmosphere/v1`

Routes raise these; the app has one exception handler per body shape (`api.py`), so a status
always follows from the class, never from the order of `except` clauses. The OpenAI classes
are not `ServiceError`s: their codes are OpenAI's, answered over HTTP only, never a
`common.v1.Error` code another service could receive.

`BodyError` (a request body that cannot be used) names the `IngressError` it is answered with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from atmosphere.bus.errors import (
    BadRequestError,
    GovernanceUnavailableError,
    NotFoundError,
    ProviderError,
    ServiceError,
)

SERVICE_PREFIX = "ingress."

# -- ingress's own answers: `{"error", "code"}` ------------------------------------------------


class IngressError(ServiceError):
    """An error ingress answers with `{"error": message, "code": code}` and `status`."""

    status: ClassVar[int] = 500

    def __init__(
        self,
        message: str = "",
        *,
        details: Mapping[str, str] | None = None,
        retryable: bool | None = None,
        retry_after: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`retry_after` (seconds) becomes a `Retry-After` header; `headers` are sent as given."""
        super().__init__(message, details=details, retryable=retryable)
        self.extra_headers = dict(headers or {})
        if retry_after is not None:
            self.extra_headers["Retry-After"] = str(retry_after)

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this answer carries (`Retry-After`, `Allow`)."""
        return dict(self.extra_headers)

    def body(self) -> dict[str, Any]:
        """`{"error", "code"}`: the JSON every native ingress error answers with."""
        return {"error": self.message, "code": self.code}


class MalformedRequestError(IngressError, BadRequestError, ValueError):
    """A request, prompt or message ingress cannot use (the socket stays open for the next one)."""

    code = "ingress.bad_request"
    status = 400


class RequestTooLargeError(MalformedRequestError):
    """A prompt or body larger than ingress (or the broker behind it) accepts."""

    code = "ingress.too_large"
    status = 413


class MalformedJsonRequestError(MalformedRequestError):
    """A body that is not JSON a service can use."""

    code = "ingress.malformed_json"


class UnauthorizedError(IngressError):
    """No valid credentials: who is calling?"""

    code = "ingress.unauthorized"
    status = 401


class ForbiddenError(IngressError):
    """Valid credentials that do not cover this agent."""

    code = "ingress.forbidden"
    status = 403


class AgentNotFoundError(IngressError, NotFoundError):
    """No agent is served under that name or path."""

    code = "ingress.unknown_agent"
    status = 404


class RunNotFoundError(IngressError, NotFoundError):
    """A run that does not exist, or is not the caller's (the two read alike, so ids cannot be probed)."""

    code = "ingress.unknown_run"
    status = 404


class PathNotFoundError(IngressError, NotFoundError):
    """Nothing is served at this path."""

    code = "ingress.not_found"
    status = 404


class SurfaceAbsentError(IngressError, NotFoundError):
    """The service that owns a user's read (the tape for `/api/runs`) is not running: the surface is absent."""

    code = "ingress.absent"
    status = 404


class MethodNotAllowedError(IngressError):
    """The path is served, with other methods (`Allow` names them)."""

    code = "ingress.method_not_allowed"
    status = 405


class OtherHttpError(IngressError):
    """An HTTP error of Starlette's that ingress has no class for (answered with Starlette's status)."""

    code = "ingress.error"


class UnavailableError(IngressError):
    """The broker (or the service behind it) did not answer: a retry may help."""

    code = "ingress.unavailable"
    status = 503
    retryable = True


class BusyError(IngressError):
    """More connections than this ingress process takes."""

    code = "ingress.busy"
    status = 503
    retryable = True


class TooManyStreamsError(IngressError):
    """A run stream beyond the client's share, or beyond what this ingress follows in all (`Retry-After`)."""

    code = "ingress.too_many_streams"
    status = 429
    retryable = True


class ServerRestartingError(IngressError):
    """Ingress is stopping: the run goes on, resume it (on another replica)."""

    code = "ingress.draining"
    status = 503
    retryable = True


class InternalError(IngressError):
    """A bug in ingress: logged, and answered without its details."""

    code = "ingress.internal"
    status = 500


class UnknownApprovalError(IngressError, NotFoundError):
    """An approval reply for an approval this connection never saw."""

    code = "ingress.unknown_approval"


class ApprovalRejectedError(IngressError):
    """The worker running the run did not accept the approval reply."""

    code = "ingress.approval_rejected"


class ApprovalNotCarriedError(IngressError):
    """A run asked for a human's approval that the door (or its client) cannot carry: it was cancelled."""

    code = "ingress.approval_required"
    status = 422


class EventsUnavailableError(IngressError):
    """Part of a run's stream is no longer stored, so it cannot be followed from there."""

    code = "ingress.stream_gap"


class UriTooLongError(IngressError):
    """A request line over the limit (`limits.py`)."""

    code = "ingress.uri_too_long"
    status = 414


class HeadersTooLargeError(IngressError):
    """A request head over the limit, or a WebSocket handshake its parser would choke on (`limits.py`)."""

    code = "ingress.headers_too_large"
    status = 431


class SlowRequestError(IngressError):
    """A request head or body that did not arrive in time (`limits.py`)."""

    code = "ingress.request_timeout"
    status = 408


# -- admin reads -------------------------------------------------------------------------------


class AdminError(IngressError):
    """An answer of `/api/admin/*` (same JSON shape, `admin.*` codes)."""


class AdminBadRequestError(AdminError, BadRequestError):
    """A malformed (traversal-shaped) id, path or query, or a body the admin route cannot use."""

    code = "admin.bad_request"
    status = 400


class AdminUnauthorizedError(AdminError):
    """Admin reads need the admin token (unless they are open); admin changes always do."""

    code = "admin.unauthorized"
    status = 401


class AdminForbiddenError(AdminError):
    """No admin token is configured, so admin reads (when they need one) and all admin changes are refused."""

    code = "admin.forbidden"
    status = 403


class AdminSurfaceAbsentError(AdminError, NotFoundError):
    """The owning service is not running, or has nothing there: this surface is absent."""

    code = "admin.absent"
    status = 404


class AdminUnknownRunError(AdminError, NotFoundError):
    """The tape has no such run."""

    code = "admin.unknown_run"
    status = 404


class AdminNotFoundError(AdminError, NotFoundError):
    """No admin surface at this path."""

    code = "admin.not_found"
    status = 404


class AdminUnavailableError(AdminError):
    """The owning service did not answer, or failed."""

    code = "admin.unavailable"
    status = 503
    retryable = True


AUTH_REFUSALS: Mapping[int, type[IngressError]] = {401: UnauthorizedError, 403: ForbiddenError}
"""An `AuthError`'s status (401 or 403) as ingress's answer to an agent endpoint."""
ADMIN_AUTH_REFUSALS: Mapping[int, type[IngressError]] = {401: AdminUnauthorizedError, 403: AdminForbiddenError}
"""An `AuthError`'s status as the admin gate's answer."""


# A run's error may carry a code this process has no class for: an agent's own
# (`session.error(code="billing.unavailable")`) or a newer dispatch's. Those are read by their
# family, the part of the code the catalogue's naming fixes.
_UNAVAILABLE_FAMILY = ".unavailable"
_PROVIDER_FAMILY = "provider."


def is_unavailable(error: ServiceError) -> bool:
    """Whether a run failed because something it needs did not answer (family `*.unavailable`)."""
    return isinstance(error, GovernanceUnavailableError) or error.wire_code.endswith(_UNAVAILABLE_FAMILY)


def is_provider_failure(error: ServiceError) -> bool:
    """Whether a run failed in the model provider (a catalogue `ProviderError`, or family `provider.*`)."""
    return isinstance(error, ProviderError) or error.wire_code.startswith(_PROVIDER_FAMILY)


# -- request bodies (`bodies.py`) --------------------------------------------------------------


class BodyError(ValueError):
    """A request body that cannot be used; `answer` is the `IngressError` class it is answered with."""

    answer: ClassVar[type[IngressError]] = MalformedRequestError

    def __init__(self, message: str) -> None:
        """`message` is safe to show to the client."""
        super().__init__(message)
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status it is answered with."""
        return self.answer.status

    @property
    def code(self) -> str:
        """What kind of refusal it is: the answer's code without `ingress.` (`too_large`, ...)."""
        return self.answer.code.removeprefix(SERVICE_PREFIX)

    def as_ingress_error(self) -> IngressError:
        """This refusal as ingress answers it."""
        return self.answer(self.message)


class BodyTooLargeError(BodyError):
    """The body is (or declares to be) larger than the route's limit: answer 413."""

    answer = RequestTooLargeError

    def __init__(self, limit: int) -> None:
        """`limit` is the route's limit in bytes."""
        super().__init__(f"The request body exceeds {limit} bytes")
        self.limit = limit


class MalformedJsonError(BodyError):
    """Text that is not JSON a service can use (syntax, depth, numbers or Unicode)."""

    answer = MalformedJsonRequestError


class UnusableJsonError(MalformedJsonError):
    """Syntactically JSON, but nested too deep, with a number out of range or a lone surrogate."""


# -- the OpenAI-compatible API: `{"error": {message, type, param, code}}` -----------------------

RETRIED_BY_CLIENTS = frozenset({408, 409, 429})
RUN_ID_HEADER = "X-Atmosphere-Run-Id"
"""The response header naming the run a request started (SSE, OpenAI)."""
"""Statuses (besides 5xx) OpenAI's clients retry unless told not to."""
DEFAULT_RETRY_AFTER = 5
"""Seconds suggested in `Retry-After` when nobody upstream said when to come back."""

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
PERMISSION_ERROR = "permission_error"
RATE_LIMIT_ERROR = "rate_limit_error"
PROVIDER_ERROR_TYPES: Mapping[int, str] = {429: "insufficient_quota"}
"""A provider's 4xx that OpenAI types otherwise than `invalid_request_error`."""
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
"""The code of a provider's rate limit that named none of its own."""


class OpenAiError(Exception):
    """An error answered in OpenAI's JSON shape; subclasses fix `status`, `type` and `code`.

    Errors say whether retrying helps, in the way OpenAI's clients read it: a 5xx (or 429) comes
    with `Retry-After` only when a later retry can succeed; every other error a client would
    retry by default (408, 409, 429, 5xx) carries `x-should-retry: false`.
    """

    status: int = 400
    type: str = INVALID_REQUEST
    code: str | None = None
    says_whether_to_retry: ClassVar[bool] = True
    """False: no `x-should-retry` header (the last-resort 500 says nothing about retrying)."""

    def __init__(self, message: str, *, param: str | None = None, retry_after: int | None = None) -> None:
        """`retry_after`: seconds after which the same request may succeed (None: retrying does not help)."""
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.run_id = ""
        """The run the failed completion started, if it started one (`X-Atmosphere-Run-Id`)."""

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """`Retry-After` when a retry can help; `x-should-retry: false` when a client would retry in vain.

        And `X-Atmosphere-Run-Id` when a run was started: its tape and events tell what happened.
        """
        headers = {RUN_ID_HEADER: self.run_id} if self.run_id else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        elif self.says_whether_to_retry and (self.status >= 500 or self.status in RETRIED_BY_CLIENTS):
            headers["x-should-retry"] = "false"
        return headers


class OpenAiInvalidRequestError(OpenAiError):
    """A request that is not a valid chat completion (400, no code)."""


class OpenAiUnsupportedParameterError(OpenAiError):
    """Something OpenAI's API has that this server cannot honour exactly (refused, not half-supported)."""

    code = "unsupported_parameter"


class OpenAiInvalidApiKeyError(OpenAiError):
    """No key, or the wrong one."""

    status = 401
    code = "invalid_api_key"


class OpenAiPermissionDeniedError(OpenAiError):
    """A valid key that may not use this model."""

    status = 403
    type = PERMISSION_ERROR
    code = "permission_denied"


class OpenAiModelNotFoundError(OpenAiError):
    """A model that is not exposed."""

    status = 404
    code = "model_not_found"


class OpenAiNotFoundError(OpenAiError):
    """Something the request names that does not exist (for this caller): a previous response."""

    status = 404
    code = "not_found"


class OpenAiTooLargeError(OpenAiError):
    """A body or run too large to accept."""

    status = 413
    code = "payload_too_large"


class OpenAiUnsupportedMediaTypeError(OpenAiError):
    """A body that is not `application/json`."""

    status = 415
    code = "unsupported_media_type"


class OpenAiApprovalRequiredError(OpenAiError):
    """The agent called a tool that needs a human's approval, which Chat Completions cannot carry."""

    status = 422
    code = "approval_required"


class OpenAiRequestBlockedError(OpenAiError):
    """A governance policy refused the run."""

    status = 403
    code = "request_blocked"


class OpenAiBudgetExceededError(OpenAiError):
    """The run went over its budget."""

    status = 429
    type = RATE_LIMIT_ERROR
    code = "budget_exceeded"


class OpenAiRateLimitedError(OpenAiError):
    """The model provider is rate limiting; its own code is kept when it named one."""

    status = 429
    type = RATE_LIMIT_ERROR
    code = RATE_LIMIT_EXCEEDED

    def __init__(self, message: str, *, provider_code: str | None = None, retry_after: int | None = None) -> None:
        """`provider_code`: the provider's own code, if it sent one."""
        super().__init__(message, retry_after=retry_after)
        if provider_code:
            self.code = provider_code


class OpenAiProviderRefusalError(OpenAiError):
    """A model provider's 4xx passed on as it was: same status, its reason, its param and code."""

    def __init__(self, message: str, *, status: int, param: str | None = None, code: str | None = None) -> None:
        """`status` is the provider's 4xx."""
        super().__init__(message, param=param)
        self.status = status
        self.type = PROVIDER_ERROR_TYPES.get(status, INVALID_REQUEST)
        self.code = code


class OpenAiServerError(OpenAiError):
    """The agent failed (the details stay in the log)."""

    status = 500
    type = SERVER_ERROR


class OpenAiInternalError(OpenAiServerError):
    """A bug in ingress itself, the last resort: answered as it always was, without retry advice."""

    says_whether_to_retry = False


class OpenAiBadGatewayError(OpenAiError):
    """The model provider answered nonsense, or refused this server's own credentials."""

    status = 502
    type = SERVER_ERROR
    code = "bad_gateway"


class OpenAiUnavailableError(OpenAiError):
    """A 503 a client may retry after `retry_after` seconds."""

    status = 503
    type = SERVER_ERROR
    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: int | None = DEFAULT_RETRY_AFTER) -> None:
        """`retry_after=None`: retrying cannot help (e.g. no model is configured)."""
        super().__init__(message, retry_after=retry_after)


class OpenAiBrokerUnavailableError(OpenAiError):
    """The broker did not answer a request outside a completion (no code, as it always was)."""

    status = 503
    type = SERVER_ERROR


class OpenAiHttpError(OpenAiError):
    """Starlette's own 404/405 (and other HTTP errors) in OpenAI's shape, without retry advice."""

    says_whether_to_retry = False
    CODES: ClassVar[Mapping[int, str]] = {404: "not_found", 405: "method_not_allowed"}

    def __init__(self, status: int, message: str) -> None:
        """`status` is the HTTP error's."""
        super().__init__(message)
        self.status = status
        self.code = self.CODES.get(status, "error")
