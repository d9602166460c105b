"""`LlamaIndexAgentRuntime`: a run executed by LlamaIndex's agent workflow over OpenAI chat completions."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llama_index.core.agent.workflow import AgentOutput, AgentWorkflow, BaseWorkflowAgent, FunctionAgent
from llama_index.core.agent.workflow.workflow_events import AgentWorkflowStartEvent
from openai import AsyncOpenAI, Timeout
from pydantic.warnings import PydanticDeprecationWarning

from atmosphere.runtimes.llamaindex._hosting import native_tool_specs, streams_text, workflow_config
from atmosphere.runtimes.llamaindex._model import NO_API_KEY, PlatformLLM, conversation_memory, platform_llm
from atmosphere.runtimes.llamaindex._outcome import NoStructuredOutputError, UnhostableError, failure_of
from atmosphere.runtimes.llamaindex._stream import Forwarder, as_chat_history
from atmosphere.runtimes.llamaindex._tools import SpecTool, ToolLoop
from atmosphere.runtimes.llamaindex._workflow import Gate, GatedAgentWorkflow
from atmosphere.sdk import ChatMessage, StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolSpec

if TYPE_CHECKING:
    from workflows.handler import WorkflowHandler  # LlamaIndex's `llama_index.core.workflow.handler` re-exports it

DEFAULT_MODEL = "default"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one run hands LlamaIndex."""

    workflow: GatedAgentWorkflow
    forwarder: Forwarder
    history: list[ChatMessage]
    max_iterations: int | None = None
    """LlamaIndex's iteration limit; None keeps its own default (a hosted object's)."""


class LlamaIndexEngine:
    """What `LlamaIndexAgentRuntime` runs once an agent needs it: the framework, its client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the framework takes seconds, and every dispatch process
    discovers every installed runtime when it starts. LlamaIndex sends nothing anywhere of its own
    (no telemetry; its instrumentation has no handler unless an app adds one), and this engine
    changes none of its globals (`Settings`): each run's agents get their LLM one by one.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the OpenAI client is created on first use."""
        self.config = config
        self._client: AsyncOpenAI | None = None

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted object's own tools (see `LlamaIndexAgentRuntime.native_tools`)."""
        return native_tool_specs(native) if isinstance(native, BaseWorkflowAgent | AgentWorkflow) else ()

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
        """Answer `ctx.request` (or run the hosted object), ending `session` with `complete` or `error`."""
        try:
            plan = self._plan(ctx, session)
        except (NoStructuredOutputError, UnhostableError) as exc:
            await session.error(str(exc), code=exc.code)
            return
        start = AgentWorkflowStartEvent(
            user_msg=ctx.request.message,
            chat_history=as_chat_history(plan.history),
            memory=conversation_memory(),
            max_iterations=plan.max_iterations,
        )
        handler = plan.workflow.run(start_event=start)
        try:
            result = await _consume(handler, plan.forwarder)
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            await session.error(failure.message, code=failure.code, retryable=failure.retryable)
            return
        if not plan.forwarder.answer_sent and isinstance(result, AgentOutput) and result.response.content:
            # An answer that did not stream as text: a ReAct agent's, a tool's `return_direct` result.
            await session.send(result.response.content)
        await session.complete()

    def _plan(self, ctx: AgentExecutionContext, session: StreamingSession) -> _Plan:
        native = ctx.native
        if native is None:
            if ctx.request.response_format is not None:
                raise NoStructuredOutputError
            return self._built(ctx, session)
        if isinstance(native, BaseWorkflowAgent | AgentWorkflow):
            return self._hosted(ctx, session, native)
        msg = f"the llamaindex runtime cannot host a {type(native).__qualname__}"
        raise UnhostableError(msg)

    def _built(self, ctx: AgentExecutionContext, session: StreamingSession) -> _Plan:
        """The Atmosphere agent as a `FunctionAgent`: its system prompt, its tools, its tool loop."""
        with _quiet():
            agent = FunctionAgent(
                name=ctx.agent,
                system_prompt=ctx.request.system_prompt or None,
                tools=[SpecTool(spec) for spec in ctx.tools],
                llm=self._llm(ctx),
            )
        model = self._model_name(ctx)
        forwarder = Forwarder(session, model_of=lambda name: model, streams_text=lambda name: True)
        loop = ToolLoop(ctx.tool_loop)
        workflow = GatedAgentWorkflow(Gate(ctx.run_tool, forwarder, loop), agents=[agent])
        return _Plan(workflow, forwarder, list(ctx.request.history), max_iterations=loop.model_turns)

    def _hosted(
        self, ctx: AgentExecutionContext, session: StreamingSession, native: BaseWorkflowAgent | AgentWorkflow
    ) -> _Plan:
        """The user's own agent or workflow, gated: its prompts, tools, handoffs and limits.

        Each agent runs on the platform's model unless it was given an LLM of its own; the request's
        system prompt, if any, comes before the history.
        """
        config = workflow_config(native, self._llm(ctx))
        agents: dict[str, BaseWorkflowAgent] = {agent.name: agent for agent in config["agents"]}
        forwarder = Forwarder(
            session,
            model_of=lambda name: agents[name].llm.metadata.model_name if name in agents else "",
            streams_text=lambda name: name in agents and streams_text(agents[name]),
            tool_names=frozenset(spec.name for spec in native_tool_specs(native)),
        )
        workflow = GatedAgentWorkflow(Gate(ctx.run_tool, forwarder), **config)
        head = [ChatMessage("system", ctx.request.system_prompt)] if ctx.request.system_prompt else []
        return _Plan(workflow, forwarder, [*head, *ctx.request.history])

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _llm(self, ctx: AgentExecutionContext) -> PlatformLLM:
        """Chat completions at `LLM_BASE_URL`, retried by the OpenAI client up to the run's policy.

        `with_options` shares the connection pool.
        """
        client = self.client.with_options(max_retries=ctx.retry.max_retries)
        return platform_llm(self._model_name(ctx), client, self.config.generation)


async def _consume(handler: WorkflowHandler, forwarder: Forwarder) -> Any:
    """Forward the run's events until it ends, and its result; a cancelled consumer cancels the run.

    LlamaIndex runs the workflow in tasks of its own, which outlive their consumer otherwise (and
    with them the provider's HTTP stream).
    """
    try:
        async for event in handler.stream_events():
            await forwarder.forward(event)
        return await handler
    except BaseException:
        if not handler.is_done():
            await handler.cancel_run()
        raise


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Build a LlamaIndex agent without pydantic's deprecation warnings.

    An agent is a workflow too, which collects its steps with `inspect.getmembers`: that reads every
    attribute of the agent (a pydantic model), pydantic's deprecated ones included. The block is
    synchronous, so no other task runs while the filter is changed.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticDeprecationWarning)
        yield
