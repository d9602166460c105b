"""`SemanticKernelAgentRuntime`: a run executed by a Semantic Kernel `ChatCompletionAgent` over chat completions."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from openai import AsyncOpenAI, Timeout
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.connectors.ai.open_ai import OpenAIChatPromptExecutionSettings
from semantic_kernel.filters import FilterTypes
from semantic_kernel.functions import KernelArguments

from atmosphere.runtimes.semantic_kernel._hosting import Gate, native_tool_specs
from atmosphere.runtimes.semantic_kernel._outcome import NoStructuredOutputError, UnhostableError, failure_of
from atmosphere.runtimes.semantic_kernel._service import PlatformChatCompletion
from atmosphere.runtimes.semantic_kernel._stream import Forwarder, as_history
from atmosphere.runtimes.semantic_kernel._tools import NO_TOOL_RUNNER, GatedKernel, SpecGate, SpecOffer, ToolLoop
from atmosphere.sdk import ChatMessage, StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolCallRequest, ToolSpec

DEFAULT_MODEL = "default"
NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""
_NOT_IN_AGENT_NAMES = re.compile(r"[^0-9A-Za-z_-]")


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one run hands the agent: the agent, the kernel it runs with, the conversation and the new message."""

    agent: ChatCompletionAgent
    kernel: Kernel
    thread: ChatHistoryAgentThread
    message: str


class SemanticKernelEngine:
    """What `SemanticKernelAgentRuntime` runs once an agent needs it: the framework, its client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the framework takes seconds, and every dispatch process
    discovers every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the OpenAI client is created on first use."""
        self.config = config
        self._client: AsyncOpenAI | None = None

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's kernel functions (see `SemanticKernelAgentRuntime.native_tools`)."""
        return native_tool_specs(native) if isinstance(native, ChatCompletionAgent) else ()

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
        forwarder = Forwarder(session, self._model_name(ctx))
        try:
            await _stream(self._plan(ctx, forwarder), forwarder)
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            await session.error(failure.message, code=failure.code, retryable=failure.retryable)
            return
        await session.complete()

    def _plan(self, ctx: AgentExecutionContext, forwarder: Forwarder) -> _Plan:
        if isinstance(ctx.native, ChatCompletionAgent):
            return self._hosted(ctx, forwarder, ctx.native)
        if ctx.native is not None:
            raise UnhostableError(ctx.native)
        if ctx.request.response_format is not None:
            raise NoStructuredOutputError
        return self._built(ctx, forwarder)

    def _built(self, ctx: AgentExecutionContext, forwarder: Forwarder) -> _Plan:
        """The agent built from `ctx`: its tools offered as declared, each call through the choke point, its loop.

        The system prompt opens the thread's history verbatim: as the agent's `instructions` it
        would be rendered as a prompt template.
        """
        loop = ToolLoop(ctx.tool_loop)
        service = self._service(ctx, forwarder, SpecOffer(ctx.tools, loop))
        kernel = GatedKernel(SpecGate(ctx.run_tool, loop), services=[service])
        agent = ChatCompletionAgent(
            kernel=kernel,
            name=_NOT_IN_AGENT_NAMES.sub("_", ctx.agent) or "agent",
            function_choice_behavior=loop.behavior(),
            arguments=KernelArguments(settings=self._settings()),
        )
        head = [ChatMessage("system", ctx.request.system_prompt)] if ctx.request.system_prompt else []
        thread = ChatHistoryAgentThread(chat_history=as_history([*head, *ctx.request.history]))
        return _Plan(agent, kernel, thread, ctx.request.message)

    def _hosted(self, ctx: AgentExecutionContext, forwarder: Forwarder, agent: ChatCompletionAgent) -> _Plan:
        """The user's own agent: its instructions, kernel, settings and function-choice behaviour, every call gated.

        It runs with a clone of its kernel that has the gate (and, when the kernel has no chat
        service of its own, the platform's model); the request's system prompt, if any, comes
        after the agent's instructions, before the history.
        """
        kernel = agent.kernel.clone()
        if not kernel.get_services_by_type(ChatCompletionClientBase):
            kernel.add_service(self._service(ctx, forwarder, None))
        kernel.add_filter(FilterTypes.AUTO_FUNCTION_INVOCATION, Gate(ctx.run_tool or _no_runner))
        head = [ChatMessage("system", ctx.request.system_prompt)] if ctx.request.system_prompt else []
        thread = ChatHistoryAgentThread(chat_history=as_history([*head, *ctx.request.history]))
        return _Plan(agent, kernel, thread, ctx.request.message)

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _service(
        self, ctx: AgentExecutionContext, forwarder: Forwarder, offer: SpecOffer | None
    ) -> PlatformChatCompletion:
        """Chat completions at `LLM_BASE_URL` for this run.

        The OpenAI client retries 429, 5xx and connection failures, honouring `Retry-After`, up to
        the run's policy (`with_options` shares the connection pool).
        """
        client = self.client.with_options(max_retries=ctx.retry.max_retries)
        return PlatformChatCompletion(
            model=self._model_name(ctx), client=client, deltas=forwarder.arguments, offer=offer
        )

    def _settings(self) -> OpenAIChatPromptExecutionSettings:
        generation = self.config.generation
        return OpenAIChatPromptExecutionSettings(
            temperature=generation.temperature,
            max_tokens=generation.max_tokens,
            top_p=generation.top_p,
            stop=list(generation.stop) or None,
        )


async def _stream(plan: _Plan, forwarder: Forwarder) -> None:
    """Forward the agent's stream until it ends; a cancelled consumer closes it, and with it the provider request."""
    stream = plan.agent.invoke_stream(messages=plan.message, thread=plan.thread, kernel=plan.kernel)
    # An async generator typed as an iterable: closed here, not whenever it is collected.
    async with contextlib.aclosing(stream) as items:  # type: ignore[type-var]
        async for item in items:
            await forwarder.forward(item.message)


async def _no_runner(call: ToolCallRequest) -> str:
    """The tool runner of a run that has none: every call is refused, none runs."""
    del call
    return NO_TOOL_RUNNER
