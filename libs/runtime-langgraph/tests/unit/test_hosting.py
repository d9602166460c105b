"""Which objects the `langgraph` runtime hosts: every compiled graph but those `create_agent` makes.

How a hosted graph runs (its ToolNodes' calls through the choke point, its subgraphs', its text
streamed) is tested with the `langchain` runtime's agents in `atmosphere-ai-langchain-bridge`.
"""

import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from pydantic import SecretStr

from atmosphere.runtimes.langgraph import LangGraphAgentRuntime


def echo_graph() -> StateGraph[MessagesState]:
    """A hand-built graph of one node, never run here."""

    def answer(state: MessagesState) -> dict[str, list[AIMessage]]:
        return {"messages": [AIMessage(f"you said {state['messages'][-1].text}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph


def test_it_hosts_compiled_graphs() -> None:
    compiled: CompiledStateGraph[MessagesState] = echo_graph().compile()
    assert LangGraphAgentRuntime.hosts(compiled)
    assert LangGraphAgentRuntime.hosts(compiled.with_config({"tags": ["mine"]}))
    outer = StateGraph(MessagesState)
    outer.add_node("inner", compiled)
    outer.add_edge(START, "inner")
    assert LangGraphAgentRuntime.hosts(outer.compile())


def test_it_hosts_no_langchain_agent_nor_anything_else() -> None:
    assert not LangGraphAgentRuntime.hosts(echo_graph())  # not compiled
    assert not LangGraphAgentRuntime.hosts(object())
    # `create_agent`'s graphs are the langchain runtime's to host (LangChain is not this package's dependency).
    agents = pytest.importorskip("langchain.agents")
    model = ChatOpenAI(model="fake-model", base_url="http://127.0.0.1:9/v1", api_key=SecretStr("k"))
    assert not LangGraphAgentRuntime.hosts(agents.create_agent(model, []))
