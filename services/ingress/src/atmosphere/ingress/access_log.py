"""The access log: one line per HTTP request, and per WebSocket connection when it closes.

`GET /atmosphere/agent/echo/poll 200 3.1ms`, `WS /atmosphere/agent/echo 101 close=1000
5012.0ms`, on the `atmosphere.ingress.access` logger at INFO (`ATMOSPHERE_INGRESS__ACCESS_LOG`
turns it off), with `method`, `path`, `status`, `duration_ms`, `close_code` and the runs the
request started or followed (`run_id`) as fields of their own in JSON lines.

Nothing of what a client sent is read beyond the method and the path: no header (a token), no
query string (`access_token`, for browsers' WebSocket API), no body (a prompt). A pure ASGI
middleware (nothing buffered): a stream's messages cost it one comparison each, the line is
written once, at the end.

uvicorn's own access lines are off (`access_log=False`), but its WebSocket protocols still log
each handshake with its query string (a browser's `access_token`) and, at DEBUG, the
handshake's headers and every frame (tokens, prompts): `quiet_uvicorn` drops those lines.

It also scopes a request's run: a route that starts or follows one calls `note_run`, and every
line logged for the rest of that request names the run (`atmosphere.bus.telemetry.bind_run`,
undone when the request ends); so does its access line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_from_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atmosphere.bus.telemetry import bind_run

__all__ = ["AccessLog", "note_run", "quiet_uvicorn"]

log = logging.getLogger("atmosphere.ingress.access")

MAX_PATH_CHARS = 256
"""Characters of a path an access line keeps (a request line may be 8 KiB)."""
MAX_RUNS = 16
"""Runs one access line names (a WebSocket connection may start many)."""
CLOSE_BEFORE_ACCEPT = 403
"""What a WebSocket closed before it was accepted answers the handshake (the ASGI spec)."""


@dataclass(eq=False)
class _Request:
    """What the access line of one request will say, gathered as it is served."""

    task: asyncio.Task[Any] | None
    """The task serving the request: only there does `note_run` bind a run (undone there at its end)."""
    runs: list[str] = field(default_factory=list)
    status: int = 0
    close_code: int | None = None
    bindings: contextlib.ExitStack | None = None
    ended: bool = False


_request: ContextVar[_Request | None] = ContextVar("atmosphere_ingress_request", default=None)


def note_run(run_id: str, agent: str = "", *, bind: bool = True) -> None:
    """The request under way started or follows `run_id`: its access line names it.

    With `bind`, called from the request's own task, the run is also bound there until the
    request ends, so every line logged for the request names it. A WebSocket connection, which
    may stream several runs at once, notes them without binding (each run's task binds its
    own); so does a call made outside the request's task (an MCP session's, an A2A task's),
    whose code binds the run itself. Call it outside any `with bind_run(...)` block.
    """
    request = _request.get()
    if request is None or request.ended:
        return
    if run_id not in request.runs and len(request.runs) < MAX_RUNS:
        request.runs.append(run_id)
    if bind and asyncio.current_task() is request.task:
        if request.bindings is None:
            request.bindings = contextlib.ExitStack()
        request.bindings.enter_context(bind_run(run_id, agent))


class AccessLog:
    """Pure ASGI middleware: the access line of every HTTP request and WebSocket connection."""

    def __init__(self, app: ASGIApp, *, enabled: bool = True) -> None:
        """Serve `app`; write access lines when `enabled` (runs are scoped either way)."""
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request (or connection), then write its line."""
        kind = scope["type"]
        if kind not in {"http", "websocket"}:
            await self.app(scope, receive, send)
            return
        request = _Request(asyncio.current_task())
        token = _request.set(request)
        started = time.perf_counter()
        try:
            if kind == "http":
                await self.app(scope, receive, _http_send(send, request))
            else:
                await self.app(scope, _ws_receive(receive, request), _ws_send(send, request))
        except Exception:
            if kind == "http" and request.status == 0:
                request.status = 500  # what the server answers for an app that raised before answering
            raise
        finally:
            request.ended = True
            if request.bindings is not None:
                request.bindings.close()
            _request.reset(token)
            if self.enabled:
                _write(scope, request, time.perf_counter() - started)


# The wrappers return `send`'s own awaitable rather than awaiting it in a coroutine of their
# own: a streamed message costs one comparison, not another coroutine.


def _http_send(send: Send, request: _Request) -> Send:
    def watched(message: Message) -> Awaitable[None]:
        if request.status == 0 and message["type"] == "http.response.start":
            request.status = int(message["status"])
        return send(message)

    return watched


def _ws_send(send: Send, request: _Request) -> Send:
    def watched(message: Message) -> Awaitable[None]:
        kind = message["type"]
        if kind != "websocket.send":
            _ws_sent(request, kind, message)
        return send(message)

    return watched


def _ws_sent(request: _Request, kind: str, message: Message) -> None:
    if kind == "websocket.accept":
        request.status = 101
    elif kind == "websocket.close":
        if request.status == 0:
            request.status = CLOSE_BEFORE_ACCEPT
        elif request.close_code is None:
            request.close_code = int(message.get("code", 1000))
    elif kind == "websocket.http.response.start" and request.status == 0:
        request.status = int(message["status"])


def _ws_receive(receive: Receive, request: _Request) -> Receive:
    async def watched() -> Message:
        message = await receive()
        if message["type"] == "websocket.disconnect" and request.close_code is None:
            request.close_code = int(message.get("code", 1005))
        return message

    return watched


def _write(scope: Scope, request: _Request, seconds: float) -> None:
    http = scope["type"] == "http"
    method = str(scope.get("method", "")) if http else "WS"
    path = _path(scope)
    duration_ms = round(seconds * 1000, 1)
    fields: dict[str, Any] = {"method": method, "path": path, "status": request.status, "duration_ms": duration_ms}
    close = ""
    if request.close_code is not None:
        fields["close_code"] = request.close_code
        close = f" close={request.close_code}"
    if request.runs:
        fields["run_id"] = ",".join(request.runs)
    log.info("%s %s %d%s %.1fms", method, path, request.status, close, duration_ms, extra=fields)


def _path(scope: Scope) -> str:
    """The request's path as it came (percent-encoded), never its query string; bounded."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        path = quote_from_bytes(raw.split(b"?", 1)[0], safe=_KEPT + "%")
    else:
        path = quote(str(scope.get("path", "")), safe=_KEPT)
    return path if len(path) <= MAX_PATH_CHARS else path[:MAX_PATH_CHARS] + "…"


_KEPT = "/:@!$&'()*+,;=-._~"
"""What a path shows as it is; anything else (a control character, a space) is percent-encoded."""


class _UvicornWire(logging.Filter):
    """Drops what uvicorn logs of a request's own bytes: this module writes the access lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith('%s - "WebSocket %s"'):
            return False  # a handshake's line, its query string included
        # The websockets library's wire dump at DEBUG (`< GET /…?access_token=…`, `< authorization:
        # Bearer …`, `< TEXT '<prompt>'`), logged through uvicorn's logger.
        return not (record.levelno <= logging.DEBUG and message.startswith(("< ", "> ")))


class _Nothing(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


_UVICORN_WIRE = _UvicornWire()
_NOTHING = _Nothing()


def quiet_uvicorn() -> None:
    """Keep uvicorn from logging paths with their query strings, headers or frames (idempotent).

    Its access log is off (`access_log=False` leaves its logger without a handler), and stays
    off even where something gives that logger one: its lines show the query string.
    """
    logging.getLogger("uvicorn.error").addFilter(_UVICORN_WIRE)
    logging.getLogger("uvicorn.access").addFilter(_NOTHING)
