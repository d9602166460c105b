"""`LangChainAgentRuntime`: Atmosphere's `AgentRuntime` SPI over LangChain (see the package docstring).

The entry point's class. Light, as dispatch needs it: its base, `GraphRuntime`, answers from the
configuration alone and runs on the bridge's engine, and LangChain is imported with `_agent` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atmosphere.langchain_bridge.runtime import GraphRuntime, compiled_graph, made_by_create_agent

if TYPE_CHECKING:
    from atmosphere.langchain_bridge.engine import OwnGraphBuilder


class LangChainAgentRuntime(GraphRuntime):
    """Atmosphere agents on LangChain's agent loop, and the user's own LangChain agents hosted."""

    name = "langchain"
    priority = 100
    hosted_objects = "create_agent's agents"

    @classmethod
    def hosts(cls, native: object) -> bool:
        """An agent `create_agent` made (every other compiled graph is the `langgraph` runtime's)."""
        return compiled_graph(native) and made_by_create_agent(native)

    def own_graph_builder(self) -> OwnGraphBuilder:
        """A run's LangChain agent (`create_agent`, the tool loop and the deadline as its middleware)."""
        # Imported here, not at the top: LangChain takes seconds to import, and dispatch loads this
        # module (the entry point) when it starts, whether or not an agent ever runs on LangChain.
        from atmosphere.runtimes.langchain._agent import own_graph  # noqa: PLC0415 - see the comment

        return own_graph
