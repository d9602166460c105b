"""One run in dispatch: everything it has, and its named steps from admission to the recorded turn.

`RunExecutor` makes a `Run` for each `RunSubmission` a worker takes; the run lives until its
terminal event. Reading `Run.execute` top to bottom is reading a run's life:

1. `execute`: the resumed marker of a re-driven run, the run's control subject, the agent task;
2. `admit`: governance admission (fail-closed);
3. `prompt`: the agent's `@prompt` method, or the default loop (`stream(message)`);
4. `stream`: one model exchange — the history, the model request (interceptors, recalled
   facts), `call_model` (the runtime under the budget's wall clock), the turn recorded just
   before the terminal event, the interceptors' `post_process`;
5. `finish`: `complete`, or the cancel's error, unless a terminal event was already written.

Every event passes `emit`, the one writer: it keeps the terminal event write-once, records the
turn before the terminal event goes out, captures the answer's text and counts usage against
the budget. Every tool call passes `call_tool` and every model exchange `call_model`: the two
places an effect journal records or replays (issue 11).

The user's `StreamingSession` is a thin front over the run (the run is its `SessionHost`): its
methods build events and hand them to `emit`, and `session.stream()` is `Run.stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atmosphere.bus import Bus
from atmosphere.bus.errors import (
    AgentFailedError,
    BudgetExceededError,
    BusError,
    HistoryUnavailableError,
    InterceptorFailedError,
    ResponseBlockedError,
    RunCancelledError,
    RuntimeFailedError,
    RuntimeUnavailableError,
    ServiceError,
    UnknownAgentError,
    broker_failure,
)
from atmosphere.bus.runs import RESUMED_METADATA_KEY, WORKER_FIRST_SEQ, RunEventWriter, TerminalGate, is_terminal
from atmosphere.bus.sizes import data_budget
from atmosphere.contracts.common.v1.common_pb2 import Usage
from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.contracts.journal.v1.journal_pb2 import EffectKind
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, RunSubmission
from atmosphere.contracts.tool.v1.tool_pb2 import WorkspaceScope
from atmosphere.dispatch.budget import BudgetMeter, budget_breach
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.delegation import SUBAGENT, Delegation, subagent_scope
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.governance_client import GovernanceClient
from atmosphere.dispatch.harness import AgentHarness
from atmosphere.dispatch.journal import DEFAULT_MAX_EFFECTS, RunJournal
from atmosphere.dispatch.memory_client import MemoryClient
from atmosphere.dispatch.model_side import NO_RUNTIME, ModelSide, cache_hint, history_of
from atmosphere.dispatch.output_guard import Blocked, OutputGuard
from atmosphere.dispatch.permissions import ToolPermissions, run_mode
from atmosphere.dispatch.resume import CapturedEvents, DeliveredEvents
from atmosphere.dispatch.run_input import input_event, seed_json, seeded
from atmosphere.dispatch.sandbox_tools import tool_loop_for
from atmosphere.dispatch.tools import LocalTool, ToolGateway
from atmosphere.sdk import AiRequest, ChatMessage, PermissionMode, StreamingSession
from atmosphere.sdk.builtin_tools import MEMORY_TOOL_NAMES
from atmosphere.sdk.host import AgentSpec, BudgetReason
from atmosphere.sdk.runtime import AgentExecutionContext, ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.dispatch")

LEASE_CHECK_INTERVAL = 1.0
"""Seconds between a run's checks that no other worker took it over while it writes events. The
first comes this long after the worker took the run: before that nobody else can hold it (a run
is redelivered only after the ack wait, several seconds), so a short run asks nothing."""


@dataclass(frozen=True)
class ExecutorOptions:
    """Timeouts of the governed steps."""

    governance_timeout: float = 5.0
    approval_timeout: float = 300.0
    offload_threshold: int = 8000
    """Tool results longer than this go to the workspace (0 or less: never)."""
    max_deliveries: int = 5
    """A run delivered this many times is ended with an error instead of run again (a durable
    run: this many deliveries in a row that committed no effect)."""
    durable: bool = False
    """Journal every effect (`ATMOSPHERE_DURABLE_RUNS_ENABLED`): a re-driven run replays them."""
    owner: str = ""
    """Who this worker is, in the journal's leases."""
    max_effects: int = DEFAULT_MAX_EFFECTS
    """A durable run's bound on journaled effects (it fails beyond it)."""
    retain_on_success: bool = False
    """Keep a succeeded run's journal instead of removing it."""
    ack_wait: float = 4.0
    """Seconds without a heartbeat before another worker takes a run over."""
    tool_permissions: ToolPermissions = field(default_factory=ToolPermissions)
    """The operator's `deny`/`confirm` per tool (`ATMOSPHERE_TOOLS__PERMISSIONS`)."""


@dataclass(frozen=True)
class RunServices:
    """What every run of one dispatch process shares: the bus, the model side, other services' clients."""

    bus: Bus
    model_side: ModelSide
    memory: MemoryClient
    governance: GovernanceClient
    options: ExecutorOptions


@dataclass(frozen=True)
class AgentBinding:
    """One served agent: its spec, harness, tools and the instance its `@prompt` runs on."""

    spec: AgentSpec
    harness: AgentHarness
    tools: Mapping[str, ToolSpec]
    instance: Any


@dataclass
class _Turn:
    """The model exchange under way, recorded in memory just before the terminal event."""

    message: str
    model: str | None
    staged: bool
    answer_from: int
    recorded: bool = False


class Run:
    """One run: its request, writer, control, budget, tools and memory hooks, and its steps."""

    def __init__(
        self,
        request: RunSubmission,
        agent: AgentBinding | None,
        services: RunServices,
        *,
        first_seq: int = WORKER_FIRST_SEQ,
        delivered: DeliveredEvents | None = None,
        journal: RunJournal | None = None,
        replay: CapturedEvents | None = None,
        taken_at: float | None = None,
    ) -> None:
        """Run `request` as `agent` (None: no such agent), writing events from `first_seq`.

        A re-driven run brings what its stream already holds (`delivered`, never sent again).
        A run from the work queue has its `journal`: every effect of a durable run (committed
        ones replay), else its tool calls' start markers. A `replay` of an ended run re-drives
        it from its journal alone into that capture: no admission, no memory, no interceptor,
        nothing written to the stream (see `RunExecutor.replay`). `taken_at`: when the worker
        took the run (monotonic), from which its first takeover check is timed.
        """
        self.request = request
        self.agent = agent
        self.services = services
        self.first_seq = first_seq
        self.delivered = delivered
        self.journal = journal
        self.replay = replay
        self.effects = self._effects()
        self.writer: RunEventWriter | CapturedEvents = replay or RunEventWriter(
            services.bus, request, first_seq=first_seq
        )
        self.control = RunControl(request.run_id, owner=request.principal.user_id)
        spec = agent.spec if agent is not None else None
        self.meter = BudgetMeter(spec.budget) if spec is not None and spec.budget and spec.budget.enforced else None
        self.workspace = self._workspace()
        self.session = StreamingSession(
            self, run_id=request.run_id, session_id=request.session_id, conversation_id=request.conversation_id
        )
        self.gateway = self._gateway() if agent is not None else None
        self.answer: list[str] = []
        """The answer's text so far (a sub-agent's forwarded text is not part of it)."""
        self._gate = TerminalGate(request.run_id)
        self._breached = False
        self._turn: _Turn | None = None
        self._model_call: asyncio.Task[None] | None = None
        self.succeeded = False
        """Whether the terminal event was `complete`."""
        self._next_lease_check = (time.monotonic() if taken_at is None else taken_at) + LEASE_CHECK_INTERVAL
        self.guard: OutputGuard | None = None
        """Holds the answer until governance has checked it (set at admission when policies judge answers)."""
        self.usage: list[Usage] = []
        """Every usage event of the run (governance prices them when it ends)."""

    # -- the run's life ----------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to exactly one terminal event; never raises for the agent's failures.

        A client cancel ends the run with an error event and returns normally (the work item
        is acked). Cancellation from outside (the worker stopping) propagates, so the item is
        handed to another worker.
        """
        try:
            if self.first_seq > WORKER_FIRST_SEQ:
                resumed = json.dumps({"fromSeq": self.first_seq})
                await self.emit(RunEvent(metadata=Metadata(key=RESUMED_METADATA_KEY, value_json=resumed)))
            if self.replay is not None:
                await self._until_done_or_cancelled()
            else:
                async with self.services.bus.serve(self.control.router(), max_inflight=4):
                    await self._until_done_or_cancelled()
            await self.finish()
            if self.journal is not None and self.replay is None:
                await self.journal.close(succeeded=self.succeeded, retain=self.services.options.retain_on_success)
        finally:
            await self.writer.close()

    async def _until_done_or_cancelled(self) -> None:
        agent = asyncio.create_task(self.run_agent())
        self.control.on_cancel(agent.cancel)
        try:
            await asyncio.wait({agent})
        finally:
            if not agent.done():
                agent.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await agent
        if agent.cancelled() and not self.control.cancelled:
            raise asyncio.CancelledError

    async def run_agent(self) -> None:
        """Admission, then the prompt; an ephemeral workspace goes with the run however it ends."""
        if self.agent is None:
            await self.fail(UnknownAgentError(f"Unknown agent '{self.request.agent}'"))
            return
        try:
            if await self.admit():
                await self.prompt()
        finally:
            if self.agent.spec.name == SUBAGENT and self.workspace is not None:
                await asyncio.shield(self.services.memory.drop_workspace(self.workspace))

    async def admit(self) -> bool:
        """Governance admission; a refusal (or no answer: fail-closed) ends the run."""
        if self.replay is not None:
            return True  # the run was admitted when it ran; its replay does nothing new
        try:
            decision = await self.services.governance.admission(self.request)
        except ServiceError as refused:
            await self.fail(refused)
            return False
        # A policy may rewrite the message (PII redaction): the run goes on with its version.
        self.request.message = decision.rewritten_message or self.request.message
        if decision.check_output:
            self.guard = OutputGuard(self._check_output, run_id=self.request.run_id)
        return True

    async def _check_output(self, tail: str, length: int, final: bool) -> Decision:
        return await self.services.governance.check_output(self.request, tail, length=length, final=final)

    async def prompt(self) -> None:
        """The agent's `@prompt` method, or the default loop; a failure ends the run as `agent.failed`."""
        assert self.agent is not None
        spec = self.agent.spec
        try:
            if spec.prompt_method is None:
                await self.stream(self.request.message)
            else:
                await getattr(self.agent.instance, spec.prompt_method)(self.request.message, self.session)
        except BusError as exc:
            log.exception("agent %s failed on run %s: the broker", spec.name, self.request.run_id)
            await self.fail(broker_failure(exc))
        except Exception as exc:
            log.exception("agent %s failed on run %s", spec.name, self.request.run_id)
            # The client learns what kind of failure of the agent's own code it was, never the traceback.
            await self.fail(AgentFailedError(type(exc).__name__))

    async def finish(self) -> None:
        """End a run its agent left open: `complete`, or the cancel's error."""
        if self._gate.closed:
            return
        if self.control.cancelled:
            await self.fail(RunCancelledError(f"Run cancelled: {self.control.cancel_reason}"))
        else:
            await self.emit(RunEvent(complete=Complete()))

    # -- one model exchange (`session.stream`) -----------------------------------------------

    async def stream(self, message: str) -> None:
        """Answer `message` with the agent's model, its tools and policies, to a terminal event."""
        assert self.agent is not None
        model_side = self.services.model_side
        if model_side.runtime is None:
            await self.fail(RuntimeUnavailableError(NO_RUNTIME))
            return
        staged = history_of(self.request)
        try:
            request = await self._input(message, staged)
        except HistoryUnavailableError as exc:  # never answered as if the conversation were new
            await self.fail(exc)
            return
        if request is None:
            return
        await self.emit(input_event(request, limit=data_budget(self.services.bus.max_payload)))
        model = request.model or model_side.runtime.config.model
        self._turn = _Turn(message, model=model, staged=bool(staged), answer_from=len(self.answer))
        handed_over = False
        try:
            await self.call_model(self._context(request))
        except asyncio.CancelledError:
            # The worker is stopping and another takes the run over: that one records the turn.
            handed_over = not self.control.cancelled
            raise
        finally:
            turn, self._turn = self._turn, None
            if not turn.recorded and not handed_over:
                await asyncio.shield(self._record(turn, None))
        if not self._breached and self._gate.closed:
            await self._post_process(request)

    async def _input(self, message: str, staged: tuple[ChatMessage, ...]) -> AiRequest | None:
        """What the model is asked: built live, or the journal's seed of it on a resume."""
        effects = self.journaled_rounds
        if effects is None:
            return await self._model_request(message, await self._history(staged))
        key, digest, seed = effects.input()
        if seed is not None:
            with contextlib.suppress(ValueError):  # an unreadable seed is built live again
                return seeded(self._base_request(message, ()), seed.payload)
        await effects.journal.pending(EffectKind.EFFECT_KIND_RUN_INPUT, key, digest)
        request = await self._model_request(message, await self._history(staged))
        if request is not None:
            payload = seed_json(
                request,
                conversation_id=self.request.conversation_id,
                user_id=self.request.principal.user_id,
                path=self.request.path,
                tools_digest=digest,
            )
            await effects.journal.commit(key, payload)
        return request

    async def _history(self, staged: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
        memory = self.services.model_side.conversation
        if memory is None:
            return staged
        assert self.agent is not None
        return await memory.history(self.request, self.agent.harness, staged)

    async def _model_request(self, message: str, history: tuple[ChatMessage, ...]) -> AiRequest | None:
        """The request the model gets, through the interceptors and recalled facts; None if one failed."""
        assert self.agent is not None
        spec, run = self.agent.spec, self.request
        request = self._base_request(message, history)
        for interceptor in spec.interceptors:
            try:
                request = await interceptor.pre_process(request)
            except Exception:
                log.exception("interceptor %s failed on run %s", type(interceptor).__name__, run.run_id)
                await self.fail(InterceptorFailedError(f"Interceptor {type(interceptor).__name__} failed"))
                return None
        memory = self.services.model_side.conversation
        if memory is not None:
            # The harness's long-term memory runs after the user's interceptors, as Atmosphere's does.
            request = await memory.recall(run, self.agent.harness, request)
        return request

    def _base_request(self, message: str, history: tuple[ChatMessage, ...]) -> AiRequest:
        """The agent's request for `message` before interceptors and recalled facts."""
        assert self.agent is not None
        spec, run = self.agent.spec, self.request
        return AiRequest(
            message=message,
            system_prompt=spec.system_prompt,
            history=history,
            model=spec.model,
            metadata=dict(run.metadata),
            response_format=spec.response_format,
            cache_hint=cache_hint(spec, self.agent.harness, run),
        )

    def _context(self, request: AiRequest) -> AgentExecutionContext:
        assert self.agent is not None
        spec = self.agent.spec
        return AgentExecutionContext(
            run_id=self.request.run_id,
            agent=spec.name,
            conversation_id=self.request.conversation_id,
            request=request,
            tools=tuple(self.agent.tools.values()),
            run_tool=self.call_tool,
            tool_loop=tool_loop_for(spec.tool_loop, self.agent.tools),
            retry=spec.retry,
            structured_output_retries=spec.structured_output_retries,
            rounds=self.journaled_rounds,
        )

    async def call_model(self, ctx: AgentExecutionContext) -> None:
        """The runtime answers `ctx`, within the budget's wall clock; its failure ends the run."""
        runtime = self.services.model_side.runtime
        assert runtime is not None
        assert self.agent is not None
        budget = self.agent.spec.budget
        deadline = budget.max_wall_clock if budget is not None and budget.max_wall_clock else None
        started = time.monotonic()
        task = self._model_call = asyncio.create_task(runtime.execute(ctx, self.session))
        try:
            done, _ = await asyncio.wait({task}, timeout=deadline if deadline and deadline > 0 else None)
            if not done:
                assert deadline is not None
                task.cancel()
                elapsed_ms = round((time.monotonic() - started) * 1000)
                await self._trip(budget_breach(BudgetReason.WALL_CLOCK, elapsed_ms, deadline * 1000))
                return
            if self.lost:
                # Another worker took the run over (the call was stopped, or a tool's start marker
                # was refused): nothing more is this worker's to say, its failure included.
                if not task.cancelled():
                    task.exception()  # retrieved, so never reported as unretrieved
                return
            if task.cancelled():
                if not self._breached:
                    raise asyncio.CancelledError
                return
            error = task.exception()
            if isinstance(error, ServiceError):  # e.g. the journal's effect bound: the run ends with it
                await self.fail(error)
                return
            if error is not None:
                log.error("runtime %s failed on run %s", runtime.name, ctx.run_id, exc_info=error)
                if isinstance(error, BusError):
                    await self.fail(broker_failure(error))
                else:
                    await self.fail(
                        RuntimeFailedError("The model runtime failed unexpectedly (dispatch's log says why)")
                    )
                return
            if not self._gate.closed:
                await self.emit(RunEvent(complete=Complete()))
        finally:
            self._model_call = None
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def call_tool(self, call: ToolCallRequest) -> str:
        """One tool call of the model, through the governed choke point; the text the model gets."""
        assert self.gateway is not None
        return await self.gateway.run_tool(call)

    async def _post_process(self, request: AiRequest) -> None:
        assert self.agent is not None
        if self.replay is not None:
            return
        text = "".join(self.answer)
        for interceptor in reversed(self.agent.spec.interceptors):
            try:
                await interceptor.post_process(request, text)
            except Exception:
                log.exception(
                    "interceptor %s post_process failed on run %s", type(interceptor).__name__, self.request.run_id
                )

    async def _record(self, turn: _Turn, terminal: RunEvent | None) -> None:
        """Store the turn: on complete the user message and the answer, otherwise the message only."""
        turn.recorded = True
        memory = self.services.model_side.conversation
        if memory is None or self.agent is None or self.replay is not None or self.lost:
            return  # a run another worker took over is that worker's to record
        completed = terminal is not None and terminal.WhichOneof("kind") == "complete"
        await memory.record(
            self.request,
            self.agent.harness,
            user=turn.message,
            answer="".join(self.answer[turn.answer_from :]) if completed else None,
            model=turn.model,
            staged=turn.staged,
        )

    # -- the one event path (the session's host) ---------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the terminal event was written."""
        return self._gate.closed

    @property
    def dropped(self) -> int:
        """How many events arrived after the terminal one and were dropped."""
        return self._gate.dropped

    async def emit(self, event: RunEvent) -> None:
        """Write `event` — the answer's text once governance has seen it (`guard`), see `_write`."""
        guard = self.guard
        if guard is None or self._gate.closed or event.origin_run_id:
            await self._write(event)
            return
        kind = event.WhichOneof("kind")
        try:
            if kind == "text_delta":
                released = await guard.text(event)
            elif kind == "text_complete":
                await guard.whole_text(event.text_complete.full_text)
                released = []
            elif kind == "error":
                # The run fails anyway: held text nobody checked is dropped, never sent unchecked.
                guard.discard()
                released = []
            else:
                released = await guard.before(final=kind == "complete")
        except Blocked as blocked:
            await self._block(blocked)
            return
        for piece in released:
            await self._write(piece)
        if kind != "text_delta":
            await self._write(event)

    async def _block(self, blocked: Blocked) -> None:
        """End the run with `Response blocked: …`; nothing of the answer after it goes anywhere."""
        assert self.guard is not None
        self.guard.discard()
        details = {"policy": blocked.policy, "reason": blocked.detail} if blocked.policy else {}
        self._breached = True  # no post-processing of an answer the client never got
        await self.fail(ResponseBlockedError(blocked.reason, details=details))
        if self._model_call is not None:
            self._model_call.cancel()

    async def _write(self, event: RunEvent) -> None:
        """Write `event`: the terminal one once, the turn recorded and the run's end reported before it.

        A re-driven run holds back what its stream already has (`delivered`); a run another
        worker took over writes nothing more.
        """
        if self.journal is not None and not await self._still_held():
            return
        if not self._gate.admit(event):
            return
        kind = event.WhichOneof("kind")
        if is_terminal(event):
            self.succeeded = kind == "complete"
            if self._turn is not None and not self._turn.recorded:
                # Before the terminal event goes out, so the next turn of this conversation (or
                # a fact extraction) finds this one stored.
                await self._record(self._turn, event)
            # Before it too: a client that starts its next run on seeing this one end finds the
            # cost accounted (a tenant's ceiling stops that next run).
            await self._report_end()
            if self.gateway is not None and self.replay is None:
                await self.gateway.release_sessions()
        for outgoing in [event] if self.delivered is None else self.delivered.admit(event):
            await self.writer.emit(outgoing)
        if kind == "text_delta" and not event.origin_run_id:  # a sub-agent's text is not the answer
            self.answer.append(event.text_delta.text)
        elif kind == "usage":
            self.usage.append(event.usage)
            await self._count(event)

    async def _report_end(self) -> None:
        """Tell governance the run ended (its cost, its answer's length); never fails the run."""
        if self.replay is not None or self.agent is None:
            return
        await self.services.governance.run_ended(
            self.request,
            usage=self.usage,
            model=self.agent.spec.model or self.services.model_side.model or "",
            response_chars=sum(len(piece) for piece in self.answer),
            succeeded=self.succeeded,
        )

    async def _still_held(self) -> bool:
        """Whether this worker still holds the run (its journal asked at most once a second).

        Once it does not, the model call under way is stopped: nothing it would say or call is
        this worker's any more.
        """
        assert self.journal is not None
        if self.journal.lost:
            return False
        now = time.monotonic()
        if self.replay is None and now >= self._next_lease_check:
            self._next_lease_check = now + LEASE_CHECK_INTERVAL
            if not await self.journal.still_held():
                if self._model_call is not None:
                    self._model_call.cancel()
                return False
        return True

    @property
    def lost(self) -> bool:
        """Whether another worker took the run over: this one writes, calls and records nothing more."""
        return self.journal is not None and self.journal.lost

    async def fail(self, error: ServiceError) -> None:
        """End the run with `error` as its terminal event."""
        await self.emit(RunEvent(error=error.to_proto()))

    async def _count(self, event: RunEvent) -> None:
        if self.meter is None or self._breached:
            return
        breach = self.meter.add(event.usage)
        if breach is not None:
            await self._trip(breach)

    async def _trip(self, breach: BudgetExceededError) -> None:
        """End the run with the budget's error and stop the model call under way."""
        self._breached = True
        await self.fail(breach)
        if self._model_call is not None:
            self._model_call.cancel()

    # -- what the run is given ---------------------------------------------------------------

    def _effects(self) -> RunEffects | None:
        """The journal's handles for this run's effects; None for a run without a journal.

        A durable run (or a replay) journals every effect; any other only its tool calls' starts.
        """
        if self.journal is None or self.agent is None:
            return None
        return RunEffects(
            self.journal,
            user_id=self.request.principal.user_id,
            model=self.agent.spec.model or self.services.model_side.model,
            tool_names=self.agent.tools,
            tools_only=not (self.services.options.durable or self.replay is not None),
        )

    @property
    def journaled_rounds(self) -> RunEffects | None:
        """The handles of a run whose inputs and model rounds are journaled (durable, or a replay)."""
        effects = self.effects
        return None if effects is None or effects.tools_only else effects

    def _workspace(self) -> WorkspaceScope | None:
        """Where this run's plan and files live; None when it has no plan or file tools."""
        if self.agent is None:
            return None
        if self.agent.spec.name == SUBAGENT:
            return subagent_scope(self.request)
        harness = self.agent.harness
        if not any(name in MEMORY_TOOL_NAMES for name in harness.tools):
            return None
        # A run without a conversation (e.g. a bare gRPC call) has a workspace of its own.
        run = self.request
        return harness.scope(self.agent.spec.name, run.conversation_id or run.session_id or run.run_id)

    def _gateway(self) -> ToolGateway:
        assert self.agent is not None
        harness, options = self.agent.harness, self.services.options
        return ToolGateway(
            bus=self.services.bus,
            run=self.request,
            emit=self.emit,
            tools=self.agent.tools,
            control=self.control,
            governance=self.services.governance,
            approval_timeout=options.approval_timeout,
            workspace=self.workspace,
            memory_tools=frozenset(name for name in harness.tools if name in MEMORY_TOOL_NAMES),
            local_tools=self._delegation_tools(),
            offload_threshold=options.offload_threshold,
            offload=self.workspace is not None and harness.has_files,
            effects=self.effects,
            permission_mode=run_mode(self.agent.spec.permission_mode, self.request),
            permissions=options.tool_permissions,
            # Only the agent's own tools declare roles (a harness tool of the same name replaced it).
            tool_roles={t.name: t.roles for t in self.agent.spec.tools if t.roles and t.name not in harness.tools},
        )

    def _delegation_tools(self) -> dict[str, LocalTool]:
        assert self.agent is not None
        harness = self.agent.harness
        if not harness.tools.keys() & {"delegate_task", "task"}:
            return {}
        mode = run_mode(self.agent.spec.permission_mode, self.request)
        delegation = Delegation(
            self.services.bus,
            self.request,
            self.emit,
            fleet=self.agent.spec.fleet,
            memory=self.services.memory,
            # Only a stricter mode travels (PLAN, DENY_ALL): a looser one would be ignored anyway.
            permission_mode=mode.name if PermissionMode.DEFAULT.stricter(mode) is not PermissionMode.DEFAULT else "",
        )
        local: dict[str, LocalTool] = {"delegate_task": delegation.delegate_task, "task": delegation.task}
        return {name: handler for name, handler in local.items() if name in harness.tools}
