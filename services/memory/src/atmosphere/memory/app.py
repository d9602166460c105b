"""Memory's wiring: the SQLite store, the workspaces, the responders."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from atmosphere.bus import Bus, ServiceError, subjects
from atmosphere.bus.errors import ReplicaBehindError
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import MemoryWrite
from atmosphere.memory.handlers import MemoryHandlers, ScreenFacts, runtime_info
from atmosphere.memory.settings import MemorySettings
from atmosphere.memory.store import MemoryStore
from atmosphere.memory.vfs import parse_routes
from atmosphere.memory.workspaces import Workspaces
from atmosphere.service import open_service
from atmosphere.service.replica import ReplicaLog, ReplicaPosition

QUEUE = "memory"

log = logging.getLogger("atmosphere.memory")


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

        # `ATMO_MEMORY` is the store of record: every replica applies every write, in order, to
        # its own store, so N replicas hold one state (`atmosphere.service.replica`).
        async def caught_up() -> None:  # `writes` is made below: it applies through `handlers`
            await writes.caught_up()

        handlers = MemoryHandlers(
            store,
            workspaces,
            screen,
            max_payload=runtime.bus.max_payload,
            write=lambda change, key: writes.write(subjects.memory_log(), change, msg_id=idempotency_id(key)),
            caught_up=caught_up,
        )
        writes: ReplicaLog[MemoryWrite, Any] = ReplicaLog(
            runtime.bus,
            stream=subjects.MEMORY_LOG_STREAM,
            filter_subject=subjects.memory_log(),
            position=ReplicaPosition(settings.db_path.parent, "memory"),
            message_type=MemoryWrite,
            apply=handlers.apply,
            outcomes=(ServiceError,),
        )
        async with writes.applying():
            await catch_up(writes)
            async with runtime.bus.serve(handlers.router(), queue=QUEUE):
                runtime.health.mark_ready()
                await stop.wait()


def idempotency_id(key: str) -> str:
    """The `Nats-Msg-Id` of a write with idempotency key `key` (fixed length whatever the ids)."""
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


async def catch_up(writes: ReplicaLog[MemoryWrite, Any]) -> None:
    """Apply what the log already holds before taking requests (a new replica starts from its start)."""
    try:
        await writes.caught_up()
    except ReplicaBehindError:
        log.warning("memory is still applying %s; reads wait for it", subjects.MEMORY_LOG_STREAM)
