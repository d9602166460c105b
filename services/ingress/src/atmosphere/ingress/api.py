"""Ingress's HTTP surface, wired: agent endpoints, the OpenAI API, info and admin, a user's own view, probes.

No `BaseHTTPMiddleware` anywhere (it buffers and costs per request): CORS is Starlette's pure
ASGI middleware, so is the access log (`access_log.py`), and streaming routes write straight
to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from atmosphere.bus import Bus, BusError
from atmosphere.ingress import (
    admin_api,
    agent_poll,
    agent_socket,
    agent_sse,
    console,
    docs,
    governance_admin,
    metrics,
    my_runs,
    openai_api,
    responses_api,
    run_control,
    workspace_api,
)
from atmosphere.ingress.access_log import AccessLog
from atmosphere.ingress.agent_prompts import PROMPT_BODY
from atmosphere.ingress.agent_sse import start_sse
from atmosphere.ingress.errors import (
    IngressError,
    InternalError,
    MalformedRequestError,
    MethodNotAllowedError,
    OpenAiBrokerUnavailableError,
    OpenAiError,
    OpenAiHttpError,
    OpenAiInternalError,
    OpenAiInvalidRequestError,
    OtherHttpError,
    PathNotFoundError,
    UnavailableError,
)
from atmosphere.ingress.http import error_responses, ingress_error_response, openai_error_response, state_of
from atmosphere.ingress.pacing import Drain
from atmosphere.ingress.protocol_doors import door_routers, mcp_served, running_doors, serve_mcp_at
from atmosphere.ingress.settings import IngressSettings
from atmosphere.ingress.state import IngressState
from atmosphere.service import open_service, telemetry

log = logging.getLogger("atmosphere.ingress")


def _methods_serving(routes: Sequence[Route], request: Request) -> set[str]:
    """The methods with which `routes` serve this request's path (a catch-all hit there is a 405)."""
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:
            methods |= route.methods or set()
    return methods


def _describe(error: Any) -> str:
    """One validation error, short: where and what (never the offending value itself)."""
    where = ".".join(str(part) for part in error.get("loc", ()))[:80]
    return f"{where}: {str(error.get('msg', 'invalid'))[:120]}"


def _under_openai(request: Request) -> bool:
    return request.url.path.startswith(openai_api.router.prefix)


def _answer(request: Request, native: IngressError, openai: OpenAiError) -> JSONResponse:
    """`native` in ingress's shape, or `openai` in OpenAI's under its prefix (whatever went wrong)."""
    if _under_openai(request):
        return openai_error_response(openai)
    return ingress_error_response(native)


HTTP_ERRORS: Mapping[int, type[IngressError]] = {404: PathNotFoundError, 405: MethodNotAllowedError}
"""Starlette's own HTTP errors, as ingress's classes (any other is an `OtherHttpError`, with its own status)."""
RETRY_AFTER = 2
"""Seconds a client is asked to wait when the broker did not answer."""


def _from_http_exception(exc: StarletteHTTPException) -> IngressError:
    return HTTP_ERRORS.get(exc.status_code, OtherHttpError)(str(exc.detail), headers=exc.headers)


def _answer_errors_in_json(app: FastAPI) -> None:
    """Every error ingress answers itself is JSON: `{"error", "code"}`, or OpenAI's shape under its prefix.

    Routes raise `IngressError` or `OpenAiError`, each answered by its one handler; Starlette's own
    errors, malformed parameters, an unanswering broker and bugs are turned into those classes.
    """

    @app.exception_handler(IngressError)
    async def ingress_error(_request: Request, exc: IngressError) -> JSONResponse:
        return ingress_error_response(exc)

    @app.exception_handler(OpenAiError)
    async def openai_error(_request: Request, exc: OpenAiError) -> JSONResponse:
        return openai_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own 404/405 answers, in the same shape as every other ingress error.
        openai = OpenAiHttpError(exc.status_code, str(exc.detail))
        if _under_openai(request):
            return openai_error_response(openai, headers=exc.headers)
        return ingress_error_response(_from_http_exception(exc), status=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # A malformed path, query or header value: 400 in the ingress shape, not FastAPI's 422.
        message = "Invalid request: " + "; ".join(_describe(error) for error in exc.errors()[:5])
        return _answer(request, MalformedRequestError(message), OpenAiInvalidRequestError(message))

    @app.exception_handler(BusError)
    async def bus_unavailable(request: Request, exc: BusError) -> JSONResponse:
        # The broker (or the service behind it) did not answer: a retry may help, a 500 would lie.
        log.warning("bus unavailable on %s %s: %s", request.method, request.url.path, exc)
        native = UnavailableError(
            "Service unavailable (the message broker did not answer); try again", retry_after=RETRY_AFTER
        )
        openai = OpenAiBrokerUnavailableError("Service unavailable; try again", retry_after=RETRY_AFTER)
        return _answer(request, native, openai)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # The last resort: a bug answers JSON 500 (and is logged), never a plain-text page.
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _answer(request, InternalError("Internal error"), OpenAiInternalError("Internal error"))


BEFORE_ROUTING = error_responses(414, 431)
"""What any operation may answer before it is routed (`limits.py`): a request line or head over the limit.

Declared on every operation because it is true of every one: a URL whose parameters are valid
(a 1024-character workspace path of 4-byte characters is 12 KiB percent-encoded) can still be
longer than the request line ingress reads. The refusal is always `{"error", "code"}`.
"""


def create_app(
    settings: IngressSettings,
    *,
    info: Callable[[], dict[str, Any]] | None = None,
    stop: asyncio.Event | None = None,
    drain: Drain | None = None,
    bus: Bus | None = None,
) -> FastAPI:
    """The ingress ASGI app; its lifespan connects to NATS and answers health and info.

    `stop` is set when the NATS connection closes for good, so the server shuts down;
    `drain` is started when ingress stops, so open streams end and say where to resume.
    `bus` replaces the connection to NATS (a test's `FakeBus`); the caller closes it.
    """
    lifespan = _lifespan(settings, info=info, stop=stop, drain=drain, bus=bus)
    # `/docs` is served from ingress's own copy of Swagger UI (`docs.py`); ReDoc would need a CDN.
    app = FastAPI(
        title="Atmosphere ingress",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        responses=BEFORE_ROUTING,
    )
    # First, so innermost: the access log, tracing and the server's error handling see sockets too.
    app.add_middleware(agent_socket.SocketDoors)
    _allow_cors(app, settings)
    # Added last, so outermost of the app's own middleware: CORS preflights get their line too.
    app.add_middleware(AccessLog, enabled=settings.ingress.access_log)
    # Outside even that (the instrumentation wraps the whole stack): an access line has its trace id.
    _trace_requests(app)
    _answer_errors_in_json(app)
    _add_probes(app)
    fixed = _include_routers(app, settings)
    if mcp_served(settings):
        serve_mcp_at(app)
    _add_admin_fallback(app, fixed)
    _add_endpoint_paths(app, fixed, openai_prefix=openai_api.router.prefix if settings.ai_openai_enabled else None)
    return app


Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def _lifespan(
    settings: IngressSettings,
    *,
    info: Callable[[], dict[str, Any]] | None,
    stop: asyncio.Event | None,
    drain: Drain | None,
    bus: Bus | None,
) -> Lifespan:
    """The app's lifespan: the running service (bus, health, info), the shared state, the conversation sweeper."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_service("ingress", settings, info=info, stop=stop, bus=bus) as runtime:
            app.state.ingress = state = IngressState.build(settings, runtime, drain=drain)
            metrics.observe(state)
            sweeping = asyncio.Event()
            sweeper = asyncio.create_task(state.conversations.run_sweeper(sweeping))
            if settings.ai_openai_enabled and not settings.ai_openai_api_key and not state.authenticator.enabled:
                log.warning(
                    "the OpenAI-compatible API is enabled without ATMOSPHERE_AI_OPENAI_API_KEY: "
                    "anyone who reaches this port can use it"
                )
            try:
                async with running_doors(app, state):
                    runtime.health.mark_ready()
                    yield
            finally:
                sweeping.set()
                await sweeper
                await state.completions.close()

    return lifespan


def _trace_requests(app: FastAPI) -> None:
    """With tracing on, a span per HTTP request and WebSocket connection, continuing its `traceparent`.

    Not one per WebSocket or SSE message (`exclude_spans`): a stream's frames are its run's,
    traced where the run is made. Probes and scrapes are no trace.
    """
    provider = telemetry.provider()
    if provider is None:
        return
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        excluded_urls="healthz,readyz,metrics",
        exclude_spans=["receive", "send"],
    )


def _allow_cors(app: FastAPI, settings: IngressSettings) -> None:
    """Let the configured browser origins call (Starlette's pure ASGI middleware), if any are."""
    if not settings.ingress.cors_origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.ingress.cors_origins),
        allow_methods=["GET", "POST"],
        allow_headers=[
            "Authorization",
            "Content-Type",
            "X-API-Key",
            "Last-Event-ID",
            "X-Atmosphere-Run-Id",
            "X-Atmosphere-Conversation-Id",
        ],
        expose_headers=["X-Atmosphere-Run-Id"],
    )


def _add_probes(app: FastAPI) -> None:
    """`/healthz` and `/readyz` (also answered over the connection cap, see `limits.py`)."""

    @app.get("/healthz", summary="Liveness", responses={503: {"description": "the NATS connection closed for good"}})
    async def healthz(request: Request) -> JSONResponse:
        """The process answers and can still recover on its own."""
        if not state_of(request).runtime.health.live:
            body = {"status": "failed", "service": "ingress", "reason": "the NATS connection closed for good"}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ok", "service": "ingress"})

    @app.get("/readyz", summary="Readiness", responses={503: {"description": "not connected to NATS"}})
    async def readyz(request: Request) -> JSONResponse:
        """Connected to NATS and serving; `instance` (host:pid) names the process that answers."""
        health = state_of(request).runtime.health
        body = {"ready": health.ready, "service": "ingress", "instance": health.instance}
        return JSONResponse(body, status_code=200 if health.ready else 503)


AGENT_DOORS = (agent_sse.router, agent_poll.router, run_control.router)
"""The SSE and long-poll doors of the agents, and the control of their runs (WebSockets: `SocketDoors`)."""


def _include_routers(app: FastAPI, settings: IngressSettings) -> list[Route]:
    """Include every router; the fixed routes they serve (a catch-all hit on their paths is a 405)."""
    app.include_router(docs.router)
    app.include_router(console.router)
    # In this order, the OpenAPI document lists their routes as it did when they were one router.
    for door in AGENT_DOORS:
        app.include_router(door)
    if settings.ai_openai_enabled:
        app.include_router(openai_api.router)
        app.include_router(responses_api.router)
    doors = door_routers(settings)
    for door in doors:
        app.include_router(door)
    app.include_router(governance_admin.router)
    app.include_router(workspace_api.router)
    app.include_router(admin_api.router)
    app.include_router(my_runs.router)
    app.include_router(metrics.router)
    # From the routers themselves: FastAPI wraps included routers in objects of its own.
    openai_routes = [*openai_api.router.routes, *responses_api.router.routes] if settings.ai_openai_enabled else []
    return [
        r
        for r in (
            *app.router.routes,
            *(route for door in AGENT_DOORS for route in door.routes),
            *openai_routes,
            *(route for door in doors for route in door.routes),
            *governance_admin.router.routes,
            *workspace_api.router.routes,
            *admin_api.router.routes,
            *my_runs.router.routes,
            *metrics.router.routes,
            *docs.router.routes,
            *console.router.routes,
        )
        if isinstance(r, Route) and "{path:path}" not in r.path
    ]


ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _add_admin_fallback(app: FastAPI, fixed: Sequence[Route]) -> None:
    """Everything under `/api/admin/` no admin route serves, whatever the method: a JSON 405, 400 or 404.

    One route for every method, registered after the admin routes (and before the `@ai_endpoint`
    paths, so `/api/admin/` is never an agent's): a known path with another method is a 405
    whose `Allow` names exactly the methods its routes serve; any other path is admin's 400
    (traversal-shaped) or 404. It is not one of the `fixed` routes, so it never adds to an `Allow`.
    """

    @app.api_route("/api/admin/{rest:path}", methods=list(ALL_METHODS), include_in_schema=False)
    async def admin_other(request: Request, rest: str) -> None:
        if allowed := _methods_serving(fixed, request):
            raise StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(allowed))})
        admin_api.refuse_unknown_admin_path(request, rest)


def _add_endpoint_paths(app: FastAPI, fixed: Sequence[Route], *, openai_prefix: str | None) -> None:
    """`@ai_endpoint` paths: whatever path an agent declared, registered last so they never shadow the rest."""

    @app.post(
        "/{path:path}",
        summary="Run a prompt on an @ai_endpoint path (Server-Sent Events)",
        openapi_extra=PROMPT_BODY,
        response_class=StreamingResponse,
        response_model=None,
        responses={200: {"content": {"text/event-stream": {}}}, **error_responses(405, 400, 401, 403, 404, 413)},
    )
    async def endpoint_sse(request: Request, path: str) -> StreamingResponse:
        """The body is the prompt."""
        _refuse_other_routes(request, fixed, openai_prefix=openai_prefix)
        return await start_sse(request, await state_of(request).directory.by_path("/" + path))

    # Without this, the POST catch-all above would make every other request on an unknown
    # path a 405: it is a 404, and a 405 only where some route serves the path.
    @app.api_route("/{path:path}", methods=list(OTHER_METHODS), include_in_schema=False)
    async def unknown_path(request: Request, path: str) -> JSONResponse:
        _refuse_other_routes(request, fixed, openai_prefix=openai_prefix)
        if await state_of(request).directory.by_path("/" + path) is not None:
            # An `@ai_endpoint` path: prompts are POSTed (or sent over its WebSocket).
            raise StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
        raise StarletteHTTPException(404, "Not Found")


OTHER_METHODS = ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")
"""Every method but POST, which the `@ai_endpoint` catch-all serves."""


def _refuse_other_routes(request: Request, fixed: Sequence[Route], *, openai_prefix: str | None) -> None:
    """Raise the 405 (a fixed route serves this path with another method) or the OpenAI 404."""
    if allowed := _methods_serving(fixed, request):
        # Shaped like every other 405 by the handler above (OpenAI's shape under its prefix).
        raise StarletteHTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(allowed))})
    if openai_prefix is not None and request.url.path.startswith(openai_prefix + "/"):
        # Under the OpenAI prefix an unknown operation is OpenAI's 404, not an agent endpoint.
        raise StarletteHTTPException(404, f"Unknown operation {request.url.path}")
