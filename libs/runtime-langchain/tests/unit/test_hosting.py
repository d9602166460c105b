"""Which objects the `langchain` runtime hosts: the agents `create_agent` makes, and no other graph.

How a hosted agent runs (its tool calls through the choke point, its middleware inside `local`, its
text streamed) is tested with the `langgraph` runtime's graphs in `atmosphere-ai-langchain-bridge`.
"""

from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic import SecretStr

from atmosphere.runtimes.langchain import LangChainAgentRuntime


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def agent() -> Any:
    """A LangChain agent, on a model these tests never call."""
    model = ChatOpenAI(model="fake-model", base_url="http://127.0.0.1:9/v1", api_key=SecretStr("k"))
    return create_agent(model, [get_weather], system_prompt="You report the weather.")


def test_it_hosts_langchain_agents_however_configured() -> None:
    assert LangChainAgentRuntime.hosts(agent())
    assert LangChainAgentRuntime.hosts(agent().with_config({"tags": ["mine"]}))


def test_it_hosts_no_other_graph_nor_anything_marked_like_an_agent() -> None:
    hand_built = StateGraph(MessagesState)
    hand_built.add_node("tools", ToolNode([get_weather]))
    hand_built.add_edge(START, "tools")
    assert not LangChainAgentRuntime.hosts(hand_built.compile())  # the langgraph runtime's
    assert not LangChainAgentRuntime.hosts(hand_built)  # not compiled
    assert not LangChainAgentRuntime.hosts(object())

    class LookAlike:
        """Carries create_agent's mark, but is no compiled graph."""

        config = agent().config

    assert not LangChainAgentRuntime.hosts(LookAlike())
