"""`CrewAiEngine`: a run kicked off as a crew, natively async (`Crew.akickoff`), in dispatch's process."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from typing import Any

from crewai import Crew, CrewOutput
from crewai.events.stream_context import add_stream_sink

from atmosphere.runtimes.crewai._bridge import Bridge
from atmosphere.runtimes.crewai._crew import built_crew, hosted_crew, kickoff_inputs, native_tool_specs
from atmosphere.runtimes.crewai._executor import CONVERSATION
from atmosphere.runtimes.crewai._llm import PlatformLLM, ProviderClients
from atmosphere.runtimes.crewai._outcome import NoStructuredOutputError, failure_of
from atmosphere.runtimes.crewai._progress import Forwarder, task_labels
from atmosphere.runtimes.crewai._tools import Gate, Incident, ToolLoop
from atmosphere.sdk import ChatMessage, StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolSpec

DEFAULT_MODEL = "default"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one run kicks off."""

    crew: Crew
    inputs: dict[str, Any] | None
    conversation: tuple[ChatMessage, ...] | None
    """The messages an Atmosphere agent's model is given (None: a hosted crew's own prompts)."""


class CrewAiEngine:
    """What `CrewAiAgentRuntime` runs once an agent needs it: the framework, its client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing CrewAI takes seconds, and every dispatch process
    discovers every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the OpenAI clients are created on first use."""
        self.config = config
        self.clients = ProviderClients(config)

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted crew's own tools (see `CrewAiAgentRuntime.native_tools`)."""
        return native_tool_specs(native)

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        return [model.id async for model in self.clients.async_client.models.list()]

    async def aclose(self) -> None:
        """Close the OpenAI clients' connections."""
        await self.clients.aclose()

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request` (or run the hosted crew), ending `session` with `complete` or `error`.

        Cancelling the task running this stops the crew and closes its model's HTTP streams
        (`Bridge.aclose`) before it returns.
        """
        bridge = Bridge(session, asyncio.get_running_loop())
        try:
            await self._run(ctx, session, bridge)
        finally:
            await bridge.aclose()

    async def _run(self, ctx: AgentExecutionContext, session: StreamingSession, bridge: Bridge) -> None:
        incident = Incident()
        try:
            plan = self._plan(ctx, bridge, incident)
        except Exception as exc:
            await _fail(session, exc)
            return
        tasks = plan.crew.tasks
        forwarder = Forwarder(bridge, task_labels(tasks), str(tasks[-1].id), self._model_name(ctx))
        # The crew runs in a context of its own, which every thread CrewAI starts for it inherits:
        # the sink reads this run's events only, the conversation is this run's.
        context = contextvars.copy_context()
        context.run(add_stream_sink, forwarder.sink)
        context.run(CONVERSATION.set, plan.conversation)
        crew_run = asyncio.create_task(plan.crew.akickoff(inputs=plan.inputs), context=context)
        incident.stop = lambda: _stop(bridge, crew_run)
        try:
            output = await crew_run
        except asyncio.CancelledError:
            if incident.error is None or _being_cancelled():
                raise
            await bridge.caught_up()
            await _fail(session, incident.error)
            return
        except Exception as exc:
            await bridge.caught_up()
            await _fail(session, incident.error or exc)
            return
        await bridge.caught_up()
        answer = output.raw if isinstance(output, CrewOutput) else ""  # a crew kicked off with `stream` off
        if not forwarder.streamed_answer and answer:
            await session.send(answer)  # an answer CrewAI did not stream (an LLM of the crew's own, a tool's)
        await session.complete()

    def _plan(self, ctx: AgentExecutionContext, bridge: Bridge, incident: Incident) -> _Plan:
        if ctx.native is not None:
            gate = Gate(bridge, ctx.run_tool, incident)
            crew = hosted_crew(ctx.native, gate, lambda: self._llm(ctx).attach(bridge, incident))
            return _Plan(crew, kickoff_inputs(crew, ctx.request), None)
        if ctx.request.response_format is not None:
            raise NoStructuredOutputError
        loop = ToolLoop(ctx.tool_loop)
        gate = Gate(bridge, ctx.run_tool, incident, loop)
        llm = self._llm(ctx).attach(bridge, incident, ctx.tools, loop)
        request = ctx.request
        head = (ChatMessage("system", request.system_prompt),) if request.system_prompt else ()
        conversation = (*head, *request.history, ChatMessage("user", request.message))
        return _Plan(built_crew(ctx, llm, gate), None, conversation)

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _llm(self, ctx: AgentExecutionContext) -> PlatformLLM:
        """The platform's model for one run: `LLM_BASE_URL`'s, streaming, with the run's retry policy."""
        generation = self.config.generation
        return PlatformLLM(
            model=self._model_name(ctx),
            base_url=self.config.base_url,
            api_key=self.config.api_key,
            custom_openai=True,
            stream=True,
            max_retries=ctx.retry.max_retries,
            temperature=generation.temperature,
            top_p=generation.top_p,
            max_tokens=generation.max_tokens,
            additional_params={"stop": list(generation.stop)} if generation.stop else {},
            clients=self.clients,
        )


def _stop(bridge: Bridge, crew_run: asyncio.Task[Any]) -> None:
    """End a crew the platform failed: no new model or tool call starts, and its task is cancelled."""
    bridge.refuse_new_work()
    crew_run.cancel()


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _fail(session: StreamingSession, exc: BaseException) -> None:
    """End with the built-in runtime's error for `exc`; a platform error propagates as raised."""
    failure = failure_of(exc)
    if failure is None:
        raise exc
    await session.error(failure.message, code=failure.code, retryable=failure.retryable)
