"""Memory's wiring: the SQLite store, the workspaces, the responders."""

from __future__ import annotations

import asyncio

from atmosphere.bus import Bus, subjects
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.memory.handlers import MemoryHandlers, ScreenFacts, runtime_info
from atmosphere.memory.settings import MemorySettings
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.vfs import parse_routes
from atmosphere.memory.workspaces import Workspaces
from atmosphere.service import open_service

QUEUE = "memory"


def governance_screen(bus: Bus, timeout: float) -> ScreenFacts:
    """Governance's fact screen over `bus`, waiting at most `timeout` seconds for each answer."""

    async def screen(request: ScreenFactsRequest) -> ScreenFactsResponse:
        return await bus.request(subjects.governance("screen_facts"), request, ScreenFactsResponse, timeout=timeout)

    return screen


async def serve(settings: MemorySettings, *, stop: asyncio.Event, bus: Bus | None = None) -> None:
    """Run memory until `stop` is set, on `bus` when given (else on a connection to `settings.nats`)."""
    workspaces = Workspaces(settings.workspace_root, routes=parse_routes(settings.llm.filesystem_routes))
    async with (
        MemoryStore.open(settings.db_path) as store,
        open_service("memory", settings, info=lambda: runtime_info(workspaces), stop=stop, bus=bus) as runtime,
    ):
        screen = governance_screen(runtime.bus, settings.memory.screen_timeout)
        handlers = MemoryHandlers(store, workspaces, screen, max_payload=runtime.bus.max_payload)
        async with runtime.bus.serve(handlers.router(), queue=QUEUE):
            runtime.health.mark_ready()
            await stop.wait()
