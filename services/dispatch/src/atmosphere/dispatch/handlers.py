"""Running one `RunRequest`: admission, the agent's `@prompt`, control, one terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import Bus, BusError, Headers, WorkItem, subjects
from atmosphere.bus.runs import WORKER_FIRST_SEQ, RunEventWriter, is_terminal
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.governance.v1.governance_pb2 import AdmitRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunRequest
from atmosphere.dispatch.budget import BudgetMeter
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.pipeline import ModelPipeline, RunSink
from atmosphere.dispatch.tools import ToolGateway
from atmosphere.sdk import AgentSpec, App, StreamingSession
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")

RESUMED_METADATA_KEY = "ai.run.resumed"


def agent_descriptors(app: App, pipeline: ModelPipeline) -> list[AgentDescriptor]:
    """The descriptors dispatch publishes to `ATMO_AGENTS`: what it serves, with runtime truth."""
    runtime = pipeline.runtime
    capabilities = sorted(c.value for c in runtime.capabilities()) if runtime is not None else []
    return [
        AgentDescriptor(
            name=spec.name,
            path=spec.path,
            kind=spec.kind,
            description=spec.description,
            runtime=runtime.name if runtime is not None else "",
            capabilities=capabilities,
            tools=[t.name for t in spec.tools],
        )
        for spec in app.agents.values()
    ]


@dataclass(frozen=True)
class ExecutorOptions:
    """Timeouts of the governed steps."""

    governance_timeout: float = 5.0
    approval_timeout: float = 300.0


class RunExecutor:
    """Executes runs: the single place where a run starts, is controlled and ends."""

    def __init__(self, app: App, bus: Bus, pipeline: ModelPipeline, options: ExecutorOptions | None = None) -> None:
        """Serve `app`'s agents over `bus`, answering `session.stream()` with `pipeline`."""
        self._app = app
        self._bus = bus
        self._pipeline = pipeline
        self._options = options or ExecutorOptions()
        # One instance per agent for the process's lifetime, like an endpoint singleton.
        self._instances: dict[str, Any] = {name: spec.cls() for name, spec in app.agents.items()}
        self._tools: dict[str, dict[str, ToolSpec]] = {
            name: {t.name: ToolSpec.of(t) for t in spec.tools} for name, spec in app.agents.items()
        }

    async def on_work(self, item: WorkItem[RunRequest]) -> None:
        """Work-queue entry point: run the request carried by `item`."""
        request = item.envelope.message
        first_seq = WORKER_FIRST_SEQ
        if item.delivered > 1:
            resumed = await self._resume_point(request)
            if resumed is None:
                log.info("run %s redelivered but already ended; acknowledging", request.run_id)
                return
            first_seq = resumed
            log.info(
                "run %s redelivered (delivery %d); re-driving from seq %d", request.run_id, item.delivered, first_seq
            )
        await self.execute(request, first_seq=first_seq)

    async def _resume_point(self, request: RunRequest) -> int | None:
        """The next seq of a redelivered run, or None if it already has its terminal event."""
        last = await self._bus.last_message(subjects.EVENTS_STREAM, subjects.run_events(request.run_id), RunEvent)
        if last is None:
            return WORKER_FIRST_SEQ
        if is_terminal(last):
            return None
        return max(WORKER_FIRST_SEQ, last.seq + 1)

    async def execute(self, request: RunRequest, *, first_seq: int = WORKER_FIRST_SEQ) -> None:
        """Run `request` to exactly one terminal event; never raises for the agent's failures.

        A client cancel ends the run with an error event and returns normally (the work item
        is acked). Cancellation from outside (the worker stopping) propagates, so the item is
        handed to another worker.
        """
        writer = RunEventWriter(self._bus, request, first_seq=first_seq)
        control = RunControl(request.run_id)
        spec = self._app.agent(request.agent)
        meter = BudgetMeter(spec.budget) if spec is not None and spec.budget and spec.budget.enforced else None
        sink = RunSink(writer, meter)
        session = StreamingSession(
            sink, run_id=request.run_id, session_id=request.session_id, conversation_id=request.conversation_id
        )
        sink.session = session
        if first_seq > WORKER_FIRST_SEQ:
            await writer.emit(
                RunEvent(metadata=Metadata(key=RESUMED_METADATA_KEY, value_json=json.dumps({"fromSeq": first_seq})))
            )
        async with self._bus.serve(control.router(), max_inflight=4):
            agent = asyncio.create_task(self._run_agent(request, spec, session, sink, control))
            control.on_cancel(agent.cancel)
            try:
                await asyncio.wait({agent})
            finally:
                if not agent.done():
                    agent.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await agent
            if agent.cancelled() and not control.cancelled:
                raise asyncio.CancelledError
        if not session.closed:
            if control.cancelled:
                await session.error(f"Run cancelled: {control.cancel_reason}", code="run.cancelled")
            else:
                await session.complete()

    async def _run_agent(
        self,
        request: RunRequest,
        spec: AgentSpec | None,
        session: StreamingSession,
        sink: RunSink,
        control: RunControl,
    ) -> None:
        if spec is None:
            await session.error(f"Unknown agent '{request.agent}'", code="dispatch.unknown_agent")
            return
        if not await self._admit(request, session):
            return
        tools: Mapping[str, ToolSpec] = self._tools[spec.name]
        gateway = ToolGateway(
            bus=self._bus,
            run=request,
            emit=session.emit,
            tools=tools,
            control=control,
            governance_timeout=self._options.governance_timeout,
            approval_timeout=self._options.approval_timeout,
        )

        async def stream(target: StreamingSession, message: str) -> None:
            await self._pipeline.stream(
                spec=spec, run=request, session=target, sink=sink, gateway=gateway, tools=tools, message=message
            )

        session.attach_streamer(stream)
        try:
            if spec.prompt_method is None:
                await session.stream(request.message)
            else:
                await getattr(self._instances[spec.name], spec.prompt_method)(request.message, session)
        except Exception as exc:
            log.exception("agent %s failed on run %s", spec.name, request.run_id)
            # The client learns what kind of failure it was, never the traceback.
            await session.error(type(exc).__name__, code="agent.failed")

    async def _admit(self, request: RunRequest, session: StreamingSession) -> bool:
        """Governance admission; no answer means no run (fail-closed)."""
        admit = AdmitRequest(
            run_id=request.run_id,
            agent=request.agent,
            message=request.message,
            principal=request.principal,
            transport=request.transport,
        )
        headers = Headers(run_id=request.run_id, principal=request.principal if request.HasField("principal") else None)
        try:
            decision = await self._bus.request(
                subjects.governance("admit"), admit, Decision, timeout=self._options.governance_timeout, headers=headers
            )
        except BusError as exc:
            log.warning("run %s: governance did not answer admission (%s); refusing", request.run_id, exc)
            await session.error(
                "Request denied: governance is unavailable (fail-closed)", code="governance.unavailable"
            )
            return False
        if not decision.allowed:
            await session.error(
                f"Request denied by policy {decision.policy or 'default'}: {decision.reason}", code="governance.denied"
            )
            return False
        return True
