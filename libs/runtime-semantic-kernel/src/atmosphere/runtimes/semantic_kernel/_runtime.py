"""`SemanticKernelAgentRuntime`: what dispatch discovers; the framework is imported only when an agent runs on it.

Every dispatch process loads every installed runtime when it starts (to report each one's state
and pick its own): this module imports no framework, the engine (`_engine`) does, on first use.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from atmosphere.sdk import StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec, framework_object

if TYPE_CHECKING:
    from atmosphere.runtimes.semantic_kernel._engine import SemanticKernelEngine

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

QUIET_FRAMEWORK = {
    # SK's OpenTelemetry spans and events of every model call (the sensitive ones carry prompts and answers).
    "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS": "false",
    "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE": "false",
    # SK's version headers on the requests of the clients it makes itself.
    "AZURE_TELEMETRY_DISABLED": "true",
}
"""Semantic Kernel's telemetry switches, off unless the process's environment says otherwise.

SK reads them once, when it is first imported (also from a `.env` file in the working
directory, which an environment variable outranks), so they are set as early as this adapter
can: when dispatch discovers the runtime, before it loads an app's hosted agent (which imports SK).
"""


class SemanticKernelAgentRuntime(AgentRuntime):
    """Runs agents on Semantic Kernel, against the OpenAI-compatible provider at `LLM_BASE_URL`."""

    name = "semantic-kernel"
    priority = 100

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the framework is imported, and its client made, on first use."""
        super().__init__(config)
        self._engine: SemanticKernelEngine | None = None
        quiet_framework()

    def is_available(self) -> bool:
        """Available when an http(s) provider URL is configured."""
        return (self.config.base_url or "").lower().startswith(("http://", "https://"))

    def unavailable_reason(self) -> str:
        """What to set (the URL itself is never shown: it may carry credentials)."""
        if self.is_available():
            return ""
        return "LLM_BASE_URL is not an http(s) URL" if self.config.base_url else "no model configured: set LLM_BASE_URL"

    def capabilities(self) -> frozenset[AiCapability]:
        """Each flag is pinned by the runtime contract suite (`atmosphere.testing`).

        Not STRUCTURED_OUTPUT: SK passes a `response_format` through but cannot heal an answer
        that does not match it, which the contract requires.
        """
        return CAPABILITIES

    @classmethod
    def hosts(cls, native: object) -> bool:
        """A Semantic Kernel `ChatCompletionAgent` is hosted by this runtime (a bare `Kernel` is no agent)."""
        return framework_object(
            native, "semantic_kernel.agents.chat_completion.chat_completion_agent", "ChatCompletionAgent"
        )

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The hosted agent's kernel functions, named as the model sees them (`plugin-function`)."""
        return self.engine.native_tools(native) if self.hosts(native) else ()

    @property
    def engine(self) -> SemanticKernelEngine:
        """The engine, the framework imported with it on first use (see `import_engine`)."""
        if self._engine is None:
            self._engine = import_engine()(self.config)
        return self._engine

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run one request on the framework's agent (see `_engine`)."""
        await self.engine.execute(ctx, session)

    async def list_models(self) -> list[str]:
        """`GET <base>/models`."""
        return await self.engine.list_models()

    async def aclose(self) -> None:
        """Close the client's connections (nothing was opened if nothing ran)."""
        if self._engine is not None:
            await self._engine.aclose()


def import_engine() -> type[SemanticKernelEngine]:
    """The engine's class, importing Semantic Kernel with its telemetry off and its import-time noise silenced.

    SK's OpenAI connector defines pydantic models in a way pydantic deprecates, warning once as it
    is imported: nothing a deployer can act on, so not shown (and not an error under `-W error`).
    """
    quiet_framework()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from atmosphere.runtimes.semantic_kernel._engine import SemanticKernelEngine  # noqa: PLC0415 - see the module
    return SemanticKernelEngine


def quiet_framework() -> None:
    """Turn SK's telemetry off in this process's environment, where the environment does not say otherwise."""
    for variable, value in QUIET_FRAMEWORK.items():
        os.environ.setdefault(variable, value)
