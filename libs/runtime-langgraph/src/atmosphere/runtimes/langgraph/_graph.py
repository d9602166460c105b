"""An Atmosphere agent as an explicit LangGraph `StateGraph`: a model node, a tools node, and the tool loop.

    START -> model -> (tool calls within the cap)  -> tools          -> model
                   -> (tool calls past a lenient cap) -> withdraw_tools -> model (offered no tools)
                   -> (an answer)                     -> END

Past a strict cap the route raises `ToolLoopExhaustedError` before any of that round's tools run.

`own_graph` is the runtime's builder (`atmosphere.langchain_bridge.engine.OwnGraphBuilder`): the
bridge's engine runs the graph it returns. This module imports LangGraph: only a run imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

from atmosphere.langchain_bridge.engine import OwnGraph
from atmosphere.langchain_bridge.failures import ToolLoopExhaustedError, within_deadline
from atmosphere.langchain_bridge.provider import Provider
from atmosphere.langchain_bridge.relay import conversation
from atmosphere.langchain_bridge.tools import TOOL_LIMIT_REACHED, agent_tools
from atmosphere.sdk import OnMaxIterations, ToolLoopPolicy
from atmosphere.sdk.runtime import AgentExecutionContext


class AgentState(MessagesState):
    """The conversation, and whether the model may still ask for tools."""

    tools_withdrawn: bool


def own_graph(provider: Provider, ctx: AgentExecutionContext) -> OwnGraph:
    """The Atmosphere agent as this run's graph: its prompt, tools and tool-loop policy."""
    graph = agent_graph(
        provider.chat_model(ctx), agent_tools(ctx), ctx.tool_loop, call_timeout=provider.config.call_timeout
    )
    system = [SystemMessage(ctx.request.system_prompt)] if ctx.request.system_prompt else []
    state = {"messages": [*system, *conversation(ctx.request)], "tools_withdrawn": False}
    return OwnGraph(graph, state, {"recursion_limit": recursion_limit(ctx.tool_loop)})


def agent_graph(
    model: BaseChatModel, tools: Sequence[BaseTool], policy: ToolLoopPolicy, *, call_timeout: float
) -> CompiledStateGraph[AgentState, None, AgentState, AgentState]:
    """The compiled graph of one run (its input: `{"messages": [...], "tools_withdrawn": False}`)."""
    with_tools = model.bind_tools(tools) if tools else model

    async def call_model(state: AgentState) -> dict[str, Any]:
        bound = model if state["tools_withdrawn"] else with_tools
        reply = await within_deadline(call_timeout, bound.ainvoke(state["messages"]))
        return {"messages": [reply]}

    def next_step(state: AgentState) -> str:
        reply = state["messages"][-1]
        if state["tools_withdrawn"] or not isinstance(reply, AIMessage) or not reply.tool_calls:
            return END
        if _tool_rounds(state["messages"]) <= policy.cap:
            return "tools"
        if policy.on_max_iterations is OnMaxIterations.FAIL:
            raise ToolLoopExhaustedError(policy.cap)
        return "withdraw_tools"

    graph = StateGraph(AgentState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_node("withdraw_tools", _withdraw_tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", next_step, ["tools", "withdraw_tools", END])
    graph.add_edge("tools", "model")
    graph.add_edge("withdraw_tools", "model")
    return graph.compile()


def recursion_limit(policy: ToolLoopPolicy) -> int:
    """The steps of the longest run the policy allows, so LangGraph's own limit never cuts it first.

    A model step, two per tool round, two to withdraw the tools, and the one in which LangGraph sees
    there is nothing left to run.
    """
    return 1 + 2 * policy.cap + 2 + 1


def _withdraw_tools(state: AgentState) -> dict[str, Any]:
    """Refuse the calls past the cap, so the model answers with what it has."""
    reply = state["messages"][-1]
    assert isinstance(reply, AIMessage)  # routed here only for a reply with tool calls
    refusals = [ToolMessage(TOOL_LIMIT_REACHED, tool_call_id=call["id"]) for call in reply.tool_calls]
    return {"messages": refusals, "tools_withdrawn": True}


def _tool_rounds(messages: Sequence[AnyMessage]) -> int:
    """The model's replies that asked for tools (the history going in holds none: it is text only)."""
    return sum(1 for m in messages if isinstance(m, AIMessage) and m.tool_calls)
