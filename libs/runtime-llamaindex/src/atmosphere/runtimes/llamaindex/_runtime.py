"""`LlamaIndexAgentRuntime`: what dispatch discovers; the framework is imported only when an agent runs on it.

Every dispatch process loads every installed runtime when it starts (to report each one's state
and pick its own): this module imports no framework, the engine (`_engine`) does, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atmosphere.sdk import StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec, framework_object

if TYPE_CHECKING:
    from atmosphere.runtimes.llamaindex._engine import LlamaIndexEngine

CAPABILITIES = frozenset(
    {
        AiCapability.TEXT_STREAMING,
        AiCapability.SYSTEM_PROMPT,
        AiCapability.CONVERSATION_MEMORY,
        AiCapability.TOOL_CALLING,
        AiCapability.TOOL_CALL_DELTA,
        AiCapability.TOKEN_USAGE,
        AiCapability.PER_REQUEST_RETRY,
        AiCapability.CANCELLATION,
        AiCapability.MODEL_ENUMERATION,
    }
)

AGENTS_MODULE = "llama_index.core.agent.workflow"
"""Where LlamaIndex's agents and `AgentWorkflow` live (the module `hosts` looks in, never imports)."""


class LlamaIndexAgentRuntime(AgentRuntime):
    """Runs agents on LlamaIndex's agent workflows, against the OpenAI-compatible provider at `LLM_BASE_URL`."""

    name = "llamaindex"
    priority = 100

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the framework is imported, and its client made, on first use."""
        super().__init__(config)
        self._engine: LlamaIndexEngine | None = None

    def is_available(self) -> bool:
        """Available when an http(s) provider URL is configured."""
        return (self.config.base_url or "").lower().startswith(("http://", "https://"))

    def unavailable_reason(self) -> str:
        """What to set (the URL itself is never shown: it may carry credentials)."""
        if self.is_available():
            return ""
        return "LLM_BASE_URL is not an http(s) URL" if self.config.base_url else "no model configured: set LLM_BASE_URL"

    def capabilities(self) -> frozenset[AiCapability]:
        """Each flag is pinned by the runtime contract suite (`atmosphere.testing`)."""
        return CAPABILITIES

    @classmethod
    def hosts(cls, native: object) -> bool:
        """A LlamaIndex agent (`FunctionAgent`, `ReActAgent`, ...) or `AgentWorkflow` is hosted by this runtime."""
        return framework_object(native, AGENTS_MODULE, "BaseWorkflowAgent") or framework_object(
            native, AGENTS_MODULE, "AgentWorkflow"
        )

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The tools of every agent of the hosted object, as the choke point validates and governs them."""
        return self.engine.native_tools(native) if self.hosts(native) else ()

    @property
    def engine(self) -> LlamaIndexEngine:
        """The engine, the framework imported with it on first use."""
        if self._engine is None:
            from atmosphere.runtimes.llamaindex._engine import LlamaIndexEngine  # noqa: PLC0415 - see the module

            self._engine = LlamaIndexEngine(self.config)
        return self._engine

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run one request on LlamaIndex's agent workflow (see `_engine`)."""
        await self.engine.execute(ctx, session)

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        return await self.engine.list_models()

    async def aclose(self) -> None:
        """Close the client's connections (nothing was opened if nothing ran)."""
        if self._engine is not None:
            await self._engine.aclose()
