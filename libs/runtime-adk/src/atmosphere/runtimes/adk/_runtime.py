"""`AdkAgentRuntime`: what dispatch discovers; ADK is imported only when an agent runs on it.

Every dispatch process loads every installed runtime when it starts (to report each one's state
and pick its own): this module imports no framework, the engine (`_engine`) does, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atmosphere.runtimes.adk._settings import BASE_URL, SETTINGS, GeminiSettings
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec, framework_object

if TYPE_CHECKING:
    from atmosphere.runtimes.adk._engine import AdkEngine

CAPABILITIES = frozenset(
    {
        AiCapability.TEXT_STREAMING,
        AiCapability.SYSTEM_PROMPT,
        AiCapability.CONVERSATION_MEMORY,
        AiCapability.TOOL_CALLING,
        AiCapability.TOKEN_USAGE,
        AiCapability.PER_REQUEST_RETRY,
        AiCapability.CANCELLATION,
        AiCapability.MODEL_ENUMERATION,
    }
)


class AdkAgentRuntime(AgentRuntime):
    """Runs agents on Google's Agent Development Kit, with Gemini through `google-genai`."""

    name = "adk"
    priority = 100
    environment = SETTINGS

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; ADK is imported, and the client made, on first use."""
        super().__init__(config)
        self.settings = GeminiSettings.of(config)
        self._engine: AdkEngine | None = None

    def is_available(self) -> bool:
        """Available when an API key or an http(s) base URL is configured."""
        return self.settings.configured

    def unavailable_reason(self) -> str:
        """What to set (neither the key nor the URL is ever shown)."""
        if self.is_available():
            return ""
        if self.settings.base_url is not None:
            return f"{BASE_URL} is not an http(s) URL"
        return "no Gemini credentials: set GOOGLE_API_KEY"

    def capabilities(self) -> frozenset[AiCapability]:
        """Each flag is pinned by the runtime contract suite (`atmosphere.testing`)."""
        return CAPABILITIES

    @classmethod
    def hosts(cls, native: object) -> bool:
        """An ADK agent (any `BaseAgent`: an `LlmAgent`, a workflow agent, a custom one) is hosted by this runtime."""
        return framework_object(native, "google.adk.agents.base_agent", "BaseAgent")

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's own tools and its sub-agents', as the choke point validates and governs them."""
        return self.engine.native_tools(native) if self.hosts(native) else ()

    @property
    def engine(self) -> AdkEngine:
        """The engine, ADK imported with it on first use."""
        if self._engine is None:
            from atmosphere.runtimes.adk._engine import AdkEngine  # noqa: PLC0415 - see the module

            self._engine = AdkEngine(self.config, self.settings)
        return self._engine

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run one request on ADK's runner (see `_engine`)."""
        await self.engine.execute(ctx, session)

    async def list_models(self) -> list[str]:
        """`GET <base>/v1beta/models`."""
        return await self.engine.list_models()

    async def aclose(self) -> None:
        """Close the client's connections (nothing was opened if nothing ran)."""
        if self._engine is not None:
            await self._engine.aclose()
