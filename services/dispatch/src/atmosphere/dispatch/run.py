"""One run in dispatch: its named steps from admission to the recorded turn.

`RunExecutor` makes a `Run` for each `RunSubmission` a worker takes for an agent it serves; the
run lives until its terminal event. Reading `Run.execute` top to bottom is reading a run's life:

1. `execute`: the resumed marker of a re-driven run, the run's control subject, the agent task;
2. `admit`: governance admission (fail-closed);
3. `prompt`: the agent's `@prompt` method, or the default loop (`stream(message)`) — or, for a
   run of one tool call and no model (`direct_call`: an app tool a door exposes), `call_directly`;
4. `stream`: one model exchange — the model request (`ModelRequests`: history, interceptors,
   recalled facts, or the journal's seed), `call_model` (the runtime under the budget's wall
   clock), the turn recorded just before the terminal event, the interceptors' `post_process`;
5. `finish`: `complete`, or the cancel's error, unless a terminal event was already written.

What the run is given is fixed in its `RunScope`; how it survives its worker (nothing, its
journal, or a replay of it) is its `Durability`, chosen once. Every event passes `emit`, the
one writer (`EventOutput`): it keeps the terminal event write-once, runs the terminal sequence
(`_before_terminal`: the turn recorded, the run's end reported) before the terminal event goes
out, captures the answer's text and counts usage against the budget. Every tool call passes
`call_tool` (the `ToolGateway`) and every model exchange `call_model`: the two places an effect
journal records or replays (issue 11).

The user's `StreamingSession` is a thin front over the run (the run is its `SessionHost`): its
methods build events and hand them to `emit`, and `session.stream()` is `Run.stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import replace

from atmosphere.bus.errors import (
    AgentFailedError,
    BusError,
    HistoryUnavailableError,
    InterceptorFailedError,
    RunCancelledError,
    RuntimeFailedError,
    RuntimeUnavailableError,
    ServiceError,
    UnknownAgentError,
    broker_failure,
)
from atmosphere.bus.runs import RESUMED_METADATA_KEY, WORKER_FIRST_SEQ
from atmosphere.bus.sizes import data_budget
from atmosphere.contracts.governance.v1.governance_pb2 import Decision
from atmosphere.contracts.run.v1.run_pb2 import Complete, Metadata, RunEvent, RunSubmission
from atmosphere.dispatch.budget import BudgetMeter, budget_breach
from atmosphere.dispatch.client_exchange import NO_EXCHANGE, ClientExchange, client_exchange_of
from atmosphere.dispatch.client_turns import client_turns_of
from atmosphere.dispatch.control import RunControl
from atmosphere.dispatch.delta_coalescer import CoalescedEvents
from atmosphere.dispatch.direct_call import call_directly, is_direct_call, rewrite_refusal
from atmosphere.dispatch.durability import Durability, EventSink, Live
from atmosphere.dispatch.effects import RunEffects
from atmosphere.dispatch.event_output import EventOutput
from atmosphere.dispatch.model_request import ModelRequests
from atmosphere.dispatch.output_guard import OutputGuard
from atmosphere.dispatch.resume import DeliveredEvents
from atmosphere.dispatch.run_input import input_event
from atmosphere.dispatch.run_scope import ExecutorOptions, RunScope, RunServices
from atmosphere.dispatch.run_telemetry import RunTelemetry
from atmosphere.dispatch.run_tools import tool_gateway
from atmosphere.dispatch.sandbox_tools import tool_loop_for
from atmosphere.dispatch.turns import Turns
from atmosphere.sdk import AiRequest, StreamingSession
from atmosphere.sdk.host import AiCapability, BudgetReason
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, ToolCallRequest

log = logging.getLogger("atmosphere.dispatch")

__all__ = ["Run", "end_unknown_agent", "report_end"]

CLIENT_TOOLS_UNSUPPORTED = (
    "The runtime '{runtime}' cannot offer a caller's own functions or answer format "
    "(it lacks CLIENT_TOOLS); the built-in runtime can"
)


def _resumed(first_seq: int) -> RunEvent:
    """The marker a re-driven run's stream goes on with."""
    return RunEvent(metadata=Metadata(key=RESUMED_METADATA_KEY, value_json=json.dumps({"fromSeq": first_seq})))


def _coalesced(durability: Durability, sink: EventSink, options: ExecutorOptions) -> EventSink:
    """`sink` joining the run's text deltas within the configured window (a replay's capture never)."""
    if not durability.reaches_services or options.text_delta_window <= 0:
        return sink
    return CoalescedEvents(sink, window=options.text_delta_window, max_chars=options.text_delta_max_chars)


class Run:
    """One run of a served agent: its control, event output, tools, and its steps."""

    def __init__(
        self,
        scope: RunScope,
        durability: Durability | None = None,
        *,
        first_seq: int = WORKER_FIRST_SEQ,
        delivered: DeliveredEvents | None = None,
    ) -> None:
        """Run `scope`'s request under `durability` (by default `Live`), writing events from `first_seq`.

        A re-driven run brings what its stream already holds (`delivered`, never sent again).
        """
        self.scope = scope
        self.durability = durability = durability or Live()
        self.first_seq = first_seq
        request = scope.request
        self.control = RunControl(request.run_id, owner=request.principal.user_id)
        self.effects = durability.effects(scope)
        budget = scope.spec.budget
        self.telemetry = RunTelemetry.of(scope)  # its metrics and spans; `execute` runs in its span
        self.output = EventOutput(
            request.run_id,
            _coalesced(durability, durability.sink(scope.services.bus, request, first_seq), scope.services.options),
            before_terminal=self._before_terminal if durability.reaches_services else None,
            stop=self._stop_model_call,
            meter=BudgetMeter(budget) if budget and budget.enforced else None,
            delivered=delivered,
            fence=durability.fence(self._stop_model_call),
            observer=self.telemetry,
        )
        self.emit = self.output.emit
        """Write an event (`EventOutput.emit`): the session's, the gateway's and the steps' one way out."""
        self.fail = self.output.fail
        """End the run with an error as its terminal event."""
        self.session = StreamingSession(
            self, run_id=request.run_id, session_id=request.session_id, conversation_id=request.conversation_id
        )
        self.exchange = client_exchange_of(request, reserved=scope.agent.tools.keys())
        """What the caller brought besides its messages (an OpenAI door as a model gateway)."""
        self.gateway = tool_gateway(scope, self.emit, self.control, self.effects, client_tools=self.exchange.tools)
        self.requests = ModelRequests(scope, self.journaled_rounds)
        self.turns = Turns(scope, durability, self.output)
        self._model_call: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        """Whether the terminal event was written."""
        return self.output.closed

    @property
    def dropped(self) -> int:
        """How many events arrived after the terminal one and were dropped."""
        return self.output.dropped

    @property
    def journaled_rounds(self) -> RunEffects | None:
        """The handles of a run whose inputs and model rounds are journaled (durable, or a replay)."""
        effects = self.effects
        return None if effects is None or effects.tools_only else effects

    # -- the run's life ----------------------------------------------------------------------

    async def execute(self) -> None:
        """Run to exactly one terminal event; never raises for the agent's failures.

        A client cancel ends the run with an error event and returns normally (the work item
        is acked). Cancellation from outside (the worker stopping) propagates, so the item is
        handed to another worker.
        """
        try:
            if self.first_seq > WORKER_FIRST_SEQ:
                await self.emit(_resumed(self.first_seq))
            async with self.durability.serving(self.scope.services.bus, self.control):
                await self._until_done_or_cancelled()
            await self.finish()
            await self.durability.close(succeeded=self.output.succeeded, retain=self.scope.settings.retain_on_success)
        finally:
            await self.output.sink.close()

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
        scope = self.scope
        try:
            # A replay was admitted when the run ran: it does nothing new.
            if not self.durability.reaches_services or await self.admit():
                await (self.call_directly() if is_direct_call(scope.request) else self.prompt())
        finally:
            if scope.is_subagent and scope.workspace is not None:
                await asyncio.shield(scope.services.memory.drop_workspace(scope.workspace))

    async def admit(self) -> bool:
        """Governance admission; a refusal (or no answer: fail-closed) ends the run."""
        run = self.scope.request
        try:
            decision = await self.scope.services.governance.admission(run)
        except ServiceError as refused:
            await self.fail(refused)
            return False
        refusal = rewrite_refusal(run, decision)
        if refusal is not None:
            await self.fail(refusal)
            return False
        # A policy may rewrite the message (PII redaction): the run goes on with its version.
        run.message = decision.rewritten_message or run.message
        if decision.check_output:
            self.output.guard = OutputGuard(self._check_output, run_id=run.run_id)
        return True

    async def _check_output(self, tail: str, length: int, final: bool) -> Decision:
        return await self.scope.services.governance.check_output(self.scope.request, tail, length=length, final=final)

    async def prompt(self) -> None:
        """The agent's `@prompt` method, or the default loop; a failure ends the run as `agent.failed`."""
        spec, run = self.scope.spec, self.scope.request
        try:
            if spec.prompt_method is None:
                await self.stream(run.message)
            else:
                await getattr(self.scope.agent.instance, spec.prompt_method)(run.message, self.session)
        except BusError as exc:
            log.exception("agent %s failed on run %s: the broker", spec.name, run.run_id)
            await self.fail(broker_failure(exc))
        except Exception as exc:
            log.exception("agent %s failed on run %s", spec.name, run.run_id)
            # The client learns what kind of failure of the agent's own code it was, never the traceback.
            await self.fail(AgentFailedError(type(exc).__name__))

    async def call_directly(self) -> None:
        """A run of one tool call and no model (`direct_call`): the agent's `@prompt` does not run."""
        await call_directly(self.scope, self.gateway, self.output, self.durability)

    async def finish(self) -> None:
        """End a run its agent left open: `complete`, or the cancel's error."""
        if self.output.closed:
            return
        if self.control.cancelled:
            await self.fail(RunCancelledError(f"Run cancelled: {self.control.cancel_reason}"))
        else:
            await self.emit(RunEvent(complete=Complete()))

    # -- one model exchange (`session.stream`) -----------------------------------------------

    async def stream(self, message: str) -> None:
        """Answer `message` with the agent's model, its tools and policies, to a terminal event."""
        scope = self.scope
        runtime = scope.services.model_side.runtime
        if runtime is None:
            await self.fail(RuntimeUnavailableError(scope.services.model_side.unavailable))
            return
        client = client_turns_of(scope.request)
        exchange = self.exchange
        if exchange is not NO_EXCHANGE and AiCapability.CLIENT_TOOLS not in runtime.capabilities():
            await self.fail(RuntimeUnavailableError(CLIENT_TOOLS_UNSUPPORTED.format(runtime=runtime.name)))
            return
        try:
            request = await self.requests.next(message, client)
        except (HistoryUnavailableError, InterceptorFailedError) as exc:  # never answered as if new
            await self.fail(exc)
            return
        if exchange is not NO_EXCHANGE:
            request = replace(request, continuation=exchange.continuation, answer_format=exchange.answer_format)
        await self.emit(input_event(request, limit=data_budget(scope.services.bus.max_payload)))
        model = request.model or runtime.config.model
        turn = self.turns.begin(message, model=model, client_kept=client.keeps_conversation)
        handed_over = False
        self.telemetry.prompted()
        try:
            await self.call_model(runtime, self._context(request, exchange))
        except asyncio.CancelledError:
            # The worker is stopping and another takes the run over: that one records the turn.
            handed_over = not self.control.cancelled
            raise
        finally:
            self.turns.current = None
            if not turn.recorded and not handed_over:
                await asyncio.shield(self.turns.record(turn, None))
        if not self.output.breached and self.output.closed and self.durability.reaches_services:
            await self._post_process(request)

    def _context(self, request: AiRequest, exchange: ClientExchange) -> AgentExecutionContext:
        scope = self.scope
        spec, tools = scope.spec, scope.agent.tools
        return AgentExecutionContext(
            run_id=scope.request.run_id,
            agent=spec.name,
            conversation_id=scope.request.conversation_id,
            request=request,
            tools=tuple(tools.values()),
            store_tools=tuple(scope.agent.harness.store_tools.values()),
            run_tool=self.call_tool,
            tool_loop=tool_loop_for(spec.tool_loop, tools),
            retry=spec.retry,
            structured_output_retries=spec.structured_output_retries,
            native=spec.hosted_object(),
            rounds=self.journaled_rounds,
            client_tools=exchange.tools,
            tool_choice=exchange.tool_choice,
            pass_to_client=self.gateway.pass_to_client if exchange.tools else None,
            listeners=(*scope.services.options.listeners, self.telemetry.model_listener()),
        )

    async def call_model(self, runtime: AgentRuntime, ctx: AgentExecutionContext) -> None:
        """`runtime` answers `ctx`, within the budget's wall clock; its failure ends the run."""
        budget = self.scope.spec.budget
        deadline = budget.max_wall_clock if budget is not None and budget.max_wall_clock else None
        started = time.monotonic()
        task = self._model_call = asyncio.create_task(runtime.execute(ctx, self.session))
        try:
            done, _ = await asyncio.wait({task}, timeout=deadline if deadline and deadline > 0 else None)
            if not done and deadline is not None:
                task.cancel()
                elapsed_ms = round((time.monotonic() - started) * 1000)
                await self.output.trip(budget_breach(BudgetReason.WALL_CLOCK, elapsed_ms, deadline * 1000))
                return
            if self.durability.lost:
                # Another worker took the run over (the call was stopped, or a tool's start marker
                # was refused): nothing more is this worker's to say, its failure included.
                if not task.cancelled():
                    task.exception()  # retrieved, so never reported as unretrieved
                return
            if task.cancelled():
                if not self.output.breached:
                    raise asyncio.CancelledError
                return
            await self._settle_model_call(runtime, ctx, task.exception())
        finally:
            self._model_call = None
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _settle_model_call(
        self, runtime: AgentRuntime, ctx: AgentExecutionContext, error: BaseException | None
    ) -> None:
        """End the exchange the runtime finished: `complete` unless ended already, or its failure."""
        if isinstance(error, ServiceError):  # e.g. the journal's effect bound: the run ends with it
            await self.fail(error)
        elif isinstance(error, BusError):
            log.error("runtime %s failed on run %s", runtime.name, ctx.run_id, exc_info=error)
            await self.fail(broker_failure(error))
        elif error is not None:
            log.error("runtime %s failed on run %s", runtime.name, ctx.run_id, exc_info=error)
            await self.fail(RuntimeFailedError("The model runtime failed unexpectedly (dispatch's log says why)"))
        elif not self.output.closed:
            await self.emit(RunEvent(complete=Complete()))

    def _stop_model_call(self) -> None:
        if self._model_call is not None:
            self._model_call.cancel()

    async def call_tool(self, call: ToolCallRequest) -> str:
        """One tool call of the model, through the governed choke point; the text the model gets."""
        return await self.telemetry.tool_call(call, self.gateway.run_tool)

    async def _post_process(self, request: AiRequest) -> None:
        text = "".join(self.output.answer)
        for interceptor in reversed(self.scope.spec.interceptors):
            try:
                await interceptor.post_process(request, text)
            except Exception:
                log.exception(
                    "interceptor %s post_process failed on run %s",
                    type(interceptor).__name__,
                    self.scope.request.run_id,
                )

    # -- the terminal sequence ---------------------------------------------------------------

    async def _before_terminal(self, terminal: RunEvent) -> None:
        """Just before the terminal event goes out: the turn recorded, the run's end reported, sessions released."""
        # So the next turn of this conversation (or a fact extraction) finds this one stored.
        await self.turns.before_terminal(terminal)
        # So a client that starts its next run on seeing this one end finds the cost accounted
        # (a tenant's ceiling stops that next run).
        await report_end(self.scope, self.output)
        await self.gateway.release_sessions()


async def report_end(scope: RunScope, output: EventOutput) -> None:
    """Tell governance the run ended (its cost, its answer's length); never fails the run."""
    await scope.services.governance.run_ended(
        scope.request,
        usage=output.usage,
        model=scope.model or "",
        response_chars=sum(len(piece) for piece in output.answer),
        succeeded=output.succeeded,
    )


async def end_unknown_agent(
    request: RunSubmission,
    services: RunServices,
    durability: Durability | None = None,
    *,
    first_seq: int = WORKER_FIRST_SEQ,
    delivered: DeliveredEvents | None = None,
) -> None:
    """End a run for an agent this worker does not serve: one `UnknownAgentError`, nothing else run."""
    durability = durability or Live()
    output = EventOutput(
        request.run_id,
        durability.sink(services.bus, request, first_seq),
        before_terminal=None,
        stop=lambda: None,
        delivered=delivered,
        fence=durability.fence(lambda: None),
    )
    try:
        if first_seq > WORKER_FIRST_SEQ:
            await output.emit(_resumed(first_seq))
        await output.fail(UnknownAgentError(f"Unknown agent '{request.agent}'"))
        await durability.close(succeeded=False, retain=services.options.retain_on_success)
    finally:
        await output.sink.close()
