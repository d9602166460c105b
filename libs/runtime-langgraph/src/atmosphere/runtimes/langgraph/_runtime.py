"""`LangGraphAgentRuntime`: Atmosphere's `AgentRuntime` SPI over LangGraph (see the package docstring).

Imports no framework (dispatch loads it to list the installed runtimes): what runs a graph is
`atmosphere.langchain_bridge`'s, and this runtime's own graph is `_graph`'s, imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atmosphere.langchain_bridge.runtime import GraphRuntime, compiled_graph, made_by_create_agent

if TYPE_CHECKING:
    from atmosphere.langchain_bridge.engine import OwnGraphBuilder


class LangGraphAgentRuntime(GraphRuntime):
    """Atmosphere agents as LangGraph graphs, and the user's own compiled graphs hosted."""

    name = "langgraph"
    priority = 100
    hosted_objects = "compiled graphs"

    @classmethod
    def hosts(cls, native: object) -> bool:
        """Any compiled graph but `create_agent`'s, which the `langchain` runtime hosts."""
        return compiled_graph(native) and not made_by_create_agent(native)

    def own_graph_builder(self) -> OwnGraphBuilder:
        """A run's explicit `StateGraph` (a model node, a ToolNode, the tool loop as its routing)."""
        # Imported here, not at the top: LangGraph takes seconds to import, and dispatch loads this
        # module (the entry point) when it starts, whether or not an agent ever runs on LangGraph.
        from atmosphere.runtimes.langgraph._graph import own_graph  # noqa: PLC0415 - see the comment

        return own_graph
