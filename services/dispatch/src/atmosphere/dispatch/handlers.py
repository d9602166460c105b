"""Taking runs off the work queue: redelivery, the poison-run guard, and one `Run` per request."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping

from atmosphere.bus import Bus, Nak, Term, WorkItem, subjects
from atmosphere.bus.errors import RunAbandonedError
from atmosphere.bus.runs import (
    EVENT_LOST_METADATA_KEY,
    WORKER_FIRST_SEQ,
    RunEventWriter,
    is_terminal,
    stored_events,
)
from atmosphere.bus.telemetry import bind_run
from atmosphere.contracts.dispatch.v1.dispatch_pb2 import AgentDescriptor
from atmosphere.contracts.run.v1.run_pb2 import Metadata, RunEvent, RunSubmission
from atmosphere.dispatch import metrics
from atmosphere.dispatch.delegation import SUBAGENT, SUBAGENT_SYSTEM_PROMPT
from atmosphere.dispatch.durability import Durability, Journaled, Live, Replaying
from atmosphere.dispatch.event_output import log_failed
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.harness import AgentHarness, subagent_harness
from atmosphere.dispatch.interrupted import interrupted_error, started_calls
from atmosphere.dispatch.journal import AtEnd, RunJournal, discard_journal
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.model_side import ModelSide
from atmosphere.dispatch.resume import CapturedEvents, DeliveredEvents
from atmosphere.dispatch.run import Run, end_unknown_agent
from atmosphere.dispatch.run_scope import AgentBinding, ExecutorOptions, RunScope, RunServices
from atmosphere.dispatch.sandbox_tools import SandboxTools, mcp_tools_of, with_sandbox_tools
from atmosphere.sdk import App
from atmosphere.sdk.errors import UserError
from atmosphere.sdk.host import AgentSpec, mcp_governed_name
from atmosphere.sdk.runtime import AgentRuntime, ToolSpec

log = logging.getLogger("atmosphere.dispatch")


def agent_descriptors(
    app: App,
    model_side: ModelSide,
    harnesses: Mapping[str, AgentHarness] | None = None,
    *,
    pool: str = "",
    runtime_state: str = "",
) -> list[AgentDescriptor]:
    """The descriptors dispatch publishes to `ATMO_AGENTS`: what it serves (in `pool`), with runtime truth."""
    runtime = model_side.runtime
    capabilities = sorted(c.value for c in runtime.capabilities()) if runtime is not None else []
    harnesses = harnesses or {}
    descriptors = []
    for spec in app.agents.values():
        harness = harnesses.get(spec.name, AgentHarness())
        own = [t.name for t in spec.tools] + [t.name for t in hosted_tools(spec, runtime)]
        descriptors.append(
            AgentDescriptor(
                name=spec.name,
                path=spec.path,
                kind=spec.kind,
                description=spec.description,
                runtime=runtime.name if runtime is not None else "",
                capabilities=capabilities,
                tools=own + [n for n in harness.tools if n not in own],
                app_tools=[t.name for t in spec.tools if t.name not in harness.tools],
                harness=harness.attached(),
                workspace=harness.scope("", "") if harness.workspace_tools else None,
                pool=pool,
                runtime_state=runtime_state,
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


def hosted_tools(spec: AgentSpec, runtime: AgentRuntime | None) -> tuple[ToolSpec, ...]:
    """The own tools of the framework object `spec` hosts (none for an `@agent` class, or without a runtime).

    An object named by its import path is imported here, by the pool that serves it; one its
    runtime does not host is the app's mistake, said as such (the pool does not start).
    """
    if spec.native is None or runtime is None:
        return ()
    native = spec.hosted_object()
    if not runtime.hosts(native):
        msg = f"hosted agent {spec.name!r}: the {runtime.name} runtime does not host a {type(native).__qualname__}"
        raise UserError(msg)
    return runtime.native_tools(native)


def _binding(spec: AgentSpec, harness: AgentHarness, runtime: AgentRuntime | None) -> AgentBinding:
    tools = {t.name: ToolSpec.of(t) for t in spec.tools} | {t.name: t for t in hosted_tools(spec, runtime)}
    tools |= dict(harness.tools)
    # One instance per agent for the process's lifetime, like an endpoint singleton.
    return AgentBinding(spec=spec, harness=harness, tools=tools, instance=spec.cls())


class RunExecutor:
    """Executes runs: the single place where a run starts, is controlled and ends."""

    def __init__(
        self,
        app: App,
        bus: Bus,
        model_side: ModelSide,
        options: ExecutorOptions | None = None,
        *,
        harnesses: Mapping[str, AgentHarness] | None = None,
    ) -> None:
        """Serve `app`'s agents over `bus`, answering `session.stream()` with `model_side`."""
        self._bus = bus
        self._options = options or ExecutorOptions()
        governance = GovernanceClient(bus, timeout=self._options.governance_timeout)
        self._services = RunServices(bus, model_side, MemoryClient(bus), governance, self._options)
        specs: dict[str, AgentSpec] = {**app.agents, SUBAGENT: SUBAGENT_SPEC}
        harnesses = {**(harnesses or {}), SUBAGENT: subagent_harness()}
        self._agents = {
            name: _binding(spec, harnesses.get(name) or AgentHarness(), model_side.runtime)
            for name, spec in specs.items()
        }
        self._sandbox_tools = SandboxTools(bus, refresh=self._options.sandbox_tools_refresh)
        self._in_hand: dict[str, asyncio.Event] = {}
        """The runs this worker executes now, by id (a redelivery of one waits for it)."""

    async def listed_mcp_tools(self) -> dict[str, list[str]]:
        """Each agent's MCP servers' tools listed now (for its descriptor), by agent."""
        listed = await self._sandbox_tools.mcp_offered()
        return {
            name: sorted(mcp_tools_of(binding.spec, listed))
            for name, binding in self._agents.items()
            if binding.spec.mcp_servers
        }

    async def on_work(self, item: WorkItem[RunSubmission]) -> None:
        """Work-queue entry point: run the request carried by `item`."""
        # As early as possible: how long this worker may have been stalled since it took the
        # item decides when the run first asks whether another worker took it over.
        taken_at = time.monotonic()
        request = item.envelope.message
        try:
            subjects.token(request.run_id, what="run id")
            subjects.token(request.agent, what="agent name")
        except ValueError as exc:
            # No run can come of it (nothing can even be written for it): drop it for good.
            raise Term(f"malformed run request: {exc}") from None
        running = self._in_hand.get(request.run_id)
        if running is not None:
            # Redelivered to the worker that still runs it (its heartbeats did not reach the
            # broker in time, e.g. the broker froze): one execution, kept alive by this delivery too.
            log.warning("run %s redelivered while this worker still runs it; waiting for it", request.run_id)
            await running.wait()
            return
        done = self._in_hand[request.run_id] = asyncio.Event()
        try:
            with bind_run(request.run_id, request.agent):  # every line of its delivery names the run
                await self._run(item, taken_at)
        finally:
            del self._in_hand[request.run_id]
            done.set()

    async def _run(self, item: WorkItem[RunSubmission], taken_at: float) -> None:
        request = item.envelope.message
        first_seq, stored, delivered = WORKER_FIRST_SEQ, None, None
        if item.delivered > 1:
            stored = await self._stored_unless_ended(request)
            if stored is None:
                log.info("run %s redelivered but already ended; acknowledging", request.run_id)
                if self._options.durable:
                    await discard_journal(self._bus, request.run_id)
                return
            first_seq = await self._resume_point(request, stored)
            delivered = DeliveredEvents(request.run_id, stored.values())
        journal = await self._journal(request, item.delivered)
        agent = await self._binding(request.agent)
        if stored is not None and await self._ended_interrupted(request, agent, journal, stored, first_seq):
            return
        attempts = journal.fruitless_deliveries if self._options.durable else item.delivered
        if attempts >= self._options.max_deliveries:
            await self._give_up(request, first_seq, item.delivered)
            await journal.close(succeeded=False)
            return
        if item.delivered > 1:
            metrics.REDELIVERIES.inc()
            if self._options.durable and journal.entries:
                metrics.JOURNAL_RESUMES.inc()  # its committed effects replay instead of running again
            log.info(
                "run %s redelivered (delivery %d); re-driving from seq %d", request.run_id, item.delivered, first_seq
            )
        durability = Journaled(journal, durable=self._options.durable, taken_at=taken_at)
        await self._execute(request, agent, durability, first_seq=first_seq, delivered=delivered)
        if journal.lost:
            # Another worker holds the run now: this delivery's ack must not end its work item.
            raise Nak(delay=self._options.ack_wait)

    async def _journal(self, request: RunSubmission, delivery: int) -> RunJournal:
        """The run's journal, taken for this worker.

        Every effect of a durable run; otherwise only tool calls' start markers, and nothing at
        all is read or written on a first delivery until its first tool call. A redelivery reads
        the journal and appends a lease in either mode: from then on the earlier holder, should
        it only have stalled, can neither start a tool call nor (within a second) write an event.
        """
        if not self._options.durable and delivery == 1:
            return RunJournal.unread(
                self._bus, request.run_id, owner=self._options.owner, max_effects=self._options.max_effects
            )
        return await RunJournal.open(
            self._bus,
            request.run_id,
            owner=self._options.owner,
            delivery=delivery,
            max_effects=self._options.max_effects,
            at_end=AtEnd.PURGE_ON_SUCCESS if self._options.durable else AtEnd.KEEP,
        )

    async def _ended_interrupted(
        self,
        request: RunSubmission,
        agent: AgentBinding | None,
        journal: RunJournal,
        stored: dict[int, RunEvent],
        first_seq: int,
    ) -> bool:
        """End a redelivered run (not durable) whose earlier worker started calls unsafe to repeat.

        Re-driven from its prompt, the run would have the model ask for them again (see
        `interrupted.py`); instead it ends with one `dispatch.run_interrupted` error naming
        them. Whether it ended.
        """
        if self._options.durable:
            return False  # the journal replays the model's rounds: its calls are never chosen anew
        tools = agent.tools if agent is not None else {}
        unsafe = [call for call in started_calls(journal, stored.values()) if not call.may_repeat(tools)]
        if not unsafe:
            return False
        error = interrupted_error(unsafe)
        # Its first worker was admitted and is gone: the run's end frees what admission took.
        await self._services.governance.run_ended(request, usage=[], model="", response_chars=0, succeeded=False)
        await RunEventWriter(self._bus, request, first_seq=first_seq).emit(RunEvent(error=error.to_proto()))
        log_failed(request.run_id, error.code, why="its worker stopped after starting tool calls that must not repeat")
        await journal.close(succeeded=False)
        return True

    async def _stored_unless_ended(self, request: RunSubmission) -> dict[int, RunEvent] | None:
        """Every stored event of a redelivered run by seq, or None if it has its terminal event."""
        # Every stored event, not just the newest: an event resent after a broker restart may
        # be stored behind a later one.
        stored = await stored_events(self._bus, request.run_id)
        if any(is_terminal(event) for event in stored.values()):
            return None
        return stored

    async def _resume_point(self, request: RunSubmission, stored: dict[int, RunEvent]) -> int:
        """The next seq of a redelivered run.

        Seqs below it that the stream lacks (events the dead worker had in flight when the
        broker lost them too) are filled with an `ai.run.event_lost` marker, so that readers
        go on instead of waiting for an event nobody will write.
        """
        holes = [seq for seq in range(WORKER_FIRST_SEQ, max(stored, default=0)) if seq not in stored]
        for seq in holes:
            marker = RunEvent(metadata=Metadata(key=EVENT_LOST_METADATA_KEY, value_json="true"))
            await RunEventWriter(self._bus, request, first_seq=seq).emit(marker, durable=True)
        if holes:
            log.warning("run %s: %d event(s) were lost with their worker; marked %s", request.run_id, len(holes), holes)
        return max(WORKER_FIRST_SEQ, max(stored, default=0) + 1)

    async def _give_up(self, request: RunSubmission, first_seq: int, delivered: int) -> None:
        """End a run that failed or took its worker down on every delivery (poison-run guard)."""
        writer = RunEventWriter(self._bus, request, first_seq=first_seq)
        error = RunAbandonedError(
            f"The run failed on {delivered} attempts and was stopped; send the prompt again",
            details={"deliveries": str(delivered)},
        )
        await writer.emit(RunEvent(error=error.to_proto()))
        why = f"delivery {delivered} of at most {self._options.max_deliveries}"
        log_failed(request.run_id, error.code, level=logging.ERROR, why=why)

    async def replay(self, request: RunSubmission) -> list[RunEvent]:
        """Re-drive an ended run from its journal alone: the events it produces, nothing sent or called.

        Needs the run's journal (a failed run keeps it; a succeeded one with
        `ATMOSPHERE_DURABLE_RUNS_RETAIN_ON_SUCCESS`). Committed model rounds and tool calls
        replay; a step the journal lacks ends the replay with `dispatch.replay_diverged`.
        """
        journal = await RunJournal.read(self._bus, request.run_id)
        capture = CapturedEvents()
        await self._execute(request, await self._binding(request.agent), Replaying(journal, capture))
        return capture.events

    async def execute(self, request: RunSubmission) -> None:
        """Run `request` to exactly one terminal event, not journaled (see `Run.execute`)."""
        await self._execute(request, await self._binding(request.agent), Live())

    async def _execute(
        self,
        request: RunSubmission,
        agent: AgentBinding | None,
        durability: Durability,
        *,
        first_seq: int = WORKER_FIRST_SEQ,
        delivered: DeliveredEvents | None = None,
    ) -> None:
        """Run `request` as `agent` under `durability`; a request for no served agent ends with its error."""
        with bind_run(request.run_id, request.agent):  # its lines and its requests name the run
            if agent is None:
                await end_unknown_agent(request, self._services, durability, first_seq=first_seq, delivered=delivered)
                return
            run = Run(RunScope.of(request, agent, self._services), durability, first_seq=first_seq, delivered=delivered)
            with run.telemetry.running():  # the run's span is the current one of all its steps
                await run.execute()

    async def _binding(self, agent: str) -> AgentBinding | None:
        """The agent's binding, its tools joined by what the sandboxes offer now.

        That is `code_exec` and `eval` when a sandbox serves them, and the tools its MCP servers
        list now (a server that does not answer lists none). Its own tool of the same name wins.
        """
        binding = self._agents.get(agent)
        if binding is None:
            return None
        offered = dict(await self._sandbox_tools.offered())
        mcp: dict[str, ToolSpec] = {}
        if binding.spec.mcp_servers:
            listed = mcp_tools_of(binding.spec, await self._sandbox_tools.mcp_offered())
            mcp = {name: spec for name, spec in listed.items() if name not in binding.tools}
        if not offered and not mcp:
            return binding
        return dataclasses.replace(
            binding,
            tools=with_sandbox_tools(binding.tools, {**offered, **mcp}),
            mcp_tools={name: mcp_governed_name(name) for name in mcp},
        )
