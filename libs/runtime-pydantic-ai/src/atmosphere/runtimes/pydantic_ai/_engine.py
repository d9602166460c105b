"""`PydanticAiAgentRuntime`: a run executed by PydanticAI's agent loop over OpenAI chat completions."""

from __future__ import annotations

import logging
from typing import Any

from openai import AsyncOpenAI, Timeout
from pydantic import BaseModel
from pydantic_ai import Agent, AgentRunResult, ModelHTTPError, NativeOutput, TextOutput, UnexpectedModelBehavior
from pydantic_ai.capabilities import ReinjectSystemPrompt
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.output import OutputSpec
from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage

from atmosphere.runtimes.pydantic_ai._hosting import Gate, native_tool_specs, system_texts, uses_own_model
from atmosphere.runtimes.pydantic_ai._outcome import StructuredOutputInvalidError, emit_entity, failure_of
from atmosphere.runtimes.pydantic_ai._stream import Forwarder, RoundUsage, as_messages
from atmosphere.runtimes.pydantic_ai._structured import (
    NATIVE_REFUSALS,
    OUTPUT_RETRIES_SPENT,
    answer_problems,
    text_parser,
    with_instructions,
)
from atmosphere.runtimes.pydantic_ai._tools import NO_TOOL_RUNNER, SpecToolset, ToolLoop
from atmosphere.sdk import ChatMessage, StreamingSession
from atmosphere.sdk.host import render_result
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolCallRequest, ToolSpec

log = logging.getLogger("atmosphere.runtimes.pydantic_ai")

DEFAULT_MODEL = "default"
PROVIDER_NAME = "atmosphere"
"""How PydanticAI names the provider in its messages (the service at `LLM_BASE_URL`)."""
NO_API_KEY = "unused"
"""The OpenAI client insists on a key (and would read `OPENAI_API_KEY` for a missing one, then send it
to `LLM_BASE_URL`): a keyless provider gets this instead, and ignores it."""


Entity = tuple[BaseModel, str]
"""A validated structured answer and the text it came as."""


class PydanticAiEngine:
    """What `PydanticAiAgentRuntime` runs once an agent needs it: the framework, its client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing the framework takes seconds, and every dispatch process
    discovers every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the OpenAI client is created on first use."""
        self.config = config
        self._client: AsyncOpenAI | None = None

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's own tools (see `PydanticAiAgentRuntime.native_tools`)."""
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
        usage = RunUsage()
        rounds = RoundUsage(session, self._model_name(ctx))
        try:
            entity = await self._answer(ctx, session, usage, rounds)
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            await rounds.report(usage)
            await session.error(failure.message, code=failure.code, retryable=failure.retryable)
            return
        await rounds.report(usage)
        if entity is not None:
            await emit_entity(session, *entity)
        await session.complete()

    async def _answer(
        self, ctx: AgentExecutionContext, session: StreamingSession, usage: RunUsage, rounds: RoundUsage
    ) -> Entity | None:
        if isinstance(ctx.native, Agent):
            await self._host(ctx, session, usage, rounds, ctx.native)
            return None
        if ctx.native is not None:
            msg = f"the pydantic-ai runtime cannot host a {type(ctx.native).__qualname__}"
            raise TypeError(msg)
        if ctx.request.response_format is not None:
            return await self._structured(ctx, session, usage, rounds, ctx.request.response_format)
        await self._run(ctx, usage, Forwarder(session, rounds), ctx.request.messages(), str)
        return None

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.config.model or DEFAULT_MODEL

    def _model(self, ctx: AgentExecutionContext) -> OpenAIChatModel:
        """The chat-completions model at `LLM_BASE_URL` (not the Responses API, which few providers speak)."""
        provider = OpenAICompatibleProvider(PROVIDER_NAME, openai_client=self.client)
        return OpenAIChatModel(self._model_name(ctx), provider=provider)

    def _transport_settings(self, ctx: AgentExecutionContext) -> ModelSettings:
        """The OpenAI client retries 429, 5xx and connection failures, honouring `Retry-After`, up to the policy."""
        return {"max_retries": ctx.retry.max_retries, "request_timeout": self.config.call_timeout}

    def _settings(self, ctx: AgentExecutionContext) -> ModelSettings:
        # framing_announcement: the request goes out as the built-in runtime sends it, with no text of PydanticAI's.
        settings: ModelSettings = {**self._transport_settings(ctx), "framing_announcement": "never"}
        generation = self.config.generation
        if generation.temperature is not None:
            settings["temperature"] = generation.temperature
        if generation.max_tokens is not None:
            settings["max_tokens"] = generation.max_tokens
        if generation.top_p is not None:
            settings["top_p"] = generation.top_p
        if generation.stop:
            settings["stop_sequences"] = list(generation.stop)
        return settings

    async def _run(
        self,
        ctx: AgentExecutionContext,
        usage: RunUsage,
        forwarder: Forwarder,
        messages: list[ChatMessage],
        output_type: OutputSpec[Any],
    ) -> AgentRunResult[Any]:
        """One PydanticAI run of the agent built from `ctx`: `messages` (the last is the user's) and its tools."""
        *head, prompt = messages
        agent = Agent(self._model(ctx), name=ctx.agent, model_settings=self._settings(ctx))
        toolset = SpecToolset(ctx.tools, ctx.run_tool, ToolLoop(ctx.tool_loop))
        return await agent.run(
            prompt.content,
            output_type=output_type,
            message_history=as_messages(head),
            usage=usage,
            event_stream_handler=forwarder,
            toolsets=[toolset],
            retries={"output": ctx.structured_output_retries},
            infer_name=False,
        )

    async def _structured(
        self,
        ctx: AgentExecutionContext,
        session: StreamingSession,
        usage: RunUsage,
        rounds: RoundUsage,
        schema: type[BaseModel],
    ) -> Entity:
        """A structured answer, healed by PydanticAI's output retries.

        Raises:
            StructuredOutputInvalidError: no answer validated within the retry budget.
        """
        forwarder = Forwarder(session, rounds, forward_text=False)  # the validated entity is sent, not its raw stream
        try:
            result = await self._native_or_instructed(ctx, usage, forwarder, schema)
        except UnexpectedModelBehavior as exc:
            if not exc.message.startswith(OUTPUT_RETRIES_SPENT):
                raise
            raise StructuredOutputInvalidError(ctx.structured_output_retries + 1, answer_problems(exc)) from exc
        entity = result.output
        assert isinstance(entity, BaseModel)
        return entity, result.response.text or entity.model_dump_json()

    async def _native_or_instructed(
        self, ctx: AgentExecutionContext, usage: RunUsage, forwarder: Forwarder, schema: type[BaseModel]
    ) -> AgentRunResult[Any]:
        """Native `response_format` first; the schema in the system prompt when the provider refuses it."""
        messages = ctx.request.messages()
        try:
            return await self._run(ctx, usage, forwarder, messages, NativeOutput(schema))
        except ModelHTTPError as exc:
            if exc.status_code not in NATIVE_REFUSALS:
                raise
            log.info("run %s: native structured output refused (%s); using prompt instructions", ctx.run_id, exc)
        return await self._run(
            ctx, usage, forwarder, with_instructions(messages, schema), TextOutput(text_parser(schema))
        )

    async def _host(
        self,
        ctx: AgentExecutionContext,
        session: StreamingSession,
        usage: RunUsage,
        rounds: RoundUsage,
        agent: Agent[Any, Any],
    ) -> None:
        """Run the user's own agent: its instructions, tools and loop, every tool call through the choke point.

        It runs on the platform's model unless it carries a model object of its own
        (`uses_own_model`). History's system messages and the request's system prompt join the
        agent's instructions; its own `system_prompt` is put back in front of the history.
        """
        history = ctx.request.history
        extra = [m.content for m in history if m.role == "system"]
        if ctx.request.system_prompt:
            extra.append(ctx.request.system_prompt)
        tool_names = frozenset(spec.name for spec in native_tool_specs(agent))
        result = await agent.run(
            ctx.request.message,
            message_history=as_messages([m for m in history if m.role != "system"]),
            model=None if uses_own_model(agent) else self._model(ctx),
            instructions=system_texts(extra),
            model_settings=self._transport_settings(ctx),
            usage=usage,
            event_stream_handler=Forwarder(session, rounds, tool_names=tool_names),
            capabilities=[Gate(ctx.run_tool or _no_runner), ReinjectSystemPrompt()],
            infer_name=False,
        )
        if not isinstance(result.output, str):
            await session.send(render_result(result.output))  # a typed answer never streamed as text


async def _no_runner(call: ToolCallRequest) -> str:
    """The tool runner of a run that has none: every call is refused, none runs."""
    del call
    return NO_TOOL_RUNNER
