"""A LangGraph graph (a model node and a `ToolNode`), as its users build one."""

from __future__ import annotations

from langchain_core.messages import AnyMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tests.e2e.apps.hosted._langchain_tools import NATIVE_TOOLS, user_model

model = user_model().bind_tools(NATIVE_TOOLS)


async def call_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
    return {"messages": [await model.ainvoke(state["messages"])]}


graph = StateGraph(MessagesState)
graph.add_node("model", call_model)
graph.add_node("tools", ToolNode(NATIVE_TOOLS))
graph.add_edge(START, "model")
graph.add_conditional_edges("model", tools_condition)
graph.add_edge("tools", "model")
hosted = graph.compile()
