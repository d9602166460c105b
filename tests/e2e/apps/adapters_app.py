"""Every runtime through the platform: an agent per runtime, and each framework's own object hosted.

`on-<runtime>` is the same agent (three tools: `lookup` answers, `forbidden` is denied by the
test's policy, `transfer` needs the client's approval) pinned to each runtime (`on-built-in` to
none: the default pool). `hosted-<framework>` serves a real object of that framework, built the
way its users build one, with three tools of its own: `native_lookup`, `native_forbidden` (denied
by the policy too) and `native_transfer` (the operator's tool permissions say `confirm`). Every
tool writes one line to a ledger file (`ATMOSPHERE_ADAPTERS_LEDGER`) when it runs: what must never
happen for a denied call.

The hosted objects that carry a model of their own (LangChain's agent, the LangGraph graph) point it
at `LLM_BASE_URL`, where the test's scripted provider listens; PydanticAI's and the Agents SDK's
name no model, so the platform's configured one runs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import agents
import pydantic_ai
from langchain.agents import create_agent
from langchain_core.messages import AnyMessage
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

from atmosphere.sdk import App, agent, hosted_agent, tool

LEDGER_ENV = "ATMOSPHERE_ADAPTERS_LEDGER"
RUNTIMES = ("built-in", "langchain", "langgraph", "pydantic-ai", "openai-agents", "anthropic")
FRAMEWORKS = ("langchain", "langgraph", "pydantic-ai", "openai-agents")


def ran(line: str) -> None:
    """Record that a tool ran (the ledger is the test's evidence)."""
    with Path(os.environ[LEDGER_ENV]).open("a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")


@tool(idempotent=True)
async def lookup(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    ran(f"lookup {city}")
    return f"sunny in {city}"


@tool
async def forbidden(target: str) -> str:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    ran(f"forbidden {target}")
    return "it ran"


@tool(requires_approval=True)
async def transfer(amount: int) -> str:
    """Move money: a human approves it first.

    Args:
        amount: How much.
    """
    ran(f"transfer {amount}")
    return f"transferred {amount}"


def _on(runtime: str) -> type[Any]:
    cls = type(f"On{runtime.title().replace('-', '')}", (), {"__doc__": f"The test agent on the {runtime} runtime."})
    pinned = None if runtime == "built-in" else runtime
    decorate = agent(name=f"on-{runtime}", tools=[lookup, forbidden, transfer], harness=[], runtime=pinned)
    return decorate(cls)


def native_lookup_text(city: str) -> str:
    ran(f"native_lookup {city}")
    return f"cloudy in {city}"


def native_forbidden_text(target: str) -> str:
    ran(f"native_forbidden {target}")
    return "it ran"


def native_transfer_text(amount: int) -> str:
    ran(f"native_transfer {amount}")
    return f"moved {amount}"


@langchain_tool
def native_lookup(city: str) -> str:
    """Current weather for a city, the framework's own way.

    Args:
        city: The city's name.
    """
    return native_lookup_text(city)


@langchain_tool
def native_forbidden(target: str) -> str:
    """Something the policy never lets run.

    Args:
        target: What it would act on.
    """
    return native_forbidden_text(target)


@langchain_tool
def native_transfer(amount: int) -> str:
    """Move money (the operator's tool permissions make a human confirm it).

    Args:
        amount: How much.
    """
    return native_transfer_text(amount)


NATIVE_TOOLS = [native_lookup, native_forbidden, native_transfer]


def _user_model() -> ChatOpenAI:
    """The model a LangChain user configures: here, the test's provider."""
    return ChatOpenAI(
        model="fake-model",
        base_url=os.environ.get("LLM_BASE_URL") or "http://127.0.0.1:9/v1",
        api_key=SecretStr("user-key"),
        stream_usage=True,
        max_retries=0,
    )


def langchain_agent() -> Any:
    return create_agent(_user_model(), NATIVE_TOOLS, system_prompt="You answer briefly.")


def langgraph_graph() -> Any:
    model = _user_model().bind_tools(NATIVE_TOOLS)

    async def call_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(NATIVE_TOOLS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def pydantic_ai_agent() -> pydantic_ai.Agent[None, str]:
    hosted = pydantic_ai.Agent(instructions="You answer briefly.", name="pydantic")
    hosted.tool_plain(name="native_lookup")(native_lookup_text)
    hosted.tool_plain(name="native_forbidden")(native_forbidden_text)
    hosted.tool_plain(name="native_transfer")(native_transfer_text)
    return hosted


def openai_agents_agent() -> agents.Agent[None]:
    tools = [
        agents.function_tool(native_lookup_text, name_override="native_lookup"),
        agents.function_tool(native_forbidden_text, name_override="native_forbidden"),
        agents.function_tool(native_transfer_text, name_override="native_transfer"),
    ]
    return agents.Agent(name="openai-agents", instructions="You answer briefly.", tools=tools)


HOSTED = {
    "langchain": langchain_agent(),
    "langgraph": langgraph_graph(),
    "pydantic-ai": pydantic_ai_agent(),
    "openai-agents": openai_agents_agent(),
}

app = App(
    agents=[
        *(_on(runtime) for runtime in RUNTIMES),
        *(hosted_agent(f"hosted-{framework}", HOSTED[framework]) for framework in FRAMEWORKS),
    ]
)
