"""Agents you already built with a framework, served as they are: `hosted_agent(name, obj)`.

ATMOSPHERE_APP=examples.runtimes.hosted:app

Each object keeps its own prompt, tools and loop; its tool calls pass the platform's governance,
approval and tape. The LangChain and LangGraph objects carry their own model, pointed here at the
stack's (`LLM_BASE_URL`); the PydanticAI and Agents SDK ones name none, so the platform's runs them.
"""

import os
from typing import Any

import agents
import pydantic_ai
from langchain.agents import create_agent
from langchain_core.messages import AnyMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

from atmosphere.sdk import App, hosted_agent


def weather_in(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    return f"sunny, 22C in {city}"


get_weather = tool("get_weather")(weather_in)


def stack_model() -> ChatOpenAI:
    """The stack's own model (what `make run` serves, or your `LLM_BASE_URL`)."""
    return ChatOpenAI(
        model=os.environ.get("LLM_MODEL") or "default",
        base_url=os.environ.get("LLM_BASE_URL") or "http://127.0.0.1:8090/v1",
        api_key=SecretStr(os.environ.get("LLM_API_KEY") or "no-key"),
        stream_usage=True,
    )


def langgraph_graph() -> Any:
    """A hand-built LangGraph agent: a model node with the tool bound, a ToolNode, a loop between them."""
    model = stack_model().bind_tools([get_weather])

    async def call_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


langchain_agent = create_agent(stack_model(), [get_weather], system_prompt="You answer weather questions briefly.")

pydantic_agent: pydantic_ai.Agent[None, str] = pydantic_ai.Agent(
    instructions="You answer weather questions briefly.", tools=[weather_in]
)

agents_sdk_agent: agents.Agent[None] = agents.Agent(
    name="weather", instructions="You answer weather questions briefly.", tools=[agents.function_tool(weather_in)]
)

app = App(
    agents=[
        hosted_agent("langchain-weather", langchain_agent),
        hosted_agent("langgraph-weather", langgraph_graph()),
        hosted_agent("pydantic-weather", pydantic_agent),
        hosted_agent("agents-sdk-weather", agents_sdk_agent),
    ]
)
