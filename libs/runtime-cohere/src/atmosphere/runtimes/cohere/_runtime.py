"""`CohereAgentRuntime`: Command models through Cohere's own v2 Chat API and SDK, natively.

One run is a loop of rounds, as in the built-in runtime: stream a chat (text and the tool plan
are forwarded as they arrive, a tool call's argument fragments as `tool_call_delta` events); when
the model stops for `TOOL_CALL`, run every call of the round concurrently through `ctx.run_tool`
(dispatch's governed choke point, the only way a tool runs), send their results back as `tool`
messages and go again, up to the tool-loop cap. Usage is reported once per round.

This module imports neither the SDK nor the engine (`_engine`): dispatch discovers every
installed runtime when it starts, and a runtime it does not run must cost it nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atmosphere.runtimes.cohere._settings import API_KEY, SETTINGS, CohereSettings
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig

if TYPE_CHECKING:
    from atmosphere.runtimes.cohere._engine import CohereEngine


class CohereAgentRuntime(AgentRuntime):
    """Cohere over its v2 Chat API (the `cohere` SDK's `AsyncClientV2`, never an OpenAI shim).

    Settings: `RuntimeConfig.extra`'s `CO_API_KEY`, `COHERE_BASE_URL` (or the SDK's `CO_API_URL`),
    `COHERE_MODEL` and `COHERE_MAX_TOKENS` (`atmosphere.runtimes.cohere._settings`). Available when an API key or a
    base URL is set; priority 100, so a configured Cohere key wins over the built-in runtime.

    Cohere has no agent object of its own to host: `hosts()` is always False, and every agent
    runs from its request and tools.

    Durable runs: `ctx.rounds` is honoured as in the built-in runtime: a committed round replays
    without a model call, a live one is committed once consumed.
    """

    name = "cohere"
    priority = 100
    environment = SETTINGS

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the SDK is imported, and its client made, on first use."""
        super().__init__(config)
        self.settings = CohereSettings.of(config)
        self._engine: CohereEngine | None = None

    def is_available(self) -> bool:
        """Available when `CO_API_KEY` or an http(s) base URL (`COHERE_BASE_URL`, `CO_API_URL`) is set."""
        return self.settings.configured

    def unavailable_reason(self) -> str:
        """What to set (the values themselves are never shown: they are secrets, or may hold one)."""
        if self.settings.configured:
            return ""
        if self.settings.base_url is not None:
            return f"{self.settings.base_url_setting} is not an http(s) URL"
        return f"no Cohere credentials: set {API_KEY}"

    def capabilities(self) -> frozenset[AiCapability]:
        """Each flag is pinned by the runtime contract suite (`atmosphere.testing`) on Cohere's wire."""
        return frozenset(
            {
                AiCapability.TEXT_STREAMING,
                AiCapability.SYSTEM_PROMPT,
                AiCapability.CONVERSATION_MEMORY,
                AiCapability.TOOL_CALLING,
                AiCapability.TOOL_CALL_DELTA,
                AiCapability.TOKEN_USAGE,
                AiCapability.PER_REQUEST_RETRY,
                AiCapability.CANCELLATION,
                AiCapability.STRUCTURED_OUTPUT,
                AiCapability.NATIVE_STRUCTURED_OUTPUT,
                AiCapability.MODEL_ENUMERATION,
            }
        )

    @property
    def engine(self) -> CohereEngine:
        """The engine, the SDK imported with it on first use."""
        if self._engine is None:
            from atmosphere.runtimes.cohere._engine import CohereEngine  # noqa: PLC0415 - see the module

            self._engine = CohereEngine(self.config, self.settings)
        return self._engine

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Answer `ctx.request`, ending `session` with `complete` or `error`."""
        await self.engine.execute(ctx, session)

    async def list_models(self) -> list[str]:
        """`GET /v1/models`, every page."""
        return await self.engine.list_models()

    async def aclose(self) -> None:
        """Close the SDK's HTTP client and its connection pool (nothing was opened if nothing ran)."""
        if self._engine is not None:
            await self._engine.aclose()
