"""`GraphRuntime`: the half of the `langchain` and `langgraph` runtimes that dispatch loads to discover them.

Every dispatch process loads every installed runtime's entry point when it starts (to report each
one's state and pick its own), and importing LangChain, LangGraph or the openai SDK takes seconds.
So this module imports no framework, only `atmosphere.sdk`: availability, capabilities and which
objects a runtime hosts are answered here, and the engine (`atmosphere.langchain_bridge.engine`), the
frameworks with it, is imported on a runtime's first use (a run, its models, a hosted graph's tools).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

from atmosphere.sdk import StreamingSession
from atmosphere.sdk.host import AiCapability
from atmosphere.sdk.runtime import AgentExecutionContext, AgentRuntime, RuntimeConfig, ToolSpec, framework_object

if TYPE_CHECKING:
    from atmosphere.langchain_bridge.engine import GraphEngine, OwnGraphBuilder

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
"""Each flag is pinned by the runtime contract suite (`atmosphere.testing.runtime_contract`).

Not declared: STRUCTURED_OUTPUT and NATIVE_STRUCTURED_OUTPUT (see each runtime's package docstring),
nor the capabilities the contract suite does not test."""

CREATE_AGENT_MARK = ("ls_integration", "langchain_create_agent")
"""The metadata `langchain.agents.create_agent` stamps on the graph it returns: such a graph is the
`langchain` runtime's to host, every other compiled graph the `langgraph` runtime's, so no object has
two hosts."""


def is_http_url(url: str | None) -> bool:
    """Whether `url` is one the provider client can call (`http://` or `https://`)."""
    return bool(url) and str(url).lower().startswith(("http://", "https://"))


def compiled_graph(native: object) -> bool:
    """Whether `native` is a compiled LangGraph graph (a `Pregel`), without importing LangGraph."""
    return framework_object(native, "langgraph.pregel", "Pregel")


def made_by_create_agent(native: object) -> bool:
    """Whether `native` carries `create_agent`'s mark: a LangChain agent rather than a hand-built graph.

    Read from the graph's `config` metadata, which `with_config` keeps, without importing LangGraph.
    """
    key, value = CREATE_AGENT_MARK
    config = getattr(native, "config", None)
    metadata = config.get("metadata") if isinstance(config, dict) else None
    return isinstance(metadata, dict) and metadata.get(key) == value


class GraphRuntime(AgentRuntime):
    """An `AgentRuntime` running LangGraph graphs against the OpenAI-compatible provider at `LLM_BASE_URL`.

    A subclass names itself (`name`, `priority`), says which compiled graphs it hosts (`hosts`, with
    `compiled_graph` and `made_by_create_agent`) and what they are (`hosted_objects`, for the error of
    a run given anything else), and supplies the builder of a run's own graph (`own_graph_builder`),
    which imports its framework: everything else is the engine's.
    """

    hosted_objects: ClassVar[str]
    """What the runtime hosts, in its error for anything else: `the <name> runtime hosts <this>, not X`."""

    def __init__(self, config: RuntimeConfig) -> None:
        """Configure; the frameworks are imported, and the provider's HTTP clients opened, on first use."""
        super().__init__(config)
        self._engine: GraphEngine | None = None

    def is_available(self) -> bool:
        """Available when an http(s) provider URL is configured (the frameworks are dependencies)."""
        return is_http_url(self.config.base_url)

    def unavailable_reason(self) -> str:
        """What to set (the URL itself is never shown: it may carry credentials)."""
        if self.is_available():
            return ""
        return "LLM_BASE_URL is not an http(s) URL" if self.config.base_url else "no model configured: set LLM_BASE_URL"

    def capabilities(self) -> frozenset[AiCapability]:
        """The contract-tested flags (no structured output: see the runtime's package docstring)."""
        return CAPABILITIES

    @abc.abstractmethod
    def own_graph_builder(self) -> OwnGraphBuilder:
        """The builder of a run's own graph (importing it imports the framework: called on first use)."""

    @property
    def engine(self) -> GraphEngine:
        """The engine, the frameworks imported with it on first use."""
        if self._engine is None:
            # Imported here, not at the top: LangChain, LangGraph and openai take seconds to import, and
            # dispatch loads every installed runtime's entry point (this module) when it starts.
            from atmosphere.langchain_bridge.engine import GraphEngine  # noqa: PLC0415 - see the comment

            self._engine = GraphEngine(
                self.config, self.own_graph_builder(), runtime=self.name, hosted_objects=self.hosted_objects
            )
        return self._engine

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The tools a hosted graph's ToolNodes run (and its subgraphs')."""
        return self.engine.native_tools(native) if compiled_graph(native) else ()

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run the agent (or the hosted graph), ending `session` with `complete` or `error`."""
        await self.engine.execute(ctx, session)

    async def list_models(self) -> list[str]:
        """The provider's models (`GET <base>/models`)."""
        return await self.engine.list_models()

    async def aclose(self) -> None:
        """Close the provider's HTTP clients (nothing was opened if nothing ran)."""
        if self._engine is not None:
            await self._engine.aclose()
