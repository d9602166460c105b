"""The ADK runtime's engine: a run is an ADK `Runner` run, Gemini natively through `google-genai`.

Two uses:

- an Atmosphere agent: an `LlmAgent` is built per run from the request — the system prompt as
  its only instruction, the agent's tools as ADK tools whose calls go to `ctx.run_tool`, the
  history seeded into an in-memory session — and run with `StreamingMode.SSE`;
- a hosted agent (`ctx.native`, any ADK `BaseAgent`): a clone of the user's own agent tree runs
  with its own instructions, tools, sub-agents and callbacks, the `Gate` plugin routing every
  tool call through the choke point, its artifacts in the conversation's workspace.

Either way the models are `PacedGemini`s on the runtime's one `google-genai` client: the run's
retries and deadlines, one connection pool.
"""

from __future__ import annotations

import logging
import re
from contextlib import aclosing
from typing import Any

import httpx
from google import genai
from google.adk.agents._streaming_mode import StreamingMode  # where ADK defines it (`run_config` re-exports it untyped)
from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.llm_agent import LlmAgent
from google.adk.agents.run_config import RunConfig
from google.adk.apps import App
from google.adk.artifacts.base_artifact_service import BaseArtifactService
from google.adk.artifacts.in_memory_artifact_service import InMemoryArtifactService
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

from atmosphere.runtimes.adk._artifacts import WorkspaceArtifactService, offers_file_tools
from atmosphere.runtimes.adk._gate import Gate
from atmosphere.runtimes.adk._hosting import UnhostableAgentError, native_tool_specs, prepared
from atmosphere.runtimes.adk._model import CallLimits, PacedGemini, Pacing
from atmosphere.runtimes.adk._settings import GeminiSettings
from atmosphere.runtimes.adk._stream import Forwarder, history_events
from atmosphere.runtimes.adk._tools import SpecTool, ToolLoop
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolCallRequest, ToolSpec
from atmosphere.sdk.runtime_errors import NO_TOOL_RUNNER, RunFailedError

log = logging.getLogger("atmosphere.runtimes.adk")

APP_NAME = "atmosphere"
USER_ID = "atmosphere"
NO_API_KEY = "unused"
"""`google-genai` refuses a client without a key: a keyless gateway (`GOOGLE_GEMINI_BASE_URL` only) gets this."""
_NOT_IDENTIFIER = re.compile(r"\W")


class _ClientTimeouts(httpx.AsyncClient):
    """An httpx client whose own timeouts hold for every request.

    `google-genai` passes each request the timeout of its `HttpOptions` — `None` when unset,
    which httpx reads as *no timeout at all* — so the connect, stall and pool limits are put
    back on each request here.
    """

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        """Send `request` under this client's timeouts."""
        request.extensions["timeout"] = self.timeout.as_dict()
        return await super().send(request, **kwargs)


class AdkEngine:
    """What `AdkAgentRuntime` runs once an agent needs it: ADK, the Gemini client and the runs.

    Apart from the runtime's own module so that installing the adapter costs dispatch nothing
    until an agent runs on it: importing ADK takes seconds, and every dispatch process discovers
    every installed runtime when it starts.
    """

    def __init__(self, config: RuntimeConfig, settings: GeminiSettings) -> None:
        """Configure; the client is created on first use."""
        self.config = config
        self.settings = settings
        self._http: httpx.AsyncClient | None = None
        self._client: genai.Client | None = None

    @property
    def client(self) -> genai.Client:
        """The one `google-genai` client (and connection pool) of every run; it retries nothing itself."""
        if self._client is None:
            config = self.config
            timeout = httpx.Timeout(
                config.call_timeout,
                connect=config.connect_timeout,
                read=config.stall_timeout,
                write=config.stall_timeout,
                pool=config.first_byte_timeout,
            )
            limits = httpx.Limits(
                max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency
            )
            self._http = _ClientTimeouts(timeout=timeout, limits=limits)
            # The client's own httpx client, not aiohttp's: the timeouts above, and cancelling a
            # run closes its response.
            options = types.HttpOptions(base_url=self.settings.base_url, httpx_async_client=self._http)
            self._client = genai.Client(
                vertexai=False, api_key=self.settings.api_key or NO_API_KEY, http_options=options
            )
        return self._client

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's own tools (see `AdkAgentRuntime.native_tools`)."""
        return native_tool_specs(native) if isinstance(native, BaseAgent) else ()

    async def list_models(self) -> list[str]:
        """`GET <base>/v1beta/models`, the names without their `models/` prefix."""
        return [(model.name or "").removeprefix("models/") async for model in await self.client.aio.models.list()]

    async def aclose(self) -> None:
        """Close the client's connections."""
        if self._http is not None:
            await self._http.aclose()
        self._http = None
        self._client = None

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request` (or run the hosted agent), ending `session` with `complete` or `error`."""
        pacing = Pacing(ctx.retry, CallLimits.of(self.config), on_retry=session.progress)
        try:
            if ctx.native is None:
                await self._built(ctx, session, pacing)
            elif isinstance(ctx.native, BaseAgent):
                await self._hosted(ctx, session, pacing, ctx.native)
            else:
                msg = f"the adk runtime cannot host a {type(ctx.native).__qualname__}"
                raise TypeError(msg)
        except RunFailedError as failure:
            await session.emit(failure.to_event())
            return
        except UnhostableAgentError as exc:
            await session.error(str(exc), code=exc.code)
            return
        await session.complete()

    def _model_name(self, ctx: AgentExecutionContext) -> str:
        return ctx.request.model or self.settings.model

    def _model(self, name: str, pacing: Pacing) -> PacedGemini:
        return PacedGemini(model=name, client=self.client).paced(pacing)

    async def _built(self, ctx: AgentExecutionContext, session: StreamingSession, pacing: Pacing) -> None:
        """The agent built from `ctx`: the system prompt its only instruction, its tools, its tool loop."""
        loop = ToolLoop(ctx.tool_loop)
        system = "\n\n".join(text for text in (ctx.request.system_prompt, *_system_texts(ctx)) if text)

        def before_model(callback_context: CallbackContext, llm_request: LlmRequest) -> LlmResponse | None:
            # The request's system prompt exactly, as every runtime sends it: not ADK's identity
            # line, and not read as a template of session state (`{name}` stays as written).
            del callback_context
            config = llm_request.config
            config.system_instruction = system or None
            if loop.withdrawn and config.tools:
                none = types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.NONE)
                config.tool_config = types.ToolConfig(function_calling_config=none)
            return None

        name = self._model_name(ctx)
        agent = LlmAgent(
            name=_agent_name(ctx.agent),
            model=self._model(name, pacing),
            tools=[SpecTool(spec, ctx.run_tool, loop, lambda: pacing.rounds) for spec in ctx.tools],
            generate_content_config=self._generation(),
            before_model_callback=before_model,
        )
        forwarder = Forwarder(session, name, tool_names=frozenset(spec.name for spec in ctx.tools))
        await self._run(ctx, agent, forwarder, plugins=[])

    async def _hosted(
        self, ctx: AgentExecutionContext, session: StreamingSession, pacing: Pacing, agent: BaseAgent
    ) -> None:
        """The user's own agent tree, cloned onto the run's models, every tool call through the choke point.

        The request's system prompt and history's system messages join each agent's own
        instructions (the `Gate` adds them to every model request).
        """
        default = self._model_name(ctx)
        root = prepared(agent, lambda name: self._model(name or default, pacing))
        forwarder = Forwarder(session, default, tool_names=frozenset(spec.name for spec in native_tool_specs(agent)))
        gate = Gate(
            run_tool=ctx.run_tool or _no_runner,
            root=root,
            instructions="\n\n".join(text for text in (*_system_texts(ctx), ctx.request.system_prompt) if text),
            forwarder=forwarder,
            run_id=ctx.run_id,
        )
        await self._run(ctx, root, forwarder, plugins=[gate], gate=gate)

    def _generation(self) -> types.GenerateContentConfig | None:
        generation = self.config.generation
        if generation == type(generation)():
            return None
        return types.GenerateContentConfig(
            temperature=generation.temperature,
            top_p=generation.top_p,
            max_output_tokens=generation.max_tokens,
            stop_sequences=list(generation.stop) or None,
        )

    async def _run(
        self,
        ctx: AgentExecutionContext,
        agent: BaseAgent,
        forwarder: Forwarder,
        *,
        plugins: list[BasePlugin],
        gate: Gate | None = None,
    ) -> None:
        """One ADK run of `agent` on the request's message, its history seeded in a fresh in-memory session.

        The runner is not closed: closing it closes the agent tree's toolsets (an MCP server's
        connection), which belong to the user's agent and outlive the run.
        """
        sessions = InMemorySessionService()
        adk_session = await sessions.create_session(app_name=APP_NAME, user_id=USER_ID)
        for event in history_events(ctx.request.history, agent.name):
            await sessions.append_event(adk_session, event)
        if gate is not None:
            gate.session_id = adk_session.id
        runner = Runner(
            app=App(name=APP_NAME, root_agent=agent, plugins=plugins),
            session_service=sessions,
            artifact_service=self._artifacts(ctx),
        )
        events = runner.run_async(
            user_id=USER_ID,
            session_id=adk_session.id,
            new_message=types.UserContent(ctx.request.message),
            run_config=RunConfig(streaming_mode=StreamingMode.SSE),
        )
        # Leaving this block, by the end, an error or a cancellation, closes the run and its HTTP response.
        async with aclosing(events):
            async for event in events:
                await forwarder.forward(event)

    @staticmethod
    def _artifacts(ctx: AgentExecutionContext) -> BaseArtifactService:
        """The conversation's workspace when the run offers the file tools, else artifacts that live for the run."""
        if ctx.run_tool is not None and offers_file_tools(frozenset(spec.name for spec in ctx.tools)):
            return WorkspaceArtifactService(ctx.run_tool)
        return InMemoryArtifactService()


def _system_texts(ctx: AgentExecutionContext) -> list[str]:
    """History's system messages (compaction summaries), which travel as instructions."""
    return [message.content for message in ctx.request.history if message.role == "system"]


def _agent_name(name: str) -> str:
    """The platform's agent name as ADK accepts one (an identifier, not `user`)."""
    identifier = _NOT_IDENTIFIER.sub("_", name) or "agent"
    if not identifier.isidentifier() or identifier == "user":
        identifier = f"agent_{identifier}"
    return identifier


async def _no_runner(call: ToolCallRequest) -> str:
    """The tool runner of a run that has none: every call is refused, none runs."""
    del call
    return NO_TOOL_RUNNER
