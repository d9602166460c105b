"""Hosting a user's graph on either runtime, against the scripted model: a real `create_agent` agent on
the `langchain` runtime, a real hand-built `StateGraph` on the `langgraph` one, each with a real `@tool`.

Which objects each runtime hosts is its own package's test (`tests/unit/test_hosting.py` there).
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware import ToolCallRequest as NodeToolCall
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

from atmosphere.langchain_bridge.runtime import GraphRuntime
from atmosphere.runtimes.langchain import LangChainAgentRuntime
from atmosphere.runtimes.langgraph import LangGraphAgentRuntime
from atmosphere.sdk import AiRequest
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolSpec
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


class Gate(Recorder):
    """The choke point as a hosted tool sees it: records each call, then refuses it or runs it via `local`."""

    def __init__(self, verdict: str | None = None, arguments: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.verdict = verdict
        self.arguments = arguments
        """Approval-edited arguments to run the call with instead of the model's."""
        self.in_local = False
        """Whether `local` is running: a hosted tool must run only then."""

    async def run_tool(self, call: ToolCallRequest) -> str:
        self.tool_calls.append(call)
        if self.verdict is not None:
            return self.verdict
        assert call.local is not None
        arguments = call.arguments_json if self.arguments is None else json.dumps(self.arguments)
        self.in_local = True
        try:
            return await call.local(arguments)
        finally:
            self.in_local = False


@dataclass
class Weather:
    """A real LangChain tool, the cities it was really run for, and whether each run was inside `local`."""

    gate: Gate | None = None
    ran: list[str] = field(default_factory=list)
    ran_outside_local: list[str] = field(default_factory=list)

    def tool(self) -> Any:
        @tool
        async def get_weather(city: str) -> str:
            """Current weather for a city."""
            self.ran.append(city)
            if self.gate is None or not self.gate.in_local:
                self.ran_outside_local.append(city)
            if city == "Atlantis":
                raise ValueError("no station in Atlantis")
            return f"sunny in {city}"

        return get_weather


@pytest.fixture
async def http() -> AsyncIterator[tuple[openai.DefaultAsyncHttpxClient, openai.DefaultHttpxClient]]:
    """The user's model's HTTP clients, closed after the test (LangChain's defaults are process-wide)."""
    async_client, sync_client = openai.DefaultAsyncHttpxClient(), openai.DefaultHttpxClient()
    yield async_client, sync_client
    await async_client.aclose()
    sync_client.close()


def offline_model() -> ChatOpenAI:
    """A model for the tests that never call it."""
    return ChatOpenAI(model="fake-model", base_url="http://127.0.0.1:9/v1", api_key=SecretStr("k"))


def user_model(provider: ScriptedModel, http: tuple[Any, Any]) -> ChatOpenAI:
    return ChatOpenAI(
        model="fake-model",
        base_url=provider.base_url,
        api_key=SecretStr("user-key"),
        stream_usage=True,
        max_retries=0,
        http_async_client=http[0],
        http_client=http[1],
    )


def weather_agent(model: ChatOpenAI, weather: Weather, middleware: Sequence[AgentMiddleware] = ()) -> Any:
    """The user's agent, as LangChain makes one: the `langchain` runtime's to host."""
    return create_agent(model, [weather.tool()], system_prompt="You report the weather.", middleware=middleware)


def weather_graph(model: ChatOpenAI, weather: Weather) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The canonical hand-built agent (a model node with the tool bound, a ToolNode, tools_condition):
    the `langgraph` runtime's to host."""
    get_weather = weather.tool()
    bound = model.bind_tools([get_weather])

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def outer_graph(model: ChatOpenAI, weather: Weather) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A graph whose one node is the hand-built weather agent, as a subgraph."""
    outer = StateGraph(MessagesState)
    outer.add_node("agent", weather_graph(model, weather))
    outer.add_edge(START, "agent")
    return outer.compile()


@dataclass(frozen=True)
class Hosting:
    """A runtime, and how the user makes the kind of graph it hosts."""

    runtime: type[GraphRuntime]
    graph: Callable[[ChatOpenAI, Weather], Any]


@pytest.fixture(
    params=[Hosting(LangChainAgentRuntime, weather_agent), Hosting(LangGraphAgentRuntime, weather_graph)],
    ids=lambda hosting: hosting.runtime.name,
)
def hosting(request: pytest.FixtureRequest) -> Hosting:
    chosen: Hosting = request.param
    return chosen


async def host(runtime_class: type[GraphRuntime], provider: ScriptedModel, graph: object, recorder: Recorder) -> None:
    runtime = runtime_class(RuntimeConfig(base_url=provider.base_url, model="fake-model"))
    try:
        await runtime.execute(context(recorder, AiRequest(message="Weather in Paris?"), native=graph), recorder.session)
    finally:
        await runtime.aclose()


def script_weather(provider: ScriptedModel, city: str = "Paris") -> None:
    provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": city}, call_id="call_w")),
        Turn.text("It is sunny in Paris.", usage=(20, 6)),
    )


def test_every_graph_has_exactly_one_host() -> None:
    model = offline_model()
    graphs = {
        "langchain": [weather_agent(model, Weather()), weather_agent(model, Weather()).with_config({"tags": ["t"]})],
        "langgraph": [weather_graph(model, Weather()), outer_graph(model, Weather())],
    }
    for name, made in graphs.items():
        for graph in made:
            hosts = [cls.name for cls in (LangChainAgentRuntime, LangGraphAgentRuntime) if cls.hosts(graph)]
            assert hosts == [name]


def test_native_tools_are_the_tool_nodes_tools_as_the_model_sees_them(hosting: Hosting) -> None:
    graph = hosting.graph(offline_model(), Weather())
    runtime = hosting.runtime(RuntimeConfig(base_url="http://127.0.0.1:9/v1"))
    assert runtime.native_tools(graph) == (
        ToolSpec(
            name="get_weather",
            description="Current weather for a city.",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        ),
    )


async def test_a_tool_call_passes_the_choke_point_and_runs_only_through_local(
    hosting: Hosting, fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider)
    gate = Gate()
    weather = Weather(gate)
    graph = hosting.graph(user_model(fake_provider, http), weather)
    original_tool_node = graph.nodes["tools"].bound
    await host(hosting.runtime, fake_provider, graph, gate)

    [call] = gate.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_w", "get_weather", {"city": "Paris"})
    assert call.local is not None
    assert weather.ran == ["Paris"]
    assert weather.ran_outside_local == []
    tool_result = {"role": "tool", "tool_call_id": "call_w", "content": "sunny in Paris"}
    assert fake_provider.requests[1].messages[-1] == tool_result
    assert gate.text() == "It is sunny in Paris."
    assert gate.kinds().count("text_delta") >= 2
    usage = [(e.usage.input_tokens, e.usage.output_tokens) for e in gate.events if e.WhichOneof("kind") == "usage"]
    assert usage == [(10, 5), (20, 6)]  # one report per model round
    assert gate.terminal().WhichOneof("kind") == "complete"
    assert graph.nodes["tools"].bound is original_tool_node, "the user's graph was changed"


async def test_a_refused_call_never_runs_and_the_model_reads_the_refusal(
    hosting: Hosting, fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider)
    gate = Gate(verdict="Error: denied")
    weather = Weather(gate)
    await host(hosting.runtime, fake_provider, hosting.graph(user_model(fake_provider, http), weather), gate)
    assert len(gate.tool_calls) == 1
    assert weather.ran == []
    assert fake_provider.requests[1].last_tool_result == "Error: denied"
    assert gate.terminal().WhichOneof("kind") == "complete"


async def test_local_runs_the_tool_with_the_approved_arguments(
    hosting: Hosting, fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider)
    gate = Gate(arguments={"city": "Rome"})
    weather = Weather(gate)
    await host(hosting.runtime, fake_provider, hosting.graph(user_model(fake_provider, http), weather), gate)
    assert weather.ran == ["Rome"]
    assert weather.ran_outside_local == []
    assert fake_provider.requests[1].last_tool_result == "sunny in Rome"


async def test_a_failing_tool_is_an_error_text_for_the_model(
    hosting: Hosting, fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider, city="Atlantis")
    gate = Gate()
    await host(hosting.runtime, fake_provider, hosting.graph(user_model(fake_provider, http), Weather(gate)), gate)
    assert fake_provider.requests[1].last_tool_result == "Error: no station in Atlantis"
    assert gate.terminal().WhichOneof("kind") == "complete"


async def test_cancelling_a_hosted_run_closes_the_upstream_request(
    hosting: Hosting, fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    graph = hosting.graph(user_model(fake_provider, http), Weather())
    task = asyncio.create_task(host(hosting.runtime, fake_provider, graph, recorder))
    for _ in range(200):
        if recorder.text():
            break
        await asyncio.sleep(0.01)
    assert recorder.text() == "Thinking"
    cancelled_at = time.monotonic()
    task.cancel()
    await asyncio.wait({task}, timeout=10.0)
    await asyncio.wait_for(fake_provider.disconnected.wait(), 10.0)
    assert time.monotonic() - cancelled_at < 10.0  # the stall lasts 30 s; loose for a loaded machine


# -- LangChain agents (the `langchain` runtime) ---------------------------------------------------


class Shouting(AgentMiddleware):
    """A user's tool-call middleware: it must run inside `local`, between the choke point and the tool."""

    async def awrap_tool_call(self, request: NodeToolCall, handler: Any) -> Any:
        result = await handler(request)
        return result.model_copy(update={"content": str(result.content).upper()})


async def test_a_hosted_agent_keeps_its_own_prompt(fake_provider: ScriptedModel, http: tuple[Any, Any]) -> None:
    script_weather(fake_provider)
    gate = Gate()
    agent = weather_agent(user_model(fake_provider, http), Weather(gate))
    await host(LangChainAgentRuntime, fake_provider, agent, gate)
    assert fake_provider.requests[0].messages[0] == {"role": "system", "content": "You report the weather."}
    assert gate.text() == "It is sunny in Paris."


async def test_the_agents_tool_middleware_runs_inside_local(
    fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider)
    gate = Gate()
    weather = Weather(gate)
    agent = weather_agent(user_model(fake_provider, http), weather, [Shouting()])
    await host(LangChainAgentRuntime, fake_provider, agent, gate)
    assert weather.ran_outside_local == []
    assert fake_provider.requests[1].last_tool_result == "SUNNY IN PARIS"


# -- Hand-built graphs (the `langgraph` runtime) --------------------------------------------------


def test_tools_in_a_subgraph_are_found_too() -> None:
    runtime = LangGraphAgentRuntime(RuntimeConfig(base_url="http://127.0.0.1:9/v1"))
    assert [spec.name for spec in runtime.native_tools(outer_graph(offline_model(), Weather()))] == ["get_weather"]


async def test_a_subgraphs_tool_calls_are_governed_and_its_text_streamed(
    fake_provider: ScriptedModel, http: tuple[Any, Any]
) -> None:
    script_weather(fake_provider)
    gate = Gate()
    weather = Weather(gate)
    await host(LangGraphAgentRuntime, fake_provider, outer_graph(user_model(fake_provider, http), weather), gate)
    assert [call.call_id for call in gate.tool_calls] == ["call_w"]
    assert weather.ran == ["Paris"]
    assert weather.ran_outside_local == []
    assert gate.text() == "It is sunny in Paris."
    assert gate.kinds().count("usage") == 2
