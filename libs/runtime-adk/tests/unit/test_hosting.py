"""Hosting a user's own ADK agent: its tools pass the choke point, its sub-agents stream, its artifacts persist."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.tools.agent_tool import AgentTool

from atmosphere.runtimes.adk import AdkAgentRuntime
from atmosphere.sdk import AiRequest, ChatMessage
from atmosphere.sdk.runtime import ToolCallRequest, ToolRunner
from atmosphere.testing.model_turns import ToolCallScript, Turn
from atmosphere.testing.runtime_contract import GEMINI_WIRE, Recorder, context
from atmosphere.testing.scripted_model import ScriptedModel


def weather_agent(ran: list[str], name: str = "weather") -> LlmAgent:
    """A real ADK agent with a real function tool (no model: the platform's is used)."""

    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city's name.
        """
        ran.append(city)
        return f"sunny in {city}"

    return LlmAgent(
        name=name, description="Knows the weather.", instruction="You report the weather.", tools=[get_weather]
    )


async def host(
    provider: ScriptedModel,
    agent: Any,
    recorder: Recorder,
    run_tool: ToolRunner,
    request: AiRequest | None = None,
    **overrides: Any,
) -> None:
    runtime = AdkAgentRuntime(GEMINI_WIRE.config(provider))
    try:
        ctx = context(
            recorder, request or AiRequest(message="Weather in Paris?"), native=agent, run_tool=run_tool, **overrides
        )
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


def contents(provider: ScriptedModel, number: int) -> list[dict[str, Any]]:
    return list(provider.requests[number]["contents"])


def origin_texts(recorder: Recorder) -> list[tuple[str, str, str]]:
    return [
        (e.origin_agent, e.origin_run_id, e.text_delta.text)
        for e in recorder.events
        if e.WhichOneof("kind") == "text_delta" and e.origin_agent
    ]


def test_an_adk_agent_is_hosted_with_its_sub_agents_tools() -> None:
    runtime = AdkAgentRuntime(GEMINI_WIRE.config(ScriptedModel()))
    helper = weather_agent([], "helper")
    root = LlmAgent(name="triage", sub_agents=[weather_agent([])], tools=[AgentTool(helper)])
    assert AdkAgentRuntime.hosts(root)
    assert not AdkAgentRuntime.hosts(object())
    specs = {spec.name: spec for spec in runtime.native_tools(root)}
    assert sorted(specs) == ["get_weather", "helper"]  # the AgentTool, and the tool of both agents (once)
    weather = specs["get_weather"]
    assert weather.parameters["properties"]["city"]["type"] == "string"
    assert weather.parameters["required"] == ["city"]
    assert weather.description.startswith("Current weather for a city.")
    assert not weather.requires_approval


async def test_the_agents_tool_runs_only_through_the_choke_point(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Paris"}, call_id="call_p")),
        Turn.text("It is sunny in Paris.", usage=(20, 7)),
    )
    ran: list[str] = []
    recorder = Recorder()
    agent = weather_agent(ran)
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert agent.model == ""  # the run used a clone on the platform's model
    [call] = recorder.tool_calls
    assert (call.call_id, call.name, json.loads(call.arguments_json)) == ("call_p", "get_weather", {"city": "Paris"})
    assert ran == ["Paris"]
    first = fake_provider.requests[0]
    assert first["systemInstruction"]["parts"][0]["text"].startswith("You report the weather.")
    assert GEMINI_WIRE.last_tool_result(fake_provider.requests[1]) == ("call_p", "sunny in Paris")
    assert fake_provider.headers[0]["x-goog-api-key"] == "contract-key"
    assert recorder.text() == "It is sunny in Paris."
    assert recorder.kinds().count("text_delta") >= 2
    # One report per model round, as the built-in runtime makes them: the tool round's, the answer's.
    usages = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert [(u.input_tokens, u.output_tokens, u.total_tokens, u.model) for u in usages] == [
        (10, 5, 15, "fake-model"),
        (20, 7, 27, "fake-model"),
    ]
    [delta] = [e.tool_call_delta for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta"]
    assert (delta.call_id, json.loads(delta.arguments_fragment)) == ("call_p", {"city": "Paris"})
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
    assert GEMINI_WIRE.last_tool_result(fake_provider.requests[1]) == ("call_p", "Error: denied")
    assert recorder.terminal().WhichOneof("kind") == "complete"


async def test_the_agents_own_before_tool_callback_runs_after_the_gate(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.tool_call("get_weather", city="Rome"), Turn.text("Fine."))
    ran: list[str] = []
    recorder = Recorder()
    agent = weather_agent(ran)
    agent.before_tool_callback = lambda tool, args, tool_context: {"answer": f"cached for {args['city']}"}
    await host(fake_provider, agent, recorder, through_local(recorder))
    assert ran == []  # the callback answered the call, as ADK lets it
    assert GEMINI_WIRE.last_tool_result(fake_provider.requests[1])[1] == '{"answer":"cached for Rome"}'


async def test_a_transfer_to_a_sub_agent_hands_off_and_gates_its_tools(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_call("transfer_to_agent", agent_name="weather"),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}, call_id="call_w")),
        Turn.text("Cold in Oslo."),
    )
    ran: list[str] = []
    recorder = Recorder()
    triage = LlmAgent(name="triage", instruction="Route each question.", sub_agents=[weather_agent(ran)])
    await host(fake_provider, triage, recorder, through_local(recorder), AiRequest(message="Oslo?"))
    [call] = recorder.tool_calls  # the transfer is ADK's own control flow, not a tool of the user's
    assert (call.call_id, call.name, call.local is not None) == ("call_w", "get_weather", True)
    assert ran == ["Oslo"]
    [handoff] = [e.handoff for e in recorder.events if e.WhichOneof("kind") == "handoff"]
    assert (handoff.from_agent, handoff.to_agent, handoff.reason) == ("triage", "weather", "transfer_to_agent")
    kinds = recorder.kinds()
    assert kinds.index("handoff") < kinds.index("text_delta")
    assert fake_provider.requests[1]["systemInstruction"]["parts"][0]["text"].startswith("You report the weather.")
    # Control passed: the sub-agent's words are the run's answer.
    assert recorder.text() == "Cold in Oslo."
    assert origin_texts(recorder) == []
    assert recorder.terminal().WhichOneof("kind") == "complete"


# ADK's own AgentTool builds its runner with the argument ADK itself deprecated.
@pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated:DeprecationWarning")
async def test_an_agent_tools_events_stream_as_the_sub_agents(fake_provider: ScriptedModel) -> None:
    fake_provider.script(
        Turn.tool_calls(ToolCallScript("weather", {"request": "Oslo?"}, call_id="call_d")),
        Turn.tool_calls(ToolCallScript("get_weather", {"city": "Oslo"}, call_id="call_w")),
        Turn.text("Cold in Oslo."),
        Turn.text("The weather agent says: cold."),
    )
    ran: list[str] = []
    recorder = Recorder()
    coordinator = LlmAgent(name="coordinator", tools=[AgentTool(weather_agent(ran))])
    await host(fake_provider, coordinator, recorder, through_local(recorder), AiRequest(message="Oslo?"))
    assert [(c.name, c.local is not None) for c in recorder.tool_calls] == [("weather", True), ("get_weather", True)]
    assert ran == ["Oslo"]
    # As dispatch forwards a delegated sub-run's events: tagged with the sub-agent, not the answer.
    assert origin_texts(recorder) == [("weather", "r1/weather", "Cold in Oslo.")]
    delegated = [e for e in recorder.events if e.WhichOneof("kind") == "tool_call_delta" and e.origin_agent]
    assert [(e.origin_agent, e.tool_call_delta.tool_name) for e in delegated] == [("weather", "get_weather")]
    answer = [e.text_delta.text for e in recorder.events if e.WhichOneof("kind") == "text_delta" and not e.origin_agent]
    assert "".join(answer) == "The weather agent says: cold."
    assert GEMINI_WIRE.last_tool_result(fake_provider.requests[3]) == ("call_d", "Cold in Oslo.")


async def test_an_agent_tool_that_would_skip_the_gate_is_refused(fake_provider: ScriptedModel) -> None:
    recorder = Recorder()
    isolated = LlmAgent(name="coordinator", tools=[AgentTool(weather_agent([]), include_plugins=False)])
    await host(fake_provider, isolated, recorder, refusing(recorder))
    assert "could not pass the platform's tool gate" in recorder.terminal().error.message
    assert fake_provider.requests == []


async def test_history_and_the_platforms_instructions_follow_the_agents_own(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("Still sunny."))
    recorder = Recorder()
    history = (
        ChatMessage("system", "Earlier: the user asked about Paris."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "Sunny."),
    )
    request = AiRequest(message="And now?", history=history, system_prompt="Be brief.")
    await host(fake_provider, weather_agent([]), recorder, refusing(recorder), request)
    said = GEMINI_WIRE.conversation(fake_provider.requests[0])
    instruction = said[0][1]
    assert instruction.startswith("You report the weather.")
    assert instruction.endswith("Earlier: the user asked about Paris.\n\nBe brief.")
    assert said[1:] == [("user", "Weather?"), ("assistant", "Sunny."), ("user", "And now?")]


async def test_model_names_and_objects(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.text("ok"))
    recorder = Recorder()
    named = weather_agent([])
    named.model = "gemini-2.5-pro"  # a name runs on the platform's client: its base URL, key, retries
    await host(fake_provider, named, recorder, refusing(recorder))
    [usage] = [e.usage for e in recorder.events if e.WhichOneof("kind") == "usage"]
    assert usage.model == "gemini-2.5-pro"
    assert fake_provider.headers[0]["x-goog-api-key"] == "contract-key"


async def test_cancelling_a_hosted_run_closes_the_upstream_request(fake_provider: ScriptedModel) -> None:
    fake_provider.script(Turn.stalled("Thinking", seconds=30))
    recorder = Recorder()
    runtime = AdkAgentRuntime(GEMINI_WIRE.config(fake_provider))
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
