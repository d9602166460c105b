"""Memory's wiring: the SQLite store, the workspaces, the responders."""

from __future__ import annotations

import asyncio

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.memory.composite import parse_routes
from atmosphere.memory.handlers import MemoryHandlers, runtime_info
from atmosphere.memory.settings import MemorySettings
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.workspaces import Workspaces
from atmosphere.service import open_service

QUEUE = "memory"


async def serve(settings: MemorySettings, *, stop: asyncio.Event) -> None:
    """Run memory until `stop` is set."""
    workspaces = Workspaces(settings.workspace_root, routes=parse_routes(settings.llm.filesystem_routes))
    bus: Bus | None = None

    async def screen(request: ScreenFactsRequest) -> ScreenFactsResponse:
        assert bus is not None
        return await bus.request(
            subjects.governance("screen_facts"), request, ScreenFactsResponse, timeout=settings.memory.screen_timeout
        )

    async with (
        MemoryStore.open(settings.db_path) as store,
        open_service("memory", settings, info=lambda: runtime_info(workspaces), stop=stop) as runtime,
    ):
        bus = runtime.bus
        handlers = MemoryHandlers(store, workspaces, screen, max_payload=bus.max_payload)
        async with bus.serve(handlers.router(), queue=QUEUE):
            runtime.health.mark_ready()
            await stop.wait()
