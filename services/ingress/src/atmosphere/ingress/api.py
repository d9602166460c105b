"""Ingress's HTTP surface: the agent WebSocket endpoint and the probes."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from atmosphere.bus import BusError
from atmosphere.contracts.common.v1.common_pb2 import Principal
from atmosphere.ingress.frames import Frame
from atmosphere.ingress.handlers import AgentDirectory, ClientGoneError, Connection
from atmosphere.ingress.settings import IngressSettings
from atmosphere.service import ServiceRuntime, open_service

# Application-defined WebSocket close codes (4000-4999), mirroring HTTP statuses.
CLOSE_UNKNOWN_AGENT = 4404
CLOSE_UNAVAILABLE = 4503

CONVERSATION_HEADER = "x-atmosphere-conversation-id"


def create_app(settings: IngressSettings, *, info: Callable[[], dict[str, Any]] | None = None) -> FastAPI:
    """The ingress ASGI app; its lifespan connects to NATS and answers health and info."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_service("ingress", settings, info=info) as runtime:
            app.state.runtime = runtime
            app.state.directory = AgentDirectory(runtime.bus)
            runtime.health.mark_ready()
            yield

    app = FastAPI(title="Atmosphere ingress", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok", "service": "ingress"}

    @app.get("/readyz", responses={503: {"description": "not connected to NATS"}})
    async def readyz() -> JSONResponse:
        """Readiness: connected to NATS and serving."""
        runtime: ServiceRuntime = app.state.runtime
        ready = runtime.health.ready
        return JSONResponse({"ready": ready, "service": "ingress"}, status_code=200 if ready else 503)

    @app.websocket("/atmosphere/agent/{name}")
    async def agent_socket(websocket: WebSocket, name: str) -> None:
        """Prompts in (text or JSON), Atmosphere frames out."""
        runtime: ServiceRuntime = app.state.runtime
        directory: AgentDirectory = app.state.directory
        await websocket.accept()
        try:
            descriptor = await directory.lookup(name)
        except BusError:
            await websocket.close(CLOSE_UNAVAILABLE, "Agent directory unavailable; try again")
            return
        if descriptor is None:
            await websocket.close(CLOSE_UNKNOWN_AGENT, f"Unknown agent '{name}'")
            return
        conversation_id = (
            websocket.headers.get(CONVERSATION_HEADER)
            or websocket.query_params.get("conversationId")
            or uuid.uuid4().hex
        )
        connection = Connection(
            bus=runtime.bus,
            agent=name,
            conversation_id=conversation_id,
            principal=Principal(auth_method="anonymous"),
            transport="websocket",
            path=websocket.url.path,
            max_prompts=settings.ingress.max_prompts_per_connection,
            send_queue_frames=settings.ingress.send_queue_frames,
        )

        async def receive() -> str | None:
            try:
                return await websocket.receive_text()
            except WebSocketDisconnect:
                return None

        async def send(frame: Frame) -> None:
            try:
                await websocket.send_text(json.dumps(frame))
            except (WebSocketDisconnect, RuntimeError) as exc:
                raise ClientGoneError from exc

        await connection.serve(receive, send)

    return app
