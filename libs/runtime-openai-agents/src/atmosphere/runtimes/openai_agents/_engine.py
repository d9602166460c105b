"""`OpenAiAgentsRuntime`: a run executed by the OpenAI Agents SDK's runner over chat completions."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    RunConfig,
    Runner,
    RunResultStreaming,
    TResponseInputItem,
    Usage,
)
from agents.run_config import DEFAULT_MAX_TURNS
from openai import AsyncOpenAI, Timeout

from atmosphere.runtimes.openai_agents._hosting import Gatekeeper, native_tool_specs
from atmosphere.runtimes.openai_agents._model import ChatModel
from atmosphere.runtimes.openai_agents._outcome import NoStructuredOutputError, failure_of
from atmosphere.runtimes.openai_agents._stream import Forwarder, Rounds, as_input
from atmosphere.runtimes.openai_agents._tools import NO_TOOL_RUNNER, Escalation, ToolLoop, spec_tools
from atmosphere.sdk import ChatMessage, StreamingSession
from atmosphere.sdk.host import render_result
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolCallRequest, ToolSpec

DEFAULT_MODEL = "default"
NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one run hands the SDK's runner."""

    agent: Agent[Any]
    input: list[TResponseInputItem]
    forwarder: Forwarder
    loop: ToolLoop | None = None
    max_turns: int = DEFAULT_MAX_TURNS


class OpenAiAgentsEngine:
    """What `OpenAiAgentsRuntime` runs once an agent needs it: the framework, its client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the framework takes seconds, and every dispatch process
    discovers every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the OpenAI client is created on first use."""
        self.config = config
        self._client: AsyncOpenAI | None = None

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's own tools (see `OpenAiAgentsRuntime.native_tools`)."""
        return native_tool_specs(native) if isinstance(native, Agent) else ()

    @property
    def client(self) -> AsyncOpenAI:
        """The one OpenAI client (and connection pool) of every run; each run sets its own retries."""
        if self._client is None:
            config = self.config
            timeout = Timeout(
                config.call_timeout,
                connect=config.connect_timeout,
                read=config.stall_timeout,
                write=config.stall_timeout,
                pool=config.first_byte_timeout,
            )
            self._client = AsyncOpenAI(base_url=config.base_url, api_key=config.api_key or NO_API_KEY, timeout=timeout)
        return self._client

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        return [model.id async for model in self.client.models.list()]

    async def aclose(self) -> None:
        """Close the OpenAI client's connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request` (or run the hosted agent), ending `session` with `complete` or `error`."""
        escalation = Escalation()
        try:
            plan = self._plan(ctx, session, escalation)
        except Exception as exc:
            await self._fail(session, exc, None, None)
            return
        # Tracing off: the SDK would export every run's traces to api.openai.com.
        run_config = RunConfig(tracing_disabled=True, model_settings=ModelSettings(include_usage=True))
        hooks = Rounds(plan.forwarder, plan.loop)
        result = Runner.run_streamed(
            plan.agent, plan.input, max_turns=plan.max_turns, hooks=hooks, run_config=run_config
        )
        try:
            await _consume(result, plan.forwarder)
        except Exception as exc:
            # What the choke point raised ends the run as raised, not as the SDK wrapped it.
            await self._fail(session, escalation.error or exc, result.context_wrapper.usage, plan.forwarder)
            return
        await plan.forwarder.report_rest(result.context_wrapper.usage)
        if ctx.native is not None and not isinstance(result.final_output, str):
            await session.send(render_result(result.final_output))  # a typed answer never streamed as text
        await session.complete()

    def _plan(self, ctx: AgentExecutionContext, session: StreamingSession, escalation: Escalation) -> _Plan:
        if isinstance(ctx.native, Agent):
            return self._hosted(ctx, session, escalation, ctx.native)
        if ctx.native is not None:
            msg = f"the openai-agents runtime cannot host a {type(ctx.native).__qualname__}"
            raise TypeError(msg)
        if ctx.request.response_format is not None:
            raise NoStructuredOutputError
        return self._built(ctx, session, escalation)

    def _built(self, ctx: AgentExecutionContext, session: StreamingSession, escalation: Escalation) -> _Plan:
        """The agent built from `ctx`: its system prompt as instructions, its tools, its tool loop."""
        loop = ToolLoop(ctx.tool_loop)
        agent: Agent[Any] = Agent(
            name=ctx.agent,
            instructions=ctx.request.system_prompt or None,
            model=self._model(ctx),
            model_settings=self._settings(),
            tools=list(spec_tools(ctx.tools, ctx.run_tool, loop, escalation)),
        )
        messages = [*ctx.request.history, ChatMessage("user", ctx.request.message)]
        # The loop, not the SDK's turn limit, ends a run: the cap's rounds, a refused one and the answer.
        forwarder = Forwarder(session, self._model_name(ctx))
        return _Plan(agent, as_input(messages), forwarder, loop, max_turns=ctx.tool_loop.cap + 2)

    def _hosted(
        self, ctx: AgentExecutionContext, session: StreamingSession, escalation: Escalation, agent: Agent[Any]
    ) -> _Plan:
        """The user's own agent, gated: its instructions, tools and handoffs, every tool call through the choke point.

        It runs on the platform's model unless it carries a model object of its own; the
        request's system prompt, if any, comes before the history.
        """
        gated = Gatekeeper(ctx.run_tool or _no_runner, escalation, self._model(ctx)).agent(agent)
        head = [ChatMessage("system", ctx.request.system_prompt)] if ctx.request.system_prompt else []
        messages = [*head, *ctx.request.history, ChatMessage("user", ctx.request.message)]
        tool_names = frozenset(spec.name for spec in native_tool_specs(agent))
        return _Plan(gated, as_input(messages), Forwarder(session, self._model_name(ctx), tool_names=tool_names))

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _model(self, ctx: AgentExecutionContext) -> ChatModel:
        """Chat completions at `LLM_BASE_URL` (not the Responses API, which few providers speak).

        The OpenAI client retries 429, 5xx and connection failures, honouring `Retry-After`, up to
        the run's policy (`with_options` shares the connection pool).
        """
        client = self.client.with_options(max_retries=ctx.retry.max_retries)
        return ChatModel(model=self._model_name(ctx), openai_client=client)

    def _settings(self) -> ModelSettings:
        generation = self.config.generation
        return ModelSettings(
            temperature=generation.temperature,
            top_p=generation.top_p,
            max_tokens=generation.max_tokens,
            extra_args={"stop": list(generation.stop)} if generation.stop else None,
        )

    async def _fail(
        self, session: StreamingSession, exc: Exception, usage: Usage | None, forwarder: Forwarder | None
    ) -> None:
        """End with the built-in runtime's error for `exc`; an exception not ours to describe propagates."""
        failure = failure_of(exc)
        if failure is None:
            raise exc
        if forwarder is not None and usage is not None:
            await forwarder.report_rest(usage)
        await session.error(failure.message, code=failure.code, retryable=failure.retryable)


async def _consume(result: RunResultStreaming, forwarder: Forwarder) -> None:
    """Forward the run's events until it ends; a cancelled consumer cancels the run, closing its provider request."""
    # An async generator typed as an iterator: closed here, not whenever it is collected.
    async with contextlib.aclosing(result.stream_events()) as events:  # type: ignore[type-var]
        try:
            async for event in events:
                await forwarder.forward(event)
        except BaseException:
            result.cancel()  # the SDK runs the agent in a task of its own, which outlives its consumer otherwise
            raise


async def _no_runner(call: ToolCallRequest) -> str:
    """The tool runner of a run that has none: every call is refused, none runs."""
    del call
    return NO_TOOL_RUNNER
