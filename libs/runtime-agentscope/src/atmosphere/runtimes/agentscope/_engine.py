"""`AgentScopeAgentRuntime`'s engine: a run executed by AgentScope's agent loop over OpenAI chat completions."""

from __future__ import annotations

import contextlib
import logging
from typing import cast

import agentscope
from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import ChatModelBase, OpenAIChatModel
from agentscope.state import AgentState
from agentscope.tool import TaskCreate, TaskGet, TaskList, TaskUpdate, ToolBase
from openai import AsyncOpenAI, DefaultAsyncHttpxClient, Timeout
from pydantic import SecretStr

from atmosphere.runtimes.agentscope._hosting import native_tool_specs, run_copy
from atmosphere.runtimes.agentscope._outcome import NoStructuredOutputError, failure_of, leaf
from atmosphere.runtimes.agentscope._plan import TASK_TOOL_NAMES, PlanBridge
from atmosphere.runtimes.agentscope._stream import Forwarder, as_context
from atmosphere.runtimes.agentscope._tools import DeclaredTool, GatedToolkit, LoopGuard, ToolLoop
from atmosphere.runtimes.agentscope._wire import DistinctCallIds, PlatformFormatter
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.builtin_tools import WRITE_TODOS
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolSpec

DEFAULT_MODEL = "default"
NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""
UNBOUNDED_CONTEXT = 2**40
"""The context size the run's model declares: AgentScope would otherwise compress a long context
with model calls of its own; the platform's memory compacts the history it sends instead."""

# AgentScope logs through a handler of its own onto stderr; its records go where the process's
# logging sends every library's instead.
agentscope.logger.handlers.clear()
agentscope.logger.propagate = True
agentscope.logger.setLevel(logging.NOTSET)


class AgentScopeEngine:
    """What `AgentScopeAgentRuntime` runs once an agent needs it: the framework, its connections and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the framework takes seconds, and every dispatch process
    discovers every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the connection pool is created on first use."""
        self.config = config
        self._http: DefaultAsyncHttpxClient | None = None

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's own tools (see `AgentScopeAgentRuntime.native_tools`)."""
        return native_tool_specs(native) if isinstance(native, Agent) else ()

    @property
    def http(self) -> DefaultAsyncHttpxClient:
        """The one connection pool of every run's OpenAI client (each run sets its own retries)."""
        if self._http is None:
            self._http = DefaultAsyncHttpxClient()
        return self._http

    def _client(self, max_retries: int) -> AsyncOpenAI:
        config = self.config
        return AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key or NO_API_KEY,
            http_client=self.http,
            max_retries=max_retries,
            timeout=self._timeout(),
        )

    def _timeout(self) -> Timeout:
        config = self.config
        return Timeout(
            config.call_timeout,
            connect=config.connect_timeout,
            read=config.stall_timeout,
            write=config.stall_timeout,
            pool=config.first_byte_timeout,
        )

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        return [model.id async for model in self._client(0).models.list()]

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request` (or run the hosted agent), ending `session` with `complete` or `error`."""
        try:
            await self._answer(ctx, session)
        except Exception as exc:  # AgentScope gathers concurrent tool calls' failures in a group
            cause = leaf(exc)
            failure = failure_of(cause)
            if failure is None:
                if cause is exc:
                    raise
                raise cause from exc
            await session.error(failure.message, code=failure.code, retryable=failure.retryable)
            return
        await session.complete()

    async def _answer(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        if ctx.native is not None:
            if not isinstance(ctx.native, Agent):
                msg = f"the agentscope runtime cannot host a {type(ctx.native).__qualname__}"
                raise TypeError(msg)
            agent = run_copy(ctx.native, list(ctx.request.history), ctx.run_tool)
            tool_names = frozenset(spec.name for spec in native_tool_specs(ctx.native))
            model = agent.model.model
        else:
            if ctx.request.response_format is not None:
                raise NoStructuredOutputError
            agent = self._built(ctx)
            tool_names = frozenset(spec.name for spec in ctx.tools)
            model = self._model_name(ctx)
        plan = _plan_bridge(ctx, agent)
        forwarder = Forwarder(session, agent.state, model=model, tool_names=tool_names, plan=plan)
        prompt = UserMsg(name="user", content=ctx.request.message)
        async with contextlib.aclosing(agent.reply_stream(prompt)) as events:
            async for event in events:
                await forwarder.forward(event)

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _built(self, ctx: AgentExecutionContext) -> Agent:
        """The agent built from `ctx`: its system prompt, history, tools and tool loop.

        With the planning harness (the runtime declares PLANNING, so dispatch hands `write_todos`
        over as the plan store, `ctx.store_tools`, never offered to the model), AgentScope's task
        tools are the model's plan surface, and the plan bridge mirrors the task list into the
        platform's store through `write_todos` (see `_plan`): one plan surface, never two. A
        `write_todos` among `ctx.tools` (`LLM_PLANNING=builtin`) is offered like any tool.
        """
        loop = ToolLoop(ctx.tool_loop)
        planning = _plans(ctx)
        tools: list[ToolBase] = [DeclaredTool(spec) for spec in ctx.tools]
        if planning:
            tools += [TaskCreate(), TaskUpdate(), TaskGet(), TaskList()]
        return Agent(
            name=ctx.agent,
            system_prompt=ctx.request.system_prompt,
            model=cast(ChatModelBase, DistinctCallIds(self._model(ctx))),
            toolkit=GatedToolkit(ctx.run_tool, loop, tools=tools),
            middlewares=[LoopGuard(loop)],
            state=AgentState(context=as_context(ctx.request.history, ctx.agent)),
            # The loop, not AgentScope's iteration cap, ends a run: the cap's rounds, a refused one and the answer.
            react_config=ReActConfig(max_iters=ctx.tool_loop.cap + 2, interruption_raise_cancelled_error=True),
            # No time, task or context hints in the conversation: the request goes out as the platform built it.
            injection_config=InjectionConfig(inject_runtime_state=False),
        )

    def _model(self, ctx: AgentExecutionContext) -> OpenAIChatModel:
        """The chat-completions model at `LLM_BASE_URL`; the OpenAI client retries, honouring `Retry-After`."""
        config = self.config
        generation = config.generation
        parameters = OpenAIChatModel.Parameters(
            max_tokens=generation.max_tokens, temperature=generation.temperature, top_p=generation.top_p
        )
        return OpenAIChatModel(
            credential=OpenAICredential(api_key=SecretStr(config.api_key or NO_API_KEY), base_url=config.base_url),
            model=self._model_name(ctx),
            parameters=parameters,
            stream=True,
            max_retries=0,  # AgentScope's retries wait a fixed second and ignore `Retry-After`: the client's do not
            context_size=UNBOUNDED_CONTEXT,
            formatter=PlatformFormatter(),
            client_kwargs={"http_client": self.http, "max_retries": ctx.retry.max_retries, "timeout": self._timeout()},
            extra_body={"stop": list(generation.stop)} if generation.stop else None,
        )


def _plans(ctx: AgentExecutionContext) -> bool:
    """Whether the run has the platform's plan store behind AgentScope's task list."""
    return any(spec.name == WRITE_TODOS.name for spec in ctx.store_tools)


def _plan_bridge(ctx: AgentExecutionContext, agent: Agent) -> PlanBridge | None:
    """A bridge when the agent keeps AgentScope's task list and the run has the platform's plan store."""
    if ctx.run_tool is None or not _plans(ctx):
        return None
    has_tasks = any(tool.name in TASK_TOOL_NAMES for group in agent.toolkit.tool_groups for tool in group.tools)
    return PlanBridge(ctx.run_tool) if has_tasks else None
