"""`GraphEngine`: one run of a LangGraph graph, streamed into Atmosphere's session.

What the `langchain` and `langgraph` runtimes share once a run needs the frameworks (their
`GraphRuntime`, which dispatch loads to discover them, imports this module on first use). A run is
either the Atmosphere agent's own graph, which the runtime's builder makes per run (`OwnGraphBuilder`:
LangChain's `create_agent`, or an explicit `StateGraph`), or the user's hosted graph, run as a copy
whose ToolNodes pass every call through the choke point (`hosting.governed`). Either is streamed with
`stream_mode="messages"`: text, tool-call fragments and usage relayed (`relay.Relay`), the failures a
run can name ending it with the built-in runtime's texts and codes (`failures.failure_of`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from atmosphere.langchain_bridge.failures import failure_of
from atmosphere.langchain_bridge.hosting import governed, tool_specs
from atmosphere.langchain_bridge.provider import Provider
from atmosphere.langchain_bridge.relay import Relay, conversation
from atmosphere.langchain_bridge.tools import run_tool_of
from atmosphere.sdk import StreamingSession
from atmosphere.sdk.runtime import AgentExecutionContext, RuntimeConfig, ToolSpec


class OwnGraph(NamedTuple):
    """The Atmosphere agent's graph of one run, its input state, and the config it runs with."""

    graph: Pregel[Any, Any, Any, Any]
    state: dict[str, Any]
    config: RunnableConfig


OwnGraphBuilder = Callable[[Provider, AgentExecutionContext], OwnGraph]
"""Builds a run's own graph: the provider's chat model (`Provider.chat_model`), the agent's prompt,
tools (`tools.agent_tools`) and tool-loop policy, and `Provider.config.call_timeout` for each call."""


class GraphEngine:
    """Runs one runtime's graphs: its own per run (from its builder), and the user's hosted ones."""

    def __init__(self, config: RuntimeConfig, own_graph: OwnGraphBuilder, *, runtime: str, hosted_objects: str) -> None:
        """Configure the runtime named `runtime`, which hosts `hosted_objects`; nothing is opened yet."""
        self._provider = Provider(config)
        self._own_graph = own_graph
        self._runtime = runtime
        self._hosted_objects = hosted_objects

    def native_tools(self, native: object) -> tuple[ToolSpec, ...]:
        """The tools the hosted graph's ToolNodes run."""
        return tool_specs(native) if isinstance(native, Pregel) else ()

    async def list_models(self) -> list[str]:
        """The provider's models (`GET <base>/models`)."""
        return await self._provider.list_models()

    async def aclose(self) -> None:
        """Close the provider's HTTP clients."""
        await self._provider.aclose()

    async def execute(self, ctx: AgentExecutionContext, session: StreamingSession) -> None:
        """Run the agent (or the hosted graph), ending `session` with `complete` or `error`."""
        relay = Relay(session)
        stream = self._hosted(ctx) if ctx.native is not None else self._own(ctx)
        try:
            async for message in stream:
                await relay.forward(message)
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            await session.error(failure.message, code=failure.code, retryable=failure.retryable)
            return
        await session.complete()

    def _own(self, ctx: AgentExecutionContext) -> AsyncIterator[BaseMessage]:
        """The Atmosphere agent as this run's graph: its prompt, tools and tool-loop policy."""
        own = self._own_graph(self._provider, ctx)
        return _messages(own.graph, own.state, own.config, subgraphs=False)

    def _hosted(self, ctx: AgentExecutionContext) -> AsyncIterator[BaseMessage]:
        """The user's graph with its own prompt, model, tools and loop; its tool calls governed."""
        native = ctx.native
        if not isinstance(native, Pregel):
            msg = f"the {self._runtime} runtime hosts {self._hosted_objects}, not {type(native).__name__}"
            raise TypeError(msg)
        graph = governed(native, run_tool_of(ctx))
        # A graph compiled with a checkpointer needs a thread: one per run, since Atmosphere's memory
        # supplies the history (a thread per conversation would hold it twice).
        config: RunnableConfig = {"configurable": {"thread_id": ctx.run_id}}
        # Subgraphs too (a subgraph node, an agent calling another as a tool): their models' text is
        # the answer's, and their usage counts.
        return _messages(graph, {"messages": conversation(ctx.request)}, config, subgraphs=True)


async def _messages(
    graph: Pregel[Any, Any, Any, Any], state: dict[str, Any], config: RunnableConfig, *, subgraphs: bool
) -> AsyncIterator[BaseMessage]:
    """The messages `graph` streams as it runs (`stream_mode="messages"`), whichever graph sent them."""
    async for part in graph.astream(state, config, stream_mode="messages", subgraphs=subgraphs, version="v2"):
        if part["type"] == "messages":
            message, _metadata = part["data"]
            yield message
