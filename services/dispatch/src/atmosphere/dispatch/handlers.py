"""Running one `RunRequest`: admission, the agent's `@prompt`, control, one terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atmosphere.bus import Bus, BusError, Headers, Term, WorkItem, request_retrying, subjects
from atmosphere.bus.runs import (
    EVENT_LOST_METADATA_KEY,
    RESUMED_METADATA_KEY,
    WORKER_FIRST_SEQ,
    RunEventWriter,
    is_terminal,
    stored_events,
)
from atmosphere.contracts.common.v1.common_pb2 import Error
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.governance.v1.governance_pb2 import AdmitRequest, Decision
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunRequest
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.dispatch.budget import BudgetMeter
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.delegation import SUBAGENT, SUBAGENT_SYSTEM_PROMPT, Delegation, subagent_scope
from atmosphere.dispatch.harness import AgentHarness, subagent_harness
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.pipeline import ModelPipeline, RunSink
from atmosphere.dispatch.tools import LocalTool, ToolGateway
from atmosphere.sdk import App, StreamingSession
from atmosphere.sdk.builtin_tools import MEMORY_TOOL_NAMES
from atmosphere.sdk.host import AgentSpec
from atmosphere.sdk.runtime import ToolSpec

log = logging.getLogger("atmosphere.dispatch")


def agent_descriptors(
    app: App, pipeline: ModelPipeline, harnesses: Mapping[str, AgentHarness] | None = None
) -> list[AgentDescriptor]:
    """The descriptors dispatch publishes to `ATMO_AGENTS`: what it serves, with runtime truth."""
    runtime = pipeline.runtime
    capabilities = sorted(c.value for c in runtime.capabilities()) if runtime is not None else []
    harnesses = harnesses or {}
    descriptors = []
    for spec in app.agents.values():
        harness = harnesses.get(spec.name, AgentHarness())
        descriptors.append(
            AgentDescriptor(
                name=spec.name,
                path=spec.path,
                kind=spec.kind,
                description=spec.description,
                runtime=runtime.name if runtime is not None else "",
                capabilities=capabilities,
                tools=[t.name for t in spec.tools]
                + [n for n in harness.tools if n not in {t.name for t in spec.tools}],
                harness=harness.attached(),
                workspace=harness.scope("", "") if harness.tools.keys() & MEMORY_TOOL_NAMES else None,
            )
        )
    return descriptors


class _SubAgent:
    """The ephemeral general-purpose sub-agent of `task`: the default prompt loop."""


SUBAGENT_SPEC = AgentSpec(
    name=SUBAGENT,
    cls=_SubAgent,
    prompt_method=None,
    system_prompt=SUBAGENT_SYSTEM_PROMPT,
    description="An ephemeral general-purpose worker with its own plan and files",
)


@dataclass(frozen=True)
class ExecutorOptions:
    """Timeouts of the governed steps."""

    governance_timeout: float = 5.0
    approval_timeout: float = 300.0
    offload_threshold: int = 8000
    """Tool results longer than this go to the workspace (0 or less: never)."""
    max_deliveries: int = 5
    """A run delivered this many times is ended with an error instead of run again."""


class RunExecutor:
    """Executes runs: the single place where a run starts, is controlled and ends."""

    def __init__(
        self,
        app: App,
        bus: Bus,
        pipeline: ModelPipeline,
        options: ExecutorOptions | None = None,
        *,
        harnesses: Mapping[str, AgentHarness] | None = None,
    ) -> None:
        """Serve `app`'s agents over `bus`, answering `session.stream()` with `pipeline`."""
        self._app = app
        self._bus = bus
        self._pipeline = pipeline
        self._options = options or ExecutorOptions()
        self._memory = MemoryClient(bus)
        self._specs: dict[str, AgentSpec] = {**app.agents, SUBAGENT: SUBAGENT_SPEC}
        self._harnesses: dict[str, AgentHarness] = {**(harnesses or {}), SUBAGENT: subagent_harness()}
        # One instance per agent for the process's lifetime, like an endpoint singleton.
        self._instances: dict[str, Any] = {name: spec.cls() for name, spec in self._specs.items()}
        self._tools: dict[str, dict[str, ToolSpec]] = {
            name: {t.name: ToolSpec.of(t) for t in spec.tools} | dict(self._harness(name).tools)
            for name, spec in self._specs.items()
        }

    def _harness(self, agent: str) -> AgentHarness:
        return self._harnesses.get(agent) or AgentHarness()

    async def on_work(self, item: WorkItem[RunRequest]) -> None:
        """Work-queue entry point: run the request carried by `item`."""
        request = item.envelope.message
        try:
            subjects.token(request.run_id, what="run id")
            subjects.token(request.agent, what="agent name")
        except ValueError as exc:
            # No run can come of it (nothing can even be written for it): drop it for good.
            raise Term(f"malformed run request: {exc}") from None
        first_seq = WORKER_FIRST_SEQ
        if item.delivered > 1:
            resumed = await self._resume_point(request)
            if resumed is None:
                log.info("run %s redelivered but already ended; acknowledging", request.run_id)
                return
            first_seq = resumed
            if item.delivered >= self._options.max_deliveries:
                await self._give_up(request, first_seq, item.delivered)
                return
            log.info(
                "run %s redelivered (delivery %d); re-driving from seq %d", request.run_id, item.delivered, first_seq
            )
        await self.execute(request, first_seq=first_seq)

    async def _resume_point(self, request: RunRequest) -> int | None:
        """The next seq of a redelivered run, or None if it already has its terminal event.

        Seqs below it that the stream lacks (events the dead worker had in flight when the
        broker lost them too) are filled with an `ai.run.event_lost` marker, so that readers
        go on instead of waiting for an event nobody will write.
        """
        # Every stored event, not just the newest: an event resent after a broker restart may
        # be stored behind a later one.
        stored = await stored_events(self._bus, request.run_id)
        if any(is_terminal(event) for event in stored.values()):
            return None
        holes = [seq for seq in range(WORKER_FIRST_SEQ, max(stored, default=0)) if seq not in stored]
        for seq in holes:
            marker = RunEvent(metadata=Metadata(key=EVENT_LOST_METADATA_KEY, value_json="true"))
            await RunEventWriter(self._bus, request, first_seq=seq).emit(marker, durable=True)
        if holes:
            log.warning("run %s: %d event(s) were lost with their worker; marked %s", request.run_id, len(holes), holes)
        return max(WORKER_FIRST_SEQ, max(stored, default=0) + 1)

    async def _give_up(self, request: RunRequest, first_seq: int, delivered: int) -> None:
        """End a run that failed or took its worker down on every delivery (poison-run guard)."""
        log.error(
            "run %s: delivery %d of at most %d; ending it", request.run_id, delivered, self._options.max_deliveries
        )
        writer = RunEventWriter(self._bus, request, first_seq=first_seq)
        error = Error(
            code="dispatch.run_abandoned",
            message=f"The run failed on {delivered} attempts and was stopped; send the prompt again",
            details={"deliveries": str(delivered)},
        )
        await writer.emit(RunEvent(error=error))

    async def execute(self, request: RunRequest, *, first_seq: int = WORKER_FIRST_SEQ) -> None:
        """Run `request` to exactly one terminal event; never raises for the agent's failures.

        A client cancel ends the run with an error event and returns normally (the work item
        is acked). Cancellation from outside (the worker stopping) propagates, so the item is
        handed to another worker.
        """
        writer = RunEventWriter(self._bus, request, first_seq=first_seq)
        try:
            await self._execute(request, writer, first_seq=first_seq)
        finally:
            await writer.close()

    async def _execute(self, request: RunRequest, writer: RunEventWriter, *, first_seq: int) -> None:
        control = RunControl(request.run_id, owner=request.principal.user_id)
        spec = self._specs.get(request.agent)
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
        scope = self._workspace(request, spec)
        try:
            if not await self._admit(request, session):
                return
            await self._prompt(request, spec=spec, session=session, sink=sink, control=control, scope=scope)
        finally:
            if spec.name == SUBAGENT and scope is not None:
                # An ephemeral workspace ends with its run, however the run ended.
                await asyncio.shield(self._memory.drop_workspace(scope))

    def _workspace(self, request: RunRequest, spec: AgentSpec) -> WorkspaceScope | None:
        """Where this run's plan and files live; None when it has no plan or file tools."""
        if spec.name == SUBAGENT:
            return subagent_scope(request)
        harness = self._harness(spec.name)
        if not any(name in MEMORY_TOOL_NAMES for name in harness.tools):
            return None
        # A run without a conversation (e.g. a bare gRPC call) has a workspace of its own.
        conversation = request.conversation_id or request.session_id or request.run_id
        return harness.scope(spec.name, conversation)

    async def _prompt(
        self,
        request: RunRequest,
        *,
        spec: AgentSpec,
        session: StreamingSession,
        sink: RunSink,
        control: RunControl,
        scope: WorkspaceScope | None,
    ) -> None:
        harness = self._harness(spec.name)
        tools: Mapping[str, ToolSpec] = self._tools[spec.name]
        local: dict[str, LocalTool] = {}
        if harness.tools.keys() & {"delegate_task", "task"}:
            delegation = Delegation(self._bus, request, session.emit, fleet=spec.fleet, memory=self._memory)
            local = {"delegate_task": delegation.delegate_task, "task": delegation.task}
            local = {name: handler for name, handler in local.items() if name in harness.tools}
        gateway = ToolGateway(
            bus=self._bus,
            run=request,
            emit=session.emit,
            tools=tools,
            control=control,
            governance_timeout=self._options.governance_timeout,
            approval_timeout=self._options.approval_timeout,
            workspace=scope,
            memory_tools=frozenset(name for name in harness.tools if name in MEMORY_TOOL_NAMES),
            local_tools=local,
            offload_threshold=self._options.offload_threshold,
            offload=scope is not None and harness.has_files,
        )

        async def stream(target: StreamingSession, message: str) -> None:
            await self._pipeline.stream(
                spec=spec,
                run=request,
                session=target,
                sink=sink,
                gateway=gateway,
                tools=tools,
                message=message,
                harness=harness,
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
            # A check is safe to repeat: a broker restart within the timeout costs a moment, not the run.
            decision = await request_retrying(
                self._bus,
                subjects.governance("admit"),
                admit,
                Decision,
                deadline=self._options.governance_timeout,
                headers=headers,
            )
        except BusError as exc:
            log.warning("run %s: governance did not answer admission (%s); refusing", request.run_id, exc)
            await session.error(
                "Request denied: governance is unavailable (fail-closed)", code="governance.unavailable"
            )
            return False
        if not decision.allowed:
            policy = decision.policy or "default"
            # The policy and reason ride along as details, so whoever follows the run (a parent's
            # `task` tool) can word the denial without parsing the message.
            denied = Error(
                code="governance.denied",
                message=f"Request denied by policy {policy}: {decision.reason}",
                details={"policy": policy, "reason": decision.reason},
            )
            await session.emit(RunEvent(error=denied))
            return False
        return True
