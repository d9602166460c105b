"""Memory's wiring: the SQLite store, the workspaces, memory's write log, the responders."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from atmosphere.bus import Bus, ServiceError, subjects
from atmosphere.bus.errors import ReplicaBehindError
from atmosphere.contracts.governance.v1.governance_pb2 import ScreenFactsRequest, ScreenFactsResponse
from atmosphere.contracts.memory.v1.memory_pb2 import MemoryWrite
from atmosphere.memory.handlers import MemoryHandlers, runtime_info
from atmosphere.memory.replication import MemoryJournal, MemoryLog, MemoryReplica
from atmosphere.memory.responders.facts import ScreenFacts
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
        replicated(
            runtime.bus,
            store,
            workspaces,
            governance_screen(runtime.bus, settings.memory.screen_timeout),
            position=ReplicaPosition(settings.db_path.parent, "memory"),
        ) as handlers,
        runtime.bus.serve(handlers.router(), queue=QUEUE),
    ):
        runtime.health.mark_ready()
        await stop.wait()


@contextlib.asynccontextmanager
async def replicated(
    bus: Bus,
    store: MemoryStore,
    workspaces: Workspaces,
    screen: ScreenFacts,
    *,
    position: ReplicaPosition | None = None,
) -> AsyncIterator[MemoryHandlers]:
    """Memory's responders, applying memory's write log to `store` and `workspaces` while the context is open.

    `ATMO_MEMORY` is the store of record: every replica applies every write, in order, to its own
    store, so N replicas hold one state (`replication.py`). The responders are returned once this
    replica applied what the log held (or, if that takes long, while it goes on applying).
    `position` keeps how far it applied beside its store (None: in memory, a test's replica).
    """
    replica = MemoryReplica(store, workspaces, max_payload=bus.max_payload)
    writes: MemoryLog = ReplicaLog(
        bus,
        stream=subjects.MEMORY_LOG_STREAM,
        filter_subject=subjects.memory_log(),
        position=position or ReplicaPosition(None, "memory"),
        message_type=MemoryWrite,
        apply=replica.apply,
        outcomes=(ServiceError,),
    )
    handlers = MemoryHandlers(
        store, workspaces, screen, max_payload=bus.max_payload, journal=MemoryJournal(replica, log=writes)
    )
    async with writes.applying():
        await catch_up(writes)
        yield handlers


async def catch_up(writes: MemoryLog) -> None:
    """Apply what the log already holds before taking requests (a new replica starts from its start)."""
    try:
        await writes.caught_up()
    except ReplicaBehindError:
        log.warning("memory is still applying %s; reads wait for it", subjects.MEMORY_LOG_STREAM)
