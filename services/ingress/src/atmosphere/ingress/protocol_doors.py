"""Which protocol doors this ingress serves, wired into the app: served only when enabled and its SDK is installed.

Each door's SDK is an extra of ingress's distribution (`atmosphere-ai-ingress[mcp]`), imported
only when the door is served, so an ingress without it starts and says so in the info (runtime
truth: a door is listed only when it really answers).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from atmosphere.ingress.errors import UnavailableError
from atmosphere.ingress.settings import IngressSettings
from atmosphere.ingress.state import IngressState

MCP_PATH = "/atmosphere/mcp"
AGUI_PATH = "/atmosphere/ag-ui"
A2A_PATH = "/atmosphere/a2a"


def sdk_installed(module: str) -> bool:
    """Whether `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def mcp_served(settings: IngressSettings) -> bool:
    """Whether this ingress serves the MCP door: enabled, and the `mcp` SDK installed."""
    return settings.mcp.enabled and sdk_installed("mcp.server.lowlevel")


def agui_served(settings: IngressSettings) -> bool:
    """Whether this ingress serves the AG-UI door: enabled, and the `ag-ui-protocol` SDK installed."""
    return settings.ag_ui.enabled and sdk_installed("ag_ui.core")


def a2a_served(settings: IngressSettings) -> bool:
    """Whether this ingress serves the A2A door: enabled, and the `a2a-sdk` installed."""
    return settings.a2a.enabled and sdk_installed("a2a.server.request_handlers")


def door_surfaces(settings: IngressSettings) -> dict[str, Any]:
    """The info blocks of the protocol doors this ingress serves (absent when not served)."""
    blocks: dict[str, Any] = {}
    if mcp_served(settings):
        blocks["mcp"] = {"path": MCP_PATH, "transport": "streamable-http", "tools": "agents"}
        if settings.mcp.tools:
            # Each as `<agent>__<tool>` for the agents that have it (only to callers who may use them).
            blocks["mcp"]["appTools"] = list(settings.mcp.tools)
    if agui_served(settings):
        blocks["agUi"] = {"path": AGUI_PATH + "/{agent}", "protocolVersion": "1.0", "interrupts": True}
    if a2a_served(settings):
        blocks["a2a"] = {
            "path": A2A_PATH + "/{agent}",
            "agentCard": A2A_PATH + "/{agent}/.well-known/agent-card.json",
            "protocolVersions": ["1.0", "0.3"],
            **({"defaultAgent": settings.a2a.default_agent} if settings.a2a.default_agent else {}),
        }
    return blocks


def door_routers(settings: IngressSettings) -> list[APIRouter]:
    """The routers of the protocol doors served over plain routes (their SDKs imported only here)."""
    routers: list[APIRouter] = []
    if agui_served(settings):
        from atmosphere.ingress import agui_door  # noqa: PLC0415 - the SDK is an extra

        routers.append(agui_door.router)
    if a2a_served(settings):
        from atmosphere.ingress import a2a_door  # noqa: PLC0415 - the SDK is an extra

        routers.append(a2a_door.router)
    return routers


class _McpEndpoint:
    """The ASGI app at `/atmosphere/mcp`: the running door of this app, else a 503.

    A class, not a function: Starlette calls a plain function endpoint with a `Request`, an
    object with `__call__` as an ASGI app (the SDK answers POST, GET and DELETE itself).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = getattr(scope["app"].state, "mcp", None)
        if door is None:  # between the app's start and its lifespan (never in service)
            body = {"error": "The MCP door is not running", "code": UnavailableError.code}
            await JSONResponse(body, status_code=UnavailableError.status)(scope, receive, send)
            return
        await door.asgi(scope, receive, send)


def serve_mcp_at(app: FastAPI) -> None:
    """Route `/atmosphere/mcp` (every method) to the MCP door."""
    app.router.routes.append(Route(MCP_PATH, endpoint=_McpEndpoint(), include_in_schema=False))


@contextlib.asynccontextmanager
async def running_doors(app: FastAPI, state: IngressState) -> AsyncIterator[None]:
    """Run the protocol doors this ingress serves for as long as the app runs."""
    async with contextlib.AsyncExitStack() as doors:
        if mcp_served(state.settings):
            from atmosphere.ingress.mcp_door import McpDoor  # noqa: PLC0415 - the SDK is an extra

            mcp = McpDoor(state)
            await doors.enter_async_context(mcp.running())
            app.state.mcp = mcp
            doors.callback(setattr, app.state, "mcp", None)
        if a2a_served(state.settings):
            from atmosphere.ingress.a2a_door import A2ADoor  # noqa: PLC0415 - the SDK is an extra

            a2a = A2ADoor()
            doors.push_async_callback(a2a.aclose)
            app.state.a2a = a2a
            doors.callback(setattr, app.state, "a2a", None)
        yield
