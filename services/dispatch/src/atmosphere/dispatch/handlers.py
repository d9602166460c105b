"""Running one `RunRequest` on its agent, and describing the agents served."""

from __future__ import annotations

import logging
from typing import Any

from atmosphere.bus import Bus, WorkItem
from atmosphere.bus.runs import RunEventWriter
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import RunEvent, RunRequest
from atmosphere.sdk import App, StreamingSession

log = logging.getLogger("atmosphere.dispatch")


def agent_descriptors(app: App) -> list[AgentDescriptor]:
    """The descriptors dispatch publishes to `ATMO_AGENTS`."""
    return [
        AgentDescriptor(name=spec.name, path=spec.path, kind=spec.kind, description=spec.description)
        for spec in app.agents.values()
    ]


class RunExecutor:
    """Executes runs: finds the agent, calls its `@prompt`, guarantees one terminal event."""

    def __init__(self, app: App, bus: Bus) -> None:
        """Serve `app`'s agents, publishing events on `bus`."""
        self._app = app
        self._bus = bus
        # One instance per agent for the process's lifetime, like an endpoint singleton.
        self._instances: dict[str, Any] = {name: spec.cls() for name, spec in app.agents.items()}

    async def on_work(self, item: WorkItem[RunRequest]) -> None:
        """Work-queue entry point: run the request carried by `item`."""
        if item.delivered > 1:
            log.info("run %s redelivered (delivery %d)", item.envelope.message.run_id, item.delivered)
        await self.execute(item.envelope.message)

    async def execute(self, request: RunRequest) -> None:
        """Run `request` to its terminal event; never raises for an agent's failure."""
        writer = RunEventWriter(self._bus, request)

        async def sink(event: RunEvent) -> None:
            await writer.emit(event)

        session = StreamingSession(
            sink,
            run_id=request.run_id,
            session_id=request.session_id,
            conversation_id=request.conversation_id,
        )
        spec = self._app.agent(request.agent)
        if spec is None:
            await session.error(f"Unknown agent '{request.agent}'", code="dispatch.unknown_agent")
            return
        handler = getattr(self._instances[spec.name], spec.prompt_method)
        try:
            await handler(request.message, session)
        except Exception as exc:
            log.exception("agent %s failed on run %s", spec.name, request.run_id)
            # The client learns what kind of failure it was, never the traceback.
            await session.error(type(exc).__name__, code="agent.failed")
            return
        if not session.closed:
            await session.complete()
