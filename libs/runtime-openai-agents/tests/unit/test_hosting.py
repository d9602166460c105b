"""Hosting a user's own `agents.Agent`: its tools pass the choke point, its answer streams."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, WebSearchTool, function_tool, handoff
from openai import AsyncOpenAI

from atmosphere.runtimes.openai_agents import OpenAiAgentsRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import RuntimeConfig, ToolCallRequest, ToolRunner
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


def weather_agent(ran: list[str]) -> Agent[None]:
    """A real Agents SDK agent with a real function tool (no model: the platform's is used)."""

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"sunny in {city}"

    return Agent(name="weather", instructions="You report the weather.", tools=[get_weather])


def runtime_for(provider: ScriptedModel) -> OpenAiAgentsRuntime:
    return OpenAiAgentsRuntime(RuntimeConfig(base_url=provider.base_url, model="fake-model", stall_timeout=5.0))


async def host(
    provider: ScriptedModel,
    agent: Agent[None],
    recorder: Recorder,
    run_tool: ToolRunner,
    request: AiRequest | None = None,
) -> None:
    runtime = runtime_for(provider)
    try:
        ctx = context(recorder, request or AiRequest(message="Weather in Paris?"), native=agent, run_tool=run_tool)
        await runtime.execute(ctx, recorder.session)
    finally:
        await runtime.aclose()


def through_local(recorder: Recorder) -> ToolRunner:
    """A choke point that lets every call through to the tool (`local`), recording it."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        assert call.local is not None
        return await call.local(call.arguments_json)

    return run_tool


def refusing(recorder: Recorder) -> ToolRunner:
    """A choke point whose gates refuse every call: `local` is never called."""

    async def run_tool(call: ToolCallRequest) -> str:
        recorder.tool_calls.append(call)
        return "Error: denied"

    return run_tool


def test_an_agents_sdk_agent_is_hosted() -> None:
    runtime = OpenAiAgentsRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    assert OpenAiAgentsRuntime.hosts(Agent(name="a"))
    assert not OpenAiAgentsRuntime.hosts(object())
    [spec] = runtime.native_tools(weather_agent([]))
    assert (spec.name, spec.description, spec.requires_approval) == (
        "get_weather",
        "Current weather for a city.",
        False,
    )
    assert spec.parameters["properties"]["city"] == {
        "description": "The city's name.",
        "title": "City",
        "type": "string",
    }
    assert spec.parameters["required"] == ["city"]


def test_the_tools_of_handoff_targets_are_listed() -> None:
    runtime = OpenAiAgentsRuntime(RuntimeConfig(base_url="http://127.0.0.1:1/v1"))
    triage = Agent(name="triage", handoffs=[weather_agent([])])
    assert [spec.name for spec in runtime.native_tools(triage)] == ["get_weather"]


async def test_the_agents_tool_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    ran: list[str] = []
    recorder = Recorder()
    agent = weather_agent(ran)
    [tool] = agent.tools
    assert isinstance(tool, FunctionTool)
    invoke = tool.on_invoke_tool
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert (agent.tools, tool.on_invoke_tool, agent.model) == ([tool], invoke, None)  # the run used a gated clone
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first, second = fake_provider.requests
    assert first["model"] == "fake-model"
    assert first["messages"][0] == {"role": "system", "content": "You report the weather."}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_p", "content": "sunny in Paris"}
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.kinds().count("text_delta") >= 2
    # One report per model round, as the built-in runtime makes them: the tool round's, the answer's.
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens, u.total_tokens) for u in usages] == [(10, 5, 15), (20, 7, 27)]
    assert recorder.kinds()[-2:] == ["usage", "complete"]


async def test_a_refused_call_never_runs_the_tool(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("I may not look."),
    )
    ran: list[str] = []
    recorder = Recorder()
    await host(fake_provider, weather_agent(ran), recorder, refusing(recorder))
    assert [c.name for c in recorder.tool_calls] == ["get_weather"]
    assert ran == []
    assert fake_provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_p",
        "content": "Error: denied",
    }
    assert recorder.terminal().WhichOneof("kind") == "complete"


@pytest.mark.parametrize("as_handoff", [False, True], ids=["agent", "handoff-object"])
async def test_a_handoff_targets_tools_pass_the_choke_point_too(fake_provider: ScriptedModel, as_handoff: bool) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("transfer_to_weather", {}, call_id="call_h")),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}, call_id="call_w")),
        Turn.text("Cold in Oslo."),
    )
    ran: list[str] = []
    recorder = Recorder()
    target = weather_agent(ran)
    triage = Agent(name="triage", handoffs=[handoff(target) if as_handoff else target])
    await host(fake_provider, triage, recorder, through_local(recorder))
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, call.local is not None) == ("call_w", "get_weather", True)
    assert ran == ["Oslo"]
    assert recorder.text() == "Cold in Oslo."


async def test_history_follows_the_agents_instructions(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Still sunny."))
    recorder = Recorder()
    history = (ChatMessage("user", "Weather?"), ChatMessage("assistant", "Sunny."))
    request = AiRequest(message="And now?", history=history)
    await host(fake_provider, weather_agent([]), recorder, refusing(recorder), request)
    assert fake_provider.requests[0]["messages"] == [
        {"role": "system", "content": "You report the weather."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And now?"},
    ]


async def test_a_tool_that_could_not_be_gated_is_refused(fake_provider: ScriptedModel) -> None:
    recorder = Recorder()
    agent = Agent(name="searcher", tools=[WebSearchTool()])  # run by the provider: no call of this process
    await host(fake_provider, agent, recorder, refusing(recorder))
    assert "could not pass the platform's tool gate" in recorder.terminal().error.message
    assert fake_provider.requests == []


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = runtime_for(fake_provider)
    ctx = context(recorder, AiRequest(message="hi"), native=weather_agent([]))
    task = asyncio.create_task(runtime.execute(ctx, recorder.session))
    try:
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
    finally:
        await runtime.aclose()


async def test_a_model_object_of_the_agents_own_is_kept(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"), Turn.text("ok"))
    client = AsyncOpenAI(base_url=fake_provider.base_url, api_key="own-key")
    recorder = Recorder()
    own = Agent(name="own", model=OpenAIChatCompletionsModel(model="own-model", openai_client=client))
    await host(fake_provider, own, recorder, refusing(recorder))
    named = Agent(name="named", model="gpt-4o")  # a name is not followed: the platform's model runs it
    await host(fake_provider, named, recorder, refusing(recorder))
    assert [r["model"] for r in fake_provider.requests] == ["own-model", "fake-model"]
    assert fake_provider.headers[0]["authorization"] == "Bearer own-key"
    await client.close()
