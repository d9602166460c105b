"""The WebSocket door of an agent: prompts in, frames out, resumable by run id.

    WS   /atmosphere/agent/{name}            prompts in, frames out; resume with X-Atmosphere-Run-Id
    WS   /{path}                             the same, for the agent at an `@ai_endpoint` path

Every WebSocket ingress serves is an agent's, so `SocketDoors` takes them all, in front of
FastAPI's router. What a connection does once open is `connection.py`'s; this module opens it,
or closes the socket with a code that says why it was refused.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from fastapi import WebSocket
from starlette.types import ASGIApp, Receive, Scope, Send

from atmosphere.bus import BusError, subjects
from atmosphere.bus.frames import Frame
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.ingress.agent_prompts import CONVERSATION_HEADER, conversation_of, find_agent
from atmosphere.ingress.auth import AuthError, Caller
from atmosphere.ingress.connection import ClientGoneError, Closed, Connection
from atmosphere.ingress.errors import MalformedRequestError
from atmosphere.ingress.http import message_limit_of, state_of
from atmosphere.ingress.inbound import close_reason
from atmosphere.ingress.metrics import OPEN_WEBSOCKETS
from atmosphere.ingress.run_access import stored_run
from atmosphere.ingress.state import IngressState
from atmosphere.ingress.stream_limits import address_of
from atmosphere.service import client_key

AGENT_SOCKET_PREFIX = "/atmosphere/agent/"
RESUME_RUN_HEADER = "x-atmosphere-run-id"
"""The HTTP/WebSocket header naming a run to resume (not the bus's own run-id header)."""
LAST_SEQ_HEADER = "x-atmosphere-last-seq"
CLOSE_AUTH = {401: 4401, 403: 4403}
CLOSE_UNKNOWN = 4404
CLOSE_UNAVAILABLE = 4503

log = logging.getLogger("atmosphere.ingress")


class _SocketRefusedError(Exception):
    """A WebSocket refused before it serves anything: closed with `code` and `reason`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class SocketDoors:
    """Pure ASGI middleware: every WebSocket, served here; anything else goes on to `app`.

    Not FastAPI routes: while a socket is open, its route kept FastAPI's router, exception
    middleware and three exit stacks on the stack, about 10 KiB per socket (tracemalloc on 2,000
    idle sockets), for nothing a socket uses. Installed innermost of the app's middleware, so
    the access log, tracing and the server's error handling still see every socket.
    """

    def __init__(self, app: ASGIApp) -> None:
        """Serve WebSockets; hand everything else to `app`."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one WebSocket connection, or pass the request on."""
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        await _serve_socket(WebSocket(scope, receive, send))


def _agent_at(state: IngressState, path: str) -> Awaitable[AgentDescriptor | None]:
    """The agent a socket at `path` is for: `/atmosphere/agent/{name}` by name, else by `@ai_endpoint` path.

    As the routes were matched: a name is one path segment; any other path (`/atmosphere/agent/`,
    `/atmosphere/agent/a/b`) is looked up as an `@ai_endpoint` path.
    """
    name = path.removeprefix(AGENT_SOCKET_PREFIX)
    if name != path and name and "/" not in name:
        return find_agent(state, name=name)
    return find_agent(state, path=path)


async def _serve_socket(websocket: WebSocket) -> None:
    """One WebSocket client of the agent at its path, served until it leaves.

    If the directory cannot be read, the socket is accepted and closed with 4503: unhandled, the
    lookup's `BusError` would make the server reject the handshake with a bare 500, and a client
    should learn that it may try again. One coroutine, not one per step: each level of the
    stack stays allocated for as long as the socket is open.
    """
    state = state_of(websocket)
    try:
        descriptor = await _agent_at(state, websocket.scope["path"])
    except BusError as exc:
        log.warning("agent directory unavailable for %s: %s", websocket.url.path, exc)
        await websocket.accept()
        await websocket.close(CLOSE_UNAVAILABLE, "The agent directory is unavailable; try again")
        return
    await websocket.accept()
    try:
        connection, resume = _open_connection(state, websocket, descriptor)
    except _SocketRefusedError as refused:
        await websocket.close(refused.code, close_reason(refused.reason))
        return
    close = functools.partial(_close_socket, websocket)
    try:
        with state.drain.tracking(connection), OPEN_WEBSOCKETS.track_inprogress():
            await connection.serve(
                _receiver(websocket, connection), functools.partial(_send_frame, websocket), close, resume=resume
            )
    except Exception:
        # Never drop the socket without a close frame: its client learns the connection ended.
        log.exception("a WebSocket connection failed")
        await close(1011, "Internal error; reconnect with X-Atmosphere-Run-Id to resume")


def _open_connection(
    state: IngressState, websocket: WebSocket, descriptor: AgentDescriptor | None
) -> tuple[Connection, tuple[str, int] | None]:
    """The connection of an accepted socket and the run it resumes; `_SocketRefusedError` when refused."""
    try:
        if descriptor is None:
            # Credentials first: without them, which agents exist is nobody's business.
            state.authenticator.identify(websocket.headers, websocket.query_params)
            raise _SocketRefusedError(CLOSE_UNKNOWN, f"Unknown agent '{websocket.url.path.rsplit('/', 1)[-1]}'")
        caller = state.authenticator.caller(descriptor.path, websocket.headers, websocket.query_params)
    except AuthError as exc:
        raise _SocketRefusedError(CLOSE_AUTH[exc.status], exc.message) from None
    headers, query = websocket.headers, websocket.query_params
    resume = _resume_point(headers, query)
    try:
        conversation_id = conversation_of(
            headers.get(CONVERSATION_HEADER) or query.get("conversationId"), caller.principal
        )
    except MalformedRequestError as exc:
        raise _SocketRefusedError(1008, exc.message) from None
    connection = Connection(
        bus=state.bus,
        agent=descriptor,
        conversation_id=conversation_id,
        conversations=state.conversations,
        principal=caller.principal,
        transport="websocket",
        may_resume=_resume_guard(state, caller, descriptor) if state.authenticator.enabled else None,
        max_prompts=state.settings.ingress.max_prompts_per_connection,
        send_queue_frames=state.settings.ingress.send_queue_frames,
        max_message_bytes=message_limit_of(state),
        streams=state.streams,
        client=client_key(caller.principal, address_of(websocket)),
        idle_timeout=state.settings.ingress.ws_idle_timeout,
    )
    return connection, resume


def _resume_point(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, int] | None:
    """The run a connecting client resumes and the last seq it saw (None: it resumes nothing)."""
    resume_id = headers.get(RESUME_RUN_HEADER) or query.get("X-Atmosphere-Run-Id") or query.get("runId")
    if not resume_id:
        return None
    try:
        subjects.token(resume_id, what="run id")
        return resume_id, max(0, int(headers.get(LAST_SEQ_HEADER) or query.get("lastSeq") or 0))
    except ValueError:
        raise _SocketRefusedError(1008, "Malformed run id or last seq") from None


def _resume_guard(state: IngressState, caller: Caller, agent: AgentDescriptor) -> Callable[[str], Awaitable[bool]]:
    """Whether a WebSocket of `caller` at `agent`'s route may resume a run: its owner, same agent.

    Another agent's run is refused even when the grant covers that agent too: a route reads only
    its own agent's runs.
    """

    async def may_resume(run_id: str) -> bool:
        stored = await stored_run(state, run_id)
        return stored is not None and stored.agent.name == agent.name and caller.owns(stored.owner)

    return may_resume


def _receiver(websocket: WebSocket, connection: Connection) -> Callable[[], Awaitable[str | Closed]]:
    """The next text message of `websocket`; a binary one must be UTF-8 or it is answered with an error frame."""

    async def receive() -> str | Closed:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return Closed(int(message.get("code") or 1006))
            if message.get("text") is not None:
                return str(message["text"])
            if message.get("bytes") is not None:
                try:
                    return bytes(message["bytes"]).decode("utf-8")
                except UnicodeDecodeError:
                    connection.reject(MalformedRequestError("A binary frame must hold UTF-8 text"))

    return receive


async def _send_frame(websocket: WebSocket, frame: Frame) -> None:
    try:
        await websocket.send_text(json.dumps(frame, separators=(",", ":")))
    except (RuntimeError, OSError) as exc:
        raise ClientGoneError from exc


async def _close_socket(websocket: WebSocket, code: int, reason: str) -> None:
    # A reason over the protocol's 123 bytes would make the close itself fail.
    with contextlib.suppress(RuntimeError, OSError):
        await websocket.close(code, close_reason(reason))
